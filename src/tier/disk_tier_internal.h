// Internals shared by disk_tier.cc (API, open, recovery) and disk_tier_io.cc (the I/O thread).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "tier/disk_recovery.h"
#include "tier/disk_tier.h"

namespace kvtier {

// A transfer that stopped before its end without an errno (a 0-byte result): end of file,
// typically a file truncated underneath.
inline constexpr int kStoppedShort = -1;

// IOError/NoSpace for `err` (an errno or kStoppedShort), prefixed by `what`.
inline Status DiskIoStatus(int err, const std::string& what) {
  if (err == kStoppedShort) {
    return Status::IOError(what + ": transfer stopped short (end of file; truncated underneath?)");
  }
  return Status::FromErrno(err, what);
}

struct DiskTier::Counters {
  std::atomic<uint64_t> writes_completed{0};
  std::atomic<uint64_t> write_errors{0};
  std::atomic<uint64_t> writes_rejected{0};
  std::atomic<uint64_t> bytes_written{0};
  std::atomic<uint64_t> reads_served{0};
  std::atomic<uint64_t> read_misses{0};
  std::atomic<uint64_t> read_errors{0};
  std::atomic<uint64_t> reads_rejected{0};
  std::atomic<uint64_t> verify_failures{0};
  std::array<std::atomic<uint64_t>, kNumBlockChecks> verify_by_check{};
  std::atomic<uint64_t> slots_dropped{0};
  std::atomic<uint64_t> bytes_read{0};
  std::atomic<uint64_t> eio_errors{0};
  std::atomic<uint64_t> enospc_errors{0};
  std::atomic<uint64_t> other_errors{0};
  std::atomic<uint64_t> short_transfers{0};
  std::atomic<uint64_t> stuck_ios{0};
  std::atomic<uint64_t> consecutive_errors{0};
  std::atomic<uint64_t> quarantines{0};
  std::atomic<uint64_t> probes{0};
  std::atomic<uint64_t> probes_ok{0};
  std::atomic<uint64_t> blocks_lost_to_truncation{0};
  std::atomic<bool> buffers_registered{false};
  // Set during Open, before the I/O thread starts; read-only afterwards.
  bool recovered_from_snapshot = false;
  uint64_t recovered_blocks = 0;
  uint64_t scan_corrupt = 0;
  uint64_t scan_duplicates = 0;
  uint64_t scan_read_errors = 0;
  uint64_t files_rescanned = 0;
  double recovery_ms = 0;
};

inline void Bump(std::atomic<uint64_t>& counter, uint64_t n = 1) {
  counter.fetch_add(n, std::memory_order_relaxed);
}

}  // namespace kvtier

// FaultInjectingIo: a DiskIo wrapper that makes the failures a disk tier must survive happen on
// demand: I/O errors (EIO, ENOSPC, any errno), short reads and writes, torn writes that the
// device reports as complete, bit flips on the way to and from the device, and stalls.
//
// Faults are drawn per request from a FaultPlan (probabilities, seeded, so a failing test
// replays), or forced for the next N requests of a kind with FailNext(). The wrapper never
// modifies a caller's buffer on the way to the device: a corrupted write goes out from a bounce
// copy. Read faults flip bits in the caller's buffer after the data arrived, as a device or bus
// would.
#pragma once

#include <cerrno>
#include <cstdint>
#include <memory>
#include <random>
#include <unordered_map>
#include <vector>

#include "core/mutex.h"
#include "tier/disk_io.h"

namespace kvtier {

struct FaultPlan {
  // Probabilities per request, each in [0, 1]. At most one fault hits a request; they are drawn
  // in this order.
  double read_error = 0;      // the read fails with read_errno without reaching the device
  double write_error = 0;     // the write fails with write_errno without reaching the device
  double short_read = 0;      // the read reports a random 4 KiB multiple below its length
  double short_write = 0;     // only a prefix (a 4 KiB multiple) is written, and reported
  double torn_write = 0;      // only part is written (a prefix, or all but the header page),
                              // but the full length is reported: a lying device, or a crash
  double write_bit_flip = 0;  // one bit of what reaches the device is flipped; full success
  double read_bit_flip = 0;   // one bit of what was read is flipped after it arrived
  double stall = 0;           // the completion is held back until ReleaseStalled()
  int read_errno = EIO;
  int write_errno = EIO;
  uint64_t seed = 1;
};

struct FaultCounts {
  uint64_t read_errors = 0;
  uint64_t write_errors = 0;
  uint64_t short_reads = 0;
  uint64_t short_writes = 0;
  uint64_t torn_writes = 0;
  uint64_t write_bit_flips = 0;
  uint64_t read_bit_flips = 0;
  uint64_t stalls = 0;

  // Faults that change bytes without an error: what verification must catch.
  uint64_t silent() const { return torn_writes + write_bit_flips + read_bit_flips; }
  uint64_t total() const {
    return read_errors + write_errors + short_reads + short_writes + silent() + stalls;
  }
};

class FaultInjectingIo final : public DiskIo {
 public:
  explicit FaultInjectingIo(std::unique_ptr<DiskIo> inner);
  ~FaultInjectingIo() override;

  // Thread-safe controls, meant for the test's thread while the tier's thread does I/O.
  void SetPlan(const FaultPlan& plan) EXCLUDES(mu_);
  // The next `count` requests of `kind` fail with `err` (before any FaultPlan draw).
  void FailNext(IoKind kind, int err, uint32_t count) EXCLUDES(mu_);
  // The next Poll() fails as if the engine itself broke (IOError), once.
  void FailNextPoll() EXCLUDES(mu_);
  // Completions held back by `stall` for requests queued so far (done or still on the device)
  // are delivered from the next Poll() on.
  void ReleaseStalled() EXCLUDES(mu_);
  FaultCounts counts() const EXCLUDES(mu_);
  // Requests forwarded to the device so far, by kind.
  uint64_t forwarded(IoKind kind) const EXCLUDES(mu_);

  uint32_t queue_depth() const override { return inner_->queue_depth(); }
  void Queue(const IoRequest& request) override EXCLUDES(mu_);
  Result<size_t> Poll(int timeout_ms, std::vector<IoCompletion>* out) override EXCLUDES(mu_);
  void Wake() override { inner_->Wake(); }
  Status RegisterBuffers(std::span<const iovec> regions) override {
    return inner_->RegisterBuffers(regions);
  }
  bool buffers_registered() const override { return inner_->buffers_registered(); }
  std::string name() const override { return inner_->name() + "+faults"; }

 private:
  enum class Fault : uint8_t {
    kNone,
    kShortRead,
    kShortWrite,
    kTornWrite,
    kWriteFlip,
    kReadFlip,
    kStall,
  };
  struct Pending {
    Fault fault = Fault::kNone;
    IoRequest original;
    uint8_t* bounce = nullptr;  // owned; freed at completion
    uint32_t report = 0;        // bytes to report for short/torn faults
    uint64_t epoch = 0;         // release epoch when queued (stalls)
  };
  struct Stalled {
    IoCompletion completion;
    uint64_t epoch;
  };

  Fault Draw(const IoRequest& r) REQUIRES(mu_);
  uint32_t RandomPages(uint32_t below_pages) REQUIRES(mu_);

  std::unique_ptr<DiskIo> inner_;
  mutable Mutex mu_;
  FaultPlan plan_ GUARDED_BY(mu_);
  std::mt19937_64 rng_ GUARDED_BY(mu_);
  uint32_t fail_next_reads_ GUARDED_BY(mu_) = 0;
  uint32_t fail_next_writes_ GUARDED_BY(mu_) = 0;
  int fail_next_read_errno_ GUARDED_BY(mu_) = EIO;
  int fail_next_write_errno_ GUARDED_BY(mu_) = EIO;
  uint64_t release_epoch_ GUARDED_BY(mu_) = 0;
  bool fail_next_poll_ GUARDED_BY(mu_) = false;  // bumped by ReleaseStalled()
  FaultCounts counts_ GUARDED_BY(mu_);
  uint64_t forwarded_reads_ GUARDED_BY(mu_) = 0;
  uint64_t forwarded_writes_ GUARDED_BY(mu_) = 0;

  // Touched only by the thread that drives this DiskIo.
  std::unordered_map<uint64_t, Pending> pending_;
  std::vector<IoCompletion> synthetic_;  // failures that never reached the device
  std::vector<Stalled> stalled_;
  std::vector<IoCompletion> inner_out_;
};

}  // namespace kvtier

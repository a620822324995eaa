// Warm restart of the disk tier: what a reopened directory holds.
//
// Fast path: a snapshot of the slot table written at clean shutdown. It is used once: the tier
// deletes it (and syncs the directory) before it writes anything, so a crash later can never
// bring back a table that no longer matches the slots. A snapshot that is missing, torn,
// fails its checksum or names another formatting of the directory is ignored.
//
// Slow path: a header scan of every slot, many reads in flight at once through the tier's
// DiskIo. A slot counts only when its header verifies (magic, version, checksum, lengths) and
// names this slot, this layout and this payload size; when a key turns up in several slots
// (a crash between a rewrite and the removal of the old copy) the newest write generation wins.
// Payloads are not read by default: every read verifies its payload anyway, so a torn block
// that the scan lets through is still never served.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/status.h"
#include "tier/block_format.h"
#include "tier/disk_files.h"
#include "tier/disk_io.h"

namespace kvtier {

// A block found in the directory at open: what the block index needs to learn of it.
struct RecoveredBlock {
  BlockKey key;
  BlockKey parent;
  uint64_t namespace_id = 0;
  uint32_t slot = 0;
  uint64_t generation = 0;
  std::vector<TokenId> tokens;
};

inline constexpr size_t kNumBlockChecks = static_cast<size_t>(BlockCheck::kBadPayload) + 1;

struct ScanReport {
  std::vector<RecoveredBlock> blocks;  // one per key: the newest generation
  uint64_t slots_scanned = 0;
  uint64_t empty = 0;        // never written (zeroed)
  uint64_t corrupt = 0;      // a header (or payload, when verified) that did not verify
  uint64_t duplicates = 0;   // older copies of a key, dropped
  uint64_t read_errors = 0;  // slots that could not be read (I/O error, short read)
  uint64_t max_generation = 0;
  std::array<uint64_t, kNumBlockChecks> by_check{};  // corrupt slots by failed check
  std::vector<std::string> problems;                 // the first few, e.g. "slot 17: bad-payload"
  // Valid blocks by the at-rest format version they were written in (index = version).
  std::array<uint64_t, kBlockFormatVersion + 1> by_version{};
};

// Reads every slot of `geometry` through `io` (queue_depth() reads in flight) and returns what
// verified. `verify_payload` reads whole slots and checks payload checksums too (what
// `kvtier inspect` does); otherwise only the 4 KiB headers are read. `files`, when not empty,
// says which files to scan (files[f] for file f; the other files' slots are skipped). IOError
// only when the I/O engine itself fails; per-slot errors are counted in the report. REQUIRES:
// nothing else uses `io` meanwhile. `progress`, when set, is called on the calling thread with
// (slots examined, slots of the geometry) every 4096 slots and once at the end: the caller
// decides whether and how to show it (the library never writes to a terminal).
using ScanProgress = std::function<void(uint64_t scanned, uint64_t total)>;
Result<ScanReport> ScanSlots(DiskIo* io, const DiskGeometry& geometry, bool verify_payload,
                             const std::vector<bool>& files = {},
                             const ScanProgress& progress = nullptr);

struct Snapshot {
  uint64_t tier_id = 0;
  uint64_t geometry_hash = 0;
  uint64_t next_generation = 0;
  // Each slot file's identity when the snapshot was written (one per file, in file order). An
  // identity of all zeros says the file was found damaged then: its slots must be scanned.
  std::vector<FileIdentity> files;
  std::vector<RecoveredBlock> blocks;
};

// Writes `snapshot` to `path` atomically (temporary file, fsync, rename, directory fsync).
Status WriteSnapshot(const std::string& path, const Snapshot& snapshot);

// Reads and checks a snapshot: NotFound when absent; Corruption when not a regular file,
// truncated, oversized for `num_slots`, failing its checksum, of another format version, or
// holding more file records than kMaxSlotFiles, more entries than slots, an out-of-range or
// repeated slot, an out-of-range token count, a repeated key, or trailing bytes. Never trusts a
// length before checking it.
Result<Snapshot> ReadSnapshot(const std::string& path, uint32_t num_slots);

// Deletes the snapshot and syncs its directory; Ok when there is none.
Status RemoveSnapshot(const std::string& path);

}  // namespace kvtier

// DiskTier: the G3 tier. Fixed-size slots in preallocated files on local SSD, written and read
// with O_DIRECT through io_uring, one I/O per block (header + payload), every read verified.
//
// Buffers: a block travels in a caller-owned, 4 KiB-aligned buffer of io_bytes() bytes laid out
// as [header area | payload] (the shape of a G2 slot; Config::header_bytes). A write fills the
// header area and sends the whole buffer in one I/O; a read lands header and payload in one I/O
// and verifies them in place. No copy on either path; register the memory the buffers come
// from (OpenOptions::buffers or RegisterBuffers) so the kernel does not map it per I/O.
//
// Slot state machine (all transitions under mu_):
//
//   kFree --SubmitWrites--> kWriting --write completed--> kValid --Remove / failed read--+
//     ^                        |                           |  ^                          |
//     |                        +---write failed------------|--|--------------------------+
//     |                                                    |  | readers pin the slot     v
//     +-------------------- readers == 0 ------------------+--+----------------------- kDoomed
//
// Only kValid slots are in the key map, so only they can be read; a slot is rewritten only
// after it returned to kFree, which needs its reader count at zero. A read records the slot's
// write generation when it starts and the header must carry that same generation, so a read can
// never return another write's bytes, half-rewritten or not. A write is reported complete (and
// its key becomes readable) only after the device completed it.
//
// Threads: one I/O thread owns the DiskIo; it submits queued requests in batches (one
// io_uring_enter for all requests queued since the last) and runs completions, verification and
// callbacks. Submit*() only takes two short locks; no lock is ever held across I/O.
//
// Failures: an I/O error, a short transfer that cannot be completed, or a block that fails
// verification is counted; `quarantine_after_errors` in a row (any success resets the run),
// a data file deleted or truncated underneath, or an I/O stuck past io_timeout_ms quarantines
// the tier: reads and writes then fail fast with Unavailable, and every reprobe_interval_ms
// the tier writes and reads back a probe page in each file and returns to service when that
// works. Nothing is served that did not verify.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/mutex.h"
#include "kvtier/block_key.h"
#include "kvtier/status.h"
#include "tier/block_format.h"
#include "tier/disk_admission.h"
#include "tier/disk_files.h"
#include "tier/disk_io.h"
#include "tier/disk_recovery.h"

namespace kvtier {

// The outcome of one request, delivered to its sink.
struct DiskOpResult {
  uint64_t cookie = 0;  // the request's cookie
  Status status;        // see SubmitWrites / SubmitReads for the codes
  uint32_t slot = 0;    // where the block is (valid for Ok)
  uint64_t generation = 0;
};

// Receives request outcomes. Called on the tier's I/O thread, or on the submitting thread
// before Submit*() returns when a request is rejected up front; must be quick, must not block
// on the tier, and may submit more requests.
class DiskCompletionSink {
 public:
  virtual ~DiskCompletionSink() = default;
  virtual void OnDiskOpDone(const DiskOpResult& result) = 0;
};

// A sink that collects results for a thread to wait on. Thread-safe.
class DiskOpWaiter final : public DiskCompletionSink {
 public:
  void OnDiskOpDone(const DiskOpResult& result) override EXCLUDES(mu_);
  // Blocks until `count` results arrived since the last Take, then returns them in arrival order.
  std::vector<DiskOpResult> Take(size_t count) EXCLUDES(mu_);

 private:
  Mutex mu_;
  std::condition_variable cv_;
  std::vector<DiskOpResult> results_ GUARDED_BY(mu_);
};

struct DiskWriteRequest {
  BlockKey key;
  BlockKey parent;
  uint64_t namespace_id = 0;
  std::span<const TokenId> tokens;  // the block's tokens; read before SubmitWrites returns
  // io_bytes() bytes, 4 KiB aligned: the tier overwrites [0, Config::header_bytes) with the
  // header; the payload follows. Unchanged by the caller until the result arrives.
  uint8_t* buffer = nullptr;
  DiskCompletionSink* sink = nullptr;
  uint64_t cookie = 0;
  // Nonzero: the payload's XXH3-64 (PayloadChecksum) must equal it, else the write is refused
  // with Corruption and nothing is written (kvtier serve: the checksum taken when the engine
  // committed the block; a slot changed since is never persisted).
  uint64_t expected_checksum = 0;
};

struct DiskReadRequest {
  BlockKey key;
  uint64_t namespace_id = 0;
  // The block's tokens, compared with the stored ones; must stay valid until the result
  // arrives. Empty skips the comparison (tools that do not know them).
  std::span<const TokenId> expected_tokens;
  uint8_t* buffer = nullptr;  // io_bytes() bytes, 4 KiB aligned; receives header + payload
  DiskCompletionSink* sink = nullptr;
  uint64_t cookie = 0;
};

// Memory that request buffers come from, for io_uring buffer registration.
struct DiskBufferRegion {
  uint8_t* base = nullptr;
  uint64_t bytes = 0;
};

struct DiskTierStats {
  // Capacity.
  uint64_t slots = 0;
  uint64_t free_slots = 0;
  uint64_t blocks = 0;  // readable (kValid) blocks
  // Writes.
  uint64_t writes_completed = 0;
  uint64_t write_errors = 0;     // I/O errors and short writes that did not complete
  uint64_t writes_rejected = 0;  // not started: full, duplicate, queue full, quarantined, bad args
  uint64_t bytes_written = 0;
  // Reads.
  uint64_t reads_served = 0;     // verified and delivered
  uint64_t read_misses = 0;      // key not present
  uint64_t read_errors = 0;      // I/O errors and short reads
  uint64_t reads_rejected = 0;   // not started: queue full, quarantined, bad args
  uint64_t verify_failures = 0;  // blocks read that did not verify (never served)
  std::array<uint64_t, kNumBlockChecks> verify_failures_by_check{};
  uint64_t slots_dropped = 0;  // slots freed because their block failed or was lost
  uint64_t bytes_read = 0;
  // Errors and quarantine.
  uint64_t eio_errors = 0;
  uint64_t enospc_errors = 0;
  uint64_t other_errors = 0;     // any other errno, and transfers that stopped short
  uint64_t short_transfers = 0;  // partial transfers, resumed
  uint64_t stuck_ios = 0;
  uint64_t consecutive_errors = 0;
  bool quarantined = false;
  std::string quarantine_reason;
  uint64_t quarantines = 0;  // times the tier entered quarantine
  uint64_t probes = 0;
  uint64_t probes_ok = 0;
  uint64_t blocks_lost_to_truncation = 0;
  // Admission.
  uint64_t admitted = 0;
  uint64_t not_admitted_unseen = 0;
  uint64_t not_admitted_budget = 0;
  // Open and recovery.
  bool recovered_from_snapshot = false;
  uint64_t recovered_blocks = 0;
  uint64_t scan_corrupt = 0;
  uint64_t scan_duplicates = 0;
  uint64_t scan_read_errors = 0;
  // Slot files the snapshot could not vouch for (changed since it was written, or found damaged
  // when it was): their slots were scanned at open.
  uint64_t files_rescanned = 0;
  double recovery_ms = 0;
  bool reformatted = false;
  bool sparse_files = false;
  bool buffers_registered = false;
  std::string io_backend;
};

class DiskTier {
 public:
  struct Config {
    // Directory of the slot files; created (0700) when missing.
    std::string dir = "./kvtier-data";
    // Bytes of slot files, headers included; slots = what fits (see DiskGeometry::For).
    uint64_t capacity_bytes = 0;
    // Payload bytes of one block (KvLayout::BlockBytes()); 1 .. KvLayout::kMaxBlockBytes.
    uint64_t payload_bytes = 0;
    // The header area in front of the payload: BlockHeaderBytes(layout), 4 KiB up to 1320
    // tokens per block. Writes carry exactly tokens_per_block tokens' worth of header.
    uint64_t header_bytes = kBlockHeaderBytes;
    // KvLayout::Fingerprint() of the blocks stored; a block of any other layout is never served.
    uint64_t layout_fingerprint = 0;
    // Slot files to spread the slots over, 1 .. kMaxSlotFiles.
    uint32_t num_files = 1;
    // I/Os in flight at once, 1..4096.
    uint32_t queue_depth = 32;
    // Requests accepted but not yet in flight; beyond it Submit*() rejects with
    // ResourceExhausted (an offload is dropped, never waited for). >= queue_depth.
    uint32_t max_queued = 4096;
    // io_uring (the default, via kAuto) or the pread/pwrite thread pool.
    IoBackend io_backend = IoBackend::kAuto;
    // Reserve the files' space with fallocate; false (or a filesystem that refuses) = sparse.
    bool preallocate = true;
    // A directory holding another geometry is reformatted (true) or refused (false).
    bool reformat_on_mismatch = true;
    // Errors in a row (I/O errors, failed verifications) that quarantine the tier, >= 1.
    uint32_t quarantine_after_errors = 8;
    // How long a quarantined tier waits between probes, >= 1.
    uint32_t reprobe_interval_ms = 10'000;
    // How often the files are checked for deletion or truncation underneath, >= 1.
    uint32_t health_check_interval_ms = 1'000;
    // An I/O in flight longer than this quarantines the tier, >= 1.
    uint32_t io_timeout_ms = 30'000;
    // Write the slot table at Close() so the next Open() need not scan.
    bool snapshot_on_close = true;
    // Admission gate (DiskTier::Admit); min_seen 2 by default.
    DiskAdmission::Config admission;

    // Ok, or InvalidArgument naming the first bad field, its value and the allowed range.
    Status Validate() const;
  };

  struct OpenOptions {
    // Regions to register with io_uring at open (see RegisterBuffers).
    std::vector<DiskBufferRegion> buffers;
    // Wraps the I/O engine before use: the fault-injection seam for tests.
    std::function<std::unique_ptr<DiskIo>(std::unique_ptr<DiskIo>)> wrap_io;
    // Told the header scan's progress when recovery scans (see ScanSlots); null: not told.
    ScanProgress recovery_progress;
  };

  struct Opened {
    std::unique_ptr<DiskTier> tier;
    // The blocks found in the directory, readable now: rebuild the block index from these.
    std::vector<RecoveredBlock> recovered;
  };

  // Opens (creating or reformatting as configured) the tier in config.dir and recovers its
  // blocks: from the clean-shutdown snapshot when there is a valid one (then deleted), else by a
  // header scan. Returns InvalidArgument for a bad config, and the errors of DiskFileSet::Open
  // (FailedPrecondition when another process holds the directory, NoSpace when the filesystem
  // cannot hold the files, ...), or of the I/O engine.
  static Result<Opened> Open(const Config& config, const OpenOptions& options = {});

  // Close()s.
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  // Finishes the requests already accepted, stops the I/O thread, writes the snapshot (when
  // configured) and closes the files. Later requests fail with Unavailable. Idempotent; returns
  // the snapshot's write error if any (the tier is closed regardless).
  Status Close() EXCLUDES(mu_, queue_mu_);

  // Starts writes. Each request's sink gets exactly one result:
  //   Ok                 the block is on the device and readable
  //   AlreadyExists      the key is stored or being written
  //   ResourceExhausted  no free slot (Remove a victim first) or the queue is full
  //   Unavailable        quarantined or closed
  //   InvalidArgument    bad buffer or tokens (see EncodeBlockHeader; a token count whose
  //                      header is not Config::header_bytes)
  //   IOError / NoSpace  the device failed the write (the slot is free again)
  void SubmitWrites(std::span<const DiskWriteRequest> requests) EXCLUDES(mu_, queue_mu_);

  // Starts verified reads. Each request's sink gets exactly one result:
  //   Ok                 buffer holds the block, fully verified
  //   NotFound           the key is not stored (a miss)
  //   Corruption         what was read did not verify; the slot is freed; a miss
  //   ResourceExhausted  the queue is full
  //   Unavailable        quarantined or closed
  //   InvalidArgument    bad buffer
  //   IOError            the device failed the read (a miss)
  void SubmitReads(std::span<const DiskReadRequest> requests) EXCLUDES(mu_, queue_mu_);

  // Makes `key` unreadable and frees its slot (once reads in flight finish). NotFound when not
  // stored; FailedPrecondition while it is being written. Does not touch the device: a crash
  // before the slot is rewritten may bring the (verified, correct) block back.
  Status Remove(const BlockKey& key) EXCLUDES(mu_);
  // True when `key` is readable.
  bool Contains(const BlockKey& key) const EXCLUDES(mu_);

  // The admission gate for demotions into this tier: records a sighting of `key` and says
  // whether to write it (seen often enough, and within the write budget).
  DiskAdmission::Decision Admit(const BlockKey& key);

  // Registers request-buffer memory with io_uring (waits for I/O in flight to finish). Ok when
  // registered; Unavailable (logged, I/O goes on unregistered) when the kernel refuses, e.g.
  // RLIMIT_MEMLOCK.
  Status RegisterBuffers(std::span<const DiskBufferRegion> regions) EXCLUDES(queue_mu_);

  // Writes and reads back the probe page of every file, now. Ok leaves (or keeps the tier out
  // of) quarantine; an error enters it. Returns the probe's outcome.
  Status ProbeNow() EXCLUDES(queue_mu_);
  // Checks the files for deletion or truncation now (also done every health_check_interval_ms);
  // an error quarantines the tier. Returns what was found.
  Status CheckHealthNow() EXCLUDES(queue_mu_);

  bool quarantined() const { return quarantined_.load(std::memory_order_acquire); }
  DiskTierStats stats() const EXCLUDES(mu_);
  const DiskGeometry& geometry() const { return geometry_; }
  uint32_t num_slots() const { return geometry_.num_slots(); }
  uint64_t payload_bytes() const { return geometry_.payload_bytes; }
  // Bytes of a request buffer: the slot stride (header area + payload, 4 KiB multiple).
  uint64_t io_bytes() const { return geometry_.slot_stride; }
  const Config& config() const { return config_; }

 private:
  enum class SlotState : uint8_t { kFree, kWriting, kValid, kDoomed };
  struct Slot {
    SlotState state = SlotState::kFree;
    uint32_t readers = 0;
    uint64_t generation = 0;
    BlockKey key;
    BlockKey parent;
    uint64_t namespace_id = 0;
    std::vector<TokenId> tokens;
  };
  enum class TaskKind : uint8_t { kWrite, kRead, kProbeWrite, kProbeRead };
  struct Task {
    TaskKind kind = TaskKind::kRead;
    uint32_t slot = 0;
    uint64_t generation = 0;
    uint32_t file = 0;
    uint64_t offset = 0;
    uint8_t* buffer = nullptr;
    uint32_t len = 0;
    uint32_t done = 0;  // bytes transferred so far (short transfers are resumed)
    BlockKey key;
    uint64_t namespace_id = 0;
    std::span<const TokenId> expected_tokens;
    DiskCompletionSink* sink = nullptr;
    uint64_t cookie = 0;
    std::chrono::steady_clock::time_point started;
    bool active = false;          // occupies its in_flight_ entry
    bool stuck_reported = false;  // counted once as stuck
  };
  enum class ControlKind : uint8_t { kRegister, kProbe, kHealth };
  struct Control {
    ControlKind kind;
    std::vector<iovec> regions;
    bool done = false;
    Status result;
  };
  struct Counters;
  // A whole-slot I/O (header + payload) of `slot` at `generation`.
  Task SlotTask(TaskKind kind, uint32_t slot, uint64_t generation, uint8_t* buffer,
                const BlockKey& key, DiskCompletionSink* sink, uint64_t cookie) const;

  DiskTier(const Config& config, const DiskGeometry& geometry);
  // `progress`: told the header scan's progress (see ScanSlots); may be null.
  Status Recover(std::vector<RecoveredBlock>* recovered, const ScanProgress& progress);
  void Deliver(DiskCompletionSink* sink, uint64_t cookie, Status status, uint32_t slot = 0,
               uint64_t generation = 0);
  // A read or write task that will not run: its slot is given back (a write's) or its read
  // ended (kept), the rejection counted, and `status` delivered.
  void Reject(Task& task, Status status) EXCLUDES(mu_);
  // Queues accepted tasks for the I/O thread; rejects (and undoes) what does not fit.
  void Enqueue(std::vector<Task>* tasks) EXCLUDES(mu_, queue_mu_);
  Status RunControl(Control* control) EXCLUDES(queue_mu_);
  void ReleaseWriteSlot(uint32_t slot) EXCLUDES(mu_);
  // Ends a read of `slot`; when `drop` the block is made unreachable and the slot freed (once
  // unpinned). Returns whether the slot was dropped by this call.
  bool EndRead(uint32_t slot, uint64_t generation, bool drop) EXCLUDES(mu_);

  // ---- I/O thread (disk_tier_io.cc) ----
  void IoLoop() EXCLUDES(mu_, queue_mu_);
  void StartTasks() EXCLUDES(mu_);
  // Moves incoming_ to the backlog; returns whether the tier is stopping.
  bool TakeIncoming() EXCLUDES(queue_mu_);
  // Bookkeeping of one completion: resumes a short transfer, or frees the in-flight entry and
  // queues the task in finished_.
  void Complete(const IoCompletion& completion);
  // The slow part of a finished task: verification, slot state, counters, the callback.
  void Finish(Task& task, int err) EXCLUDES(mu_);
  void FinishWrite(Task& task, int err) EXCLUDES(mu_);
  void FinishRead(Task& task, int err) EXCLUDES(mu_);
  void FinishProbe(Task& task, int err);
  void FinishProbeRound() EXCLUDES(mu_, queue_mu_);
  void RunTimers() EXCLUDES(mu_);
  void StartProbe() EXCLUDES(mu_, queue_mu_);
  Status HealthCheck() EXCLUDES(mu_);
  // Counts an error (an errno, or 0 for a block that failed verification) and quarantines the
  // tier at quarantine_after_errors in a row.
  void NoteError(int err, const std::string& what) EXCLUDES(mu_);
  void NoteSuccess();
  void EnterQuarantine(const std::string& reason) EXCLUDES(mu_);
  void FailBacklog(const Status& status) EXCLUDES(mu_);
  void RunControls() EXCLUDES(queue_mu_);
  void CompleteControl(Control* control, Status result) EXCLUDES(queue_mu_);

  const Config config_;
  const DiskGeometry geometry_;
  std::unique_ptr<DiskFileSet> files_;
  std::unique_ptr<DiskIo> io_;
  std::unique_ptr<DiskAdmission> admission_;
  std::unique_ptr<Counters> counters_;
  // Fixed at Open (the files and engine are gone after Close).
  bool opened_ = false;
  std::string reformat_reason_;
  bool sparse_files_ = false;
  std::string io_backend_name_;

  // The slot table.
  mutable Mutex mu_;
  std::vector<Slot> slots_ GUARDED_BY(mu_);
  std::unordered_map<BlockKey, uint32_t, BlockKeyHash> by_key_ GUARDED_BY(mu_);  // kWriting, kValid
  std::vector<uint32_t> free_ GUARDED_BY(mu_);
  uint64_t next_generation_ GUARDED_BY(mu_) = 1;
  uint64_t valid_blocks_ GUARDED_BY(mu_) = 0;
  std::string quarantine_reason_ GUARDED_BY(mu_);

  // Hand-off to the I/O thread.
  Mutex queue_mu_;
  std::condition_variable control_cv_;
  std::vector<Task> incoming_ GUARDED_BY(queue_mu_);
  std::deque<Control*> controls_ GUARDED_BY(queue_mu_);
  bool stopping_ GUARDED_BY(queue_mu_) = false;
  bool closed_ GUARDED_BY(queue_mu_) = false;
  std::atomic<bool> io_thread_sleeping_{false};
  std::atomic<bool> quarantined_{false};
  std::atomic<uint64_t> queued_{0};  // accepted, not yet in flight (incoming_ + backlog_)
  std::thread io_thread_;
  std::once_flag close_once_;
  Status close_status_;

  // Owned by the I/O thread.
  std::deque<Task> backlog_;
  std::vector<Task> in_flight_;
  std::vector<uint32_t> free_task_ids_;
  uint32_t in_flight_count_ = 0;
  std::vector<Control*> pending_registers_;
  std::vector<IoCompletion> completions_;
  std::vector<std::pair<Task, int>> finished_;
  uint32_t consecutive_errors_ = 0;
  std::chrono::steady_clock::time_point next_health_check_;
  std::chrono::steady_clock::time_point next_probe_;
  uint32_t probe_tasks_left_ = 0;
  bool probe_failed_ = false;
  std::string probe_failure_;
  std::vector<Control*> probe_waiters_;
  uint8_t* probe_pages_ = nullptr;  // per file: a page written, a page read back
  uint64_t probe_round_ = 0;
};

}  // namespace kvtier

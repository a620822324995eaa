// TransferEngine: moves blocks between tiers without blocking the caller.
//
// Memory is registered by kind before use: the engine's G1 (host memory, or device memory through
// the CUDA backend), the G2 arena, the G3 disk tier (remote tiers later). A submitted batch
// (TransferJob) completes per move through the job (poll or wait) and callbacks, and per layer
// for moves into G1.
//
// Backends: a pool of memcpy workers for G1 <-> G2 (gather/scatter between the G1 arrangement and
// contiguous slots) when G1 is host memory; the CUDA backend (device_backend.h: one stream per
// direction, an event per layer) when G1 is device memory; and the disk tier's io_uring engine
// for G2 <-> G3. A G3 -> G1 move reads into a G2 slot and scatters from there. G3 writes are
// handed to the disk tier by a worker (the tier checksums the payload as it accepts a write:
// never on the submitting thread). Two priorities: the workers always take a waiting load before
// a save (the CUDA backend gives loads their own, higher-priority stream), and saves wait in a
// bounded queue: a save batch that does not fit is refused whole (ResourceExhausted) and
// counted, never waited for. Loads are never refused for space.
//
// G2 slots hold a block as [header area | payload] (the at-rest shape; the header area is
// BlockHeaderBytes(layout): 4 KiB up to 1320 tokens per block), so a slot goes to and from G3 in
// one I/O; G1 copies use the payload part.
//
// G4 (a RemoteStore): the engine's own remote threads make every remote call, never the
// submitting thread. Each Submit's G4 moves become at most `remote.threads` calls (one batch
// per call, which the store pipelines), all with one deadline: submit time + load_timeout (or
// save_timeout). A batch still queued at its deadline fails TimedOut without a call. A load's
// deadline holds whatever its store call does: a watchdog thread ends every G4 load move still
// queued or in a call at its deadline (TimedOut), so the engine's waits return and it
// recomputes; a call that returns later (a FIFO opened without O_NONBLOCK, a hard-mounted NFS
// server that stops answering) finds its moves abandoned, discards what it read (nothing
// reaches G1), and only then hands its G2 slot back (TransferJob::SlotLent). A put encodes the
// at-rest header into the
// slot's header area first; a get lands in a G2 slot and is verified against the expected key,
// namespace, layout, tokens and payload length before it can end Ok (any mismatch: Corruption,
// never served). G4 saves wait in their own bounded queue (refused whole when full, counted).
// Code: transfer_engine_remote.cc.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/mutex.h"
#include "kvtier/g1_memory.h"
#include "kvtier/status.h"
#include "kvtier/tier.h"
#include "tier/block_format.h"
#include "tier/disk_tier.h"
#include "tier/host_arena.h"
#include "tier/remote_store.h"
#include "transfer/device_backend.h"
#include "transfer/transfer_job.h"

namespace kvtier {

// Offset of the payload inside a G2 slot of `layout`'s blocks: their at-rest header area.
inline uint64_t G2PayloadOffset(const KvLayout& layout) { return BlockHeaderBytes(layout); }

class TransferEngine final : private DiskCompletionSink {
 public:
  struct Config {
    uint32_t copy_threads = 2;         // memcpy workers, 1..256
    uint32_t max_queued_saves = 1024;  // save moves waiting for a worker at most, >= 1
    // A load of at least this many G2 -> G1 bytes into a host G1 is copied with non-temporal
    // stores (Stores::kStreaming, block_copy.h); UINT64_MAX: never, 0: always
    // (transfer.load_stores).
    uint64_t stream_load_bytes = UINT64_MAX;
    // The CUDA backend's settings, used when a device G1 is registered.
    DeviceCopyBackend::Config cuda;
    // Makes the device backend when a device G1 is registered; null = CreateCudaBackend. Tests
    // inject a stand-in that runs the same plans on host memory (there is no GPU to test with).
    std::function<Result<std::unique_ptr<DeviceCopyBackend>>(const DeviceCopyBackend::Config&)>
        device_backend_factory;
    // Ok, or InvalidArgument naming the field, its value and the allowed range.
    Status Validate() const;
  };

  // How G4 moves run (RegisterRemote).
  struct RemoteConfig {
    uint32_t threads = 2;                          // remote calls in flight at most, 1..64
    uint32_t max_queued_saves = 256;               // G4 save moves waiting at most, >= 1
    std::chrono::milliseconds load_timeout{500};   // deadline of a G4 load batch, > 0
    std::chrono::milliseconds save_timeout{2000};  // deadline of a G4 save batch, > 0
    // A load is cut into store calls of about this many bytes (at least one block each), so
    // that verifying a call's blocks and copying them on to G1 overlap the next call. > 0.
    uint64_t load_call_bytes = 16ull << 20;
    // Hands back a caller's G2 slot (a G4 load's g2_slot, not kAnyStagingSlot) that was lent
    // to a store call abandoned at its deadline (TransferJob::SlotLent), once that call has
    // returned and nothing writes into the slot any more. Runs on a remote thread, possibly
    // long after the job ended; must be quick. Null: such slots are never handed back.
    std::function<void(uint32_t g2_slot)> release_lent_slot;
    // Ok, or InvalidArgument naming the field, its value and the allowed range.
    Status Validate() const;
  };

  struct Stats {
    uint64_t jobs = 0;
    uint64_t moves_ok = 0;
    uint64_t moves_failed = 0;
    uint64_t saves_dropped = 0;  // save moves refused because a save queue was full
    std::array<uint64_t, kNumTransferOps> bytes_by_op{};  // indexed by BlockTransfer::Op
    std::array<uint64_t, kNumTransferOps> moves_by_op{};
    uint64_t remote_timeouts = 0;  // G4 moves that ended TimedOut (queued or in the call)
    uint64_t remote_corrupt = 0;   // G4 gets that failed verification (never served)
    uint64_t remote_failures = 0;  // G4 moves that failed otherwise (NotFound not included)
    // G4 loads ended TimedOut at their deadline by the watchdog while the store's call had not
    // returned (counted in remote_timeouts too), and of those, calls that returned since: their
    // result was discarded and their slot handed back.
    uint64_t remote_abandoned = 0;
    uint64_t remote_late_returns = 0;
  };

  // Starts the workers. InvalidArgument for a bad config.
  static Result<std::unique_ptr<TransferEngine>> Create(const Config& config);
  // Finishes every accepted move (queued memcpy work runs; disk I/O in flight completes), then
  // stops the workers.
  ~TransferEngine() override;
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  // Registration happens before the first Submit and is not thread-safe with it.
  // G1: InvalidArgument when it does not validate. Device memory (on_device) starts the CUDA
  // backend (device_backend.h), which then moves every G1 <-> G2 block; Unavailable, with the
  // probe's reason, when this build has no CUDA backend or the machine no usable GPU; IOError
  // when pinning the G2 arena fails.
  Status RegisterG1(const G1Memory& g1);
  // G2: InvalidArgument when the arena's slots cannot hold header + payload of `layout`. With
  // a device G1, also pins the whole arena once for the CUDA backend (IOError when refused).
  Status RegisterHostArena(HostArena* arena, const KvLayout& layout);
  // G3: InvalidArgument when the tier's io_bytes() differ from the G2 slot stride or its
  // payload from the layout's; registers the G2 arena with its io_uring (a refusal is logged
  // and I/O goes on unregistered). REQUIRES: RegisterHostArena first.
  Status RegisterDisk(DiskTier* disk);
  // G4: InvalidArgument for a bad config or a null store; starts the remote threads. The store
  // must outlive the engine. REQUIRES: RegisterHostArena first (G4 moves go through G2 slots).
  Status RegisterRemote(RemoteStore* store, const RemoteConfig& config);
  // Staging slots for kG3ToG1 moves given BlockTransfer::kAnyStagingSlot: G2 slots the caller
  // keeps out of its cache for good. A staged move takes one when its read starts and returns
  // it once its scatter into G1 ends; moves wait (in order) while all are taken.
  // InvalidArgument for an empty list or a slot out of range. REQUIRES: RegisterHostArena.
  Status RegisterStagingSlots(std::vector<uint32_t> slots);

  // Starts `moves`. Validates every move first (endpoints registered, indices in range) and
  // starts none on InvalidArgument. A kSave batch is refused whole with ResourceExhausted when
  // the save queue cannot take it. Otherwise returns the job, which completes asynchronously;
  // callbacks run on the engine's or the disk tier's threads.
  Result<std::shared_ptr<TransferJob>> Submit(std::vector<BlockTransfer> moves,
                                              TransferPriority priority,
                                              TransferJob::MoveCallback on_move = nullptr,
                                              TransferJob::DoneCallback on_done = nullptr)
      EXCLUDES(mu_, disk_mu_);

  // Orders the device G1 accesses of one direction after the engine's own device work: the
  // G1 reads of save batches (kDeviceToHost) or the G1 writes of load batches (kHostToDevice)
  // submitted after this call, staged G3/G4 loads that reach G1 later included, start on the
  // device only once the work queued on `engine_stream` (a cudaStream_t as an integer; 0 = the
  // legacy default stream) before this call has finished. Never waits on the host. Earlier
  // batches are not affected. Ok; FailedPrecondition when no G1 is registered; InvalidArgument
  // when G1 is host memory (there is no device work to order after: a host G1's copies run when
  // they are submitted); the device backend's error otherwise (DeviceCopyBackend::
  // OrderAfterStream). After an error, every device batch of that direction fails (IOError,
  // naming it) until an ordering of that direction succeeds, since it could touch G1 before the
  // engine's work did.
  Status OrderAfterEngineStream(CopyDirection dir, uintptr_t engine_stream) EXCLUDES(order_mu_);

  Stats stats() const;
  // True when a G4 load into `g1_block` will be fetched by the G1's owner itself, with no G2
  // slot (DeviceCopyBackend::CanFetch; kvtier serve's attached engines): the planner then
  // gives it kAnyStagingSlot and no cache slot. It may change before the load starts; the load
  // then stages through the pool like any other.
  bool CanFetch(uint32_t g1_block) const {
    return device_ != nullptr && device_->CanFetch(g1_block);
  }
  // Told the duration of each G3 I/O (one block, submit to completion) and each G4 call (one
  // batch of puts or gets), with its tier and whether it wrote: the metrics' I/O latency. Runs
  // on the I/O threads, so it must be cheap and thread-safe. REQUIRES: set before the first
  // Submit, at most once.
  using IoObserver = std::function<void(TierId tier, bool write, std::chrono::nanoseconds took)>;
  void SetIoObserver(IoObserver observer) { io_observer_ = std::move(observer); }
  // The CUDA backend when a device G1 is registered, else null.
  DeviceCopyBackend* device_backend() const { return device_.get(); }
  uint32_t queued_saves() const { return queued_saves_.load(std::memory_order_relaxed); }
  uint32_t queued_remote_saves() const {
    return queued_remote_saves_.load(std::memory_order_relaxed);
  }

 private:
  // One unit of memcpy work.
  struct WorkItem {
    std::shared_ptr<TransferJob> job;
    uint32_t move = 0;   // the move, when `moves` is empty
    int32_t layer = -1;  // scatter: one layer; -1 = the whole move (gather, or staged scatter)
    // A scatter of one layer of several moves (about 1 MiB in all): one queue operation and
    // one job update per item rather than per block.
    std::vector<uint32_t> moves;
    uint32_t staging = BlockTransfer::kAnyStagingSlot;  // staged scatter: the pool slot used
    bool stream = false;  // a scatter of a large load: non-temporal stores
  };
  struct DiskOp {
    std::shared_ptr<TransferJob> job;
    uint32_t move = 0;
    uint32_t slot = 0;  // the G2 slot the I/O uses
    std::chrono::steady_clock::time_point submitted{};
  };
  // One remote call's worth of G4 moves of one job.
  struct RemoteBatch {
    std::shared_ptr<TransferJob> job;
    std::vector<uint32_t> moves;
    RemoteDeadline deadline;
  };

  explicit TransferEngine(const Config& config);
  IoObserver io_observer_;  // set once before the first Submit
  Status ValidateMove(const BlockTransfer& m) const;
  void WorkerLoop() EXCLUDES(mu_);
  void Execute(const WorkItem& item);
  // Returns a staging slot to the pool, or hands it to the next waiting staged move.
  void ReleaseStaging(uint32_t slot) EXCLUDES(disk_mu_);
  void EndMove(TransferJob& job, uint32_t move, const Status& status);
  void EnqueueLoads(std::vector<WorkItem> items) EXCLUDES(mu_);
  // Hands `moves` of `job` (all G1 <-> G2 in direction `dir`) to the CUDA backend; releases
  // `reserved` save-queue places when they end. as_load: wait for room on the device (loads);
  // otherwise a full device drops the moves (ResourceExhausted) and counts them.
  // `staging_slot`: the pool slot a staged G3 -> G1 move read into (given back when it ends).
  void SubmitDevice(const std::shared_ptr<TransferJob>& job, CopyDirection dir,
                    std::vector<uint32_t> moves, uint32_t reserved, bool as_load,
                    uint32_t staging_slot = BlockTransfer::kAnyStagingSlot) EXCLUDES(order_mu_);
  Status PinArenaForDevice();
  // Starts the disk I/O of `moves`. A staged move (kAnyStagingSlot) takes a pool slot or waits
  // for one; `given_slot` is the pool slot ReleaseStaging hands to one waiting move.
  void StartDisk(const std::shared_ptr<TransferJob>& job, std::span<const uint32_t> moves,
                 uint32_t given_slot = BlockTransfer::kAnyStagingSlot) EXCLUDES(disk_mu_);
  void OnDiskOpDone(const DiskOpResult& result) override EXCLUDES(disk_mu_, mu_);
  uint8_t* Payload(uint32_t slot) const {
    return arena_->SlotData(slot) + G2PayloadOffset(layout_);
  }
  // Remote side (transfer_engine_remote.cc).
  void StartRemote(const std::shared_ptr<TransferJob>& job, std::span<const uint32_t> moves,
                   bool save) EXCLUDES(remote_mu_);
  void RemoteLoop() EXCLUDES(remote_mu_);
  void ExecuteRemote(const RemoteBatch& batch) EXCLUDES(mu_);
  void RemotePuts(const RemoteBatch& batch, std::span<const uint32_t> moves);
  void RemoteGets(const RemoteBatch& batch, std::span<const uint32_t> moves) EXCLUDES(mu_);
  // G4 -> G1 moves whose G1 owner fetches them itself (DeviceCopyBackend::Fetch): no G2 slot,
  // one copy. Calls of about load_call_bytes each, as RemoteGets's.
  void StartFetches(const std::shared_ptr<TransferJob>& job, std::span<const uint32_t> moves,
                    RemoteDeadline deadline, size_t per_call);
  void FetchEnded(TransferJob& job, uint32_t move, const Status& status);
  void EndRemoteMove(TransferJob& job, uint32_t move, const Status& status);
  // The G2 slot of a G4 load that nothing writes into any more goes back: a pool slot to the
  // pool; a caller's slot lent to an abandoned call through release_lent_slot.
  void ReleaseLentSlot(const BlockTransfer& m, uint32_t slot) EXCLUDES(disk_mu_);
  // Ends, TimedOut, the moves of `job` among `moves` that are still queued or in a store call
  // (TransferJob::Abandon).
  void AbandonOverdue(const std::shared_ptr<TransferJob>& job, std::span<const uint32_t> moves,
                      const char* why);
  void WatchdogLoop() EXCLUDES(remote_mu_);
  void StopRemote() EXCLUDES(remote_mu_);

  const Config config_;
  G1Memory g1_;
  bool g1_registered_ = false;
  HostArena* arena_ = nullptr;
  KvLayout layout_;
  DiskTier* disk_ = nullptr;
  std::unique_ptr<DeviceCopyBackend> device_;  // set while a device G1 is registered
  bool device_host_registered_ = false;
  // The last OrderAfterEngineStream of each direction (CopyDirection as index) failed: its
  // device batches are failed, not started, until one succeeds.
  Mutex order_mu_;
  Status order_error_[2] GUARDED_BY(order_mu_);

  Mutex mu_;
  std::condition_variable work_cv_;
  std::deque<WorkItem> load_queue_ GUARDED_BY(mu_);
  std::deque<WorkItem> save_queue_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  uint32_t executing_ GUARDED_BY(mu_) = 0;  // items taken by a worker and not finished
  std::condition_variable idle_cv_;         // queues empty and nothing executing
  // Bumped whenever work is queued for the workers or a disk op starts; the destructor waits
  // until a round of its quiescence wait saw no change.
  std::atomic<uint64_t> activity_{0};
  std::vector<std::thread> workers_;
  std::atomic<uint32_t> queued_saves_{0};

  Mutex disk_mu_;
  std::condition_variable disk_cv_;
  std::unordered_map<uint64_t, DiskOp> disk_ops_ GUARDED_BY(disk_mu_);
  uint64_t next_cookie_ GUARDED_BY(disk_mu_) = 1;
  std::vector<uint32_t> staging_free_ GUARDED_BY(disk_mu_);
  size_t staging_total_ = 0;  // set once by RegisterStagingSlots
  // Staged moves waiting for a staging slot, in submission order.
  std::deque<std::pair<std::shared_ptr<TransferJob>, uint32_t>> staging_waiting_
      GUARDED_BY(disk_mu_);

  RemoteStore* remote_ = nullptr;
  RemoteConfig remote_config_;
  Mutex remote_mu_;
  std::condition_variable remote_cv_;
  std::deque<RemoteBatch> remote_loads_ GUARDED_BY(remote_mu_);
  std::deque<RemoteBatch> remote_saves_ GUARDED_BY(remote_mu_);
  bool remote_stopping_ GUARDED_BY(remote_mu_) = false;
  std::vector<std::thread> remote_workers_;
  // G4 load batches by deadline, for the watchdog (entries of finished jobs are harmless).
  struct LoadDeadline {
    std::weak_ptr<TransferJob> job;
    std::vector<uint32_t> moves;
  };
  std::multimap<RemoteDeadline, LoadDeadline> load_deadlines_ GUARDED_BY(remote_mu_);
  std::condition_variable watchdog_cv_;
  bool watchdog_stopping_ GUARDED_BY(remote_mu_) = false;
  std::thread watchdog_;
  std::atomic<uint32_t> queued_remote_saves_{0};

  std::atomic<uint64_t> jobs_{0}, moves_ok_{0}, moves_failed_{0}, saves_dropped_{0};
  std::atomic<uint64_t> remote_timeouts_{0}, remote_corrupt_{0}, remote_failures_{0};
  std::atomic<uint64_t> remote_abandoned_{0}, remote_late_returns_{0};
  std::array<std::atomic<uint64_t>, kNumTransferOps> bytes_by_op_{};
  std::array<std::atomic<uint64_t>, kNumTransferOps> moves_by_op_{};
};

}  // namespace kvtier

#include "transfer/transfer_engine.h"

#include <algorithm>
#include <string>

#include "core/log.h"
#include "tier/cond_wait.h"
#include "transfer/block_copy.h"

namespace kvtier {

namespace {

size_t OpIndex(BlockTransfer::Op op) { return static_cast<size_t>(op); }

}  // namespace

Status TransferEngine::Config::Validate() const {
  if (copy_threads < 1 || copy_threads > 256) {
    return Status::InvalidArgument("transfer copy_threads = " + std::to_string(copy_threads) +
                                   " is out of range; allowed: 1..256");
  }
  if (max_queued_saves < 1) {
    return Status::InvalidArgument("transfer max_queued_saves = 0; allowed: 1 or more");
  }
  return Status::Ok();
}

TransferEngine::TransferEngine(const Config& config) : config_(config) {}

Result<std::unique_ptr<TransferEngine>> TransferEngine::Create(const Config& config) {
  KVTIER_RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<TransferEngine> engine(new TransferEngine(config));
  for (uint32_t i = 0; i < config.copy_threads; ++i) {
    engine->workers_.emplace_back([e = engine.get()] { e->WorkerLoop(); });
  }
  return engine;
}

TransferEngine::~TransferEngine() {
  // Remote gets may still queue scatters, so the remote threads finish first (every batch
  // ends by its deadline).
  StopRemote();
  // Queued memcpy work may start disk I/O (a G2 -> G3 write becomes I/O when a worker takes
  // it), and disk completions may queue memcpy work (a staged scatter) or start the next staged
  // read, so neither side can be waited for alone: wait for both until a whole round started
  // nothing new (activity_ counts every queued item and every disk op started).
  for (;;) {
    const uint64_t seen = activity_.load(std::memory_order_acquire);
    {
      MutexLock lock(&mu_);
      while (!load_queue_.empty() || !save_queue_.empty() || executing_ != 0) {
        CondWait(&idle_cv_, &mu_);
      }
    }
    {
      // Staged moves hold or wait for staging slots; each one returned may start another read.
      MutexLock lock(&disk_mu_);
      while (!disk_ops_.empty() || !staging_waiting_.empty() ||
             staging_free_.size() < staging_total_) {
        CondWait(&disk_cv_, &disk_mu_);
      }
    }
    if (activity_.load(std::memory_order_acquire) == seen) break;
  }
  // Then the device's batches (their callbacks end moves through this engine).
  device_.reset();
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (auto& w : workers_) w.join();
}

Status TransferEngine::RegisterG1(const G1Memory& g1) {
  KVTIER_RETURN_IF_ERROR(g1.Validate());
  if (arena_ != nullptr && g1.layout.Fingerprint() != layout_.Fingerprint()) {
    return Status::InvalidArgument("G1 layout " + g1.layout.ToString() +
                                   " differs from the G2 layout " + layout_.ToString());
  }
  if (device_ != nullptr) {
    return Status::FailedPrecondition("a device G1 is registered already; one per engine");
  }
  if (g1.on_device) {
    auto backend = config_.device_backend_factory ? config_.device_backend_factory(config_.cuda)
                                                  : CreateCudaBackend(config_.cuda);
    if (!backend.ok()) {
      return Status(backend.status().code(),
                    "G1 is device memory, which only the CUDA backend can reach: " +
                        backend.status().message() +
                        ". Register G1 in host memory, or run on a machine with a usable GPU");
    }
    KVTIER_RETURN_IF_ERROR((*backend)->RegisterG1(g1));
    device_ = std::move(*backend);
    if (arena_ != nullptr) {
      Status pinned = PinArenaForDevice();
      if (!pinned.ok()) {
        device_.reset();
        return pinned;
      }
    }
  }
  g1_ = g1;
  g1_registered_ = true;
  if (arena_ == nullptr) layout_ = g1.layout;
  return Status::Ok();
}

Status TransferEngine::RegisterHostArena(HostArena* arena, const KvLayout& layout) {
  if (arena == nullptr) return Status::InvalidArgument("RegisterHostArena(nullptr)");
  KVTIER_RETURN_IF_ERROR(layout.Validate());
  const uint64_t header_area = G2PayloadOffset(layout);
  if (arena->slot_bytes() < header_area + layout.BlockBytes()) {
    return Status::InvalidArgument(
        "G2 slots of " + std::to_string(arena->slot_bytes()) + " bytes cannot hold a " +
        std::to_string(header_area) + "-byte header area and a " +
        std::to_string(layout.BlockBytes()) + "-byte block; make slot_bytes at least " +
        std::to_string(header_area + layout.BlockBytes()));
  }
  if (g1_registered_ && g1_.layout.Fingerprint() != layout.Fingerprint()) {
    return Status::InvalidArgument("G2 layout " + layout.ToString() +
                                   " differs from the G1 layout " + g1_.layout.ToString());
  }
  if (device_host_registered_ && arena_ != arena) {
    return Status::FailedPrecondition(
        "the G2 arena is pinned for the CUDA backend already; one per engine");
  }
  arena_ = arena;
  layout_ = layout;
  if (device_ != nullptr) {
    Status pinned = PinArenaForDevice();
    if (!pinned.ok()) {
      arena_ = nullptr;
      return pinned;
    }
  }
  return Status::Ok();
}

Status TransferEngine::PinArenaForDevice() {
  if (device_host_registered_) return Status::Ok();
  KVTIER_RETURN_IF_ERROR(device_->RegisterHost(arena_->base(), arena_->mapped_bytes()));
  device_host_registered_ = true;
  return Status::Ok();
}

Status TransferEngine::RegisterDisk(DiskTier* disk) {
  if (disk == nullptr) return Status::InvalidArgument("RegisterDisk(nullptr)");
  if (arena_ == nullptr) {
    return Status::FailedPrecondition(
        "RegisterDisk needs the G2 arena registered first (G3 I/O "
        "goes through G2 slots)");
  }
  if (disk->io_bytes() != arena_->slot_stride() || disk->payload_bytes() != layout_.BlockBytes()) {
    return Status::InvalidArgument("G3 blocks (" + std::to_string(disk->io_bytes()) +
                                   "-byte I/Os, " + std::to_string(disk->payload_bytes()) +
                                   "-byte payloads) do not match G2 slots (" +
                                   std::to_string(arena_->slot_stride()) + "-byte stride, " +
                                   std::to_string(layout_.BlockBytes()) + "-byte payloads)");
  }
  const DiskBufferRegion region{arena_->base(), arena_->mapped_bytes()};
  Status reg = disk->RegisterBuffers(std::span<const DiskBufferRegion>(&region, 1));
  if (!reg.ok()) {
    KVTIER_LOG(kWarn) << "G3: the G2 arena could not be registered with io_uring ("
                      << reg.ToString() << "); disk I/O goes on without registered buffers";
  }
  disk_ = disk;
  return Status::Ok();
}

Status TransferEngine::ValidateMove(const BlockTransfer& m) const {
  using Op = BlockTransfer::Op;
  if (arena_ == nullptr) return Status::FailedPrecondition("no G2 arena registered");
  if (m.g2_slot == BlockTransfer::kAnyStagingSlot) {
    if (m.op != Op::kG3ToG1 && m.op != Op::kG4ToG1) {
      return Status::InvalidArgument(std::string(BlockTransferOpName(m.op)) +
                                     " move names the staging pool; only G3->G1 and G4->G1 "
                                     "moves may");
    }
    if (staging_total_ == 0) {
      return Status::FailedPrecondition(std::string(BlockTransferOpName(m.op)) +
                                        " move names the staging pool, but none is registered");
    }
  } else if (m.g2_slot >= arena_->num_slots()) {
    return Status::InvalidArgument(std::string(BlockTransferOpName(m.op)) + " move names G2 slot " +
                                   std::to_string(m.g2_slot) + "; the arena has " +
                                   std::to_string(arena_->num_slots()));
  }
  const bool g1 = m.op == Op::kG1ToG2 || m.IntoG1();
  const bool g3 = m.op == Op::kG2ToG3 || m.op == Op::kG3ToG2 || m.op == Op::kG3ToG1;
  if (OpIndex(m.op) >= kNumTransferOps) return Status::InvalidArgument("unknown move op");
  if (m.Remote() && remote_ == nullptr) {
    return Status::FailedPrecondition("no G4 remote store registered");
  }
  if (g1) {
    if (!g1_registered_) return Status::FailedPrecondition("no G1 memory registered");
    if (m.g1_block >= g1_.num_blocks) {
      return Status::InvalidArgument(std::string(BlockTransferOpName(m.op)) +
                                     " move names G1 block " + std::to_string(m.g1_block) +
                                     "; G1 has " + std::to_string(g1_.num_blocks));
    }
  }
  if (g3 && disk_ == nullptr) return Status::FailedPrecondition("no G3 disk tier registered");
  return Status::Ok();
}

Result<std::shared_ptr<TransferJob>> TransferEngine::Submit(std::vector<BlockTransfer> moves,
                                                            TransferPriority priority,
                                                            TransferJob::MoveCallback on_move,
                                                            TransferJob::DoneCallback on_done) {
  using Op = BlockTransfer::Op;
  for (const BlockTransfer& m : moves) KVTIER_RETURN_IF_ERROR(ValidateMove(m));
  // Items for the workers' queues: G1 copies, and G3 writes (a write checksums its 2 MiB
  // payload before it is queued to the device, which must not happen on the caller's thread:
  // a Commit that demotes would pay for it).
  size_t memcpy_items = 0;
  for (const BlockTransfer& m : moves) {
    if (m.op == Op::kG1ToG2 || m.op == Op::kG2ToG1 || m.op == Op::kG2ToG3) ++memcpy_items;
  }
  size_t remote_moves = 0;
  for (const BlockTransfer& m : moves) remote_moves += m.Remote() ? 1 : 0;
  const bool save = priority == TransferPriority::kSave;
  if (save && remote_moves > 0) {
    // G4 saves have their own bound: a slow server must not take the local saves' room.
    uint32_t queued = queued_remote_saves_.load(std::memory_order_relaxed);
    do {
      if (queued + remote_moves > remote_config_.max_queued_saves) {
        saves_dropped_.fetch_add(moves.size(), std::memory_order_relaxed);
        return Status::ResourceExhausted("G4 save queue full (" + std::to_string(queued) + " of " +
                                         std::to_string(remote_config_.max_queued_saves) +
                                         " waiting); the save was dropped");
      }
    } while (!queued_remote_saves_.compare_exchange_weak(
        queued, queued + static_cast<uint32_t>(remote_moves), std::memory_order_relaxed));
  }
  if (save && memcpy_items > 0) {
    // Reserve room first: concurrent submitters never overshoot the bound together.
    uint32_t queued = queued_saves_.load(std::memory_order_relaxed);
    do {
      if (queued + memcpy_items > config_.max_queued_saves) {
        saves_dropped_.fetch_add(moves.size(), std::memory_order_relaxed);
        queued_remote_saves_.fetch_sub(static_cast<uint32_t>(remote_moves),
                                       std::memory_order_relaxed);
        return Status::ResourceExhausted("save queue full (" + std::to_string(queued) + " of " +
                                         std::to_string(config_.max_queued_saves) +
                                         " waiting); the save was dropped");
      }
    } while (!queued_saves_.compare_exchange_weak(
        queued, queued + static_cast<uint32_t>(memcpy_items), std::memory_order_relaxed));
  }
  auto job = std::make_shared<TransferJob>(std::move(moves), layout_.num_layers, priority,
                                           std::move(on_move), std::move(on_done));
  jobs_.fetch_add(1, std::memory_order_relaxed);

  std::vector<WorkItem> items;
  std::vector<uint32_t> scatters, disk_moves, remote, device_gathers, device_scatters;
  const bool device = device_ != nullptr;
  for (uint32_t i = 0; i < job->moves().size(); ++i) {
    if (job->moves()[i].Remote()) {
      remote.push_back(i);
      continue;
    }
    switch (job->moves()[i].op) {
      case Op::kG1ToG2:
        if (device) {
          device_gathers.push_back(i);
        } else {
          items.push_back(WorkItem{job, i, -1, {}});
        }
        break;
      case Op::kG2ToG3:
        items.push_back(WorkItem{job, i, -1, {}});
        break;
      case Op::kG2ToG1:
        (device ? device_scatters : scatters).push_back(i);
        break;
      default:
        disk_moves.push_back(i);
        break;
    }
  }
  if (save) {
    // A save's scatters (unusual, but allowed) go whole; gathers are already whole.
    for (uint32_t i : scatters) items.push_back(WorkItem{job, i, -1, {}});
  } else if (!scatters.empty()) {
    // Layer-major, so that layer 0 of every block lands first and the engine can start on it;
    // each item copies one layer of a group of blocks, about 1 MiB.
    const size_t per_item = std::max<uint64_t>(1, (1u << 20) / layout_.LayerBytes());
    const bool stream = scatters.size() * layout_.BlockBytes() >= config_.stream_load_bytes;
    for (uint32_t l = 0; l < layout_.num_layers; ++l) {
      for (size_t b = 0; b < scatters.size(); b += per_item) {
        WorkItem it{job, 0, static_cast<int32_t>(l), {}};
        it.stream = stream;
        const size_t e = std::min(scatters.size(), b + per_item);
        it.moves.assign(scatters.begin() + b, scatters.begin() + e);
        items.push_back(std::move(it));
      }
    }
  }
  if (!items.empty()) {
    {
      MutexLock lock(&mu_);
      auto& q = save ? save_queue_ : load_queue_;
      for (auto& it : items) q.push_back(std::move(it));
      activity_.fetch_add(1, std::memory_order_release);
    }
    work_cv_.notify_all();
  }
  if (!disk_moves.empty()) StartDisk(job, disk_moves);
  // Device moves hold their save-queue places until the device finished them.
  if (!device_gathers.empty()) {
    const uint32_t reserved = save ? static_cast<uint32_t>(device_gathers.size()) : 0;
    SubmitDevice(job, CopyDirection::kDeviceToHost, std::move(device_gathers), reserved, !save);
  }
  if (!device_scatters.empty()) {
    const uint32_t reserved = save ? static_cast<uint32_t>(device_scatters.size()) : 0;
    SubmitDevice(job, CopyDirection::kHostToDevice, std::move(device_scatters), reserved, !save);
  }
  if (!remote.empty()) StartRemote(job, remote, save);
  return job;
}

Status TransferEngine::OrderAfterEngineStream(CopyDirection dir, uintptr_t engine_stream) {
  const char* what = dir == CopyDirection::kDeviceToHost ? "saves" : "loads";
  if (!g1_registered_) {
    return Status::FailedPrecondition(std::string("ordering ") + what +
                                      " after the engine's CUDA stream: no G1 is registered");
  }
  if (device_ == nullptr) {
    return Status::InvalidArgument(
        std::string("ordering ") + what + " after the engine's CUDA stream " +
        std::to_string(engine_stream) +
        ": G1 is host memory, whose copies no CUDA stream can order; pass no stream");
  }
  Status s = device_->OrderAfterStream(dir, engine_stream);
  MutexLock lock(&order_mu_);
  order_error_[static_cast<int>(dir)] = s;
  return s;
}

void TransferEngine::SubmitDevice(const std::shared_ptr<TransferJob>& job, CopyDirection dir,
                                  std::vector<uint32_t> moves, uint32_t reserved, bool as_load,
                                  uint32_t staging_slot) {
  std::vector<DeviceBlockCopy> copies;
  copies.reserve(moves.size());
  for (uint32_t i : moves) {
    const BlockTransfer& m = job->moves()[i];
    const bool pooled = m.g2_slot == BlockTransfer::kAnyStagingSlot;
    copies.push_back(DeviceBlockCopy{m.g1_block, Payload(pooled ? staging_slot : m.g2_slot)});
  }
  // A staged move from the pool gives its slot back once (when it lands or fails).
  auto pool_slot = std::make_shared<std::atomic<uint32_t>>(staging_slot);
  auto give_slot = [this, pool_slot] {
    const uint32_t s = pool_slot->exchange(BlockTransfer::kAnyStagingSlot);
    if (s != BlockTransfer::kAnyStagingSlot) ReleaseStaging(s);
  };
  auto shared_moves = std::make_shared<const std::vector<uint32_t>>(std::move(moves));
  const bool load = dir == CopyDirection::kHostToDevice;
  const size_t op = OpIndex(load ? BlockTransfer::Op::kG2ToG1 : BlockTransfer::Op::kG1ToG2);
  // The save-queue places go back before the moves end, so a caller that saw its job end also
  // sees the room it held (once, whichever callback gets there first).
  auto places = std::make_shared<std::atomic<uint32_t>>(reserved);
  auto give_back = [this, places] {
    const uint32_t n = places->exchange(0, std::memory_order_relaxed);
    if (n > 0) queued_saves_.fetch_sub(n, std::memory_order_relaxed);
  };
  DeviceCopyBackend::LayerCallback on_layer = nullptr;
  if (load) {
    on_layer = [this, job, shared_moves, op, give_back, give_slot](uint32_t layer) {
      std::vector<uint32_t> finished;
      job->LayersLanded(*shared_moves, layer, &finished);
      bytes_by_op_[op].fetch_add(layout_.LayerBytes() * shared_moves->size(),
                                 std::memory_order_relaxed);
      if (!finished.empty()) {
        give_back();
        give_slot();
      }
      for (uint32_t i : finished) EndMove(*job, i, Status::Ok());
    };
  }
  auto end_all = [this, job, shared_moves, load, op, give_back, give_slot](const Status& status) {
    give_back();
    give_slot();
    if (!load && status.ok()) {
      bytes_by_op_[op].fetch_add(layout_.BlockBytes() * shared_moves->size(),
                                 std::memory_order_relaxed);
    }
    for (uint32_t i : *shared_moves) {
      // A load's moves ended Ok as their last layer landed; only the others end here.
      if (!load || !status.ok()) {
        if (!load || job->MoveStatus(i).Is(StatusCode::kFailedPrecondition)) {
          EndMove(*job, i, status);
        }
      }
    }
  };
  Status ordered;
  {
    MutexLock lock(&order_mu_);
    ordered = order_error_[static_cast<int>(dir)];
  }
  if (!ordered.ok()) {
    // Started now, the batch could read G1 before the engine wrote it (a save), or write G1
    // before the engine's queued work is done with it (a load).
    end_all(Status::IOError(std::string("CUDA ") + CopyDirectionName(dir) + " batch of " +
                            std::to_string(copies.size()) +
                            " blocks not started: the last ordering after the engine's stream "
                            "failed (" +
                            ordered.message() + ")"));
    return;
  }
  // Loads wait for room on the device; saves never wait (a full device drops them, counted).
  Status s = device_->Submit(dir, copies, std::move(on_layer), end_all, as_load);
  if (!s.ok()) {
    if (!as_load && s.Is(StatusCode::kResourceExhausted)) {
      saves_dropped_.fetch_add(copies.size(), std::memory_order_relaxed);
    } else {
      KVTIER_LOG(kWarn) << "CUDA " << CopyDirectionName(dir) << " batch of " << copies.size()
                        << " blocks refused: " << s.ToString();
    }
    end_all(s);
  }
}

void TransferEngine::StartDisk(const std::shared_ptr<TransferJob>& job,
                               std::span<const uint32_t> moves, uint32_t given_slot) {
  using Op = BlockTransfer::Op;
  std::vector<DiskWriteRequest> writes;
  std::vector<DiskReadRequest> reads;
  {
    MutexLock lock(&disk_mu_);
    for (uint32_t i : moves) {
      const BlockTransfer& m = job->moves()[i];
      uint32_t slot = m.g2_slot;
      if (slot == BlockTransfer::kAnyStagingSlot && given_slot != BlockTransfer::kAnyStagingSlot) {
        slot = given_slot;  // handed over by ReleaseStaging
      } else if (slot == BlockTransfer::kAnyStagingSlot) {
        if (staging_free_.empty() || !staging_waiting_.empty()) {
          staging_waiting_.emplace_back(job, i);  // started by ReleaseStaging
          continue;
        }
        slot = staging_free_.back();
        staging_free_.pop_back();
      }
      const uint64_t cookie = next_cookie_++;
      disk_ops_.emplace(cookie, DiskOp{job, i, slot, std::chrono::steady_clock::now()});
      activity_.fetch_add(1, std::memory_order_release);
      if (m.op == Op::kG2ToG3) {
        DiskWriteRequest w;
        w.key = m.key;
        w.parent = m.parent;
        w.namespace_id = m.namespace_id;
        w.tokens = m.tokens;
        w.buffer = arena_->SlotData(m.g2_slot);
        w.sink = this;
        w.cookie = cookie;
        w.expected_checksum = m.expected_checksum;
        writes.push_back(w);
      } else {
        DiskReadRequest r;
        r.key = m.key;
        r.namespace_id = m.namespace_id;
        r.expected_tokens = m.tokens;
        r.buffer = arena_->SlotData(slot);
        r.sink = this;
        r.cookie = cookie;
        reads.push_back(r);
      }
    }
  }
  // Outside disk_mu_: a request refused up front completes on this thread, in OnDiskOpDone.
  if (!writes.empty()) disk_->SubmitWrites(writes);
  if (!reads.empty()) disk_->SubmitReads(reads);
}

void TransferEngine::OnDiskOpDone(const DiskOpResult& result) {
  DiskOp op;
  {
    MutexLock lock(&disk_mu_);
    auto it = disk_ops_.find(result.cookie);
    if (it == disk_ops_.end()) return;
    op = it->second;  // stays in the map until handled: the destructor waits for it
  }
  const BlockTransfer& m = op.job->moves()[op.move];
  if (io_observer_) {
    io_observer_(kTierG3, m.op == BlockTransfer::Op::kG2ToG3,
                 std::chrono::steady_clock::now() - op.submitted);
  }
  if (m.op == BlockTransfer::Op::kG3ToG1 && result.status.ok() && device_ != nullptr) {
    bytes_by_op_[OpIndex(BlockTransfer::Op::kG3ToG2)].fetch_add(disk_->io_bytes(),
                                                                std::memory_order_relaxed);
    // The staged half of a load into G1 is a load, whatever the job's priority.
    SubmitDevice(
        op.job, CopyDirection::kHostToDevice, {op.move}, 0, /*as_load=*/true,
        m.g2_slot == BlockTransfer::kAnyStagingSlot ? op.slot : BlockTransfer::kAnyStagingSlot);
  } else if (m.op == BlockTransfer::Op::kG3ToG1 && result.status.ok()) {
    bytes_by_op_[OpIndex(BlockTransfer::Op::kG3ToG2)].fetch_add(disk_->io_bytes(),
                                                                std::memory_order_relaxed);
    {
      // The staged half of a load into G1 is a load, whatever the job's priority.
      MutexLock lock(&mu_);
      load_queue_.push_back(WorkItem{op.job, op.move, -1, {}, op.slot});
      activity_.fetch_add(1, std::memory_order_release);
    }
    work_cv_.notify_one();
  } else {
    if (result.status.ok()) {
      bytes_by_op_[OpIndex(m.op)].fetch_add(disk_->io_bytes(), std::memory_order_relaxed);
    }
    if (m.g2_slot == BlockTransfer::kAnyStagingSlot) ReleaseStaging(op.slot);
    EndMove(*op.job, op.move, result.status);
  }
  MutexLock lock(&disk_mu_);
  disk_ops_.erase(result.cookie);
  // Notified under the lock, so the destructor cannot destroy disk_cv_ before this returns.
  if (disk_ops_.empty()) disk_cv_.notify_all();
}

void TransferEngine::WorkerLoop() {
  for (;;) {
    WorkItem item;
    {
      MutexLock lock(&mu_);
      while (!stopping_ && load_queue_.empty() && save_queue_.empty()) {
        CondWait(&work_cv_, &mu_);
      }
      if (!load_queue_.empty()) {
        item = std::move(load_queue_.front());
        load_queue_.pop_front();
      } else if (!save_queue_.empty()) {
        item = std::move(save_queue_.front());
        save_queue_.pop_front();
        queued_saves_.fetch_sub(1, std::memory_order_relaxed);
      } else {
        return;  // stopping, and nothing left
      }
      ++executing_;
    }
    Execute(item);
    MutexLock lock(&mu_);
    if (--executing_ == 0 && load_queue_.empty() && save_queue_.empty()) {
      // Under the lock, so the destructor cannot destroy idle_cv_ before this returns.
      idle_cv_.notify_all();
    }
  }
}

void TransferEngine::Execute(const WorkItem& item) {
  using Op = BlockTransfer::Op;
  TransferJob& job = *item.job;
  const BlockTransfer& m = job.moves()[item.move];
  if (m.op == Op::kG2ToG3) {
    const uint32_t move = item.move;
    StartDisk(item.job, std::span<const uint32_t>(&move, 1));
    return;
  }
  if (m.op == Op::kG1ToG2) {
    GatherBlock(g1_, m.g1_block, Payload(m.g2_slot));
    bytes_by_op_[OpIndex(m.op)].fetch_add(layout_.BlockBytes(), std::memory_order_relaxed);
    EndMove(job, item.move, Status::Ok());
    return;
  }
  if (!item.moves.empty()) {
    // One layer of several blocks.
    const uint32_t layer = static_cast<uint32_t>(item.layer);
    for (uint32_t i : item.moves) {
      const BlockTransfer& mv = job.moves()[i];
      ScatterLayer(g1_, Payload(mv.g2_slot), mv.g1_block, layer,
                   item.stream ? Stores::kStreaming : Stores::kCached);
    }
    bytes_by_op_[OpIndex(Op::kG2ToG1)].fetch_add(layout_.LayerBytes() * item.moves.size(),
                                                 std::memory_order_relaxed);
    std::vector<uint32_t> finished;
    job.LayersLanded(item.moves, layer, &finished);
    for (uint32_t i : finished) EndMove(job, i, Status::Ok());
    return;
  }
  // A scatter into G1: one layer, or all of them in order (a staged move: from the slot its
  // read used, returned to the pool before the move ends).
  const bool pooled = m.g2_slot == BlockTransfer::kAnyStagingSlot;
  const uint32_t slot = pooled ? item.staging : m.g2_slot;
  const uint32_t first = item.layer < 0 ? 0 : static_cast<uint32_t>(item.layer);
  const uint32_t last = item.layer < 0 ? layout_.num_layers : first + 1;
  for (uint32_t l = first; l < last; ++l) {
    ScatterLayer(g1_, Payload(slot), m.g1_block, l);
    bytes_by_op_[OpIndex(Op::kG2ToG1)].fetch_add(layout_.LayerBytes(), std::memory_order_relaxed);
    if (job.LayerLanded(item.move, l)) {
      if (pooled) ReleaseStaging(slot);
      EndMove(job, item.move, Status::Ok());
    }
  }
}

void TransferEngine::ReleaseStaging(uint32_t slot) {
  std::shared_ptr<TransferJob> job;
  uint32_t move = 0;
  {
    MutexLock lock(&disk_mu_);
    if (staging_waiting_.empty()) {
      staging_free_.push_back(slot);
      if (staging_free_.size() == staging_total_) disk_cv_.notify_all();
      return;
    }
    job = std::move(staging_waiting_.front().first);
    move = staging_waiting_.front().second;
    staging_waiting_.pop_front();
  }
  StartDisk(job, std::span<const uint32_t>(&move, 1), slot);  // the slot goes straight to it
}

Status TransferEngine::RegisterStagingSlots(std::vector<uint32_t> slots) {
  if (arena_ == nullptr) {
    return Status::FailedPrecondition("RegisterStagingSlots before RegisterHostArena");
  }
  if (slots.empty()) return Status::InvalidArgument("RegisterStagingSlots: no slots given");
  for (uint32_t s : slots) {
    if (s >= arena_->num_slots()) {
      return Status::InvalidArgument("RegisterStagingSlots: slot " + std::to_string(s) +
                                     " is past the arena's " + std::to_string(arena_->num_slots()));
    }
  }
  MutexLock lock(&disk_mu_);
  staging_total_ = slots.size();
  staging_free_ = std::move(slots);
  return Status::Ok();
}

void TransferEngine::EndMove(TransferJob& job, uint32_t move, const Status& status) {
  const size_t op = OpIndex(job.moves()[move].op);
  moves_by_op_[op].fetch_add(1, std::memory_order_relaxed);
  (status.ok() ? moves_ok_ : moves_failed_).fetch_add(1, std::memory_order_relaxed);
  job.MoveDone(move, status);
}

TransferEngine::Stats TransferEngine::stats() const {
  Stats s;
  s.jobs = jobs_.load(std::memory_order_relaxed);
  s.moves_ok = moves_ok_.load(std::memory_order_relaxed);
  s.moves_failed = moves_failed_.load(std::memory_order_relaxed);
  s.saves_dropped = saves_dropped_.load(std::memory_order_relaxed);
  s.remote_timeouts = remote_timeouts_.load(std::memory_order_relaxed);
  s.remote_corrupt = remote_corrupt_.load(std::memory_order_relaxed);
  s.remote_failures = remote_failures_.load(std::memory_order_relaxed);
  s.remote_abandoned = remote_abandoned_.load(std::memory_order_relaxed);
  s.remote_late_returns = remote_late_returns_.load(std::memory_order_relaxed);
  for (size_t i = 0; i < s.bytes_by_op.size(); ++i) {
    s.bytes_by_op[i] = bytes_by_op_[i].load(std::memory_order_relaxed);
    s.moves_by_op[i] = moves_by_op_[i].load(std::memory_order_relaxed);
  }
  return s;
}

}  // namespace kvtier

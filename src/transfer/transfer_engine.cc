// TransferEngine, part 1 of 3: its configuration, set-up and tear-down, the registration of G1,
// the G2 arena, G3 and the staging slots, the validation and routing of a submitted job (Submit),
// and the counters. The local moves a job is routed to (the copy workers, G3 disk I/O, the CUDA
// batches, the staging pool) run in transfer_engine_local.cc; its G4 side is in
// transfer_engine_remote.cc. See transfer_engine.h for the contract.
#include "transfer/transfer_engine.h"

#include <algorithm>
#include <string>

#include "core/log.h"
#include "tier/cond_wait.h"

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

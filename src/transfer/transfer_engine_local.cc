// TransferEngine, part 2 of 3: the local moves of a job, once Submit (transfer_engine.cc) has
// routed them: batches for the CUDA backend (SubmitDevice), G3 reads and writes (StartDisk,
// OnDiskOpDone), the copy workers and their work items (WorkerLoop, Execute), and the staging
// pool that G3 loads into G1 borrow a G2 slot from (ReleaseStaging). Set-up, registration and
// Submit are in transfer_engine.cc; the G4 side is in transfer_engine_remote.cc. See
// transfer_engine.h for the contract.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/log.h"
#include "tier/cond_wait.h"
#include "transfer/block_copy.h"
#include "transfer/transfer_engine.h"

namespace kvtier {

namespace {

size_t OpIndex(BlockTransfer::Op op) { return static_cast<size_t>(op); }

}  // namespace

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

}  // namespace kvtier

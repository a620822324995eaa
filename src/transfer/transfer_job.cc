#include "transfer/transfer_job.h"

#include <string>

#include "tier/cond_wait.h"

namespace kvtier {

const char* BlockTransferOpName(BlockTransfer::Op op) {
  switch (op) {
    case BlockTransfer::Op::kG1ToG2:
      return "G1->G2";
    case BlockTransfer::Op::kG2ToG1:
      return "G2->G1";
    case BlockTransfer::Op::kG2ToG3:
      return "G2->G3";
    case BlockTransfer::Op::kG3ToG2:
      return "G3->G2";
    case BlockTransfer::Op::kG3ToG1:
      return "G3->G1";
    case BlockTransfer::Op::kG2ToG4:
      return "G2->G4";
    case BlockTransfer::Op::kG4ToG2:
      return "G4->G2";
    case BlockTransfer::Op::kG4ToG1:
      return "G4->G1";
  }
  return "?";
}

TransferJob::TransferJob(std::vector<BlockTransfer> moves, uint32_t num_layers,
                         TransferPriority priority, MoveCallback on_move, DoneCallback on_done)
    : moves_(std::move(moves)),
      num_layers_(num_layers),
      priority_(priority),
      on_move_(std::move(on_move)),
      on_done_(std::move(on_done)) {
  MutexLock lock(&mu_);
  status_.assign(moves_.size(), Status::FailedPrecondition("move still in flight"));
  ended_.assign(moves_.size(), 0);
  landed_.assign(moves_.size() * num_layers_, 0);
  layers_left_.assign(moves_.size(), num_layers_);
  uint32_t into_g1 = 0;
  for (const BlockTransfer& m : moves_) into_g1 += m.IntoG1() ? 1 : 0;
  layer_pending_.assign(num_layers_, into_g1);
  layer_error_.assign(num_layers_, Status::Ok());
  remaining_ = moves_.size();
  callbacks_left_ = moves_.size();
  io_phase_.assign(moves_.size(), IoPhase::kQueued);
  lent_.assign(moves_.size(), 0);
  finished_ = moves_.empty();
}

bool TransferJob::Done() const {
  MutexLock lock(&mu_);
  return finished_;
}

Status TransferJob::Wait() const {
  MutexLock lock(&mu_);
  while (!finished_) CondWait(&cv_, &mu_);
  return first_error_;
}

Status TransferJob::WaitLayer(uint32_t layer) const {
  if (layer >= num_layers_) {
    return Status::InvalidArgument("WaitLayer(" + std::to_string(layer) + ") but the layout has " +
                                   std::to_string(num_layers_) + " layers");
  }
  MutexLock lock(&mu_);
  while (layer_pending_[layer] != 0) CondWait(&cv_, &mu_);
  return layer_error_[layer];
}

Status TransferJob::MoveStatus(size_t index) const {
  MutexLock lock(&mu_);
  if (index >= status_.size()) return Status::InvalidArgument("no such move");
  return status_[index];
}

size_t TransferJob::failed_moves() const {
  MutexLock lock(&mu_);
  return failed_;
}

bool TransferJob::SlotLent(size_t index) const {
  MutexLock lock(&mu_);
  // Abandoned while queued ends the move too, but lends nothing: only kInIo sets lent_.
  return index < lent_.size() && lent_[index] != 0;
}

bool TransferJob::LayerLanded(size_t index, uint32_t layer) {
  const uint32_t move = static_cast<uint32_t>(index);
  std::vector<uint32_t> finished;
  LayersLanded(std::span<const uint32_t>(&move, 1), layer, &finished);
  return !finished.empty();
}

void TransferJob::LayersLanded(std::span<const uint32_t> moves, uint32_t layer,
                               std::vector<uint32_t>* finished) {
  bool wake = false;
  {
    MutexLock lock(&mu_);
    if (layer >= num_layers_) return;
    for (uint32_t index : moves) {
      if (index >= moves_.size() || ended_[index] || !moves_[index].IntoG1() ||
          landed_[size_t{index} * num_layers_ + layer]) {
        continue;  // a backend bug; ignoring it keeps the counts sane
      }
      landed_[size_t{index} * num_layers_ + layer] = 1;
      if (--layers_left_[index] == 0) finished->push_back(index);
      wake = --layer_pending_[layer] == 0 || wake;
    }
  }
  if (wake) cv_.notify_all();
}

void TransferJob::MoveDone(size_t index, const Status& status) {
  Status reported;
  {
    MutexLock lock(&mu_);
    if (index >= moves_.size() || ended_[index]) return;
    ended_[index] = 1;
    Status final_status = status;
    if (moves_[index].IntoG1() && final_status.ok() && layers_left_[index] != 0) {
      final_status = Status::Internal("move ended before all its layers landed");
    }
    status_[index] = final_status;
    reported = final_status;
    if (moves_[index].IntoG1()) {
      for (uint32_t l = 0; l < num_layers_; ++l) {
        if (landed_[index * num_layers_ + l]) continue;
        landed_[index * num_layers_ + l] = 1;
        --layer_pending_[l];
        if (layer_error_[l].ok()) layer_error_[l] = final_status;
      }
      layers_left_[index] = 0;
    }
    if (!final_status.ok()) {
      ++failed_;
      if (first_error_.ok()) first_error_ = final_status;
    }
    --remaining_;
  }
  if (on_move_) on_move_(*this, index, reported);
  // The done callback runs after EVERY move callback has returned, not only the last move's:
  // move callbacks run on different threads, and one may still be running when the last move
  // ends (the done callback would then miss what it did).
  bool run_done = false;
  {
    MutexLock lock(&mu_);
    run_done = --callbacks_left_ == 0;
  }
  if (run_done) {
    if (on_done_) on_done_(*this);
    // Done() and Wait() see the job finished only after the callbacks ran, so whatever they did
    // (index updates, slot releases) is visible to the waiter.
    MutexLock lock(&mu_);
    finished_ = true;
  }
  cv_.notify_all();
}

bool TransferJob::BeginIo(size_t index) {
  MutexLock lock(&mu_);
  if (index >= moves_.size() || ended_[index] || io_phase_[index] != IoPhase::kQueued) {
    return false;
  }
  io_phase_[index] = IoPhase::kInIo;
  return true;
}

bool TransferJob::FinishIo(size_t index) {
  MutexLock lock(&mu_);
  if (index >= moves_.size() || io_phase_[index] != IoPhase::kInIo) return false;
  io_phase_[index] = IoPhase::kLanding;
  return true;
}

TransferJob::Abandoned TransferJob::Abandon(size_t index) {
  MutexLock lock(&mu_);
  if (index >= moves_.size() || ended_[index]) return Abandoned::kNo;
  switch (io_phase_[index]) {
    case IoPhase::kQueued:
      io_phase_[index] = IoPhase::kAbandoned;
      return Abandoned::kWhileQueued;
    case IoPhase::kInIo:
      io_phase_[index] = IoPhase::kAbandoned;
      lent_[index] = 1;
      return Abandoned::kInIo;
    case IoPhase::kLanding:
    case IoPhase::kAbandoned:
      return Abandoned::kNo;
  }
  return Abandoned::kNo;
}

}  // namespace kvtier

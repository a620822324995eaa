// TransferEngine's G4 side: the remote threads, puts from G2 slots, verified gets into G2 slots
// (and on into G1). See transfer_engine.h for the contract.
#include <algorithm>
#include <atomic>
#include <string>

#include "core/log.h"
#include "tier/cond_wait.h"
#include "transfer/transfer_engine.h"

namespace kvtier {

Status TransferEngine::RemoteConfig::Validate() const {
  if (threads < 1 || threads > 64) {
    return Status::InvalidArgument("transfer remote threads = " + std::to_string(threads) +
                                   " is out of range; allowed: 1..64");
  }
  if (max_queued_saves < 1) {
    return Status::InvalidArgument("transfer remote max_queued_saves = 0; allowed: 1 or more");
  }
  if (load_call_bytes == 0) {
    return Status::InvalidArgument("transfer remote load_call_bytes = 0; allowed: 1 or more");
  }
  if (load_timeout.count() <= 0 || save_timeout.count() <= 0) {
    return Status::InvalidArgument("G4 load/save timeouts must be > 0 ms (got " +
                                   std::to_string(load_timeout.count()) + " / " +
                                   std::to_string(save_timeout.count()) + ")");
  }
  return Status::Ok();
}

Status TransferEngine::RegisterRemote(RemoteStore* store, const RemoteConfig& config) {
  if (store == nullptr) return Status::InvalidArgument("RegisterRemote(nullptr)");
  KVTIER_RETURN_IF_ERROR(config.Validate());
  if (arena_ == nullptr) {
    return Status::FailedPrecondition(
        "RegisterRemote needs the G2 arena registered first (G4 moves go through G2 slots)");
  }
  if (remote_ != nullptr) return Status::FailedPrecondition("a G4 store is registered already");
  remote_ = store;
  remote_config_ = config;
  for (uint32_t i = 0; i < config.threads; ++i) {
    remote_workers_.emplace_back([this] { RemoteLoop(); });
  }
  watchdog_ = std::thread([this] { WatchdogLoop(); });
  return Status::Ok();
}

void TransferEngine::StopRemote() {
  {
    MutexLock lock(&remote_mu_);
    remote_stopping_ = true;
  }
  remote_cv_.notify_all();
  // A call that never returns (a hard-mounted NFS server gone for good) holds this join: its
  // thread writes into a G2 slot, so neither the slot nor the arena may go before it returns.
  // The watchdog keeps ending the loads queued behind it meanwhile.
  for (auto& w : remote_workers_) w.join();
  remote_workers_.clear();
  {
    MutexLock lock(&remote_mu_);
    watchdog_stopping_ = true;
  }
  watchdog_cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
}

void TransferEngine::WatchdogLoop() {
  for (;;) {
    std::shared_ptr<TransferJob> job;
    std::vector<uint32_t> moves;
    {
      MutexLock lock(&remote_mu_);
      while (!job) {
        if (watchdog_stopping_) return;
        if (load_deadlines_.empty()) {
          CondWait(&watchdog_cv_, &remote_mu_);
          continue;
        }
        const auto first = load_deadlines_.begin();
        const RemoteDeadline now = RemoteClock::now();
        if (now < first->first) {
          CondWaitFor(&watchdog_cv_, &remote_mu_, first->first - now);
          continue;
        }
        job = first->second.job.lock();
        moves = std::move(first->second.moves);
        load_deadlines_.erase(first);
      }
    }
    // Not under remote_mu_: ending a move runs the job's callbacks.
    AbandonOverdue(job, moves, "its deadline passed");
  }
}

void TransferEngine::AbandonOverdue(const std::shared_ptr<TransferJob>& job,
                                    std::span<const uint32_t> moves, const char* why) {
  for (uint32_t i : moves) {
    const BlockTransfer& m = job->moves()[i];
    switch (job->Abandon(i)) {
      case TransferJob::Abandoned::kNo:
        break;
      case TransferJob::Abandoned::kWhileQueued:
        EndRemoteMove(*job, i,
                      Status::TimedOut(std::string(BlockTransferOpName(m.op)) + ": " + why +
                                       " while it was queued"));
        break;
      case TransferJob::Abandoned::kInIo:
        remote_abandoned_.fetch_add(1, std::memory_order_relaxed);
        EndRemoteMove(*job, i,
                      Status::TimedOut(std::string(BlockTransferOpName(m.op)) + ": " + why +
                                       " while the store's call had not returned; its late "
                                       "result will be discarded"));
        break;
    }
  }
}

void TransferEngine::ReleaseLentSlot(const BlockTransfer& m, uint32_t slot) {
  if (m.g2_slot == BlockTransfer::kAnyStagingSlot) {
    ReleaseStaging(slot);
  } else if (remote_config_.release_lent_slot) {
    remote_config_.release_lent_slot(slot);
  }
}

void TransferEngine::StartRemote(const std::shared_ptr<TransferJob>& job,
                                 std::span<const uint32_t> all_moves, bool save) {
  const auto timeout = save ? remote_config_.save_timeout : remote_config_.load_timeout;
  const RemoteDeadline deadline = RemoteClock::now() + timeout;
  // G4 -> G1 loads whose engine fetches them itself skip the remote threads and G2.
  std::vector<uint32_t> fetched, moves;
  for (uint32_t i : all_moves) {
    const BlockTransfer& m = job->moves()[i];
    const bool fetch = !save && device_ != nullptr && m.op == BlockTransfer::Op::kG4ToG1 &&
                       device_->CanFetch(m.g1_block);
    (fetch ? fetched : moves).push_back(i);
  }
  // Spread over every remote thread, so a big move uses every connection. A load is also cut
  // into calls of about load_call_bytes: a call's blocks are verified and go on to G1 when
  // the call returns, so smaller calls overlap those steps with the next call's transfer.
  const auto per_call_of = [&](size_t n) {
    size_t per_call =
        std::max<size_t>(1, (n + remote_config_.threads - 1) / remote_config_.threads);
    if (!save) {
      const uint64_t block_bytes = G2PayloadOffset(layout_) + layout_.BlockBytes();
      per_call = std::clamp<size_t>(remote_config_.load_call_bytes / block_bytes, 1, per_call);
    }
    return per_call;
  };
  const size_t per_call = per_call_of(moves.size());
  // Gets are watched: at the deadline the watchdog ends whichever of them are still queued or
  // in a call, whatever that call is doing.
  std::vector<uint32_t> gets;
  for (uint32_t i : all_moves) {
    if (job->moves()[i].op != BlockTransfer::Op::kG2ToG4) gets.push_back(i);
  }
  {
    MutexLock lock(&remote_mu_);
    for (size_t b = 0; b < moves.size(); b += per_call) {
      const size_t e = std::min(moves.size(), b + per_call);
      RemoteBatch batch{job, std::vector<uint32_t>(moves.begin() + b, moves.begin() + e), deadline};
      (save ? remote_saves_ : remote_loads_).push_back(std::move(batch));
    }
    if (!gets.empty()) load_deadlines_.emplace(deadline, LoadDeadline{job, std::move(gets)});
  }
  remote_cv_.notify_all();
  watchdog_cv_.notify_all();
  if (!fetched.empty()) StartFetches(job, fetched, deadline, per_call_of(fetched.size()));
}

void TransferEngine::StartFetches(const std::shared_ptr<TransferJob>& job,
                                  std::span<const uint32_t> moves, RemoteDeadline deadline,
                                  size_t per_call) {
  for (size_t b = 0; b < moves.size(); b += per_call) {
    const size_t e = std::min(moves.size(), b + per_call);
    std::vector<G4Fetch> items;
    auto started = std::make_shared<std::vector<uint32_t>>();
    for (size_t k = b; k < e; ++k) {
      const uint32_t i = moves[k];
      if (!job->BeginIo(i)) continue;  // abandoned at its deadline already
      const BlockTransfer& m = job->moves()[i];
      items.push_back(G4Fetch{m.g1_block, RemoteObjectName(m.namespace_id, m.key), m.namespace_id,
                              m.key, m.tokens});
      started->push_back(i);
    }
    if (started->empty()) continue;
    const auto start = std::chrono::steady_clock::now();
    auto left = std::make_shared<std::atomic<size_t>>(started->size());
    Status s = device_->Fetch(
        std::move(items), deadline, [this, job, started, start, left](size_t k, const Status& st) {
          FetchEnded(*job, (*started)[k], st);
          if (left->fetch_sub(1) == 1 && io_observer_) {
            io_observer_(kTierG4, false, std::chrono::steady_clock::now() - start);
          }
        });
    if (!s.ok()) {
      for (uint32_t i : *started) {
        if (job->FinishIo(i)) EndRemoteMove(*job, i, s);
      }
    }
  }
}

void TransferEngine::FetchEnded(TransferJob& job, uint32_t move, const Status& status) {
  if (!job.FinishIo(move)) {
    // Ended at its deadline while the engine's fetch ran; this is its late answer.
    remote_late_returns_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (status.ok()) {
    bytes_by_op_[static_cast<size_t>(BlockTransfer::Op::kG4ToG1)].fetch_add(
        layout_.BlockBytes(), std::memory_order_relaxed);
    for (uint32_t l = 0; l < layout_.num_layers; ++l) job.LayerLanded(move, l);
  }
  EndRemoteMove(job, move, status);
}

void TransferEngine::RemoteLoop() {
  for (;;) {
    RemoteBatch batch;
    {
      MutexLock lock(&remote_mu_);
      while (!remote_stopping_ && remote_loads_.empty() && remote_saves_.empty()) {
        CondWait(&remote_cv_, &remote_mu_);
      }
      if (!remote_loads_.empty()) {
        batch = std::move(remote_loads_.front());
        remote_loads_.pop_front();
      } else if (!remote_saves_.empty()) {
        batch = std::move(remote_saves_.front());
        remote_saves_.pop_front();
        queued_remote_saves_.fetch_sub(static_cast<uint32_t>(batch.moves.size()),
                                       std::memory_order_relaxed);
      } else {
        return;  // stopping, and nothing left
      }
    }
    ExecuteRemote(batch);
  }
}

void TransferEngine::EndRemoteMove(TransferJob& job, uint32_t move, const Status& status) {
  if (status.Is(StatusCode::kTimedOut)) {
    remote_timeouts_.fetch_add(1, std::memory_order_relaxed);
  } else if (status.Is(StatusCode::kCorruption)) {
    remote_corrupt_.fetch_add(1, std::memory_order_relaxed);
  } else if (!status.ok() && !status.Is(StatusCode::kNotFound)) {
    remote_failures_.fetch_add(1, std::memory_order_relaxed);
  }
  EndMove(job, move, status);
}

void TransferEngine::ExecuteRemote(const RemoteBatch& batch) {
  std::vector<uint32_t> puts, gets;
  for (uint32_t i : batch.moves) {
    (batch.job->moves()[i].op == BlockTransfer::Op::kG2ToG4 ? puts : gets).push_back(i);
  }
  if (RemoteClock::now() >= batch.deadline) {
    // Waited too long behind other calls: a late move is a failed move, never a late one.
    for (uint32_t i : puts) {
      EndRemoteMove(*batch.job, i,
                    Status::TimedOut(std::string(BlockTransferOpName(batch.job->moves()[i].op)) +
                                     " passed its deadline while queued"));
    }
    AbandonOverdue(batch.job, gets, "its deadline passed");
    return;
  }
  if (!puts.empty()) {
    const auto start = std::chrono::steady_clock::now();
    RemotePuts(batch, puts);
    if (io_observer_) io_observer_(kTierG4, true, std::chrono::steady_clock::now() - start);
  }
  if (!gets.empty()) {
    const auto start = std::chrono::steady_clock::now();
    RemoteGets(batch, gets);
    if (io_observer_) io_observer_(kTierG4, false, std::chrono::steady_clock::now() - start);
  }
}

void TransferEngine::RemotePuts(const RemoteBatch& batch, std::span<const uint32_t> moves) {
  const uint64_t header_area = G2PayloadOffset(layout_);
  const uint64_t block_bytes = header_area + layout_.BlockBytes();
  std::vector<RemotePut> items;
  std::vector<uint32_t> sent;
  items.reserve(moves.size());
  for (uint32_t i : moves) {
    const BlockTransfer& m = batch.job->moves()[i];
    uint8_t* slot = arena_->SlotData(m.g2_slot);
    BlockHeaderFields f;
    f.layout_fingerprint = layout_.Fingerprint();
    f.namespace_id = m.namespace_id;
    f.key = m.key;
    f.parent = m.parent;
    const uint64_t checksum = PayloadChecksum(slot + header_area, layout_.BlockBytes());
    Status enc =
        m.expected_checksum != 0 && checksum != m.expected_checksum
            ? Status::Corruption(
                  "G4 write refused: the block's bytes changed after it was "
                  "committed; an engine wrote into a committed G2 slot")
        : BlockHeaderBytesFor(m.tokens.size()) != header_area
            ? Status::InvalidArgument("G4 write of a block of " + std::to_string(m.tokens.size()) +
                                      " tokens; this layout's blocks hold " +
                                      std::to_string(layout_.tokens_per_block))
            : EncodeBlockHeader(f, m.tokens, layout_.BlockBytes(), checksum, slot);
    if (!enc.ok()) {
      EndRemoteMove(*batch.job, i, enc);
      continue;
    }
    items.push_back(RemotePut{RemoteObjectName(m.namespace_id, m.key), {slot, block_bytes}});
    sent.push_back(i);
  }
  if (items.empty()) return;
  std::vector<Status> results(items.size());
  remote_->Put(items, batch.deadline, results);
  for (size_t k = 0; k < sent.size(); ++k) {
    if (results[k].ok()) {
      bytes_by_op_[static_cast<size_t>(BlockTransfer::Op::kG2ToG4)].fetch_add(
          block_bytes, std::memory_order_relaxed);
    }
    EndRemoteMove(*batch.job, sent[k], results[k]);
  }
}

void TransferEngine::RemoteGets(const RemoteBatch& batch, std::span<const uint32_t> moves) {
  using Op = BlockTransfer::Op;
  const uint64_t header_area = G2PayloadOffset(layout_);
  const uint64_t block_bytes = header_area + layout_.BlockBytes();
  std::vector<RemoteGet> items;
  std::vector<uint32_t> sent, slots;  // moves called for, and the G2 slot each lands in
  items.reserve(moves.size());
  for (uint32_t i : moves) {
    const BlockTransfer& m = batch.job->moves()[i];
    // Abandoned at its deadline while queued: ended already, and its slot is not ours.
    if (!batch.job->BeginIo(i)) continue;
    uint32_t slot = m.g2_slot;
    if (slot == BlockTransfer::kAnyStagingSlot) {
      // A slot of the staging pool, only if one is free now: a G4 load never waits for one
      // (its deadline runs); without one it is a miss, recomputed.
      MutexLock lock(&disk_mu_);
      if (!staging_free_.empty()) {
        slot = staging_free_.back();
        staging_free_.pop_back();
      }
    }
    if (slot == BlockTransfer::kAnyStagingSlot) {
      if (batch.job->FinishIo(i)) {
        EndRemoteMove(*batch.job, i,
                      Status::ResourceExhausted("G4->G1: no staging slot free; recomputed"));
      }
      continue;
    }
    items.push_back(RemoteGet{
        RemoteObjectName(m.namespace_id, m.key), {arena_->SlotData(slot), block_bytes}, 0});
    sent.push_back(i);
    slots.push_back(slot);
  }
  if (items.empty()) return;
  std::vector<Status> results(items.size());
  remote_->Get(items, batch.deadline, results);
  std::vector<std::pair<uint32_t, uint32_t>> staged;  // move, slot
  for (size_t k = 0; k < sent.size(); ++k) {
    const uint32_t i = sent[k];
    const BlockTransfer& m = batch.job->moves()[i];
    if (!batch.job->FinishIo(i)) {
      // The watchdog ended this move at its deadline while the call ran: whatever the call
      // wrote stays in the slot, which goes back only now that nothing writes into it.
      remote_late_returns_.fetch_add(1, std::memory_order_relaxed);
      ReleaseLentSlot(m, slots[k]);
      continue;
    }
    const bool pooled = m.g2_slot == BlockTransfer::kAnyStagingSlot;
    Status st = results[k];
    if (st.ok()) {
      const ExpectedBlock e = ExpectedLayoutBlock(layout_, m.namespace_id, m.key, m.tokens);
      const BlockCheck check = VerifyBlock({items[k].dest.data(), items[k].bytes_read}, e);
      if (check != BlockCheck::kOk) {
        st = Status::Corruption("G4 object " + items[k].name + " failed verification (" +
                                BlockCheckName(check) + "); not served");
      }
    }
    if (st.ok()) {
      bytes_by_op_[static_cast<size_t>(Op::kG4ToG2)].fetch_add(block_bytes,
                                                               std::memory_order_relaxed);
    }
    if (st.ok() && m.op == Op::kG4ToG1) {
      staged.emplace_back(i, slots[k]);
    } else {
      if (pooled) ReleaseStaging(slots[k]);
      EndRemoteMove(*batch.job, i, st);
    }
  }
  if (staged.empty()) return;
  if (device_ != nullptr) {
    // A device G1: the staged half goes to the CUDA backend (a pooled slot goes back when the
    // move lands or fails).
    for (const auto& [i, slot] : staged) {
      const bool pooled = batch.job->moves()[i].g2_slot == BlockTransfer::kAnyStagingSlot;
      SubmitDevice(batch.job, CopyDirection::kHostToDevice, {i}, 0, /*as_load=*/true,
                   pooled ? slot : BlockTransfer::kAnyStagingSlot);
    }
    return;
  }
  {
    // The staged half of a load into G1 is a load, whatever the job's priority. A pooled slot
    // goes back to the pool when its scatter ends (Execute).
    MutexLock lock(&mu_);
    for (const auto& [i, slot] : staged) {
      load_queue_.push_back(WorkItem{batch.job, i, -1, {}, slot});
      activity_.fetch_add(1, std::memory_order_release);
    }
  }
  work_cv_.notify_all();
}

}  // namespace kvtier

// BlockManagerImpl, the save path: Commit (and deferred saves), starting the saves,
// waiting for them, the end of a demotion write.
#include <algorithm>
#include <chrono>
#include <string>

#include "core/log.h"
#include "manager/block_manager_impl.h"
#include "tier/block_format.h"
#include "tier/cond_wait.h"

namespace kvtier {

// ---------------------------------------------------------------------------------------------
// Scheduler side

Status BlockManagerImpl::Commit(const std::string& request_id, std::span<const TokenId> tokens,
                                std::span<const uint32_t> g1_block_ids) {
  const ScopedLatency latency(metrics_ ? metrics_->commit : nullptr);
  struct Candidate {
    BlockKey key, parent;
    uint32_t g1_block;
    std::vector<TokenId> tokens;
  };
  std::vector<Candidate> candidates;
  std::vector<BlockKey> seen;
  uint64_t ns;
  uint8_t store_tiers;
  uint32_t instance;
  {
    MutexLock lock(&mu_);
    Request* entry = requests_.Find(request_id);
    if (entry == nullptr) {
      return Status::NotFound("Commit: request '" + request_id + "' had no Lookup");
    }
    requests_.Touch(*entry);
    Request& r = *entry;
    ns = r.namespace_id;
    instance = r.instance;
    store_tiers = r.store_tiers;
    // Adopt the engine's view of the tokens; re-key from the first block that changed.
    size_t same = 0;
    while (same < r.tokens.size() && same < tokens.size() && r.tokens[same] == tokens[same]) ++same;
    const size_t valid_blocks = same / tpb_;
    if (r.keys.size() > valid_blocks) r.keys.resize(valid_blocks);
    r.committed_blocks =
        std::min<uint32_t>(r.committed_blocks, static_cast<uint32_t>(valid_blocks));
    r.tokens.assign(tokens.begin(), tokens.end());
    const BlockKey parent0 = r.keys.empty() ? r.hasher->root() : r.keys.back();
    const std::span<const std::string> extra(r.block_extra);
    r.hasher->AppendKeys(std::span<const TokenId>(r.tokens).subspan(r.keys.size() * tpb_), parent0,
                         &r.keys, extra.subspan(std::min(r.keys.size(), extra.size())));
    const uint32_t full = static_cast<uint32_t>(r.keys.size());
    if (g1_block_ids.size() < full) {
      return Status::InvalidArgument("Commit: " + std::to_string(full) + " full blocks but " +
                                     std::to_string(g1_block_ids.size()) + " G1 block ids");
    }
    for (uint32_t i = r.committed_blocks; i < full; ++i) {
      const BlockKey& key = r.keys[i];
      seen.push_back(key);
      // A block the engine does not hold (connector.h: kNoG1Block) is neither saved nor reused.
      if (g1_block_ids[i] == kNoG1Block) continue;
      const bool loaded = i >= r.load_first && i < r.load_first + r.loaded_blocks;
      // Without G2 in its store_tiers, nothing of the request is saved (G2 leads to the rest).
      if (loaded || saving_keys_.count(key) || !((store_tiers >> kTierG2) & 1u)) continue;
      candidates.push_back(
          Candidate{key, i == 0 ? r.hasher->root() : r.keys[i - 1], g1_block_ids[i],
                    std::vector<TokenId>(r.tokens.begin() + size_t{i} * tpb_,
                                         r.tokens.begin() + size_t{i + 1} * tpb_)});
    }
    r.committed_blocks = full;
    // Held from now on: RequestFinished must not let the engine free these G1 blocks while a
    // save may still read them.
    r.saves_in_flight += static_cast<uint32_t>(candidates.size());
  }
  for (const BlockKey& k : seen) g3_filter_->RecordAndCheck(k);

  // Blocks kvtier already holds are reuse, not saves.
  std::vector<Candidate> to_save;
  std::vector<BlockKey> reused;
  for (Candidate& c : candidates) {
    // Only a copy in G2 makes a commit redundant. A key held only by G3 is saved to G2 again:
    // the engine computed it although G3 held it, so G3's copy could not serve it (a quarantined
    // G3, or a prefix match cut short before it, as by a damaged block ahead of it whose
    // neighbours are damaged too and not yet read), and the fresh copy is then found first. A
    // key that no tier holds but a running load still pins (it failed verification and was
    // invalidated) is saved again too.
    const std::optional<BlockInfo> info = index_->Get(c.key);
    if (info.has_value() && (info->tier_mask & (1u << kTierG2)) != 0) {
      reused.push_back(c.key);
    } else {
      to_save.push_back(std::move(c));
    }
  }
  if (!reused.empty()) {
    index_->Touch(reused);
    c_.dedup.fetch_add(reused.size(), std::memory_order_relaxed);
  }
  uint32_t released = static_cast<uint32_t>(reused.size());
  {
    // Claim the keys, so a concurrent commit of the same prefix does not save it twice.
    MutexLock lock(&mu_);
    const size_t before = to_save.size();
    std::vector<Candidate> claimed;
    claimed.reserve(to_save.size());
    for (Candidate& c : to_save) {
      if (saving_keys_.insert(c.key).second) claimed.push_back(std::move(c));
    }
    to_save.swap(claimed);
    released += static_cast<uint32_t>(before - to_save.size());
  }
  std::vector<PendingSave> saves;
  std::vector<Candidate> no_slot;
  for (Candidate& c : to_save) {
    std::optional<uint32_t> slot =
        no_slot.empty() ? AllocateG2Slot(ns, SlotUse::kSave) : std::nullopt;
    if (!slot) {
      no_slot.push_back(std::move(c));  // and the blocks after it: saves keep commit order
      continue;
    }
    slots_->Set(*slot, G2SlotTable::Meta{c.key, c.parent, ns, store_tiers}, c.tokens);
    saves.push_back(PendingSave{instance, request_id, c.key, c.parent, c.g1_block, *slot});
  }
  MutexLock lock(&mu_);
  if (DrainingSaves(request_id)) {
    // WaitForRequestSaves runs: the engine is reusing the blocks; nothing of them starts.
    for (const PendingSave& s : saves) {
      ReleaseG2Slot(s.g2_slot);
      saving_keys_.erase(s.key);
    }
    c_.dropped_saves.fetch_add(saves.size(), std::memory_order_relaxed);
    released += static_cast<uint32_t>(saves.size());
    saves.clear();
    for (Candidate& c : no_slot) saving_keys_.erase(c.key);
    c_.dropped_saves.fetch_add(no_slot.size(), std::memory_order_relaxed);
    released += static_cast<uint32_t>(no_slot.size());
    no_slot.clear();
  }
  for (auto& s : saves) pending_saves_.push_back(std::move(s));
  // Blocks without a slot wait for one while a slot can free: G2's victims are being demoted
  // (a slot frees when each write ends), saves are in flight (their blocks become evictable
  // when they land), or G3 is behind G2 (a save there never evicts: StartSave evicts for the
  // deferred saves, and drops them when nothing is evictable); up to the bound. Otherwise
  // they are dropped and counted.
  const bool slot_coming = SlotComing() || g3_ != nullptr;
  for (Candidate& c : no_slot) {
    if (slot_coming && deferred_saves_.size() < max_deferred_saves_) {
      c_.deferred.fetch_add(1, std::memory_order_relaxed);
      deferred_saves_.push_back(
          DeferredSave{instance, request_id, c.key, c.parent, ns, c.g1_block, std::move(c.tokens),
                       std::chrono::steady_clock::now() + max_defer_, store_tiers});
    } else {
      c_.dropped_saves.fetch_add(1, std::memory_order_relaxed);
      saving_keys_.erase(c.key);
      ++released;
    }
  }
  if (released > 0) ReleaseSaveHolds(request_id, released);
  return Status::Ok();
}

void BlockManagerImpl::RetryDeferredSaves() {
  std::deque<DeferredSave> waiting;
  {
    MutexLock lock(&mu_);
    if (deferred_saves_.empty()) return;
    waiting.swap(deferred_saves_);
  }
  std::vector<PendingSave> saves;
  size_t given = 0;
  for (; given < waiting.size(); ++given) {
    const DeferredSave& d = waiting[given];
    std::optional<uint32_t> slot = AllocateG2Slot(d.namespace_id, SlotUse::kSave);
    if (!slot) break;
    slots_->Set(*slot, G2SlotTable::Meta{d.key, d.parent, d.namespace_id, d.store_tiers}, d.tokens);
    saves.push_back(PendingSave{d.instance, d.request_id, d.key, d.parent, d.g1_block, *slot});
  }
  MutexLock lock(&mu_);
  for (auto& s : saves) {
    if (DrainingSaves(s.request_id)) {
      // Its request's WaitForRequestSaves took the deferred list while this call held it.
      ReleaseG2Slot(s.g2_slot);
      c_.dropped_saves.fetch_add(1, std::memory_order_relaxed);
      saving_keys_.erase(s.key);
      ReleaseSaveHolds(s.request_id, 1);
      continue;
    }
    pending_saves_.push_back(std::move(s));
  }
  // Still no slot and none coming, or waited too long (or its request is being drained):
  // drop, so the engine gets its G1 blocks back.
  const bool slot_coming = SlotComing();
  const auto now = std::chrono::steady_clock::now();
  for (size_t i = waiting.size(); i-- > given;) {
    if (slot_coming && now < waiting[i].deadline && !DrainingSaves(waiting[i].request_id)) {
      deferred_saves_.push_front(std::move(waiting[i]));
    } else {
      c_.dropped_saves.fetch_add(1, std::memory_order_relaxed);
      saving_keys_.erase(waiting[i].key);
      ReleaseSaveHolds(waiting[i].request_id, 1);
    }
  }
}

void BlockManagerImpl::ReleaseSaveHolds(const std::string& request_id, uint32_t n) {
  Request* entry = requests_.Find(request_id);
  if (entry == nullptr) return;
  Request& r = *entry;
  r.saves_in_flight -= std::min(n, r.saves_in_flight);
  if (r.saves_in_flight != 0) return;
  request_saves_cv_.notify_all();
  requests_.Touch(*entry);
  RetireIfDone(*entry);
}

// ---------------------------------------------------------------------------------------------
// Worker side

Status BlockManagerImpl::RegisterDeviceMemory(const G1Memory& g1) {
  if (g1.layout.Fingerprint() != layout_.Fingerprint() ||
      g1.layout.g1_arrangement != layout_.g1_arrangement) {
    return Status::InvalidArgument("RegisterDeviceMemory: layout " + g1.layout.ToString() +
                                   " differs from the manager's " + layout_.ToString());
  }
  KVTIER_RETURN_IF_ERROR(engine_->RegisterG1(g1));
  g1_registered_ = true;
  return Status::Ok();
}

Status BlockManagerImpl::StartSave(uint32_t instance) {
  StartG2Reserve();
  RetryDeferredSaves();
  std::vector<PendingSave> saves;
  {
    MutexLock lock(&mu_);
    if (instance == kAllInstances) {
      saves.swap(pending_saves_);
    } else {
      // This engine's saves, and any left by an engine that is gone (they fail and free their
      // slots); the others wait for their own engine's StartSave.
      std::vector<PendingSave> others;
      for (PendingSave& p : pending_saves_) {
        (p.instance == instance || gone_instances_.count(p.instance) ? saves : others)
            .push_back(std::move(p));
      }
      pending_saves_.swap(others);
    }
    saves_outstanding_ += saves.size();
  }
  if (saves.empty()) return Status::Ok();
  if (!g1_registered_) {
    for (const auto& s : saves) {
      ReleaseG2Slot(s.g2_slot);
      EndSave(s.request_id, s.key);
    }
    return Status::FailedPrecondition("StartSave before RegisterDeviceMemory");
  }
  std::vector<BlockTransfer> moves;
  moves.reserve(saves.size());
  for (const auto& s : saves) {
    BlockTransfer m;
    m.op = BlockTransfer::Op::kG1ToG2;
    m.g1_block = s.g1_block;
    m.g2_slot = s.g2_slot;
    moves.push_back(std::move(m));
  }
  auto shared = std::make_shared<std::vector<PendingSave>>(std::move(saves));
  // Every block of the batch enters the index when the whole batch has landed, in commit order
  // (a request's blocks in prefix order), whatever order the copy workers finished them in: the
  // lineage-aware policies see a parent before its child, and the same replay gives the same
  // index on every run. Then write-through to G4, as one batch.
  const auto submitted = std::chrono::steady_clock::now();
  auto on_done = [this, shared, submitted](const TransferJob& job) {
    const int64_t took = metrics_ ? NanosSince(submitted) : 0;
    std::vector<G4Write> writes;
    for (size_t i = 0; i < shared->size(); ++i) {
      const PendingSave& s = (*shared)[i];
      const Status st = job.MoveStatus(i);
      bool stored = false;
      if (st.ok() && shared_g2_) {
        // kvtier serve: the engine wrote this slot through its own mapping; its bytes as they
        // are now, at the commit, are the block (G2SlotTable::Meta::commit_checksum).
        const uint64_t sum = PayloadChecksum(g2_->SlotData(s.g2_slot) + G2PayloadOffset(layout_),
                                             layout_.BlockBytes());
        slots_->SetCommitChecksum(s.g2_slot, sum);
      }
      if (st.ok()) {
        stored = index_->Insert(s.key, s.parent, kTierG2, s.g2_slot).ok();
      }
      if (stored) {
        c_.saved.fetch_add(1, std::memory_order_relaxed);
        if (metrics_) metrics_->save->ObserveNanos(took);
        Emit({G2StoredEvent(s.g2_slot, s.key, s.parent)});
        DropReplacedG3Copy(s.key, s.parent);
        if (auto w = PrepareWriteThrough(s.key, s.parent, s.g2_slot)) {
          // Counted before the save ends, so WaitForSaves sees it.
          g4_->BeginWrite();
          writes.push_back(std::move(*w));
        }
      } else {
        if (!st.ok()) c_.dropped_saves.fetch_add(1, std::memory_order_relaxed);
        ReleaseG2Slot(s.g2_slot);
      }
      EndSave(s.request_id, s.key);
    }
    SubmitG4Writes(std::move(writes));
  };
  auto job = engine_->Submit(std::move(moves), TransferPriority::kSave, nullptr, on_done);
  if (!job.ok()) {
    // The queue is full: the offload is dropped, never waited for.
    c_.dropped_saves.fetch_add(shared->size(), std::memory_order_relaxed);
    for (const auto& s : *shared) {
      ReleaseG2Slot(s.g2_slot);
      EndSave(s.request_id, s.key);
    }
    return job.status().Is(StatusCode::kResourceExhausted) ? Status::Ok() : job.status();
  }
  return Status::Ok();
}

void BlockManagerImpl::WaitForSaves(uint32_t instance) {
  if (instance != kAllInstances) {
    for (;;) {
      {
        MutexLock lock(&mu_);
        for (;;) {
          // A request's save holds are its deferred, queued and submitted saves.
          uint64_t holds = 0, waiting = 0;
          for (const auto& [id, r] : requests_.entries())
            holds += r.instance == instance ? r.saves_in_flight : 0;
          for (const DeferredSave& d : deferred_saves_) waiting += d.instance == instance;
          for (const PendingSave& p : pending_saves_) waiting += p.instance == instance;
          const bool pool_busy = demotions_in_flight_.load() != 0 || G4WritesInFlight() != 0;
          if (holds <= waiting && !pool_busy) {
            if (waiting == 0) return;
            break;
          }
          // Woken by a request's holds reaching 0; demotions and G4 writes are polled.
          CondWaitFor(&request_saves_cv_, &mu_, std::chrono::milliseconds(5));
        }
      }
      Status s = StartSave(instance);
      if (!s.ok()) KVTIER_LOG(kWarn) << "WaitForSaves: " << s.ToString();
    }
  }
  for (;;) {
    {
      MutexLock lock(&mu_);
      while (saves_outstanding_ != 0 || demotions_in_flight_.load() != 0 ||
             G4WritesInFlight() != 0) {
        CondWait(&saves_cv_, &mu_);
      }
      if (deferred_saves_.empty() && pending_saves_.empty()) return;
    }
    // Deferred saves get the slots the demotions freed (or are dropped if none can free).
    Status s = StartSave(kAllInstances);
    if (!s.ok()) KVTIER_LOG(kWarn) << "WaitForSaves: " << s.ToString();
  }
}

void BlockManagerImpl::WaitForRequestSaves(const std::string& request_id) {
  MutexLock lock(&mu_);
  Request* entry = requests_.Find(request_id);
  if (entry == nullptr) return;
  ++entry->save_drains;
  // Its saves that have not started are dropped: deferred ones, and queued ones (their G2
  // slots go back). A RetryDeferredSaves holding the deferred list now drops its share itself.
  uint32_t dropped = 0;
  for (auto d = deferred_saves_.begin(); d != deferred_saves_.end();) {
    if (d->request_id != request_id) {
      ++d;
      continue;
    }
    saving_keys_.erase(d->key);
    d = deferred_saves_.erase(d);
    ++dropped;
  }
  for (auto q = pending_saves_.begin(); q != pending_saves_.end();) {
    if (q->request_id != request_id) {
      ++q;
      continue;
    }
    ReleaseG2Slot(q->g2_slot);
    saving_keys_.erase(q->key);
    q = pending_saves_.erase(q);
    ++dropped;
  }
  if (dropped > 0) {
    c_.dropped_saves.fetch_add(dropped, std::memory_order_relaxed);
    ReleaseSaveHolds(request_id, dropped);
  }
  // What is left was submitted: a save batch still reading G1.
  for (;;) {
    entry = requests_.Find(request_id);
    if (entry == nullptr) return;  // finished and done: erased
    if (entry->saves_in_flight == 0) break;
    CondWait(&request_saves_cv_, &mu_);
  }
  --entry->save_drains;
}

void BlockManagerImpl::EndDemotion() {
  MutexLock lock(&mu_);
  demotions_in_flight_.fetch_sub(1);
  saves_cv_.notify_all();
}

}  // namespace kvtier

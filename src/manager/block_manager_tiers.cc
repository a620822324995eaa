// BlockManagerImpl, the G2 slot part: G2 allocation and eviction, demotion of G2 victims to G3
// (admission, making room, the G3 flush). What each slot holds, and the namespace share, are
// the slot table's (g2_slot_table.h).
#include <algorithm>
#include <chrono>

#include "core/log.h"
#include "manager/block_manager_impl.h"
#include "tier/cond_wait.h"

namespace kvtier {

void BlockManagerImpl::ReleaseG2Slot(uint32_t slot) {
  slots_->Free(slot);
  Status s = g2_->Release(slot);
  if (!s.ok()) KVTIER_LOG(kError) << "internal: " << s.ToString();
}

void BlockManagerImpl::FlushG2ToG3() {
  WaitForSaves();  // saves into G2 land first
  const auto start = std::chrono::steady_clock::now();
  const uint32_t max_in_flight =
      std::clamp<uint32_t>(settings_.transfer.max_queued_saves / 2, 1, 32);
  uint64_t written = 0;
  while (!g3_->quarantined()) {
    {
      MutexLock lock(&mu_);
      while (demotions_in_flight_.load() >= max_in_flight) CondWait(&saves_cv_, &mu_);
    }
    auto victim = index_->EvictOne(kTierG2);
    if (!victim) break;
    c_.evicted_g2.fetch_add(1, std::memory_order_relaxed);
    Emit({Event(KvEvent::Kind::kRemoved, victim->key, victim->parent, kTierG2)});
    if (((victim->remaining_tiers >> kTierG3) & 1u) ||
        !((slots_->StoreTiers(victim->slot) >> kTierG3) & 1u)) {
      ReleaseG2Slot(victim->slot);
    } else {
      Demote(*victim);
      ++written;
    }
  }
  WaitForSaves();
  KVTIER_LOG(kInfo)
      << "G3: " << written << " blocks written from G2 at shutdown in "
      << std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count()
      << " ms";
}

bool BlockManagerImpl::AdmitToG3(const BlockKey& key) {
  if (!g3_ || g3_->quarantined()) return false;
  bool first_sighting = false;
  if (g3_filter_->Estimate(key) < g3_filter_->min_seen()) {
    if (!g3_gate_ || !g3_gate_->Admit(key)) return false;
    first_sighting = true;
  }
  const bool admitted = g3_->Admit(key) == DiskAdmission::Decision::kAdmit;
  if (admitted && first_sighting) c_.first_sighting.fetch_add(1, std::memory_order_relaxed);
  return admitted;
}

void BlockManagerImpl::MakeRoomInG3() {
  // Blocks in G3 plus demotions in flight must fit its slots.
  while (index_->TierCount(kTierG3) + demotions_in_flight_.load() >= g3_->num_slots()) {
    auto victim = index_->EvictOne(kTierG3);
    if (!victim) return;
    c_.evicted_g3.fetch_add(1, std::memory_order_relaxed);
    if (g3_gate_) g3_gate_->OnRemoved(victim->key);
    Status s = g3_->Remove(victim->key);
    if (!s.ok() && !s.Is(StatusCode::kNotFound)) {
      KVTIER_LOG(kWarn) << "G3 remove of an evicted block: " << s.ToString();
    }
    Emit({Event(KvEvent::Kind::kRemoved, victim->key, victim->parent, kTierG3)});
  }
}

void BlockManagerImpl::DropReplacedG3Copy(const BlockKey& key, const BlockKey& parent) {
  // The engine computed this block again although G3 held it (Commit saves such blocks), so
  // G3's copy could not serve it and may be damaged unread: the fresh copy replaces it, and
  // reaches G3 again by demotion or the shutdown flush. A copy a load is reading (pinned) stays.
  if (!g3_) return;
  const std::optional<BlockInfo> info = index_->Get(key);
  if (!info.has_value() || ((info->tier_mask >> kTierG3) & 1u) == 0) return;
  if (!index_->Remove(key, kTierG3).ok()) return;
  if (g3_gate_) g3_gate_->OnRemoved(key);
  const Status s = g3_->Remove(key);
  if (!s.ok() && !s.Is(StatusCode::kNotFound)) {
    KVTIER_LOG(kWarn) << "G3 remove of a replaced block: " << s.ToString();
  }
  Emit({Event(KvEvent::Kind::kRemoved, key, parent, kTierG3)});
}

void BlockManagerImpl::Demote(const EvictedBlock& victim) {
  BlockTransfer m;
  m.op = BlockTransfer::Op::kG2ToG3;
  m.key = victim.key;
  m.parent = victim.parent;
  m.g2_slot = victim.slot;
  {
    G2SlotTable::WriteRecord r = slots_->CopyForWrite(victim.slot);
    m.namespace_id = r.namespace_id;
    m.expected_checksum = r.commit_checksum;
    m.tokens = std::move(r.tokens);
  }
  MakeRoomInG3();
  demotions_in_flight_.fetch_add(1);
  const uint32_t slot = victim.slot;
  const BlockKey key = victim.key, parent = victim.parent;
  // Without write-through, G4 is fed by demotion: once the G3 write has ended (whatever its
  // outcome), the same slot is written to G4, and only then freed. One after the other, because
  // both writes encode their header into the slot's header area. So G4 holds every block G3
  // was given, and G3's own victims are already in G4 when G3 drops them.
  const bool feed_g4 =
      g4_ != nullptr && !g4_->write_through() && ((slots_->StoreTiers(slot) >> kTierG4) & 1u);
  auto end = [this, slot, key, parent, feed_g4] {
    if (feed_g4) {
      WriteEvictedToG4(slot, key, parent);  // frees the slot and ends the demotion
    } else {
      ReleaseG2Slot(slot);
      EndDemotion();
    }
  };
  // For the kStored event (the header gets the same tokens).
  auto tokens = std::make_shared<const std::vector<TokenId>>(m.tokens);
  const uint64_t ns = m.namespace_id;
  auto job = engine_->Submit(
      {std::move(m)}, TransferPriority::kSave,
      [this, key, parent, end, tokens, ns](const TransferJob&, size_t, const Status& s) {
        if (s.ok() || s.Is(StatusCode::kAlreadyExists)) {
          if (index_->Insert(key, parent, kTierG3, 0).ok()) {
            c_.demoted.fetch_add(1, std::memory_order_relaxed);
            Emit({StoredEvent(key, parent, kTierG3, ns, *tokens)});
          }
        } else {
          c_.demotion_failures.fetch_add(1, std::memory_order_relaxed);
        }
        end();
      });
  if (!job.ok()) {
    c_.demotion_failures.fetch_add(1, std::memory_order_relaxed);
    end();
  }
}

bool BlockManagerImpl::EvictFromG2(uint64_t ns) {
  auto victim = ns == 0 || !slots_->share_on()
                    ? index_->EvictOne(kTierG2)
                    : index_->EvictOne(kTierG2, [this, ns](uint32_t slot) {
                        return slots_->EvictableFor(ns, slot);
                      });
  if (!victim) return false;
  c_.evicted_g2.fetch_add(1, std::memory_order_relaxed);
  Emit({Event(KvEvent::Kind::kRemoved, victim->key, victim->parent, kTierG2)});
  const bool in_g3 = (victim->remaining_tiers >> kTierG3) & 1u;
  const uint8_t store_tiers = slots_->StoreTiers(victim->slot);
  const bool g3_allowed = (store_tiers >> kTierG3) & 1u;
  if (!in_g3 && g3_allowed && AdmitToG3(victim->key)) {
    Demote(*victim);  // the slot frees when the write ends
  } else if (!in_g3 && DemoteToG4(*victim)) {
    // Leaving the local tiers: G4 takes it (write-through off); the slot frees when it ends.
  } else {
    if (!in_g3 && g3_) c_.not_admitted.fetch_add(1, std::memory_order_relaxed);
    ReleaseG2Slot(victim->slot);
  }
  return true;
}

std::optional<uint32_t> BlockManagerImpl::AllocateStagingSlot(uint64_t ns) {
  if (std::optional<uint32_t> free_slot = g2_->Allocate()) return free_slot;
  if (staging_slots_ > 0) {
    c_.staged_via_pool.fetch_add(1, std::memory_order_relaxed);
    return BlockTransfer::kAnyStagingSlot;
  }
  return AllocateG2Slot(ns, SlotUse::kStaging);
}

uint32_t BlockManagerImpl::MaxDemotions() const {
  // Beyond it the disk is behind: a save is better dropped than paid for by evicting more of
  // G2, and no single call starts a burst of demotions.
  return std::clamp<uint32_t>(g2_->num_slots() / 8, 8, 64);
}

uint32_t BlockManagerImpl::G2Reserve() const {
  return std::clamp<uint32_t>(g2_->num_slots() / 16, 1, 256);
}

std::optional<uint32_t> BlockManagerImpl::AllocateG2Slot(uint64_t ns, SlotUse use) {
  last_alloc_ns_.store(ns, std::memory_order_relaxed);
  std::optional<uint32_t> slot = g2_->Allocate();
  // Each round frees a slot now (a victim G3 does not take, or holds already) or starts a
  // demotion, whose slot frees only when its write ends. Bounded, so a caller never spins and
  // never waits on I/O.
  //
  // A save with G3 behind G2 evicts nothing: it is deferred, and StartSave evicts for it
  // (StartG2Reserve) or it gets the slot a demotion in flight frees (RetryDeferredSaves).
  // Evicting in Commit cost the caller the policy's choice under the index's tier lock (which
  // the demotions' ends contend for), a G3 eviction and a submission that wakes the copy
  // threads, up to 4 times, for a slot that still came only when a write ended: Commit's p99
  // was 90-260 us while demotions kept the disk busy (bench manager; docs/status.md). A load's
  // staging slot, and a save without G3 (its victim's slot frees at once), are evicted for
  // here: without a staging slot the engine recomputes the block.
  if (use == SlotUse::kSave && g3_) return slot;
  for (int round = 0; !slot && round < 4; ++round) {
    if (demotions_in_flight_.load() >= MaxDemotions()) break;
    if (!EvictFromG2(ns)) break;
    slot = g2_->Allocate();
  }
  return slot;
}

void BlockManagerImpl::StartG2Reserve() {
  // Saves wait for a slot and no demotion is in flight to free one: evict for them and for a
  // reserve of free slots, so the next saves and staged loads find one without waiting for a
  // demotion write, until a demotion starts (the deferred saves then wait for it) or enough
  // slots are free. At most as many evictions as slots were short at the start (a victim that
  // goes to G4 instead frees its slot only when that write ends, which G2SlotsShort does not
  // count). Only for deferred saves: evicting for free slots that loads hold for staging (they
  // come back by themselves) pushed blocks G3 had no room for out of the cache
  // (ManagerMetrics.HistogramCountsEqualTheOperationsDone). Without G3 a save evicts for
  // itself (its victim's slot frees at once).
  if (!g3_ || demotions_in_flight_.load() != 0) return;
  {
    MutexLock lock(&mu_);
    if (deferred_saves_.empty()) return;
  }
  const int64_t short_at_start = G2SlotsShort();
  for (int64_t i = 0; i < short_at_start && G2SlotsShort() > 0; ++i) {
    if (!EvictFromG2(last_alloc_ns_.load(std::memory_order_relaxed))) return;
    if (demotions_in_flight_.load() != 0) return;
  }
}

int64_t BlockManagerImpl::G2SlotsShort() {
  size_t deferred;
  {
    MutexLock lock(&mu_);
    deferred = deferred_saves_.size();
  }
  const uint32_t in_flight = demotions_in_flight_.load();
  if (in_flight >= MaxDemotions()) return 0;
  const int64_t coming = int64_t{g2_->free_slots()} + in_flight;
  return int64_t{G2Reserve()} + static_cast<int64_t>(deferred) - coming;
}

}  // namespace kvtier

// BlockManagerImpl, the G4 part: opening the store, the Lookup query, write-through and
// eviction writes. The design and its reasons: docs/g4.md.
#include <string>

#include "core/log.h"
#include "manager/block_manager_impl.h"
#include "tier/cond_wait.h"

namespace kvtier {

Status BlockManagerImpl::InitG4() {
  KVTIER_ASSIGN_OR_RETURN(g4_, G4Path::Open(settings_.g4, layout_.BlockBytes(), tpb_, wrap_g4_));
  if (!g4_) return Status::Ok();
  // A G4 load abandoned at its deadline lends its staging slot to the store's call until the
  // call returns (TransferJob::SlotLent); then it is free again.
  Status s = engine_->RegisterRemote(
      g4_->store(), g4_->EngineConfig([this](uint32_t slot) { ReleaseG2Slot(slot); }));
  if (!s.ok()) {
    g4_.reset();
    return s;
  }
  g4_->StartRemover();
  KVTIER_LOG(kInfo) << "G4: " << g4_->store()->Describe()
                    << (g4_->write_through() ? " (write-through)" : " (fed by eviction)");
  return Status::Ok();
}

std::optional<BlockManagerImpl::G4Write> BlockManagerImpl::PrepareWriteThrough(
    const BlockKey& key, const BlockKey& parent, uint32_t slot) {
  if (!g4_ || !g4_->write_through()) return std::nullopt;
  if (!((slots_->StoreTiers(slot) >> kTierG4) & 1u)) return std::nullopt;
  if (!index_->Pin(key).ok()) return std::nullopt;
  // Pinned now, so it cannot leave G2; but it may have left before the pin (evicted, its slot
  // reused): then there is nothing to write from.
  const std::optional<BlockInfo> info = index_->Get(key);
  if (!info || !info->InTier(kTierG2) || info->slot[kTierG2] != slot) {
    Status s = index_->Unpin(std::span<const BlockKey>(&key, 1));
    if (!s.ok()) KVTIER_LOG(kError) << "internal: " << s.ToString();
    return std::nullopt;
  }
  G4Write w;
  w.key = key;
  w.parent = parent;
  w.g2_slot = slot;
  {
    G2SlotTable::WriteRecord r = slots_->CopyForWrite(slot);
    w.namespace_id = r.namespace_id;
    w.expected_checksum = r.commit_checksum;
    w.tokens = std::move(r.tokens);
  }
  return w;
}

void BlockManagerImpl::SubmitG4Writes(std::vector<G4Write> writes) {
  if (writes.empty()) return;
  std::vector<BlockTransfer> moves;
  moves.reserve(writes.size());
  for (const G4Write& w : writes) {
    BlockTransfer m;
    m.op = BlockTransfer::Op::kG2ToG4;
    m.key = w.key;
    m.parent = w.parent;
    m.namespace_id = w.namespace_id;
    m.tokens = w.tokens;
    m.g2_slot = w.g2_slot;
    m.expected_checksum = w.expected_checksum;
    moves.push_back(std::move(m));
  }
  auto shared = std::make_shared<std::vector<G4Write>>(std::move(writes));
  // What a G4 write holds until it ends: an evicted block's G2 slot (and its demotion), or a
  // written-through block's pin.
  auto release = [this](const G4Write& w) {
    if (w.evicted) {
      ReleaseG2Slot(w.g2_slot);
      EndDemotion();
    } else {
      Status u = index_->Unpin(std::span<const BlockKey>(&w.key, 1));
      if (!u.ok()) KVTIER_LOG(kError) << "internal: " << u.ToString();
    }
    EndG4Write();
  };
  auto end_one = [this, release](const G4Write& w, const Status& s) {
    if (s.ok()) {
      g4_->Written(w.key);  // the object is whole again: offerable
      Emit({StoredEvent(w.key, w.parent, kTierG4, w.namespace_id, w.tokens)});
    } else {
      g4_->WriteFailed();
    }
    release(w);
  };
  auto job = engine_->Submit(std::move(moves), TransferPriority::kSave,
                             [shared, end_one](const TransferJob&, size_t i, const Status& s) {
                               end_one((*shared)[i], s);
                             });
  if (!job.ok()) {
    // The G4 save queue is full (a slow or dead server): dropped, never waited for.
    g4_->Dropped(shared->size());
    for (const G4Write& w : *shared) release(w);
  }
}

bool BlockManagerImpl::DemoteToG4(const EvictedBlock& victim) {
  if (!g4_ || g4_->write_through()) return false;
  if (!((slots_->StoreTiers(victim.slot) >> kTierG4) & 1u)) return false;
  G4Write w;
  w.key = victim.key;
  w.parent = victim.parent;
  w.g2_slot = victim.slot;
  w.evicted = true;
  {
    G2SlotTable::WriteRecord r = slots_->CopyForWrite(victim.slot);
    w.namespace_id = r.namespace_id;
    // Written only if the slot still holds what its commit saved (kvtier serve: an engine may
    // have written into it since).
    w.expected_checksum = r.commit_checksum;
    w.tokens = std::move(r.tokens);
  }
  demotions_in_flight_.fetch_add(1);
  g4_->BeginWrite();
  std::vector<G4Write> one;
  one.push_back(std::move(w));
  SubmitG4Writes(std::move(one));
  return true;
}

void BlockManagerImpl::WriteEvictedToG4(uint32_t slot, const BlockKey& key,
                                        const BlockKey& parent) {
  G4Write w;
  w.key = key;
  w.parent = parent;
  w.g2_slot = slot;
  w.evicted = true;  // SubmitG4Writes frees the slot and ends the demotion
  {
    G2SlotTable::WriteRecord r = slots_->CopyForWrite(slot);
    w.namespace_id = r.namespace_id;
    w.expected_checksum = r.commit_checksum;
    w.tokens = std::move(r.tokens);
  }
  g4_->BeginWrite();
  std::vector<G4Write> one;
  one.push_back(std::move(w));
  SubmitG4Writes(std::move(one));
}

void BlockManagerImpl::EndG4Write() {
  MutexLock lock(&mu_);
  g4_->EndWrite();
  saves_cv_.notify_all();
}

}  // namespace kvtier

// BlockManagerImpl, the G4 part: opening the store, the Lookup query, write-through and
// eviction writes. The design and its reasons: docs/g4.md.
#include <string>

#include "core/log.h"
#include "manager/block_manager_impl.h"
#include "tier/cond_wait.h"

namespace kvtier {

Status BlockManagerImpl::InitG4() {
  const G4Options& cfg = settings_.g4;
  if (cfg.backend == G4Options::Backend::kNone) return Status::Ok();
  const std::string backend = G4Options::BackendName(cfg.backend);
  g4_write_through_ = cfg.write_through;
  g4_lookup_deadline_ = std::chrono::milliseconds(cfg.lookup_deadline_ms);
  const double load_gbps = cfg.load_gbps;
  const double recompute_tps = cfg.recompute_tokens_per_s;
  if (load_gbps > 0 && recompute_tps > 0) {
    const double load_s = static_cast<double>(layout_.BlockBytes()) / (load_gbps * 1e9);
    const double recompute_s = static_cast<double>(tpb_) / recompute_tps;
    g4_slower_than_recompute_ = load_s >= recompute_s;
    KVTIER_LOG(kInfo) << "G4: a block loads in an estimated " << load_s * 1e3
                      << " ms and recomputes in " << recompute_s * 1e3 << " ms: G4 blocks are "
                      << (g4_slower_than_recompute_ ? "NOT offered (recompute is faster)"
                                                    : "offered");
  } else if (load_gbps > 0 || recompute_tps > 0) {
    KVTIER_LOG(kWarn) << "g4.load_gbps and g4.recompute_tokens_per_s work together; only one "
                         "is set, so G4 blocks are always offered. Set both, or neither";
  }

  Result<std::unique_ptr<RemoteStore>> opened = Status::Unavailable("no backend");
  // G4Options::Validate refused fs without a dir and redis without endpoints.
  if (cfg.backend == G4Options::Backend::kFs) {
    FsStoreOptions fo;
    fo.dir = cfg.dir;
    opened = OpenFsStore(fo);
  } else {
    RedisStoreOptions ro;
    ro.endpoints = cfg.endpoints;
    ro.cluster = cfg.cluster;
    ro.username = cfg.username;
    ro.password = cfg.password;
    ro.connections_per_node = std::max<uint32_t>(ro.connections_per_node, cfg.threads);
    ro.max_pipeline_bytes = uint64_t{cfg.redis_pipeline_kib} << 10;
    opened = OpenRedisStore(ro);
    // A malformed endpoint is the operator's mistake: refuse to start rather than run without.
    if (!opened.ok() && opened.status().Is(StatusCode::kInvalidArgument)) return opened.status();
  }
  if (!opened.ok()) {
    KVTIER_LOG(kWarn) << "G4 (" << backend << ") could not open: " << opened.status().ToString()
                      << "; running without the networked tier";
    return Status::Ok();
  }
  if (wrap_g4_) opened = wrap_g4_(std::move(opened).value());
  TransferEngine::RemoteConfig rc;
  rc.threads = cfg.threads;
  rc.max_queued_saves = cfg.max_queued_saves;
  rc.load_timeout = std::chrono::milliseconds(cfg.load_deadline_ms);
  rc.save_timeout = std::chrono::milliseconds(cfg.save_deadline_ms);
  // A G4 load abandoned at its deadline lends its staging slot to the store's call until the
  // call returns (TransferJob::SlotLent); then it is free again.
  rc.release_lent_slot = [this](uint32_t slot) { ReleaseG2Slot(slot); };
  KVTIER_RETURN_IF_ERROR(engine_->RegisterRemote(opened->get(), rc));
  g4_ = std::move(opened).value();
  G4Remover::Options removal;
  removal.deadline = rc.save_timeout;
  // Only what is still remembered as bad: a block written to G4 again since is whole.
  g4_remover_ = std::make_unique<G4Remover>(
      g4_.get(), removal, [this](const BlockKey& key) { return g4_rejected_.Contains(key); });
  KVTIER_LOG(kInfo) << "G4: " << g4_->Describe()
                    << (g4_write_through_ ? " (write-through)" : " (fed by eviction)");
  return Status::Ok();
}

uint32_t BlockManagerImpl::MatchInG4(std::span<const BlockKey> keys, uint64_t namespace_id) {
  if (!g4_ || keys.empty()) return 0;
  // Never past a block whose object failed a load of ours (not even asked about).
  keys = keys.first(g4_rejected_.FirstIn(keys));
  if (keys.empty()) return 0;
  std::vector<std::string> names;
  names.reserve(keys.size());
  for (const BlockKey& k : keys) names.push_back(RemoteObjectName(namespace_id, k));
  std::vector<uint8_t> present(keys.size(), 0);
  const Status s = g4_->Contains(names, RemoteClock::now() + g4_lookup_deadline_, present);
  if (!s.ok()) {
    c_.g4_lookup_failures.fetch_add(1, std::memory_order_relaxed);
    if (s.Is(StatusCode::kTimedOut)) c_.g4_lookup_timeouts.fetch_add(1, std::memory_order_relaxed);
    KVTIER_LOG(kDebug) << "G4 lookup: " << s.ToString() << " (a miss)";
    return 0;
  }
  uint32_t n = 0;
  while (n < present.size() && present[n] != 0) ++n;
  return n;
}

std::optional<BlockManagerImpl::G4Write> BlockManagerImpl::PrepareWriteThrough(
    const BlockKey& key, const BlockKey& parent, uint32_t slot) {
  if (!g4_ || !g4_write_through_) return std::nullopt;
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
      c_.g4_saved.fetch_add(1, std::memory_order_relaxed);
      g4_rejected_.Forget(w.key);  // the object is whole again: offerable
      Emit({StoredEvent(w.key, w.parent, kTierG4, w.namespace_id, w.tokens)});
    } else {
      c_.g4_save_failures.fetch_add(1, std::memory_order_relaxed);
    }
    release(w);
  };
  auto job = engine_->Submit(std::move(moves), TransferPriority::kSave,
                             [shared, end_one](const TransferJob&, size_t i, const Status& s) {
                               end_one((*shared)[i], s);
                             });
  if (!job.ok()) {
    // The G4 save queue is full (a slow or dead server): dropped, never waited for.
    c_.g4_dropped.fetch_add(shared->size(), std::memory_order_relaxed);
    for (const G4Write& w : *shared) release(w);
  }
}

bool BlockManagerImpl::DemoteToG4(const EvictedBlock& victim) {
  if (!g4_ || g4_write_through_) return false;
  if (!((slots_->StoreTiers(victim.slot) >> kTierG4) & 1u)) return false;
  G4Write w;
  w.key = victim.key;
  w.parent = victim.parent;
  w.g2_slot = victim.slot;
  w.evicted = true;
  {
    G2SlotTable::WriteRecord r = slots_->CopyForWrite(victim.slot);
    w.namespace_id = r.namespace_id;
    w.tokens = std::move(r.tokens);
  }
  demotions_in_flight_.fetch_add(1);
  g4_writes_in_flight_.fetch_add(1);
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
  g4_writes_in_flight_.fetch_add(1);
  std::vector<G4Write> one;
  one.push_back(std::move(w));
  SubmitG4Writes(std::move(one));
}

void BlockManagerImpl::RejectG4Load(const PlannedLoad& p, const Status& st) {
  if (!st.Is(StatusCode::kCorruption) && !st.Is(StatusCode::kNotFound)) return;  // transient
  g4_rejected_.Add(p.key);
  if (st.Is(StatusCode::kCorruption) && g4_remover_) {
    g4_remover_->Enqueue(RemoteObjectName(p.namespace_id, p.key), p.key);
  }
}

void BlockManagerImpl::EndG4Write() {
  MutexLock lock(&mu_);
  g4_writes_in_flight_.fetch_sub(1);
  saves_cv_.notify_all();
}

}  // namespace kvtier

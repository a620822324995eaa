// BlockManagerImpl: construction and start-up (tiers, policies, metrics, the event
// publisher), Stats. The other parts: block_manager_{tiers,lookup,save,requests,g4}.cc, and the
// parts with their own state: g2_slot_table.cc, manager_events.cc.
#include <algorithm>
#include <cassert>
#include <chrono>
#include <string>

#include "core/log.h"
#include "manager/block_manager_impl.h"
#include "transfer/block_copy.h"

namespace kvtier {

// ---------------------------------------------------------------------------------------------
// Construction

BlockManagerImpl::BlockManagerImpl(const ManagerOptions& options)
    : options_(options), layout_(options.layout), tpb_(options.layout.tokens_per_block) {}

Result<std::unique_ptr<BlockManagerImpl>> BlockManagerImpl::Create(
    const ManagerOptions& options, const DiskTier::OpenOptions& g3_open, WrapG4 wrap_g4,
    DeviceBackendFactory device_backend, bool shared_g2) {
  KVTIER_RETURN_IF_ERROR(options.layout.Validate());
  if (options.model_id.empty()) {
    return Status::InvalidArgument(
        "ManagerOptions.model_id is empty; name the model, so keys of "
        "different models never collide");
  }
  // The settings, typed and checked, once: nothing below reads options.config again.
  KVTIER_ASSIGN_OR_RETURN(ManagerSettings settings, ManagerSettings::FromConfig(options.config));
  for (const std::string& warning : options.config.Warnings()) KVTIER_LOG(kWarn) << warning;
  std::unique_ptr<BlockManagerImpl> impl(new BlockManagerImpl(options));
  impl->settings_ = std::move(settings);
  impl->wrap_g4_ = std::move(wrap_g4);
  impl->device_backend_ = std::move(device_backend);
  impl->shared_g2_ = shared_g2;
  KVTIER_RETURN_IF_ERROR(impl->Init(g3_open));
  return impl;
}

Status BlockManagerImpl::Init(const DiskTier::OpenOptions& g3_open) {
  const ManagerSettings& cfg = settings_;
  algorithm_ = cfg.requests.hash;
  hashers_ = std::make_unique<HasherCache>(options_.model_id, layout_.Fingerprint(), tpb_,
                                           algorithm_, cfg.requests.max_namespaces);
  events_ = std::make_unique<ManagerEvents>(tpb_, hashers_.get());

  HostArena::Config g2;
  g2.capacity_bytes = cfg.g2.capacity_bytes;
  g2.slot_bytes = G2PayloadOffset(layout_) + layout_.BlockBytes();
  g2.hugepages = cfg.g2.hugepages;
  g2.lock_memory = cfg.g2.lock_memory;
  g2.prefault_threads = cfg.g2.prefault_threads;
  g2.shared = shared_g2_;
  if (g2.capacity_bytes < (g2.slot_bytes + 4095) / 4096 * 4096) {
    return Status::InvalidArgument("g2.capacity_bytes = " + std::to_string(g2.capacity_bytes) +
                                   " holds no block of this layout (" +
                                   std::to_string(g2.slot_bytes) +
                                   " bytes with its header area); raise it");
  }
  KVTIER_ASSIGN_OR_RETURN(g2_, HostArena::Create(g2));
  slots_ = std::make_unique<G2SlotTable>(g2_->num_slots(), tpb_, cfg.g2.namespace_share);

  std::vector<RecoveredBlock> recovered;
  if (cfg.g3.enabled) {
    DiskTier::Config dc;
    dc.dir = cfg.g3.dir;
    dc.capacity_bytes = cfg.g3.capacity_bytes;
    dc.payload_bytes = layout_.BlockBytes();
    dc.header_bytes = G2PayloadOffset(layout_);
    dc.layout_fingerprint = layout_.Fingerprint();
    dc.num_files = cfg.g3.files;
    dc.queue_depth = cfg.g3.queue_depth;
    dc.quarantine_after_errors = cfg.g3.quarantine_after_errors;
    dc.reprobe_interval_ms = cfg.g3.reprobe_interval_ms;
    // Frequency admission is the manager's (it sees every use); the tier keeps only the budget.
    dc.admission.min_seen = 1;
    dc.admission.write_budget_bytes_per_s = cfg.g3.write_budget_bytes_per_s;
    DiskTier::OpenOptions open = g3_open;
    if (!open.recovery_progress) open.recovery_progress = options_.g3_recovery_progress;
    auto opened = DiskTier::Open(dc, open);
    if (opened.ok()) {
      g3_ = std::move(opened->tier);
      recovered = std::move(opened->recovered);
    } else if (cfg.g3.dir_set) {
      // A directory the user named is a tier the user asked for: it must not vanish silently
      // (a disk tier that disappears at a restart is a complaint DESIGN.md lists).
      std::string origin = "set explicitly";
      if (!cfg.g3.dir_origin.empty()) origin += ", from " + cfg.g3.dir_origin;
      return Status(opened.status().code(),
                    "G3 cannot open in g3.dir = " + dc.dir + " (" + origin +
                        "): " + opened.status().message() +
                        "; fix that directory, set g3.dir to one kvtier can use, or set "
                        "g3.enabled = false to run without the SSD tier");
    } else {
      KVTIER_LOG(kWarn) << "G3 is off: it could not open in the default g3.dir " << dc.dir << " ("
                        << opened.status().ToString()
                        << "); kvtier runs on G2 alone. Set g3.dir to a directory it can use "
                           "for the SSD tier, or g3.enabled = false to run without it";
    }
  }

  std::vector<uint32_t> staging;
  if (g3_ || cfg.g4.backend != G4Options::Backend::kNone) {
    // The staging pool (see block_manager_impl.h). Only a tier below G2 (G3, G4) needs it.
    uint64_t target = cfg.g2.staging_slots;
    if (target == 0) target = std::clamp<uint32_t>(g2_->num_slots() / 16, 4, 64);
    target = std::min<uint64_t>(target, g2_->num_slots() / 2);
    for (uint64_t i = 0; i < target; ++i) {
      std::optional<uint32_t> slot = g2_->Allocate();
      if (!slot) break;
      staging.push_back(*slot);
    }
    staging_slots_ = static_cast<uint32_t>(staging.size());
  }

  BlockIndex::Config ic;
  ic.num_shards = cfg.index.shards;
  ic.tiers[kTierG2].policy = cfg.index.g2.kind;
  ic.tiers[kTierG2].capacity_blocks = g2_->num_slots() - staging_slots_;
  ic.tiers[kTierG3].policy = cfg.index.g3.kind;
  ic.tiers[kTierG3].capacity_blocks = g3_ ? g3_->num_slots() : 0;
  ic.tiers[kTierG2].options = cfg.index.g2.options;
  ic.tiers[kTierG3].options = cfg.index.g3.options;
  KVTIER_ASSIGN_OR_RETURN(index_, BlockIndex::Create(ic));

  AdmissionFilter::Config fc;
  fc.min_seen = cfg.g3.admit_min_seen;
  fc.expected_keys = std::max<uint64_t>(4096, 4ull * (g3_ ? g3_->num_slots() : 0));
  KVTIER_ASSIGN_OR_RETURN(g3_filter_, AdmissionFilter::Create(fc));
  if (const double w = cfg.g3.admit_max_writes_per_hit; g3_ && w > 0 && fc.min_seen > 1) {
    FirstSightingGate::Config gc;
    gc.max_writes_per_hit = w;
    gc.horizon = std::max<uint64_t>(1024, g3_->num_slots());
    auto gate = FirstSightingGate::Create(gc);
    if (!gate.ok()) {
      return Status::InvalidArgument("g3.admit_max_writes_per_hit: " + gate.status().message());
    }
    g3_gate_ = std::move(*gate);
  }

  {
    MutexLock lock(&mu_);  // no other thread yet; the table is mu_'s
    requests_.set_idle_ttl(std::chrono::milliseconds(cfg.requests.idle_request_ttl_ms));
  }
  // Deferred saves hold their requests' G1 blocks: never more of them than G2's cache holds.
  max_defer_ = std::chrono::milliseconds(cfg.transfer.max_defer_ms);
  max_deferred_saves_ = static_cast<uint32_t>(
      std::min<uint64_t>(cfg.transfer.max_queued_saves, g2_->num_slots() - staging_slots_));
  TransferEngine::Config tc;
  tc.copy_threads = cfg.transfer.copy_threads;
  tc.max_queued_saves = cfg.transfer.max_queued_saves;
  tc.stream_load_bytes = StreamLoadBytes(cfg.transfer.load_stores);
  tc.device_backend_factory = device_backend_;
  KVTIER_ASSIGN_OR_RETURN(engine_, TransferEngine::Create(tc));
  KVTIER_RETURN_IF_ERROR(engine_->RegisterHostArena(g2_.get(), layout_));
  if (!staging.empty()) KVTIER_RETURN_IF_ERROR(engine_->RegisterStagingSlots(std::move(staging)));
  KVTIER_RETURN_IF_ERROR(InitG4());
  if (g3_) {
    Status s = engine_->RegisterDisk(g3_.get());
    if (!s.ok()) {
      KVTIER_LOG(kWarn) << "G3 left out: " << s.ToString();
      g3_.reset();
    }
  }
  KVTIER_RETURN_IF_ERROR(events_->StartPublisher(cfg.events));
  if (g3_) {
    // Warm restart: what G3 held before is servable again. Its headers hold each block's
    // tokens; the names of its namespace are not known yet (namespace_known = false).
    std::vector<KvEvent> stored;
    for (const RecoveredBlock& b : recovered) {
      if (index_->Insert(b.key, b.parent, kTierG3, b.slot).ok()) {
        stored.push_back(events_->Stored(b.key, b.parent, kTierG3, b.namespace_id, b.tokens,
                                         /*always=*/true));
      }
    }
    // For the first subscriber, and the wire, right after its AllBlocksCleared.
    events_->SetRecovered(std::move(stored));
    KVTIER_LOG(kInfo) << "G3: " << recovered.size() << " blocks recovered from " << cfg.g3.dir;
  }
  return InitMetrics();
}

Status BlockManagerImpl::InitMetrics() {
  ManagerMetrics::Sources sources;
  sources.stats = [this] { return Stats(); };
  sources.queues = [this] {
    ManagerMetrics::Queues q;
    q.queued_saves = engine_->queued_saves();
    q.demotions_in_flight = demotions_in_flight_.load(std::memory_order_relaxed);
    q.g4_writes_in_flight = g4_ ? g4_->writes_in_flight() : 0;
    return q;
  };
  sources.block_bytes = layout_.BlockBytes();
  KVTIER_ASSIGN_OR_RETURN(metrics_, ManagerMetrics::Create(settings_.metrics, std::move(sources)));
  if (!metrics_) return Status::Ok();
  engine_->SetIoObserver([m = metrics_.get()](TierId tier, bool write, std::chrono::nanoseconds t) {
    if (Histogram* h = m->io[tier][write ? 1 : 0]) {
      h->ObserveNanos(std::chrono::duration_cast<std::chrono::nanoseconds>(t).count());
    }
  });
  KVTIER_LOG(kInfo) << "metrics: serving /metrics on " << settings_.metrics.bind << ":"
                    << metrics_->port();
  return Status::Ok();
}

BlockManagerImpl::~BlockManagerImpl() {
  // No scrape may read the tiers while they close. The histograms stay until the members go
  // (after engine_, below): the flush and the drain still record I/O into them.
  if (metrics_) metrics_->StopServer();
  if (g3_ && settings_.g3.flush_on_close) FlushG2ToG3();
  // With G4, a completion submits the next move through engine_: a save's completion submits
  // its write-through G4 write, a demotion's its G4 write. Those chains must end while engine_
  // is whole; unique_ptr::reset nulls the pointer before the destructor drains, so a chain still
  // running then would call through a null engine_ (TSan caught it under load).
  if (g4_ != nullptr) WaitForSaves();
  // The engine drains first: its callbacks use the index, the arena and the request table.
  engine_.reset();
  if (g4_) g4_->StopRemover();  // its thread calls the store; what is still queued is dropped
  if (g3_) {
    Status s = g3_->Close();
    if (!s.ok()) KVTIER_LOG(kWarn) << "G3 close: " << s.ToString();
  }
  // Nothing emits any more: the publisher sends what is queued and stops.
  events_.reset();
}

KvEvent BlockManagerImpl::G2StoredEvent(uint32_t slot, const BlockKey& key,
                                        const BlockKey& parent) const {
  if (!events_->wanted()) return Event(KvEvent::Kind::kStored, key, parent, kTierG2);
  const G2SlotTable::WriteRecord r = slots_->CopyForWrite(slot);
  return StoredEvent(key, parent, kTierG2, r.namespace_id, r.tokens);
}

// ---------------------------------------------------------------------------------------------
// Stats

ManagerStats BlockManagerImpl::Stats() {
  ManagerStats s;
  s.lookups = c_.lookups.load();
  s.lookup_blocks = c_.lookup_blocks.load();
  for (TierId t = 0; t < kNumTiers; ++t) s.hit_blocks[t] = c_.hit_blocks[t].load();
  s.miss_blocks = c_.miss_blocks.load();
  s.load_failures = c_.load_failures.load();
  s.saved_blocks = c_.saved.load();
  s.dedup_blocks = c_.dedup.load();
  s.dropped_saves = c_.dropped_saves.load();
  s.demoted_blocks = c_.demoted.load();
  s.demotions_not_admitted = c_.not_admitted.load();
  s.demotions_first_sighting = c_.first_sighting.load();
  s.g3_admitting_first_sightings = g3_gate_ && g3_gate_->counts().open;
  s.demotion_failures = c_.demotion_failures.load();
  s.evicted_blocks_g2 = c_.evicted_g2.load();
  s.evicted_blocks_g3 = c_.evicted_g3.load();
  s.promoted_blocks = c_.promoted.load();
  s.corrupt_blocks = c_.corrupt.load();
  s.events_emitted = events_->emitted();
  events_->AddPublisherStats(&s);
  const TransferEngine::Stats ts = engine_->stats();
  s.bytes_by_path = ts.bytes_by_op;
  s.g2_blocks = index_->TierCount(kTierG2);
  s.g2_slots = g2_->num_slots();
  s.g2_free_slots = g2_->free_slots();
  s.g2_staging_slots = staging_slots_;
  s.staged_via_pool = c_.staged_via_pool.load();
  s.deferred_saves = c_.deferred.load();
  if (g3_) {
    const DiskTierStats ds = g3_->stats();
    s.g3_blocks = index_->TierCount(kTierG3);
    s.g3_slots = g3_->num_slots();
    s.g3_quarantines = ds.quarantines;
    s.g3_quarantined = ds.quarantined;
    s.corrupt_blocks = std::max<uint64_t>(s.corrupt_blocks, ds.verify_failures);
  }
  s.pinned_blocks = index_->TotalPins();
  if (g4_) g4_->FillStats(&s);
  s.g4_timeouts = ts.remote_timeouts;
  s.g4_abandoned_loads = ts.remote_abandoned;
  s.g4_late_returns = ts.remote_late_returns;
  s.expired_requests = c_.expired_requests.load();
  {
    MutexLock lock(&mu_);
    s.tracked_requests = requests_.size();
  }
  return s;
}

}  // namespace kvtier

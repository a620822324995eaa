#include <time.h>

#include <algorithm>
#include <cassert>
#include <chrono>
#include <string>

#include "core/log.h"
#include "events/event_publisher.h"
#include "manager/block_manager_impl.h"
#include "tier/cond_wait.h"

namespace kvtier {

namespace {

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// A Lookup repeated within this time reuses the G4 answer of the last one (vLLM asks again
// for every request it cannot schedule yet; each fresh answer is a round trip).
constexpr auto kG4LookupReuse = std::chrono::seconds(1);

// Idle request entries one Lookup drops at most (the sweep's bound per call).
constexpr int kSweepBatch = 64;

Result<PolicyKind> PolicyFromConfig(const Config& config, const char* field) {
  return ParsePolicyKind(config.GetString(field));
}

// The policy settings of tier `tier` ("g2"): its gN.credit_lru.* and gN.adaptive.* fields. The
// config has checked each value's range; BlockIndex validates them again for the tier's kind.
// InvalidArgument naming the key when AdaptiveConfig refuses a value the schema let through.
Result<PolicyOptions> PolicyOptionsFromConfig(const Config& config, const std::string& tier) {
  PolicyOptions options;
  for (const char* field : CreditLruConfig::kFieldNames) {
    Status s = options.credit_lru.Set(field, config.GetDouble(tier + ".credit_lru." + field));
    assert(s.ok() && "every CreditLruConfig field has a config key");
    (void)s;
  }
  for (const char* field : AdaptiveConfig::kFieldNames) {
    const std::string key = tier + ".adaptive." + field;
    if (Status s = options.adaptive.Set(field, config.GetDouble(key)); !s.ok()) {
      return Status::InvalidArgument(key + ": " + s.message());
    }
  }
  return options;
}

}  // namespace

const char* KvEventKindName(KvEvent::Kind kind) {
  return kind == KvEvent::Kind::kStored ? "stored" : "removed";
}

// ---------------------------------------------------------------------------------------------
// Construction

BlockManager::Impl::Impl(const ManagerOptions& options)
    : options_(options), layout_(options.layout), tpb_(options.layout.tokens_per_block) {}

Result<std::unique_ptr<BlockManager::Impl>> BlockManager::Impl::Create(
    const ManagerOptions& options, const DiskTier::OpenOptions& g3_open, WrapG4 wrap_g4,
    DeviceBackendFactory device_backend, bool shared_g2) {
  KVTIER_RETURN_IF_ERROR(options.layout.Validate());
  if (options.model_id.empty()) {
    return Status::InvalidArgument(
        "ManagerOptions.model_id is empty; name the model, so keys of "
        "different models never collide");
  }
  std::unique_ptr<Impl> impl(new Impl(options));
  impl->wrap_g4_ = std::move(wrap_g4);
  impl->device_backend_ = std::move(device_backend);
  impl->shared_g2_ = shared_g2;
  KVTIER_RETURN_IF_ERROR(impl->Init(g3_open));
  return impl;
}

Status BlockManager::Impl::Init(const DiskTier::OpenOptions& g3_open) {
  const Config& cfg = options_.config;
  KVTIER_ASSIGN_OR_RETURN(algorithm_, ParseHashAlgorithm(cfg.GetString("hash.algorithm")));

  HostArena::Config g2;
  g2.capacity_bytes = cfg.GetBytes("g2.capacity_bytes");
  g2.slot_bytes = kG2PayloadOffset + layout_.BlockBytes();
  g2.hugepages = cfg.GetBool("g2.hugepages");
  g2.lock_memory = cfg.GetBool("g2.lock_memory");
  g2.prefault_threads = static_cast<uint32_t>(cfg.GetUint("g2.prefault_threads"));
  g2.shared = shared_g2_;
  if (g2.capacity_bytes < (g2.slot_bytes + 4095) / 4096 * 4096) {
    return Status::InvalidArgument("g2.capacity_bytes = " + std::to_string(g2.capacity_bytes) +
                                   " holds no block of this layout (" +
                                   std::to_string(g2.slot_bytes) +
                                   " bytes with its header area); raise it");
  }
  KVTIER_ASSIGN_OR_RETURN(g2_, HostArena::Create(g2));
  {
    MutexLock lock(&slot_mu_);
    slot_meta_.resize(g2_->num_slots());
    slot_tokens_.resize(size_t{g2_->num_slots()} * tpb_);
  }
  ns_share_ = cfg.GetDouble("g2.namespace_share");
  {
    MutexLock lock(&ns_mu_);
    slot_ns_.assign(g2_->num_slots(), 0);
  }

  std::vector<RecoveredBlock> recovered;
  if (cfg.GetBool("g3.enabled")) {
    DiskTier::Config dc;
    dc.dir = cfg.GetString("g3.dir");
    dc.capacity_bytes = cfg.GetBytes("g3.capacity_bytes");
    dc.payload_bytes = layout_.BlockBytes();
    dc.layout_fingerprint = layout_.Fingerprint();
    dc.num_files = static_cast<uint32_t>(cfg.GetUint("g3.files"));
    dc.queue_depth = static_cast<uint32_t>(cfg.GetUint("g3.queue_depth"));
    dc.quarantine_after_errors = static_cast<uint32_t>(cfg.GetUint("g3.quarantine_after_errors"));
    dc.reprobe_interval_ms = static_cast<uint32_t>(cfg.GetUint("g3.reprobe_interval_ms"));
    // Frequency admission is the manager's (it sees every use); the tier keeps only the budget.
    dc.admission.min_seen = 1;
    dc.admission.write_budget_bytes_per_s = cfg.GetBytes("g3.write_budget_bytes_per_s");
    DiskTier::OpenOptions open = g3_open;
    if (!open.recovery_progress) open.recovery_progress = options_.g3_recovery_progress;
    auto opened = DiskTier::Open(dc, open);
    if (opened.ok()) {
      g3_ = std::move(opened->tier);
      recovered = std::move(opened->recovered);
    } else if (cfg.IsSet("g3.dir")) {
      // A directory the user named is a tier the user asked for: it must not vanish silently
      // (a disk tier that disappears at a restart is a complaint DESIGN.md lists).
      std::string origin = "set explicitly";
      for (const ConfigEntry& e : cfg.Entries()) {
        if (e.spec->name == "g3.dir" && !e.origin.empty()) origin += ", from " + e.origin;
      }
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
  if (g3_ || cfg.GetString("g4.backend") != "none") {
    // The staging pool (see block_manager_impl.h). Only a tier below G2 (G3, G4) needs it.
    uint64_t target = cfg.GetUint("g2.staging_slots");
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
  ic.num_shards = static_cast<uint32_t>(cfg.GetUint("index.shards"));
  KVTIER_ASSIGN_OR_RETURN(ic.tiers[kTierG2].policy, PolicyFromConfig(cfg, "g2.policy"));
  ic.tiers[kTierG2].capacity_blocks = g2_->num_slots() - staging_slots_;
  KVTIER_ASSIGN_OR_RETURN(ic.tiers[kTierG3].policy, PolicyFromConfig(cfg, "g3.policy"));
  ic.tiers[kTierG3].capacity_blocks = g3_ ? g3_->num_slots() : 0;
  KVTIER_ASSIGN_OR_RETURN(ic.tiers[kTierG2].options, PolicyOptionsFromConfig(cfg, "g2"));
  KVTIER_ASSIGN_OR_RETURN(ic.tiers[kTierG3].options, PolicyOptionsFromConfig(cfg, "g3"));
  for (const std::string& warning : cfg.Warnings()) KVTIER_LOG(kWarn) << warning;
  KVTIER_ASSIGN_OR_RETURN(index_, BlockIndex::Create(ic));

  AdmissionFilter::Config fc;
  fc.min_seen = static_cast<uint32_t>(cfg.GetUint("g3.admit_min_seen"));
  fc.expected_keys = std::max<uint64_t>(4096, 4ull * (g3_ ? g3_->num_slots() : 0));
  KVTIER_ASSIGN_OR_RETURN(g3_filter_, AdmissionFilter::Create(fc));
  if (const double w = cfg.GetDouble("g3.admit_max_writes_per_hit");
      g3_ && w > 0 && fc.min_seen > 1) {
    FirstSightingGate::Config gc;
    gc.max_writes_per_hit = w;
    gc.horizon = std::max<uint64_t>(1024, g3_->num_slots());
    auto gate = FirstSightingGate::Create(gc);
    if (!gate.ok()) {
      return Status::InvalidArgument("g3.admit_max_writes_per_hit: " + gate.status().message());
    }
    g3_gate_ = std::move(*gate);
  }

  idle_ttl_ = std::chrono::milliseconds(cfg.GetUint("manager.idle_request_ttl_ms"));
  // Deferred saves hold their requests' G1 blocks: never more of them than G2's cache holds.
  max_defer_ = std::chrono::milliseconds(cfg.GetUint("transfer.max_defer_ms"));
  max_deferred_saves_ = static_cast<uint32_t>(std::min<uint64_t>(
      cfg.GetUint("transfer.max_queued_saves"), g2_->num_slots() - staging_slots_));
  TransferEngine::Config tc;
  tc.copy_threads = static_cast<uint32_t>(cfg.GetUint("transfer.copy_threads"));
  tc.max_queued_saves = static_cast<uint32_t>(cfg.GetUint("transfer.max_queued_saves"));
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
  KVTIER_RETURN_IF_ERROR(InitEventPublisher());
  if (g3_) {
    // Warm restart: what G3 held before is servable again. Its headers hold each block's
    // tokens; the names of its namespace are not known yet (namespace_known = false).
    MutexLock lock(&events_mu_);
    for (const RecoveredBlock& b : recovered) {
      if (index_->Insert(b.key, b.parent, kTierG3, b.slot).ok()) {
        recovered_events_.push_back(
            StoredEvent(b.key, b.parent, kTierG3, b.namespace_id, b.tokens, /*always=*/true));
      }
    }
    // The wire hears of them too, right after its AllBlocksCleared.
    if (publisher_) publisher_->Publish(recovered_events_);
    KVTIER_LOG(kInfo) << "G3: " << recovered.size() << " blocks recovered from "
                      << cfg.GetString("g3.dir");
  }
  return InitMetrics();
}

Status BlockManager::Impl::InitMetrics() {
  ManagerMetrics::Sources sources;
  sources.stats = [this] { return Stats(); };
  sources.queues = [this] {
    ManagerMetrics::Queues q;
    q.queued_saves = engine_->queued_saves();
    q.demotions_in_flight = demotions_in_flight_.load(std::memory_order_relaxed);
    q.g4_writes_in_flight = g4_writes_in_flight_.load(std::memory_order_relaxed);
    return q;
  };
  sources.block_bytes = layout_.BlockBytes();
  KVTIER_ASSIGN_OR_RETURN(metrics_, ManagerMetrics::Create(options_.config, std::move(sources)));
  if (!metrics_) return Status::Ok();
  engine_->SetIoObserver([m = metrics_.get()](TierId tier, bool write, std::chrono::nanoseconds t) {
    if (Histogram* h = m->io[tier][write ? 1 : 0]) {
      h->ObserveNanos(std::chrono::duration_cast<std::chrono::nanoseconds>(t).count());
    }
  });
  KVTIER_LOG(kInfo) << "metrics: serving /metrics on " << options_.config.GetString("metrics.bind")
                    << ":" << metrics_->port();
  return Status::Ok();
}

BlockManager::Impl::~Impl() {
  // No scrape may read the tiers while they close. The histograms stay until the members go
  // (after engine_, below): the flush and the drain still record I/O into them.
  if (metrics_) metrics_->StopServer();
  if (g3_ && options_.config.GetBool("g3.flush_on_close")) FlushG2ToG3();
  // With G4, a completion submits the next move through engine_: a save's completion submits
  // its write-through G4 write, a demotion's its G4 write. Those chains must end while engine_
  // is whole; unique_ptr::reset nulls the pointer before the destructor drains, so a chain still
  // running then would call through a null engine_ (TSan caught it under load).
  if (g4_ != nullptr) WaitForSaves();
  // The engine drains first: its callbacks use the index, the arena and the request table.
  engine_.reset();
  g4_remover_.reset();  // its thread calls g4_; what is still queued is dropped
  if (g3_) {
    Status s = g3_->Close();
    if (!s.ok()) KVTIER_LOG(kWarn) << "G3 close: " << s.ToString();
  }
  // Nothing emits any more: the publisher sends what is queued and stops.
  publisher_.reset();
}

Status BlockManager::Impl::InitEventPublisher() {
  const Config& cfg = options_.config;
  if (cfg.GetString("events.endpoint").empty()) {
    if (!cfg.GetString("events.replay_endpoint").empty()) {
      return Status::InvalidArgument(
          "events.replay_endpoint is set but events.endpoint is empty; set events.endpoint "
          "(the PUB address) too, or clear both");
    }
    return Status::Ok();
  }
  EventPublisher::Config pc;
  pc.endpoint = cfg.GetString("events.endpoint");
  pc.replay_endpoint = cfg.GetString("events.replay_endpoint");
  pc.topic = cfg.GetString("events.topic");
  pc.queue_events = static_cast<uint32_t>(cfg.GetUint("events.queue_events"));
  pc.replay_batches = static_cast<uint32_t>(cfg.GetUint("events.replay_batches"));
  pc.replay_bytes = cfg.GetBytes("events.replay_bytes");
  pc.data_parallel_rank = static_cast<int64_t>(cfg.GetUint("events.data_parallel_rank"));
  KVTIER_ASSIGN_OR_RETURN(publisher_, EventPublisher::Start(pc));
  events_wanted_.store(true);
  KVTIER_LOG(kInfo) << "events: publishing on " << publisher_->endpoint()
                    << (publisher_->replay_endpoint().empty()
                            ? std::string()
                            : ", replay on " + publisher_->replay_endpoint());
  return Status::Ok();
}

Result<const BlockHasher*> BlockManager::Impl::HasherFor(const std::string& salt,
                                                         const std::string& adapter) {
  MutexLock lock(&hashers_mu_);
  auto& slot = hashers_[{salt, adapter}];
  if (!slot) {
    KeyNamespace ns{options_.model_id, layout_.Fingerprint(), salt, adapter};
    KVTIER_ASSIGN_OR_RETURN(BlockHasher h, BlockHasher::Create(ns, tpb_, algorithm_));
    slot = std::make_unique<BlockHasher>(std::move(h));
    namespace_names_[slot->root().hi] = {adapter, salt};
  }
  return slot.get();
}

// ---------------------------------------------------------------------------------------------
// Events

KvEvent BlockManager::Impl::Event(KvEvent::Kind kind, const BlockKey& key, const BlockKey& parent,
                                  TierId tier) const {
  KvEvent e;
  e.kind = kind;
  e.key = key;
  e.parent = parent;
  e.tier = tier;
  e.time_ns = NowNs();
  return e;
}

KvEvent BlockManager::Impl::StoredEvent(const BlockKey& key, const BlockKey& parent, TierId tier,
                                        uint64_t namespace_id, std::span<const TokenId> tokens,
                                        bool always) {
  KvEvent e = Event(KvEvent::Kind::kStored, key, parent, tier);
  if (!always && !events_wanted_.load(std::memory_order_relaxed)) return e;
  e.block_size = tpb_;
  // namespace_id is the root key's first half (Request::namespace_id): a first block's parent.
  e.parent_is_root = parent.hi == namespace_id;
  e.token_ids.assign(tokens.begin(), tokens.end());
  MutexLock lock(&hashers_mu_);
  auto it = namespace_names_.find(namespace_id);
  if (it == namespace_names_.end()) {
    e.namespace_known = false;
  } else {
    e.lora_name = it->second.first;
    e.cache_salt = it->second.second;
  }
  return e;
}

KvEvent BlockManager::Impl::G2StoredEvent(uint32_t slot, const BlockKey& key,
                                          const BlockKey& parent) {
  if (!events_wanted_.load(std::memory_order_relaxed)) {
    return Event(KvEvent::Kind::kStored, key, parent, kTierG2);
  }
  uint64_t namespace_id = 0;
  std::vector<TokenId> tokens;
  {
    MutexLock lock(&slot_mu_);
    namespace_id = slot_meta_[slot].namespace_id;
    tokens.assign(slot_tokens_.begin() + size_t{slot} * tpb_,
                  slot_tokens_.begin() + size_t{slot + 1} * tpb_);
  }
  return StoredEvent(key, parent, kTierG2, namespace_id, tokens);
}

void BlockManager::Impl::Emit(std::vector<KvEvent> events) {
  if (events.empty()) return;
  c_.events.fetch_add(events.size(), std::memory_order_relaxed);
  std::vector<KvEventCallback> subs;
  {
    MutexLock lock(&events_mu_);
    subs = subscribers_;
  }
  for (const auto& cb : subs) cb(events);
  if (publisher_) publisher_->Publish(std::move(events));  // queued or dropped; never waits
}

void BlockManager::Impl::SubscribeEvents(KvEventCallback callback) {
  std::vector<KvEvent> replay;
  events_wanted_.store(true);
  {
    MutexLock lock(&events_mu_);
    subscribers_.push_back(callback);
    // The first subscriber learns of the blocks G3 recovered at start-up.
    replay.swap(recovered_events_);
  }
  if (!replay.empty()) callback(replay);
}

// ---------------------------------------------------------------------------------------------
// G2 slots, demotion to G3

void BlockManager::Impl::SetSlotMeta(uint32_t slot, const SlotMeta& meta,
                                     std::span<const TokenId> tokens) {
  AssignSlotNamespace(slot, meta.namespace_id);
  MutexLock lock(&slot_mu_);
  slot_meta_[slot] = meta;
  std::fill_n(slot_tokens_.begin() + size_t{slot} * tpb_, tpb_, TokenId{0});
  std::copy_n(tokens.begin(), std::min<size_t>(tokens.size(), tpb_),
              slot_tokens_.begin() + size_t{slot} * tpb_);
}

void BlockManager::Impl::AssignSlotNamespace(uint32_t slot, uint64_t ns) {
  MutexLock lock(&ns_mu_);
  if (slot >= slot_ns_.size() || slot_ns_[slot] == ns) return;
  if (uint64_t old = slot_ns_[slot]; old != 0) {
    auto it = ns_slots_.find(old);
    if (it != ns_slots_.end() && --it->second == 0) ns_slots_.erase(it);
  }
  slot_ns_[slot] = ns;
  if (ns != 0) ++ns_slots_[ns];
}

bool BlockManager::Impl::EvictableFor(uint64_t ns, uint32_t slot) {
  if (ns == 0 || ns_share_ <= 0) return true;
  MutexLock lock(&ns_mu_);
  if (slot >= slot_ns_.size()) return true;
  const uint64_t owner = slot_ns_[slot];
  if (owner == 0 || owner == ns) return true;
  // The requester counts as a namespace holding blocks even before its first one lands.
  const uint64_t holders = ns_slots_.size() + (ns_slots_.count(ns) == 0 ? 1 : 0);
  const double guaranteed = ns_share_ * static_cast<double>(slot_ns_.size()) /
                            static_cast<double>(std::max<uint64_t>(holders, 1));
  auto it = ns_slots_.find(owner);
  return it != ns_slots_.end() && static_cast<double>(it->second) > guaranteed;
}

void BlockManager::Impl::ReleaseG2Slot(uint32_t slot) {
  AssignSlotNamespace(slot, 0);
  Status s = g2_->Release(slot);
  if (!s.ok()) KVTIER_LOG(kError) << "internal: " << s.ToString();
}

void BlockManager::Impl::FlushG2ToG3() {
  WaitForSaves();  // saves into G2 land first
  const auto start = std::chrono::steady_clock::now();
  const uint32_t max_in_flight = std::clamp<uint32_t>(
      static_cast<uint32_t>(options_.config.GetUint("transfer.max_queued_saves") / 2), 1, 32);
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
        !((SlotStoreTiers(victim->slot) >> kTierG3) & 1u)) {
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

uint8_t BlockManager::Impl::SlotStoreTiers(uint32_t slot) {
  MutexLock lock(&slot_mu_);
  return slot_meta_[slot].store_tiers;
}

bool BlockManager::Impl::AdmitToG3(const BlockKey& key) {
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

void BlockManager::Impl::MakeRoomInG3() {
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

void BlockManager::Impl::DropReplacedG3Copy(const BlockKey& key, const BlockKey& parent) {
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

void BlockManager::Impl::Demote(const EvictedBlock& victim) {
  BlockTransfer m;
  m.op = BlockTransfer::Op::kG2ToG3;
  m.key = victim.key;
  m.parent = victim.parent;
  m.g2_slot = victim.slot;
  {
    MutexLock lock(&slot_mu_);
    m.namespace_id = slot_meta_[victim.slot].namespace_id;
    m.tokens.assign(slot_tokens_.begin() + size_t{victim.slot} * tpb_,
                    slot_tokens_.begin() + size_t{victim.slot + 1} * tpb_);
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
      g4_ != nullptr && !g4_write_through_ && ((SlotStoreTiers(slot) >> kTierG4) & 1u);
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

bool BlockManager::Impl::EvictFromG2(uint64_t ns) {
  auto victim =
      ns == 0 || ns_share_ <= 0
          ? index_->EvictOne(kTierG2)
          : index_->EvictOne(kTierG2, [this, ns](uint32_t slot) { return EvictableFor(ns, slot); });
  if (!victim) return false;
  c_.evicted_g2.fetch_add(1, std::memory_order_relaxed);
  Emit({Event(KvEvent::Kind::kRemoved, victim->key, victim->parent, kTierG2)});
  const bool in_g3 = (victim->remaining_tiers >> kTierG3) & 1u;
  const uint8_t store_tiers = SlotStoreTiers(victim->slot);
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

std::optional<uint32_t> BlockManager::Impl::AllocateStagingSlot(uint64_t ns) {
  if (std::optional<uint32_t> free_slot = g2_->Allocate()) return free_slot;
  if (staging_slots_ > 0) {
    c_.staged_via_pool.fetch_add(1, std::memory_order_relaxed);
    return BlockTransfer::kAnyStagingSlot;
  }
  return AllocateG2Slot(ns);
}

std::optional<uint32_t> BlockManager::Impl::AllocateG2Slot(uint64_t ns) {
  // Demotions in flight at most. Beyond it the disk is behind: a save is better dropped than
  // paid for by evicting more of G2, and no single call starts a burst of demotions.
  const uint32_t max_demotions = std::clamp<uint32_t>(g2_->num_slots() / 8, 8, 64);
  std::optional<uint32_t> slot = g2_->Allocate();
  // Each round frees a slot now (a victim G3 does not take) or starts a demotion. Bounded, so
  // a caller never spins and never waits on I/O.
  for (int round = 0; !slot && round < 4; ++round) {
    if (demotions_in_flight_.load() >= max_demotions) break;
    if (!EvictFromG2(ns)) break;
    slot = g2_->Allocate();
  }
  // Keep a reserve of free (or soon free) slots, so the next saves and staged loads find one
  // without waiting for a demotion write; at most one eviction per call. Without G3 an eviction
  // frees its slot at once, so a reserve would only shrink the cache (by up to 256 blocks:
  // 0.006 of hit ratio on the Mooncake trace at 5%, docs/replay.md).
  const uint32_t reserve = std::clamp<uint32_t>(g2_->num_slots() / 16, 1, 256);
  if (g3_ && g2_->free_slots() + demotions_in_flight_.load() < reserve &&
      demotions_in_flight_.load() < max_demotions) {
    EvictFromG2(ns);
  }
  return slot;
}

// ---------------------------------------------------------------------------------------------
// Scheduler side

Result<LookupResult> BlockManager::Impl::Lookup(const RequestSpec& spec,
                                                uint32_t num_computed_tokens, uint32_t instance) {
  if (spec.request_id.empty()) return Status::InvalidArgument("Lookup: empty request_id");
  if (num_computed_tokens % tpb_ != 0) {
    return Status::InvalidArgument(
        "Lookup: num_computed_tokens = " + std::to_string(num_computed_tokens) +
        " is not a multiple of the block size " + std::to_string(tpb_));
  }
  KVTIER_ASSIGN_OR_RETURN(const BlockHasher* hasher, HasherFor(spec.cache_salt, spec.adapter_id));
  c_.lookups.fetch_add(1, std::memory_order_relaxed);
  const ScopedLatency latency(metrics_ ? metrics_->lookup : nullptr);

  std::vector<BlockKey> keys;
  bool reuse_keys = false;
  {
    MutexLock lock(&mu_);
    auto it = requests_.find(spec.request_id);
    if (it != requests_.end() && it->second.hasher == hasher &&
        it->second.block_extra == spec.block_extra &&
        it->second.tokens.size() >= spec.prompt.size() &&
        std::equal(spec.prompt.begin(), spec.prompt.end(), it->second.tokens.begin())) {
      keys = it->second.keys;  // asked again: no need to hash again
      reuse_keys = true;
    }
  }
  if (!reuse_keys) hasher->AppendKeys(spec.prompt, hasher->root(), &keys, spec.block_extra);
  const uint32_t prompt_blocks = static_cast<uint32_t>(spec.prompt.size() / tpb_);
  // The last prompt token is always computed (the engine needs its logits).
  const uint32_t max_blocks =
      spec.prompt.empty() ? 0 : static_cast<uint32_t>((spec.prompt.size() - 1) / tpb_);
  const uint32_t start = num_computed_tokens / tpb_;

  LookupResult result;
  uint32_t loadable = 0;
  uint32_t local = 0, in_g4 = 0;
  bool g4_reused = false;
  if (start < max_blocks) {
    MatchResult m = index_->Match(std::span<const BlockKey>(keys).subspan(0, max_blocks),
                                  LocalTiersToOffer() & spec.load_tiers);
    local = static_cast<uint32_t>(m.num_blocks());
    if (m.num_blocks() > start) {
      loadable = static_cast<uint32_t>(m.num_blocks()) - start;
      for (size_t i = start; i < m.num_blocks(); ++i) ++result.blocks_by_tier[m.tiers[i]];
    }
    const bool g4_allowed = g4_ && ((spec.load_tiers >> kTierG4) & 1u);
    if (g4_allowed && local < max_blocks && g4_slower_than_recompute_) {
      c_.g4_skipped_lookups.fetch_add(1, std::memory_order_relaxed);
    } else if (g4_allowed && local < max_blocks) {
      // G4 only for what the local tiers lack, in one round trip within the lookup deadline. A
      // repeated Lookup (the scheduler asking again) reuses a recent answer.
      bool& reused = g4_reused;
      if (reuse_keys) {
        MutexLock lock(&mu_);
        auto it = requests_.find(spec.request_id);
        if (it != requests_.end() && it->second.g4_first == local &&
            std::chrono::steady_clock::now() - it->second.g4_asked_at < kG4LookupReuse) {
          in_g4 = it->second.g4_blocks;
          reused = true;
        }
      }
      if (reused) {
        // A block whose load failed since the answer is not offered again.
        in_g4 = static_cast<uint32_t>(
            g4_rejected_.FirstIn(std::span<const BlockKey>(keys).subspan(local, in_g4)));
      }
      if (!reused) {
        in_g4 = MatchInG4(std::span<const BlockKey>(keys).subspan(local, max_blocks - local),
                          hasher->root().hi);
        c_.g4_lookup_blocks.fetch_add(in_g4, std::memory_order_relaxed);
      }
      const uint32_t end = local + in_g4;
      if (end > start) {
        const uint32_t from = std::max(local, start);
        result.blocks_by_tier[kTierG4] += end - from;
        loadable = end - start;
      }
    }
  }
  result.num_tokens = loadable * tpb_;

  MutexLock lock(&mu_);
  SweepIdleRequests(std::chrono::steady_clock::now());
  bool made = false;
  Request& r = ActiveRequest(spec.request_id, &made);
  if (!reuse_keys || made) {
    // (made: the entry whose keys were reused went meanwhile; these are the prompt's.)
    keys.resize(std::min<size_t>(keys.size(), prompt_blocks));
    r.tokens.assign(spec.prompt.begin(), spec.prompt.end());
    r.keys = std::move(keys);
    r.block_extra = spec.block_extra;
    r.committed_blocks = std::min(r.committed_blocks, prompt_blocks);
  }
  r.instance = instance;
  r.load_tiers = spec.load_tiers;
  r.store_tiers = spec.store_tiers;
  r.hasher = hasher;
  r.namespace_id = hasher->root().hi;
  r.lookup_start = start;
  r.lookup_blocks = loadable;
  if (!g4_reused) r.g4_asked_at = std::chrono::steady_clock::now();
  r.g4_first = local;
  r.g4_blocks = in_g4;
  return result;
}

Result<uint32_t> BlockManager::Impl::PrepareLoad(const std::string& request_id,
                                                 std::span<const uint32_t> g1_block_ids,
                                                 uint32_t num_external_tokens, bool async_load) {
  if (num_external_tokens % tpb_ != 0) {
    return Status::InvalidArgument(
        "PrepareLoad: num_external_tokens = " + std::to_string(num_external_tokens) +
        " is not a multiple of the block size");
  }
  uint32_t start, want, asked, g4_first = 0, g4_end = 0;
  std::vector<BlockKey> keys;
  std::vector<TokenId> tokens;
  uint64_t ns;
  uint8_t load_tiers;
  {
    MutexLock lock(&mu_);
    auto it = requests_.find(request_id);
    if (it == requests_.end()) {
      return Status::NotFound("PrepareLoad: request '" + request_id + "' had no Lookup");
    }
    Request& r = it->second;
    want = num_external_tokens / tpb_;
    if (want > r.lookup_blocks) {
      return Status::InvalidArgument("PrepareLoad: " + std::to_string(num_external_tokens) +
                                     " tokens asked, but the last Lookup offered " +
                                     std::to_string(r.lookup_blocks * tpb_));
    }
    start = r.lookup_start;
    if (g1_block_ids.size() < start + want) {
      return Status::InvalidArgument("PrepareLoad: " + std::to_string(g1_block_ids.size()) +
                                     " G1 block ids given; the load needs " +
                                     std::to_string(start + want));
    }
    if (r.load_in_flight) {
      return Status::FailedPrecondition("PrepareLoad: request '" + request_id +
                                        "' already has a load in flight");
    }
    keys.assign(r.keys.begin() + start, r.keys.begin() + start + want);
    tokens.assign(r.tokens.begin() + size_t{start} * tpb_,
                  r.tokens.begin() + size_t{start + want} * tpb_);
    ns = r.namespace_id;
    load_tiers = r.load_tiers;
    g4_first = r.g4_first;
    g4_end = r.g4_first + r.g4_blocks;
    const uint32_t prompt_blocks = static_cast<uint32_t>(r.tokens.size() / tpb_);
    asked = prompt_blocks > start ? prompt_blocks - start : 0;
  }
  c_.lookup_blocks.fetch_add(asked, std::memory_order_relaxed);

  MatchResult m = index_->MatchAndPin(keys, LocalTiersToOffer() & load_tiers);
  std::vector<PlannedLoad> plan;
  size_t planned = 0;
  for (; planned < m.num_blocks(); ++planned) {
    PlannedLoad p;
    p.request_id = request_id;
    p.block_index = start + static_cast<uint32_t>(planned);
    p.key = keys[planned];
    p.namespace_id = ns;
    p.source = m.tiers[planned];
    p.g1_block = g1_block_ids[start + planned];
    if (p.source == kTierG2) {
      p.g2_slot = m.slots[planned];
    } else {
      std::optional<uint32_t> staging = AllocateStagingSlot(ns);
      if (!staging) break;  // no room to stage: the engine computes the rest
      p.g2_slot = *staging;
      p.tokens.assign(tokens.begin() + planned * tpb_, tokens.begin() + (planned + 1) * tpb_);
    }
    plan.push_back(std::move(p));
  }
  const size_t pinned_planned = planned;
  if (planned < m.num_blocks()) {
    KVTIER_RETURN_IF_ERROR(
        index_->Unpin(std::span<const BlockKey>(keys).subspan(planned, m.num_blocks() - planned)));
  } else if (g4_ && ((load_tiers >> kTierG4) & 1u)) {
    // Past the local run: what the Lookup found in G4 (not pinned: G4 is shared, and a block
    // gone since is a failed load, recomputed).
    for (; planned < want; ++planned) {
      const uint32_t i = start + static_cast<uint32_t>(planned);
      if (i < g4_first || i >= g4_end) break;
      if (g4_rejected_.Contains(keys[planned])) break;  // its load failed since the Lookup
      std::optional<uint32_t> staging = AllocateStagingSlot(ns);
      if (!staging) break;
      PlannedLoad p;
      p.request_id = request_id;
      p.block_index = i;
      p.key = keys[planned];
      p.namespace_id = ns;
      p.source = kTierG4;
      p.g1_block = g1_block_ids[i];
      p.g2_slot = *staging;
      p.tokens.assign(tokens.begin() + planned * tpb_, tokens.begin() + (planned + 1) * tpb_);
      plan.push_back(std::move(p));
    }
  }
  // Lineage parents for the index: block i's parent is block i-1 (or the root for block 0).
  {
    MutexLock lock(&mu_);
    auto it = requests_.find(request_id);
    if (it == requests_.end()) {
      // Finished while we planned: undo.
      for (const PlannedLoad& p : plan) {
        if (HoldsCacheSlot(p)) ReleaseG2Slot(p.g2_slot);
      }
      KVTIER_RETURN_IF_ERROR(
          index_->Unpin(std::span<const BlockKey>(keys).subspan(0, pinned_planned)));
      return Status::NotFound("PrepareLoad: request '" + request_id + "' finished meanwhile");
    }
    Touch(it);
    Request& r = it->second;
    for (PlannedLoad& p : plan) {
      p.parent = p.block_index == 0 ? r.hasher->root() : r.keys[p.block_index - 1];
      p.async = async_load;
      p.instance = r.instance;
    }
    r.load_first = start;
    r.load_planned = static_cast<uint32_t>(plan.size());
    r.loaded_blocks = 0;
    r.load_in_flight = !plan.empty();
    for (auto& p : plan) pending_loads_.push_back(std::move(p));
  }
  c_.miss_blocks.fetch_add(asked - planned, std::memory_order_relaxed);
  return static_cast<uint32_t>(planned) * tpb_;
}

Status BlockManager::Impl::Commit(const std::string& request_id, std::span<const TokenId> tokens,
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
    auto it = requests_.find(request_id);
    if (it == requests_.end()) {
      return Status::NotFound("Commit: request '" + request_id + "' had no Lookup");
    }
    Touch(it);
    Request& r = it->second;
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
    std::optional<uint32_t> slot = no_slot.empty() ? AllocateG2Slot(ns) : std::nullopt;
    if (!slot) {
      no_slot.push_back(std::move(c));  // and the blocks after it: saves keep commit order
      continue;
    }
    SetSlotMeta(*slot, SlotMeta{c.key, c.parent, ns, store_tiers}, c.tokens);
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
  // (a slot frees when each write ends) or saves are in flight (their blocks become evictable
  // when they land); up to the bound. Otherwise they are dropped and counted.
  const bool slot_coming = SlotComing();
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

void BlockManager::Impl::RetryDeferredSaves() {
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
    std::optional<uint32_t> slot = AllocateG2Slot(d.namespace_id);
    if (!slot) break;
    SetSlotMeta(*slot, SlotMeta{d.key, d.parent, d.namespace_id, d.store_tiers}, d.tokens);
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

void BlockManager::Impl::ReleaseSaveHolds(const std::string& request_id, uint32_t n) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  Request& r = it->second;
  r.saves_in_flight -= std::min(n, r.saves_in_flight);
  if (r.saves_in_flight != 0) return;
  request_saves_cv_.notify_all();
  Touch(it);
  RetireIfDone(it);
}

BlockManager::Impl::Request& BlockManager::Impl::ActiveRequest(const std::string& id, bool* made) {
  auto [it, inserted] = requests_.try_emplace(id);
  if (inserted) it->second.by_activity = by_activity_.insert(by_activity_.end(), id);
  *made = inserted;
  Touch(it);
  return it->second;
}

void BlockManager::Impl::Touch(RequestMap::iterator it) {
  it->second.last_active = std::chrono::steady_clock::now();
  by_activity_.splice(by_activity_.end(), by_activity_, it->second.by_activity);
}

void BlockManager::Impl::EraseRequest(RequestMap::iterator it) {
  by_activity_.erase(it->second.by_activity);
  requests_.erase(it);
}

void BlockManager::Impl::RetireIfDone(RequestMap::iterator it) {
  Request& r = it->second;
  if (!r.finished || !Idle(r)) return;
  if (r.kept_for_saves) {
    if (!gone_instances_.count(r.instance)) saves_done_.emplace_back(r.instance, it->first);
    r.kept_for_saves = false;
  }
  if (!r.load_unreported && !r.retiring) EraseRequest(it);
}

void BlockManager::Impl::SweepIdleRequests(std::chrono::steady_clock::time_point now) {
  for (int n = 0; n < kSweepBatch && !by_activity_.empty(); ++n) {
    auto it = requests_.find(by_activity_.front());
    if (it == requests_.end()) {  // cannot happen (the invariant); heal rather than spin
      by_activity_.pop_front();
      continue;
    }
    if (now - it->second.last_active < idle_ttl_) return;  // the rest is more recent
    if (Idle(it->second)) {
      EraseRequest(it);
      c_.expired_requests.fetch_add(1, std::memory_order_relaxed);
    } else {
      Touch(it);  // a load or saves in flight: not idle; looked at again a TTL later
    }
  }
}

bool BlockManager::Impl::DrainingSaves(const std::string& id) const {
  auto it = requests_.find(id);
  return it != requests_.end() && it->second.save_drains > 0;
}

void BlockManager::Impl::EndSave(const std::string& request_id, const BlockKey& key) {
  MutexLock lock(&mu_);
  saving_keys_.erase(key);
  --saves_outstanding_;
  ReleaseSaveHolds(request_id, 1);
  if (saves_outstanding_ == 0) saves_cv_.notify_all();
}

bool BlockManager::Impl::RequestFinished(const std::string& request_id) {
  MutexLock lock(&mu_);
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return false;
  Request& r = it->second;
  r.finished = true;
  // About saves only: a load in flight keeps the entry (and its pins) until it ends, and
  // loads_done tells the engine when (see the contract).
  r.kept_for_saves = r.saves_in_flight > 0;
  const bool kept = r.kept_for_saves;
  RetireIfDone(it);
  return kept;
}

// ---------------------------------------------------------------------------------------------
// Worker side

Status BlockManager::Impl::RegisterDeviceMemory(const G1Memory& g1) {
  if (g1.layout.Fingerprint() != layout_.Fingerprint() ||
      g1.layout.g1_arrangement != layout_.g1_arrangement) {
    return Status::InvalidArgument("RegisterDeviceMemory: layout " + g1.layout.ToString() +
                                   " differs from the manager's " + layout_.ToString());
  }
  KVTIER_RETURN_IF_ERROR(engine_->RegisterG1(g1));
  g1_registered_ = true;
  return Status::Ok();
}

Status BlockManager::Impl::StartSave(uint32_t instance) {
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
          g4_writes_in_flight_.fetch_add(1);
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

void BlockManager::Impl::WaitForSaves() {
  for (;;) {
    {
      MutexLock lock(&mu_);
      while (saves_outstanding_ != 0 || demotions_in_flight_.load() != 0 ||
             g4_writes_in_flight_.load() != 0) {
        CondWait(&saves_cv_, &mu_);
      }
      if (deferred_saves_.empty() && pending_saves_.empty()) return;
    }
    // Deferred saves get the slots the demotions freed (or are dropped if none can free).
    Status s = StartSave(kAllInstances);
    if (!s.ok()) KVTIER_LOG(kWarn) << "WaitForSaves: " << s.ToString();
  }
}

void BlockManager::Impl::WaitForRequestSaves(const std::string& request_id) {
  MutexLock lock(&mu_);
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  ++it->second.save_drains;
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
    it = requests_.find(request_id);
    if (it == requests_.end()) return;  // finished and done: erased
    if (it->second.saves_in_flight == 0) break;
    CondWait(&request_saves_cv_, &mu_);
  }
  --it->second.save_drains;
}

void BlockManager::Impl::EndDemotion() {
  MutexLock lock(&mu_);
  demotions_in_flight_.fetch_sub(1);
  saves_cv_.notify_all();
}

Status BlockManager::Impl::StartLoad(uint32_t instance) {
  MutexLock start_lock(&start_load_mu_);
  std::vector<PlannedLoad> loads;
  {
    MutexLock lock(&mu_);
    std::vector<PlannedLoad> others;
    for (PlannedLoad& p : pending_loads_) {
      (Matches(p.instance, instance) ? loads : others).push_back(std::move(p));
    }
    pending_loads_.swap(others);
  }
  if (loads.empty()) return Status::Ok();
  if (!g1_registered_) return Status::FailedPrecondition("StartLoad before RegisterDeviceMemory");
  // Two batches: the engine's next forward pass waits on the synchronous one (WaitLayer);
  // nothing waits on the asynchronous one but its own requests' LoadedTokens.
  std::vector<PlannedLoad> sync, async;
  for (PlannedLoad& p : loads) (p.async ? async : sync).push_back(std::move(p));
  const Status s = SubmitLoads(std::move(sync), /*async=*/false);
  const Status a = SubmitLoads(std::move(async), /*async=*/true);
  return s.ok() ? a : s;
}

Status BlockManager::Impl::SubmitLoads(std::vector<PlannedLoad> loads, bool async) {
  if (loads.empty()) return Status::Ok();
  std::vector<BlockTransfer> moves;
  moves.reserve(loads.size());
  for (const PlannedLoad& p : loads) {
    BlockTransfer m;
    m.op = p.source == kTierG2   ? BlockTransfer::Op::kG2ToG1
           : p.source == kTierG3 ? BlockTransfer::Op::kG3ToG1
                                 : BlockTransfer::Op::kG4ToG1;
    m.key = p.key;
    m.parent = p.parent;
    m.namespace_id = p.namespace_id;
    m.tokens = p.tokens;
    m.g1_block = p.g1_block;
    m.g2_slot = p.g2_slot;
    moves.push_back(std::move(m));
  }
  auto shared = std::make_shared<std::vector<PlannedLoad>>(std::move(loads));
  auto job = engine_->Submit(
      std::move(moves), TransferPriority::kLoad,
      [this, shared](const TransferJob& job, size_t i, const Status& st) {
        const PlannedLoad& p = (*shared)[i];
        if (p.source == kTierG2) return;
        if (st.ok() && !HoldsCacheSlot(p)) return;  // staged through the pool: not promoted
        if (st.ok()) {
          // The staged copy stays: the block is promoted to G2.
          SetSlotMeta(p.g2_slot, SlotMeta{p.key, p.parent, p.namespace_id}, p.tokens);
          if (index_->Insert(p.key, p.parent, kTierG2, p.g2_slot).ok()) {
            c_.promoted.fetch_add(1, std::memory_order_relaxed);
            Emit({StoredEvent(p.key, p.parent, kTierG2, p.namespace_id, p.tokens)});
          } else {
            ReleaseG2Slot(p.g2_slot);
          }
          return;
        }
        // A slot lent to a G4 call abandoned at its deadline comes back through the transfer
        // engine's release_lent_slot once the call has returned, not now.
        if (HoldsCacheSlot(p) && !job.SlotLent(i)) ReleaseG2Slot(p.g2_slot);
        if (p.source == kTierG4) {
          // G4 is not indexed here: a failed G4 load is a miss, counted. A corrupt or vanished
          // object is not offered by this manager again (g4_rejected_) until it writes the
          // block again; a corrupt one is also deleted from the store, off this thread.
          c_.g4_load_failures.fetch_add(1, std::memory_order_relaxed);
          if (st.Is(StatusCode::kCorruption)) c_.g4_corrupt.fetch_add(1, std::memory_order_relaxed);
          RejectG4Load(p, st);
          return;
        }
        if (st.Is(StatusCode::kCorruption) || st.Is(StatusCode::kNotFound)) {
          // The tier dropped the block (it failed verification, or vanished): so does the index.
          if (st.Is(StatusCode::kCorruption)) c_.corrupt.fetch_add(1, std::memory_order_relaxed);
          if (index_->Invalidate(p.key, kTierG3).ok()) {
            Emit({Event(KvEvent::Kind::kRemoved, p.key, p.parent, kTierG3)});
          }
        }
      },
      [this, shared, started = std::chrono::steady_clock::now()](const TransferJob& j) {
        OnLoadBatchDone(*shared, j, started);
      });
  if (!job.ok()) {
    // Unreachable for loads unless a move is invalid (a bug): undo the pins and staging slots.
    KVTIER_LOG(kError) << "internal: load batch refused: " << job.status().ToString();
    auto dummy = std::make_shared<TransferJob>(std::vector<BlockTransfer>{}, layout_.num_layers,
                                               TransferPriority::kLoad);
    for (const PlannedLoad& p : *shared) {
      if (HoldsCacheSlot(p)) ReleaseG2Slot(p.g2_slot);
    }
    OnLoadBatchDone(*shared, *dummy, std::chrono::steady_clock::now());
    return job.status();
  }
  MutexLock lock(&mu_);
  std::erase_if(load_jobs_, [](const auto& j) { return j.second->Done(); });
  if (!async) load_jobs_.emplace_back(shared->front().instance, *job);
  for (const PlannedLoad& p : *shared) {
    auto it = requests_.find(p.request_id);
    if (it != requests_.end() && it->second.load_in_flight) it->second.load_job = *job;
  }
  return Status::Ok();
}

void BlockManager::Impl::OnLoadBatchDone(const std::vector<PlannedLoad>& loads,
                                         const TransferJob& job,
                                         std::chrono::steady_clock::time_point started) {
  const int64_t took = metrics_ ? NanosSince(started) : 0;
  std::vector<BlockKey> pinned, hits;
  pinned.reserve(loads.size());
  std::vector<std::pair<std::string, uint32_t>> intact;  // request -> blocks loaded intact
  std::unordered_map<std::string, bool> broken;
  for (size_t i = 0; i < loads.size(); ++i) {
    const PlannedLoad& p = loads[i];
    if (p.source != kTierG4) pinned.push_back(p.key);  // G4 loads hold no pin
    const bool ok = i < job.moves().size() && job.MoveStatus(i).ok();
    bool& is_broken = broken[p.request_id];
    if (ok && !is_broken) {
      hits.push_back(p.key);
      c_.hit_blocks[p.source].fetch_add(1, std::memory_order_relaxed);
      if (p.source == kTierG3 && g3_gate_) g3_gate_->OnHit(p.key);
      if (metrics_ && metrics_->load[p.source]) metrics_->load[p.source]->ObserveNanos(took);
      if (intact.empty() || intact.back().first != p.request_id)
        intact.emplace_back(p.request_id, 0);
      ++intact.back().second;
    } else {
      if (!ok) c_.load_failures.fetch_add(1, std::memory_order_relaxed);
      is_broken = true;  // blocks after a failed one are not usable either (prefix semantics)
    }
  }
  Status s = index_->Unpin(pinned);
  if (!s.ok()) KVTIER_LOG(kError) << "internal: " << s.ToString();
  index_->Touch(hits);
  for (const BlockKey& k : hits) g3_filter_->RecordAndCheck(k);

  MutexLock lock(&mu_);
  std::unordered_set<std::string> done;
  for (const PlannedLoad& p : loads) done.insert(p.request_id);
  for (const std::string& id : done) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    Request& r = it->second;
    r.loaded_blocks = 0;
    for (const auto& [rid, n] : intact) {
      if (rid == id) r.loaded_blocks += n;
    }
    r.load_in_flight = false;
    r.load_job.reset();
    // An engine that is gone is told nothing (and its entries are not kept for a report).
    const bool gone = gone_instances_.count(r.instance) != 0;
    if (!gone) loads_done_.emplace_back(r.instance, id);
    // Finished while loading: kept until the engine has been told (loads_done) and has had a
    // step to ask LoadedTokens.
    if (r.finished && !gone) r.load_unreported = true;
    Touch(it);
    RetireIfDone(it);
  }
}

Status BlockManager::Impl::WaitLayer(uint32_t layer, uint32_t instance) {
  if (layer >= layout_.num_layers) {
    return Status::InvalidArgument("WaitLayer(" + std::to_string(layer) + "): the layout has " +
                                   std::to_string(layout_.num_layers) + " layers");
  }
  std::vector<std::shared_ptr<TransferJob>> jobs;
  {
    MutexLock start_lock(&start_load_mu_);  // a StartLoad in progress has registered its job
    MutexLock lock(&mu_);
    for (const auto& [owner, job] : load_jobs_) {
      if (Matches(owner, instance)) jobs.push_back(job);
    }
  }
  Status first;
  for (const auto& job : jobs) {
    Status s = job->WaitLayer(layer);
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

uint32_t BlockManager::Impl::LoadedTokens(const std::string& request_id) {
  std::shared_ptr<TransferJob> job;
  bool unstarted = false;
  uint32_t instance = 0;
  {
    MutexLock start_lock(&start_load_mu_);  // a StartLoad in progress has registered its job
    MutexLock lock(&mu_);
    auto it = requests_.find(request_id);
    if (it == requests_.end()) return 0;
    job = it->second.load_job;
    unstarted = it->second.load_in_flight && !job;
    instance = it->second.instance;
  }
  if (unstarted) {
    // Prepared but never started: start it now rather than report a load that may still land.
    (void)StartLoad(instance);
    MutexLock start_lock(&start_load_mu_);
    MutexLock lock(&mu_);
    auto it = requests_.find(request_id);
    if (it == requests_.end()) return 0;
    job = it->second.load_job;
  }
  if (job) (void)job->Wait();  // callbacks, including OnLoadBatchDone, ran before Wait returns
  MutexLock lock(&mu_);
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return 0;
  return it->second.loaded_blocks * tpb_;
}

FinishedRequests BlockManager::Impl::Finished(uint32_t instance) {
  {
    bool deferred;
    {
      MutexLock lock(&mu_);
      deferred = !deferred_saves_.empty();
    }
    if (deferred) {
      Status s = StartSave(instance);
      if (!s.ok()) KVTIER_LOG(kWarn) << "Finished: " << s.ToString();
    }
  }
  FinishedRequests f;
  MutexLock lock(&mu_);
  // Finished requests the last call listed in loads_done: their step has passed.
  // A plain loop, not erase_if with a lambda: the thread-safety analysis cannot see that a
  // lambda runs under mu_.
  size_t kept = 0;
  for (size_t i = 0; i < retiring_.size(); ++i) {
    if (!Matches(retiring_[i].first, instance)) {
      if (kept != i) retiring_[kept] = std::move(retiring_[i]);
      ++kept;
      continue;
    }
    auto it = requests_.find(retiring_[i].second);
    if (it != requests_.end() && it->second.retiring) {
      it->second.retiring = false;
      RetireIfDone(it);
    }
  }
  retiring_.resize(kept);
  TakeInstance(&saves_done_, instance, &f.saves_done);
  TakeInstance(&loads_done_, instance, &f.loads_done);
  for (const std::string& id : f.loads_done) {
    auto it = requests_.find(id);
    if (it == requests_.end() || !it->second.load_unreported) continue;
    it->second.load_unreported = false;
    it->second.retiring = true;
    retiring_.emplace_back(it->second.instance, id);
  }
  return f;
}

void BlockManager::Impl::TakeInstance(std::vector<std::pair<uint32_t, std::string>>* from,
                                      uint32_t instance, std::vector<std::string>* to) {
  std::erase_if(*from, [&](std::pair<uint32_t, std::string>& e) {
    if (!Matches(e.first, instance)) return false;
    to->push_back(std::move(e.second));
    return true;
  });
}

void BlockManager::Impl::AdoptInstance(uint32_t instance) {
  MutexLock lock(&mu_);
  gone_instances_.erase(instance);
}

size_t BlockManager::Impl::InstanceRequests(uint32_t instance) {
  MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [id, r] : requests_) n += Matches(r.instance, instance);
  return n;
}

size_t BlockManager::Impl::ForgetInstance(uint32_t instance) {
  std::vector<std::string> ids;
  {
    MutexLock lock(&mu_);
    gone_instances_.insert(instance);
    // Deferred saves of the engine would wait for a slot only to copy from a G1 that is gone.
    std::vector<std::pair<std::string, BlockKey>> dropped;
    for (auto d = deferred_saves_.begin(); d != deferred_saves_.end();) {
      if (d->instance != instance) {
        ++d;
        continue;
      }
      saving_keys_.erase(d->key);
      ReleaseSaveHolds(d->request_id, 1);
      c_.dropped_saves.fetch_add(1, std::memory_order_relaxed);
      d = deferred_saves_.erase(d);
    }
    for (const auto& [id, r] : requests_) {
      if (r.instance == instance) ids.push_back(id);
    }
  }
  // What was bound but not started runs now and fails in the copy backend (the engine's copies
  // cannot run), releasing pins and slots on the usual failure path.
  Status s = StartLoad(instance);
  if (!s.ok()) KVTIER_LOG(kWarn) << "ForgetInstance(" << instance << "): " << s.ToString();
  s = StartSave(instance);
  if (!s.ok()) KVTIER_LOG(kWarn) << "ForgetInstance(" << instance << "): " << s.ToString();
  for (const std::string& id : ids) (void)RequestFinished(id);
  {
    MutexLock lock(&mu_);
    std::vector<std::string> unused;
    TakeInstance(&saves_done_, instance, &unused);
    TakeInstance(&loads_done_, instance, &unused);
  }
  return ids.size();
}

ManagerStats BlockManager::Impl::Stats() {
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
  s.events_emitted = c_.events.load();
  if (publisher_) {
    const EventPublisher::Stats ps = publisher_->stats();
    s.events_published = ps.published_events;
    s.events_publish_dropped = ps.dropped_events;
    s.event_batches_published = ps.batches;
    s.event_replay_requests = ps.replay_requests;
  }
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
  s.g4_enabled = g4_ != nullptr;
  if (g4_) s.g4_breaker_open = g4_->Stats().breaker_open;
  s.g4_lookup_blocks = c_.g4_lookup_blocks.load();
  s.g4_skipped_lookups = c_.g4_skipped_lookups.load();
  s.g4_lookup_failures = c_.g4_lookup_failures.load();
  s.g4_lookup_timeouts = c_.g4_lookup_timeouts.load();
  s.g4_saved_blocks = c_.g4_saved.load();
  s.g4_save_failures = c_.g4_save_failures.load();
  s.g4_dropped_saves = c_.g4_dropped.load();
  s.g4_load_failures = c_.g4_load_failures.load();
  s.g4_corrupt_blocks = c_.g4_corrupt.load();
  s.g4_timeouts = ts.remote_timeouts;
  s.g4_abandoned_loads = ts.remote_abandoned;
  s.g4_late_returns = ts.remote_late_returns;
  s.g4_rejected_keys = g4_rejected_.size();
  s.expired_requests = c_.expired_requests.load();
  s.g4_removed_corrupt = g4_remover_ ? g4_remover_->removed() : 0;
  {
    MutexLock lock(&mu_);
    s.tracked_requests = requests_.size();
  }
  return s;
}

}  // namespace kvtier

#include "manager/g4_path.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "core/log.h"

namespace kvtier {

Result<std::unique_ptr<G4Path>> G4Path::Open(const G4Options& cfg, uint64_t block_bytes,
                                             uint32_t tokens_per_block, const WrapStore& wrap) {
  if (cfg.backend == G4Options::Backend::kNone) return std::unique_ptr<G4Path>();
  const std::string backend = G4Options::BackendName(cfg.backend);
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
    return std::unique_ptr<G4Path>();
  }
  std::unique_ptr<RemoteStore> store = std::move(opened).value();
  if (wrap) store = wrap(std::move(store));
  return std::unique_ptr<G4Path>(new G4Path(std::move(store), cfg, block_bytes, tokens_per_block));
}

G4Path::G4Path(std::unique_ptr<RemoteStore> store, const G4Options& cfg, uint64_t block_bytes,
               uint32_t tokens_per_block)
    : store_(std::move(store)),
      cfg_(cfg),
      write_through_(cfg.write_through),
      lookup_deadline_(cfg.lookup_deadline_ms) {
  const double load_gbps = cfg.load_gbps;
  const double recompute_tps = cfg.recompute_tokens_per_s;
  if (load_gbps > 0 && recompute_tps > 0) {
    const double load_s = static_cast<double>(block_bytes) / (load_gbps * 1e9);
    const double recompute_s = static_cast<double>(tokens_per_block) / recompute_tps;
    slower_than_recompute_ = load_s >= recompute_s;
    KVTIER_LOG(kInfo) << "G4: a block loads in an estimated " << load_s * 1e3
                      << " ms and recomputes in " << recompute_s * 1e3 << " ms: G4 blocks are "
                      << (slower_than_recompute_ ? "NOT offered (recompute is faster)" : "offered");
  } else if (load_gbps > 0 || recompute_tps > 0) {
    KVTIER_LOG(kWarn) << "g4.load_gbps and g4.recompute_tokens_per_s work together; only one "
                         "is set, so G4 blocks are always offered. Set both, or neither";
  }
}

G4Path::~G4Path() { StopRemover(); }

TransferEngine::RemoteConfig G4Path::EngineConfig(
    std::function<void(uint32_t)> release_lent_slot) const {
  TransferEngine::RemoteConfig rc;
  rc.threads = cfg_.threads;
  rc.max_queued_saves = cfg_.max_queued_saves;
  rc.load_timeout = std::chrono::milliseconds(cfg_.load_deadline_ms);
  rc.save_timeout = std::chrono::milliseconds(cfg_.save_deadline_ms);
  rc.release_lent_slot = std::move(release_lent_slot);
  return rc;
}

void G4Path::StartRemover() {
  G4Remover::Options removal;
  removal.deadline = std::chrono::milliseconds(cfg_.save_deadline_ms);
  // Only what is still remembered as bad: a block written to G4 again since is whole.
  remover_ = std::make_unique<G4Remover>(
      store_.get(), removal, [this](const BlockKey& key) { return rejected_.Contains(key); });
}

void G4Path::StopRemover() {
  if (remover_) removed_before_stop_ = remover_->removed();
  remover_.reset();
}

bool G4Path::SkipLookup() {
  if (!slower_than_recompute_) return false;
  skipped_lookups_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

uint32_t G4Path::Match(std::span<const BlockKey> keys, uint64_t namespace_id) {
  // Never past a block whose object failed a load of ours (not even asked about).
  keys = keys.first(rejected_.FirstIn(keys));
  if (keys.empty()) return 0;
  std::vector<std::string> names;
  names.reserve(keys.size());
  for (const BlockKey& k : keys) names.push_back(RemoteObjectName(namespace_id, k));
  std::vector<uint8_t> present(keys.size(), 0);
  const Status s = store_->Contains(names, RemoteClock::now() + lookup_deadline_, present);
  if (!s.ok()) {
    lookup_failures_.fetch_add(1, std::memory_order_relaxed);
    if (s.Is(StatusCode::kTimedOut)) lookup_timeouts_.fetch_add(1, std::memory_order_relaxed);
    KVTIER_LOG(kDebug) << "G4 lookup: " << s.ToString() << " (a miss)";
    return 0;
  }
  uint32_t n = 0;
  while (n < present.size() && present[n] != 0) ++n;
  lookup_blocks_.fetch_add(n, std::memory_order_relaxed);
  return n;
}

void G4Path::LoadFailed(const BlockKey& key, uint64_t namespace_id, const Status& st) {
  load_failures_.fetch_add(1, std::memory_order_relaxed);
  if (st.Is(StatusCode::kCorruption)) corrupt_.fetch_add(1, std::memory_order_relaxed);
  if (!st.Is(StatusCode::kCorruption) && !st.Is(StatusCode::kNotFound)) return;  // transient
  rejected_.Add(key);
  if (st.Is(StatusCode::kCorruption) && remover_) {
    remover_->Enqueue(RemoteObjectName(namespace_id, key), key);
  }
}

void G4Path::Written(const BlockKey& key) {
  saved_.fetch_add(1, std::memory_order_relaxed);
  rejected_.Forget(key);
}

void G4Path::FillStats(ManagerStats* s) const {
  s->g4_enabled = true;
  s->g4_breaker_open = store_->Stats().breaker_open;
  s->g4_lookup_blocks = lookup_blocks_.load();
  s->g4_skipped_lookups = skipped_lookups_.load();
  s->g4_lookup_failures = lookup_failures_.load();
  s->g4_lookup_timeouts = lookup_timeouts_.load();
  s->g4_saved_blocks = saved_.load();
  s->g4_save_failures = save_failures_.load();
  s->g4_dropped_saves = dropped_.load();
  s->g4_load_failures = load_failures_.load();
  s->g4_corrupt_blocks = corrupt_.load();
  s->g4_rejected_keys = rejected_.size();
  s->g4_removed_corrupt = remover_ ? remover_->removed() : removed_before_stop_.load();
}

}  // namespace kvtier

// BlockManagerImpl, the load path: Lookup and PrepareLoad (planning), then starting,
// submitting and finishing the planned loads, WaitLayer and LoadedTokens.
#include <algorithm>
#include <chrono>
#include <string>

#include "core/log.h"
#include "manager/block_manager_impl.h"

namespace kvtier {

namespace {

// A Lookup repeated within this time reuses the G4 answer of the last one (vLLM asks again
// for every request it cannot schedule yet; each fresh answer is a round trip): a second when
// the answer found every block asked about, 50 ms when it did not. Blocks still being written
// (a P/D producer's write-through, the consumer waiting for them: docs/pd.md) or a query that
// passed its deadline are then seen within 50 ms, not a second (measured: 2 waits of 1.0 s per
// probe across hosts with one reuse time for both).
constexpr auto kG4LookupReuse = std::chrono::seconds(1);
constexpr auto kG4PartialLookupReuse = std::chrono::milliseconds(50);

}  // namespace

// ---------------------------------------------------------------------------------------------
// Scheduler side

Result<LookupResult> BlockManagerImpl::Lookup(const RequestSpec& spec, uint32_t num_computed_tokens,
                                              uint32_t instance) {
  if (spec.request_id.empty()) return Status::InvalidArgument("Lookup: empty request_id");
  if (num_computed_tokens % tpb_ != 0) {
    return Status::InvalidArgument(
        "Lookup: num_computed_tokens = " + std::to_string(num_computed_tokens) +
        " is not a multiple of the block size " + std::to_string(tpb_));
  }
  KVTIER_ASSIGN_OR_RETURN(std::shared_ptr<const BlockHasher> hasher,
                          HasherFor(spec.cache_salt, spec.adapter_id));
  c_.lookups.fetch_add(1, std::memory_order_relaxed);
  const ScopedLatency latency(metrics_ ? metrics_->lookup : nullptr);

  std::vector<BlockKey> keys;
  bool reuse_keys = false;
  {
    MutexLock lock(&mu_);
    Request* entry = requests_.Find(spec.request_id);
    if (entry != nullptr && entry->hasher == hasher && entry->block_extra == spec.block_extra &&
        entry->tokens.size() >= spec.prompt.size() &&
        std::equal(spec.prompt.begin(), spec.prompt.end(), entry->tokens.begin())) {
      keys = entry->keys;  // asked again: no need to hash again
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
    // From the first block the engine lacks: the blocks before it are the engine's own (a state
    // group of a hybrid model holds only some boundaries, so kvtier may lack earlier ones).
    MatchResult m =
        index_->Match(std::span<const BlockKey>(keys).subspan(start, max_blocks - start),
                      LocalTiersToOffer() & spec.load_tiers);
    loadable = static_cast<uint32_t>(m.num_blocks());
    local = start + loadable;
    for (size_t i = 0; i < m.num_blocks(); ++i) ++result.blocks_by_tier[m.tiers[i]];
    const bool g4_allowed = g4_ && ((spec.load_tiers >> kTierG4) & 1u);
    if (g4_allowed && local < max_blocks && g4_->SkipLookup()) {
      // Loading from G4 is slower than recomputing: not asked (counted).
    } else if (g4_allowed && local < max_blocks) {
      // G4 only for what the local tiers lack, in one round trip within the lookup deadline. A
      // repeated Lookup (the scheduler asking again) reuses a recent answer.
      bool& reused = g4_reused;
      if (reuse_keys) {
        MutexLock lock(&mu_);
        Request* entry = requests_.Find(spec.request_id);
        if (entry != nullptr && entry->g4_first == local &&
            std::chrono::steady_clock::now() - entry->g4_asked_at <
                (entry->g4_whole ? std::chrono::steady_clock::duration(kG4LookupReuse)
                                 : kG4PartialLookupReuse)) {
          in_g4 = entry->g4_blocks;
          reused = true;
        }
      }
      if (reused) {
        // A block whose load failed since the answer is not offered again.
        in_g4 = static_cast<uint32_t>(
            g4_->FirstRejected(std::span<const BlockKey>(keys).subspan(local, in_g4)));
      }
      if (!reused) {
        in_g4 = g4_->Match(std::span<const BlockKey>(keys).subspan(local, max_blocks - local),
                           hasher->root().hi);
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
  Request& r = requests_.Activate(spec.request_id, &made);
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
  if (!g4_reused) {
    r.g4_asked_at = std::chrono::steady_clock::now();
    r.g4_whole = local + in_g4 >= max_blocks;
  }
  r.g4_first = local;
  r.g4_blocks = in_g4;
  return result;
}

Result<uint32_t> BlockManagerImpl::PrepareLoad(const std::string& request_id,
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
    Request* entry = requests_.Find(request_id);
    if (entry == nullptr) {
      return Status::NotFound("PrepareLoad: request '" + request_id + "' had no Lookup");
    }
    Request& r = *entry;
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

  // A block the engine does not hold ends the load there (connector.h: kNoG1Block).
  for (uint32_t i = 0; i < want; ++i) {
    if (g1_block_ids[start + i] == kNoG1Block) {
      keys.resize(i);
      want = i;
      break;
    }
  }
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
      if (g4_->Rejected(keys[planned])) break;  // its load failed since the Lookup
      // An engine that fetches G4 blocks itself needs no G2 slot (the block is not promoted).
      std::optional<uint32_t> staging =
          engine_->CanFetch(g1_block_ids[i])
              ? std::optional<uint32_t>(BlockTransfer::kAnyStagingSlot)
              : AllocateStagingSlot(ns);
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
    Request* entry = requests_.Find(request_id);
    if (entry == nullptr) {
      // Finished while we planned: undo.
      for (const PlannedLoad& p : plan) {
        if (HoldsCacheSlot(p)) ReleaseG2Slot(p.g2_slot);
      }
      KVTIER_RETURN_IF_ERROR(
          index_->Unpin(std::span<const BlockKey>(keys).subspan(0, pinned_planned)));
      return Status::NotFound("PrepareLoad: request '" + request_id + "' finished meanwhile");
    }
    requests_.Touch(*entry);
    Request& r = *entry;
    for (PlannedLoad& p : plan) {
      p.parent = p.block_index == 0 ? r.hasher->root() : r.keys[p.block_index - 1];
      p.async = async_load;
      p.instance = r.instance;
    }
    r.load_first = start;
    r.load_planned = static_cast<uint32_t>(plan.size());
    r.loaded_blocks = 0;
    r.load_in_flight = !plan.empty();
    loads_.Plan(std::move(plan));
  }
  c_.miss_blocks.fetch_add(asked - planned, std::memory_order_relaxed);
  return static_cast<uint32_t>(planned) * tpb_;
}

// ---------------------------------------------------------------------------------------------
// Worker side

Status BlockManagerImpl::StartLoad(uint32_t instance) {
  MutexLock start_lock(&start_load_mu_);
  std::vector<PlannedLoad> loads;
  {
    MutexLock lock(&mu_);
    loads = loads_.TakePlanned(instance);
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

Status BlockManagerImpl::SubmitLoads(std::vector<PlannedLoad> loads, bool async) {
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
          slots_->Set(p.g2_slot, G2SlotTable::Meta{p.key, p.parent, p.namespace_id}, p.tokens);
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
          // object is not offered by this manager again (G4Path::Rejected) until it writes the
          // block again; a corrupt one is also deleted from the store, off this thread.
          g4_->LoadFailed(p.key, p.namespace_id, st);
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
  loads_.Started(shared->front().instance, *job, async);
  for (const PlannedLoad& p : *shared) {
    Request* entry = requests_.Find(p.request_id);
    if (entry != nullptr && entry->load_in_flight) entry->load_job = *job;
  }
  return Status::Ok();
}

void BlockManagerImpl::OnLoadBatchDone(const std::vector<PlannedLoad>& loads,
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
    Request* entry = requests_.Find(id);
    if (entry == nullptr) continue;
    Request& r = *entry;
    r.loaded_blocks = 0;
    for (const auto& [rid, n] : intact) {
      if (rid == id) r.loaded_blocks += n;
    }
    r.load_in_flight = false;
    r.load_job.reset();
    // An engine that is gone is told nothing (and its entries are not kept for a report).
    const bool gone = gone_instances_.count(r.instance) != 0;
    if (!gone) loads_.Done(r.instance, id);
    // Finished while loading: kept until the engine has been told (loads_done) and has had a
    // step to ask LoadedTokens.
    if (r.finished && !gone) r.load_unreported = true;
    requests_.Touch(*entry);
    RetireIfDone(*entry);
  }
}

Status BlockManagerImpl::WaitLayer(uint32_t layer, uint32_t instance) {
  if (layer >= layout_.num_layers) {
    return Status::InvalidArgument("WaitLayer(" + std::to_string(layer) + "): the layout has " +
                                   std::to_string(layout_.num_layers) + " layers");
  }
  std::vector<std::shared_ptr<TransferJob>> jobs;
  {
    MutexLock start_lock(&start_load_mu_);  // a StartLoad in progress has registered its job
    MutexLock lock(&mu_);
    jobs = loads_.JobsOf(instance);
  }
  Status first;
  for (const auto& job : jobs) {
    Status s = job->WaitLayer(layer);
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

uint32_t BlockManagerImpl::LoadedTokens(const std::string& request_id) {
  std::shared_ptr<TransferJob> job;
  bool unstarted = false;
  uint32_t instance = 0;
  {
    MutexLock start_lock(&start_load_mu_);  // a StartLoad in progress has registered its job
    MutexLock lock(&mu_);
    Request* entry = requests_.Find(request_id);
    if (entry == nullptr) return 0;
    job = entry->load_job;
    unstarted = entry->load_in_flight && !job;
    instance = entry->instance;
  }
  if (unstarted) {
    // Prepared but never started: start it now rather than report a load that may still land.
    (void)StartLoad(instance);
    MutexLock start_lock(&start_load_mu_);
    MutexLock lock(&mu_);
    Request* entry = requests_.Find(request_id);
    if (entry == nullptr) return 0;
    job = entry->load_job;
  }
  if (job) (void)job->Wait();  // callbacks, including OnLoadBatchDone, ran before Wait returns
  MutexLock lock(&mu_);
  Request* entry = requests_.Find(request_id);
  if (entry == nullptr) return 0;
  return entry->loaded_blocks * tpb_;
}

}  // namespace kvtier

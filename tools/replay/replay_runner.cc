#include "replay/replay_runner.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "cli/service_env.h"
#include "index/policy_names.h"
#include "policies/lab_policies.h"
#include "replay/replay_host_g1.h"

namespace kvtier::cli {

namespace {

uint64_t Mix(uint64_t x) {
  x ^= x >> 31;
  x *= 0x7fb5d329728ea185ull;
  x ^= x >> 27;
  x *= 0x81dadef4bc2dd44dull;
  return x ^ (x >> 33);
}

}  // namespace

// `g4_staging` slots are added to G2 for the staging pool when G4 is on (0 otherwise).
Result<Config> ReplayConfig(const ReplayOptions& o, const KvLayout& layout, uint64_t g4_staging) {
  // The replay is a lab command: a lab policy (lineage-lru, s3fifo, ...) runs in the real
  // manager of this process, which a deployment's config refuses (docs/policies.md).
  if (IsLabPolicyName(o.policy)) EnableLabPolicies();
  Config c;
  // Attached mode (docs/service.md): with KVTIER_SERVICE_SOCKET set, the replay's manager is
  // kvtier serve on that socket (whose own settings size G2 and G3; the ones below are then
  // the daemon's business).
  KVTIER_RETURN_IF_ERROR(c.LoadEnvironment(ServiceEnvironment()));
  // The manager's G2 slot: a 4 KiB header area + the payload, 4 KiB-aligned by the arena.
  const uint64_t slot = (4096 + layout.BlockBytes() + 4095) / 4096 * 4096;
  KVTIER_RETURN_IF_ERROR(
      c.Set("g2.capacity_bytes", std::to_string((o.g2_blocks + g4_staging) * slot)));
  KVTIER_RETURN_IF_ERROR(c.Set("g2.policy", o.policy));
  KVTIER_RETURN_IF_ERROR(c.Set("g2.lock_memory", "false"));
  KVTIER_RETURN_IF_ERROR(c.Set("transfer.copy_threads", std::to_string(o.copy_threads)));
  // A request's saves are one batch; the longest Mooncake request has 247 blocks.
  KVTIER_RETURN_IF_ERROR(c.Set("transfer.max_queued_saves", "65536"));
  if (o.g3_blocks == 0) {
    KVTIER_RETURN_IF_ERROR(c.Set("g3.enabled", "false"));
  } else {
    KVTIER_RETURN_IF_ERROR(c.Set("g3.dir", o.g3_dir));
    // Slot files: the tier rounds to whole slots; 1 MiB spare covers its file header.
    KVTIER_RETURN_IF_ERROR(
        c.Set("g3.capacity_bytes", std::to_string(o.g3_blocks * slot + (1ull << 20))));
    KVTIER_RETURN_IF_ERROR(c.Set("g3.policy", o.policy));
    KVTIER_RETURN_IF_ERROR(c.Set("g3.admit_min_seen", std::to_string(o.g3_admit_min_seen)));
  }
  for (const auto& [name, value] : o.settings) KVTIER_RETURN_IF_ERROR(c.Set(name, value));
  if (!o.g4_backend.empty()) {
    KVTIER_RETURN_IF_ERROR(c.Set("g4.backend", o.g4_backend));
    if (o.g4_backend == "fs") {
      KVTIER_RETURN_IF_ERROR(c.Set("g4.dir", o.g4_dir));
    } else {
      KVTIER_RETURN_IF_ERROR(c.Set("g4.endpoints", o.g4_endpoints));
    }
    if (o.g4_write_through.has_value()) {
      KVTIER_RETURN_IF_ERROR(c.Set("g4.write_through", *o.g4_write_through ? "true" : "false"));
    }
    // Exactly the staging pool asked for (the manager's auto size, at most 64, would cut a
    // long prompt's G4 run short), and room for a whole request's write-through batch.
    if (o.g4_lookup_deadline_ms > 0) {
      KVTIER_RETURN_IF_ERROR(
          c.Set("g4.lookup_deadline_ms", std::to_string(o.g4_lookup_deadline_ms)));
    }
    if (o.g4_load_deadline_ms > 0) {
      KVTIER_RETURN_IF_ERROR(c.Set("g4.load_deadline_ms", std::to_string(o.g4_load_deadline_ms)));
    }
    KVTIER_RETURN_IF_ERROR(c.Set("g2.staging_slots", std::to_string(g4_staging)));
    KVTIER_RETURN_IF_ERROR(c.Set("g4.max_queued_saves", "65536"));
  }
  return c;
}

void FillBlockContent(const BlockKey& key, uint64_t seed, uint8_t* out, uint64_t bytes) {
  uint64_t x = key.hi ^ Mix(key.lo ^ seed);
  for (uint64_t off = 0; off < bytes; off += 8) {
    x = Mix(x + off);
    std::memcpy(out + off, &x, std::min<uint64_t>(8, bytes - off));
  }
}

Result<ReplaySizing> SizeReplay(const ReplayTrace& trace, const ReplayOptions& o) {
  ReplaySizing z;
  const uint32_t tpb = trace.tokens_per_block();
  KVTIER_ASSIGN_OR_RETURN(z.layout, ReplayLayout(o.payload_bytes, tpb));
  z.requests =
      o.max_requests == 0 ? trace.requests() : std::min<size_t>(o.max_requests, trace.requests());
  z.g1_blocks = 1;
  for (size_t r = 0; r < z.requests; ++r) {
    z.g1_blocks = std::max<uint64_t>(z.g1_blocks, (trace.cost_tokens(r) + tpb) / tpb + 1);
    z.g1_blocks = std::max<uint64_t>(z.g1_blocks, trace.prompt_blocks(r) + 1);
  }
  if (z.g1_blocks > (1u << 20)) {
    return Status::InvalidArgument("a request needs " + std::to_string(z.g1_blocks) +
                                   " G1 blocks; the replay's G1 holds at most 2^20");
  }
  // The manager keeps at most half of G2 for staging and at most 4096 slots (its config bound).
  z.g4_staging = o.g4_backend.empty() ? 0 : std::min<uint64_t>({z.g1_blocks, o.g2_blocks, 4096});
  return z;
}

Result<KvLayout> ReplayLayout(uint64_t payload_bytes, uint32_t tokens_per_block) {
  const uint64_t per_dim = 4ull * tokens_per_block;  // K and V, fp16, one head
  if (payload_bytes == 0 || payload_bytes % per_dim != 0 ||
      payload_bytes / per_dim > KvLayout::kMaxHeadDim) {
    return Status::InvalidArgument("--payload-bytes " + std::to_string(payload_bytes) +
                                   ": must be a multiple of " + std::to_string(per_dim) +
                                   " (K and V planes of fp16 for " +
                                   std::to_string(tokens_per_block) + " tokens), at most " +
                                   std::to_string(per_dim * KvLayout::kMaxHeadDim));
  }
  KvLayout l;
  l.num_layers = 1;
  l.num_planes = 2;
  l.num_kv_heads = 1;
  l.head_dim = static_cast<uint32_t>(payload_bytes / per_dim);
  l.tokens_per_block = tokens_per_block;
  l.dtype = DType::kFp16;
  l.g1_arrangement = G1Arrangement::kLayerSeparate;
  KVTIER_RETURN_IF_ERROR(l.Validate());
  return l;
}

Result<ReplayResult> RunReplay(const ReplayTrace& trace, const ReplayOptions& o) {
  KVTIER_RETURN_IF_ERROR(o.cost.Validate());
  if (o.g2_blocks == 0) return Status::InvalidArgument("G2 needs at least one slot");
  if (o.g3_blocks > 0 && o.g3_dir.empty()) {
    return Status::InvalidArgument("a G3 replay needs a directory for its slot files");
  }
  if (!o.g4_backend.empty() && o.g4_backend != "fs" && o.g4_backend != "redis") {
    return Status::InvalidArgument("G4 backend '" + o.g4_backend + "': use fs or redis");
  }
  if (o.g4_backend == "fs" && o.g4_dir.empty()) {
    return Status::InvalidArgument("a G4 fs replay needs the shared directory (g4_dir)");
  }
  if (o.g4_backend == "redis" && o.g4_endpoints.empty()) {
    return Status::InvalidArgument("a G4 redis replay needs the server's host:port");
  }
  const uint32_t tpb = trace.tokens_per_block();
  KVTIER_ASSIGN_OR_RETURN(const ReplaySizing z, SizeReplay(trace, o));
  const KvLayout& layout = z.layout;
  const size_t requests = z.requests;
  const uint64_t g1_need = z.g1_blocks;
  const uint64_t g4_staging = z.g4_staging;
  KVTIER_ASSIGN_OR_RETURN(Config config, ReplayConfig(o, layout, g4_staging));

  ManagerOptions mo;
  mo.layout = layout;
  mo.model_id = "kvtier-replay";
  mo.config = config;
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<BlockManager> manager, BlockManager::Create(mo));
  HostG1 g1(layout, static_cast<uint32_t>(g1_need));
  KVTIER_RETURN_IF_ERROR(manager->RegisterDeviceMemory(g1.memory()));
  KVTIER_ASSIGN_OR_RETURN(
      BlockHasher hasher,
      BlockHasher::Create(KeyNamespace{mo.model_id, layout.Fingerprint(), "", ""}, tpb));

  ReplayResult res;
  {
    const ManagerStats s = manager->Stats();
    res.g2_slots = s.g2_slots - std::min<uint64_t>(s.g2_slots, g4_staging);
    res.g3_slots = s.g3_slots;
    res.g2_staging_slots = s.g2_staging_slots;
    // The manager runs on without a G4 that cannot open (a worker must): a replay asked to
    // measure G4 must not silently measure without it. (A Redis server that is down is not
    // this case: the store opens with its breaker open, and its failures are counted.)
    if (!o.g4_backend.empty() && !s.g4_enabled) {
      return Status::Unavailable(
          "G4 (" + o.g4_backend + " " + (o.g4_backend == "fs" ? o.g4_dir : o.g4_endpoints) +
          ") could not be opened (the manager's warning above says why); fix it or drop --g4");
    }
  }
  res.ttft_kvtier_s.reserve(requests);
  res.ttft_recompute_s.reserve(requests);
  const uint64_t block_bytes = layout.BlockBytes();
  std::vector<uint8_t> content(block_bytes);
  std::vector<TokenId> prompt;
  std::vector<uint32_t> g1_blocks(g1_need);
  std::iota(g1_blocks.begin(), g1_blocks.end(), 0u);
  // From the manager's counters as they stand: attached to kvtier serve, they are the daemon
  // pool's, which other processes' requests have moved already.
  std::array<uint64_t, kNumTiers> hits_before = manager->Stats().hit_blocks;
  uint64_t verify_counter = 0;

  const auto start = std::chrono::steady_clock::now();
  for (size_t r = 0; r < requests; ++r) {
    const uint64_t seed =
        o.content_seed + (o.reseed_at_request != 0 && r >= o.reseed_at_request ? 1 : 0);
    trace.Prompt(r, &prompt);
    const std::string id = trace.RequestId(r);
    const std::vector<BlockKey> keys = hasher.KeysFor(prompt);
    const uint32_t g1_used = static_cast<uint32_t>((prompt.size() + tpb - 1) / tpb);
    const std::span<const uint32_t> blocks(g1_blocks.data(), g1_used);

    KVTIER_ASSIGN_OR_RETURN(LookupResult lr, manager->Lookup({id, prompt, "", "", {}}, 0));
    if (o.after_lookup) o.after_lookup(r, lr.blocks_by_tier[kTierG4]);
    KVTIER_ASSIGN_OR_RETURN(uint32_t planned, manager->PrepareLoad(id, blocks, lr.num_tokens));
    KVTIER_RETURN_IF_ERROR(manager->StartLoad());
    for (uint32_t l = 0; l < layout.num_layers; ++l) {
      // A failed load is not an error of the replay: LoadedTokens says what arrived intact and
      // the rest is computed, as an engine would.
      (void)manager->WaitLayer(l);
    }
    const uint32_t loaded = manager->LoadedTokens(id) / tpb;
    if (loaded * tpb < lr.num_tokens || planned < lr.num_tokens) ++res.short_loads;

    for (uint32_t i = 0; i < loaded && o.verify_every > 0; ++i) {
      if (verify_counter++ % o.verify_every != 0) continue;
      FillBlockContent(keys[i], seed, content.data(), block_bytes);
      ++res.verified_blocks;
      if (!g1.Equals(blocks[i], content.data())) ++res.mismatched_blocks;
    }
    for (uint32_t i = loaded; i < keys.size(); ++i) {
      FillBlockContent(keys[i], seed, content.data(), block_bytes);
      g1.Scatter(blocks[i], content.data());
    }
    KVTIER_RETURN_IF_ERROR(manager->Commit(id, prompt, blocks));
    KVTIER_RETURN_IF_ERROR(manager->StartSave());
    const bool held = manager->RequestFinished(id);
    // Serve the next request on the index this one left: wait for its saves and demotions.
    manager->WaitForSaves();
    if (held) {
      // The manager reports the request in saves_done once its saves ended; only then may the
      // engine reuse the blocks.
      bool done = false;
      for (int tries = 0; tries < 1000 && !done; ++tries) {
        for (const std::string& d : manager->Finished().saves_done) done = done || d == id;
        if (!done) manager->WaitForSaves();
      }
      if (!done) {
        return Status::Internal("request " + id +
                                " never reported its saves done after WaitForSaves");
      }
    } else {
      (void)manager->Finished();
    }
    for (uint32_t b = 0; b < g1_used; ++b) g1.Poison(b);
    if (o.after_request) o.after_request(r);

    // Per-tier hits of this request: the manager's counters are exact since requests run one
    // at a time.
    const ManagerStats s = manager->Stats();
    std::array<uint64_t, kNumTiers> mine{};
    for (TierId t = 0; t < kNumTiers; ++t) {
      mine[t] = s.hit_blocks[t] - hits_before[t];
      res.hit_blocks[t] += mine[t];
    }
    hits_before = s.hit_blocks;

    const uint64_t n = trace.prompt_blocks(r);
    const uint64_t cost_tokens = trace.cost_tokens(r);
    // The last token is always computed, even when every block loaded (a partial Mooncake block
    // that hit is whole-block reuse of an identical prompt).
    const uint64_t loaded_tokens = std::min<uint64_t>(uint64_t{loaded} * tpb, cost_tokens - 1);
    res.prompt_blocks += n;
    res.prompt_tokens += cost_tokens;
    res.prefill_tokens_saved += loaded_tokens;
    res.ttft_recompute_s.push_back(o.cost.ComputeSeconds(cost_tokens));
    res.ttft_kvtier_s.push_back(o.cost.LoadSeconds(mine, tpb) +
                                o.cost.ComputeSeconds(cost_tokens - loaded_tokens));
  }
  manager->WaitForSaves();
  res.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  res.requests = requests;
  res.stats = manager->Stats();
  return res;
}

}  // namespace kvtier::cli

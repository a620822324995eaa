// The core of `kvtier replay`: drives a real BlockManager (real G2 arena, optional real G3 slot
// files, optional real G4 store: a shared directory or a Redis server) through the public
// connector API, request by request, the way an engine with a host-memory G1 would:
//
//   Lookup -> PrepareLoad -> StartLoad -> WaitLayer(every layer) -> LoadedTokens
//   -> verify the loaded blocks byte for byte -> "compute" the rest (fill from the key)
//   -> Commit -> StartSave -> RequestFinished -> WaitForSaves -> Finished (free G1)
//
// Requests run one at a time, in trace order, and each waits for its saves: the index then
// holds the same blocks whatever the machine's speed, so runs are repeatable and comparable
// with the simulator's (whose semantics are the same: lab/sim/policy_sim.h). Block payloads
// are scaled down (payload_bytes); a block's bytes are a pure function of its key, so every
// loaded block can be checked against what was committed.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kvtier/connector.h"
#include "replay/replay_cost.h"
#include "sim/replay_trace.h"

namespace kvtier::cli {

struct ReplayOptions {
  std::string policy = "adaptive";  // eviction policy of G2 and G3 (lru, ...; or the lab's)
  uint64_t g2_blocks = 1;           // G2 slots (capacity); >= 1
  uint64_t g3_blocks = 0;           // G3 slots; 0 = no G3
  std::string g3_dir;               // where G3's slot files go; REQUIRED when g3_blocks > 0
  uint32_t g3_admit_min_seen = 2;   // sightings before G3 admits a G2 victim (1..15)
  // G4 (docs/g4.md): "" = none, "fs" (g4_dir REQUIRED: the shared directory) or "redis"
  // (g4_endpoints REQUIRED: "host:port"). G4 has no slot count: it holds what its backend holds.
  // With G4 the G2 arena gets a staging pool of min(longest prompt, g2_blocks) slots ON TOP of
  // g2_blocks (a G4 load that finds no staging slot is recomputed, never waited for), so G2's
  // cache still has g2_blocks slots.
  std::string g4_backend;
  std::string g4_dir;
  std::string g4_endpoints;
  std::optional<bool> g4_write_through;  // unset = the manager's default (g4.write_through)
  // G4 deadlines (0 = the manager's defaults: g4.lookup_deadline_ms, g4.load_deadline_ms). A
  // late answer is a miss, so a loaded machine changes hit ratios unless these are raised.
  uint32_t g4_lookup_deadline_ms = 0;
  uint32_t g4_load_deadline_ms = 0;
  uint64_t payload_bytes = 4096;  // bytes of one (scaled) block; see ReplayLayout
  uint32_t copy_threads = 2;      // transfer engine memcpy workers
  uint32_t verify_every = 1;      // check every n-th loaded block byte for byte (0 = none)
  uint64_t max_requests = 0;      // replay only the first n requests (0 = all)
  CostModel cost;
  // Further manager config settings (name, value), applied after the ones above, e.g.
  // {"g2.credit_lru.stale_tail", "0"} from --credit-lru. A refused one fails the replay.
  std::vector<std::pair<std::string, std::string>> settings;
  // Test hooks. reseed_at_request: from this request on (0 = never), blocks are computed from
  // a different seed, as if the engine's KV had changed under the same keys: every later load
  // of an older block must count as a mismatch (proves the check catches wrong bytes).
  // after_request: called after each request's saves ended (e.g. to damage G3's files).
  // after_lookup: called between a request's Lookup and its load, with the blocks Lookup
  // offered from G4 (e.g. to kill the G4 server under a planned load).
  // content_seed: the seed of every block's bytes before reseed_at_request (a second worker
  // with another seed is an engine whose KV changed under the same keys).
  uint64_t reseed_at_request = 0;
  uint64_t content_seed = 0;
  std::function<void(size_t request)> after_request;
  std::function<void(size_t request, uint32_t g4_blocks)> after_lookup;
};

struct ReplayResult {
  uint64_t requests = 0;
  uint64_t prompt_blocks = 0;                    // full blocks of all prompts
  std::array<uint64_t, kNumTiers> hit_blocks{};  // blocks loaded into G1, by source tier
  uint64_t prompt_tokens = 0;                    // cost-model prompt tokens, all requests
  uint64_t prefill_tokens_saved = 0;             // prompt tokens loaded instead of computed
  uint64_t verified_blocks = 0;
  uint64_t mismatched_blocks = 0;  // loaded blocks whose bytes differ from what was committed
  uint64_t short_loads = 0;        // requests that loaded fewer tokens than Lookup offered
  std::vector<double> ttft_kvtier_s, ttft_recompute_s;  // per request, cost model
  double wall_seconds = 0;
  ManagerStats stats;                   // the manager's counters at the end
  uint64_t g2_slots = 0, g3_slots = 0;  // cache slots (G2's exclude the staging pool added for G4)
  uint64_t g2_staging_slots = 0;        // G2 slots of the staging pool (G3/G4 loads)
  uint64_t hits() const {
    uint64_t h = 0;
    for (uint64_t b : hit_blocks) h += b;
    return h;
  }
};

// The scaled layout of a replay block: 1 layer, K and V, 1 KV head, fp16, tokens_per_block
// tokens, head_dim = payload_bytes / (4 x tokens_per_block). InvalidArgument (saying what to
// pass) unless payload_bytes is a positive multiple of 4 x tokens_per_block and fits a layout.
Result<KvLayout> ReplayLayout(uint64_t payload_bytes, uint32_t tokens_per_block);

// The manager configuration RunReplay builds from `o`: G2 of (o.g2_blocks + g4_staging) slots
// (`g4_staging`: the G4 staging pool, 0 without G4), G3 and G4 as `o` says, then o.settings.
// InvalidArgument when a setting is refused. A lab policy in o.policy (lineage-lru,
// leaf-first-lru, s3fifo) enables the lab's policies in this process first (EnableLabPolicies,
// lab/policies/lab_policies.h), so the real manager runs it. (Also used by the multi-worker
// replay.)
Result<Config> ReplayConfig(const ReplayOptions& o, const KvLayout& layout, uint64_t g4_staging);

// What a replay of `trace` under `o` is sized by (shared by the single- and multi-worker
// replays): the scaled layout, the requests replayed (o.max_requests caps them), the G1 blocks
// the longest prompt needs (its full blocks plus a partial one) and the G4 staging pool (0
// without G4; at most G1's need, G2's slots and the manager's bound of 4096). InvalidArgument
// for a bad payload size or a prompt past 2^20 blocks.
struct ReplaySizing {
  KvLayout layout;
  size_t requests = 0;
  uint64_t g1_blocks = 0;
  uint64_t g4_staging = 0;
};
Result<ReplaySizing> SizeReplay(const ReplayTrace& trace, const ReplayOptions& o);

// Replays `trace`. InvalidArgument for bad options (naming the field); the manager's errors
// otherwise (a failed connector call ends the replay: it is a bug, not a miss); Unavailable
// when the G4 store cannot be opened at all (e.g. an fs directory that takes no writes). A G4
// that fails later (server gone, late, corrupt) is not an error: its loads are recomputed and its
// failures counted in ReplayResult::stats (g4_*). Two replays given the same G4 share it: the
// second is a fresh worker that finds what the first wrote.
Result<ReplayResult> RunReplay(const ReplayTrace& trace, const ReplayOptions& options);

// The bytes of the block named `key` (`bytes` of them): a pure function of the key and seed.
void FillBlockContent(const BlockKey& key, uint64_t seed, uint8_t* out, uint64_t bytes);

}  // namespace kvtier::cli

// The multi-worker replay (`kvtier replay --workers N --router R`, docs/router.md): N workers,
// each a real BlockManager (its own G2 arena, optional G3 slot files; G4, when given, shared by
// all) behind a simulated G1 prefix cache, take the trace's requests as a router sends them.
//
// Time is simulated: request r arrives at its trace timestamp; its worker serves prefills one at
// a time, first come first served, each taking the cost model's load + compute time
// (replay_cost.h) for what its G1 and its manager supplied. TTFT = wait in the queue + service.
// The blocks themselves move through the real tiers, one request at a time in arrival order,
// each waiting for its saves (as RunReplay does): the index a request is routed on is the one
// the earlier arrivals left, whatever the machine's speed, so runs are repeatable.
//
// Routers:
//   round-robin   request r goes to worker r mod N
//   least-loaded  the least queued work (ties: least work so far, then the lower id)
//   gpu-prefix    the longest G1 prefix (the anchors' rule: Dynamo/llm-d/SGLang see only GPU
//                 memory); ties as least-loaded
//   gpu-aware     KvRouter fed by the G1 events only, with the same queue term: a GPU-only KV
//                 router that weighs load as Dynamo's does (a fairer baseline than gpu-prefix,
//                 which sends everything to one worker when all prompts share a first block)
//   kvtier        KvRouter (include/kvtier/router.h) fed by every worker's real events
//                 (BlockManager::SubscribeEvents: G2, G3, G4) and its simulated G1's events,
//                 with each worker's queued seconds as the queue term; equal estimates as
//                 least-loaded
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kvtier/router.h"
#include "replay/replay_runner.h"

namespace kvtier::cli {

enum class RouterKind { kRoundRobin, kLeastLoaded, kGpuPrefix, kGpuAware, kKvtier };
inline constexpr RouterKind kAllRouters[] = {RouterKind::kRoundRobin, RouterKind::kLeastLoaded,
                                             RouterKind::kGpuPrefix, RouterKind::kGpuAware,
                                             RouterKind::kKvtier};
// "round-robin", "least-loaded", "gpu-prefix", "gpu-aware", "kvtier".
const char* RouterKindName(RouterKind kind);
// InvalidArgument listing the names when `name` is none of them.
Result<RouterKind> ParseRouterKind(const std::string& name);

struct MultiWorkerOptions {
  uint32_t workers = 2;  // 1..64
  RouterKind router = RouterKind::kKvtier;
  // Each worker's manager: g2_blocks and g3_blocks are PER WORKER; g3_dir is a base directory
  // (worker i gets g3_dir/worker-i); G4 (g4_backend...) is shared by all workers. Test hooks of
  // ReplayOptions other than max_requests are not used.
  ReplayOptions replay;
  // Each worker's G1 prefix cache, in blocks; >= 1. (`--g1-fraction` x g2_blocks.)
  uint64_t g1_blocks = 1;
  // Arrival time of each request, in seconds (the trace's timestamps); one per trace request.
  // Requests are served in arrival order (stable for equal times).
  std::vector<double> arrival_s;
  // Namespace of the keys (model id): each run of several routers on one G4 uses its own, so
  // no run finds another's blocks.
  std::string model_id = "kvtier-replay";
  // (request, worker): just before that request (arrival order) is routed, the worker's G1 is
  // emptied, as vLLM's reset_prefix_cache does (the kvtier router then gets AllBlocksCleared for
  // G1: ClearWorker). For tests, and to show what a restart costs.
  std::vector<std::pair<size_t, uint32_t>> clear_g1_at;
};

struct WorkerFigures {
  uint64_t requests = 0;
  double work_s = 0;                             // service seconds (load + compute)
  std::array<uint64_t, kNumTiers> hit_blocks{};  // blocks supplied by its G1, G2, G3, G4
};

struct MultiWorkerResult {
  RouterKind router = RouterKind::kKvtier;
  uint64_t requests = 0;
  uint64_t prompt_blocks = 0;
  std::array<uint64_t, kNumTiers> hit_blocks{};  // G1 = the simulated G1 prefix cache
  uint64_t prompt_tokens = 0;
  uint64_t prefill_tokens_saved = 0;
  uint64_t verified_blocks = 0;
  uint64_t mismatched_blocks = 0;
  uint64_t short_loads = 0;
  std::vector<double> ttft_s;    // per request (arrival order): queue wait + service
  std::vector<double> wait_s;    // per request: time in the worker's queue
  std::vector<uint32_t> routed;  // per request (trace order): the worker it went to
  std::vector<WorkerFigures> workers;
  double wall_seconds = 0;
  uint64_t router_events = 0;  // events the kvtier router applied (0 for the others)

  uint64_t hits() const {
    uint64_t h = 0;
    for (uint64_t b : hit_blocks) h += b;
    return h;
  }
  // The busiest worker's work / the mean worker's work (1 = perfectly even; 0 without work).
  double load_imbalance() const;
};

// Runs the trace through `options.workers` workers under `options.router`. InvalidArgument for
// bad options (naming the field: workers out of 1..64, g1_blocks 0, arrival_s of the wrong size
// or with a negative or non-finite time); RunReplay's errors otherwise.
Result<MultiWorkerResult> RunMultiWorkerReplay(const ReplayTrace& trace,
                                               const MultiWorkerOptions& options);

// The trace's request timestamps in seconds, one per request of `trace` (read from `path` again:
// the parsers keep no timestamps). Mooncake's "timestamp" is in milliseconds, and so is the
// kvtier format's optional one (absent: the previous request's time, 0 for the first).
// InvalidArgument naming the line when a line's request count or timestamp does not parse.
Result<std::vector<double>> ReadArrivalSeconds(const std::string& path, const ReplayTrace& trace);

}  // namespace kvtier::cli

// KV-aware routing: which worker should take a request so that its time to first token is
// lowest. A KvRouter keeps a prefix index of which worker holds which block in which tier (fed
// by the workers' KV events: vLLM's own G1 events and kvtier's G2/G3/G4 events) and, for a
// request's chained block keys, estimates each worker's TTFT as
//
//   queue_s(worker)                                  the worker's queued work (set by the caller)
//   + sum over the blocks the worker can supply of   block_bytes / load_gbps[tier]
//   + (prompt tokens not supplied) / prefill_tokens_per_s
//
// where a worker supplies the longest prefix of the request's blocks that it holds in any tier
// (each block from the fastest tier holding it; G4 counts for every worker, since it is shared).
// It picks the worker with the lowest estimate among those that are up; equal estimates go to
// the worker with the shorter queue, then to the lower WorkerId (deterministic).
//
// The router knows keys and events only, never a BlockManager (docs/router.md). Used by
// `kvtier replay --workers N --router kvtier` and by `kvtier router` (the HTTP proxy, through
// the Python package).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/events.h"
#include "kvtier/status.h"
#include "kvtier/tier.h"

namespace kvtier {

using WorkerId = uint32_t;

struct RouterOptions {
  uint32_t tokens_per_block = 16;
  uint64_t block_bytes = 0;  // bytes of one block's KV (all layers); > 0
  // Prefill speed of one worker, for the tokens it must compute. > 0.
  double prefill_tokens_per_s = 0;
  // Bandwidth at which a block reaches G1 from each tier, in GB/s (1e9 bytes/s); G1 is already
  // there (0 = free). Each > 0 except G1.
  std::array<double, kNumTiers> load_gbps{0.0, 12.0, 2.0, 1.25};
  // Weight of a worker's queued work in the estimate (1 = queued seconds count in full).
  double queue_weight = 1.0;
  // Blocks tracked per worker and tier before the oldest are forgotten (bounds memory when a
  // worker's removals are lost). 0 = unbounded.
  uint64_t max_blocks_per_worker_tier = 0;
};

// One worker's estimate for a request.
struct RouteCandidate {
  WorkerId worker = 0;
  bool up = false;
  // Of the request's leading blocks, how many this worker supplies from each tier (G4 counts
  // for every worker); the rest are computed.
  std::array<uint32_t, kNumTiers> blocks_by_tier{};
  uint32_t compute_tokens = 0;
  double queue_s = 0;
  double load_s = 0;
  double compute_s = 0;
  double ttft_s = 0;  // queue_s * queue_weight + load_s + compute_s
};

struct RouteDecision {
  WorkerId worker = 0;                     // the candidate with the lowest ttft_s among those up
  std::vector<RouteCandidate> candidates;  // every known worker, in WorkerId order
};

// Thread-safe: every method may be called from any thread (one internal mutex; Route holds it
// for O(blocks x workers)).
class KvRouter {
 public:
  // InvalidArgument when an option is out of range (says which).
  static Result<std::unique_ptr<KvRouter>> Create(const RouterOptions& options);
  virtual ~KvRouter() = default;

  const RouterOptions& options() const { return options_; }

  // Adds a worker (up, no blocks, no queue). AlreadyExists when it is known.
  virtual Status AddWorker(WorkerId worker) = 0;
  // Forgets a worker and its blocks. NotFound when it is unknown.
  virtual Status RemoveWorker(WorkerId worker) = 0;
  // A worker that is down is never chosen (its blocks are kept: it may come back).
  virtual Status SetWorkerUp(WorkerId worker, bool up) = 0;
  // The worker's queued work, in seconds (the caller's estimate: in-flight prefills, for
  // instance). NotFound when the worker is unknown; InvalidArgument when negative.
  virtual Status SetWorkerQueue(WorkerId worker, double queue_s) = 0;

  // Applies a worker's events, in order: kStored adds (worker, tier, key), kRemoved drops it.
  // A G4 event is recorded once for all workers (whoever reports it). NotFound when the worker is
  // unknown, InvalidArgument for an event whose tier or kind is out of range (says which);
  // nothing is applied then. A removal of a block the index does not hold is ignored.
  virtual Status Apply(WorkerId worker, std::span<const KvEvent> events) = 0;
  // Drops every block the worker holds in `tiers` (a mask of 1 << TierId; G4 is shared and is
  // cleared only when its bit is given). vLLM's AllBlocksCleared, or a worker restart.
  // NotFound when the worker is unknown; InvalidArgument for bits past G4.
  virtual Status ClearWorker(WorkerId worker, uint8_t tiers) = 0;

  // The estimate for a request whose full blocks have keys `keys` (chained, first block first)
  // and whose prompt has `prompt_tokens` tokens (> (keys.size() - 1) * tokens_per_block and
  // >= 1: the last key may name a partial block, as Mooncake's last hash id does). A worker
  // supplies each block it holds from its cheapest tier; the last prompt token is always
  // computed (compute_tokens >= 1). Unavailable when no worker is up; InvalidArgument when
  // prompt_tokens is too small for the keys.
  virtual Result<RouteDecision> Route(std::span<const BlockKey> keys,
                                      uint32_t prompt_tokens) const = 0;

  // Blocks the index holds for `worker` in `tier` (for G4: the shared set). 0 when unknown.
  virtual uint64_t BlockCount(WorkerId worker, TierId tier) const = 0;

 protected:
  explicit KvRouter(const RouterOptions& options) : options_(options) {}
  RouterOptions options_;
};

}  // namespace kvtier

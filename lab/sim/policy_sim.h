// Trace-driven simulation of one cache tier under an EvictionPolicy: the core of `kvtier sim`.
//
// A trace is a sequence of requests, each a list of prefix-chained block ids (the Mooncake
// format: equal ids name equal prefixes, so the parent of a request's block i is its block i-1,
// and the first block hangs off a common root). The simulator knows nothing of tokens, bytes or
// tiers: it counts blocks, which is all an eviction policy decides about.
//
// Semantics of SimulatePolicy (the Belady oracle relies on them, see belady_policy.h):
//  - Requests are served one at a time, in trace order.
//  - Prefix hits: the blocks from the request's first one up to (not including) its first block
//    that is not cached. Each gets OnAccess. Only these count as hits.
//  - Every block after the first miss is recomputed and stored: OnInsert if it is not cached
//    (evicting Victim() + OnRemove first while the tier is full), OnAccess if it is cached
//    already (a block behind a miss is not a hit, but it was used).
//  - So each block reference causes exactly one OnInsert or OnAccess, in trace order.
//  - Nothing is pinned: every tracked block is evictable.
// hit_ratio = prefix-hit blocks / all blocks of the trace.
#pragma once

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

#include "index/eviction_policy.h"
#include "kvtier/block_key.h"
#include "kvtier/status.h"

namespace kvtier {

// A parsed trace. Request r's block ids are ids[begin(r) .. end(r)).
struct Trace {
  std::vector<uint64_t> ids;           // every block reference, in trace order
  std::vector<uint64_t> request_ends;  // request r ends at ids[request_ends[r]]
  // Per request: its "input_length" (prompt tokens) as the trace gives it, 0 when absent.
  std::vector<uint64_t> input_lengths;
  uint64_t distinct_blocks = 0;
  // Ids seen under two different parents (a trace that is not prefix-chained). The simulator
  // still runs (a block's parent is its predecessor in the current request), but lineage-aware
  // policies then see an inconsistent forest; reported so that nobody trusts such a run blindly.
  uint64_t lineage_conflicts = 0;

  size_t requests() const { return request_ends.size(); }
  uint64_t begin(size_t r) const { return r == 0 ? 0 : request_ends[r - 1]; }
  uint64_t end(size_t r) const { return request_ends[r]; }
};

// Parses a Mooncake JSONL trace: one JSON object per line with an array "hash_ids" of
// non-negative integers (required) and, if present, non-negative numbers "timestamp",
// "input_length" and "output_length"; other keys are skipped whatever their value. Blank lines
// are skipped. InvalidArgument("trace line N: ...") for the first malformed line.
Result<Trace> ParseMooncakeTrace(std::istream& in);
// Opens `path` and parses it; NotFound / IOError when it cannot be read.
Result<Trace> LoadMooncakeTrace(const std::string& path);

// The block key the simulator uses for a trace id: deterministic, distinct per id, never the
// root key.
BlockKey TraceBlockKey(uint64_t hash_id);
// The parent of every request's first block (never tracked by a policy).
BlockKey TraceRootKey();
// The reference string of the trace (every block, in order), as MakeBeladyPolicy wants it.
std::vector<BlockKey> TraceReferences(const Trace& trace);

// ceil(fraction x distinct blocks), at least 1. REQUIRES: fraction > 0 and finite.
uint64_t CapacityForFraction(const Trace& trace, double fraction);

struct SimResult {
  uint64_t blocks = 0;         // all block references
  uint64_t hit_blocks = 0;     // prefix hits
  uint64_t inserts = 0;        // OnInsert calls (recomputed blocks stored)
  uint64_t late_accesses = 0;  // cached blocks behind a miss (OnAccess, not hits)
  uint64_t evictions = 0;
  double hit_ratio() const { return blocks == 0 ? 0.0 : double(hit_blocks) / double(blocks); }
};

// Replays `trace` through a tier of `capacity_blocks` slots ranked by `policy`, which must be
// empty. Internal if the policy names no victim while the tier is full or names an untracked
// key (a broken policy, not a broken trace). REQUIRES: capacity_blocks >= 1.
Result<SimResult> SimulatePolicy(const Trace& trace, EvictionPolicy& policy,
                                 uint64_t capacity_blocks);
// The same replay with a tier that never evicts: the ceiling of every policy.
SimResult SimulateUnbounded(const Trace& trace);

}  // namespace kvtier

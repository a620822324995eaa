// Synthetic KV-cache workloads in the Mooncake trace format: the generator behind
// `kvtier gen-trace` (docs/workloads.md).
//
// A workload is a set of *sessions* (a conversation, an agent run, a one-shot query), each a
// series of requests. A request is a prompt of tokens cut into 512-token blocks; each block has
// a *content label* (a system prompt's block j, a document's block j, or fresh text), and its
// hash id is interned from (parent id, label), so two requests share a hash id exactly when they
// share the whole prefix up to it, as Mooncake's prefix-chained ids do. Ids are numbered in
// order of first appearance.
//
// A later turn of a session re-sends the previous prompt and the model's answer and appends new
// text: it keeps the previous prompt's full blocks; its partial last block (if any) and the rest
// are new. With block_aligned every appended piece is padded to whole blocks (agent frameworks
// that re-send a context growing by tool outputs), so nothing is lost between turns.
//
// Determinism: one xoshiro256** stream seeded by splitmix64(seed) and hand-written
// distributions (never std::*_distribution, whose output differs between standard libraries),
// so a (preset, seed, overrides) triple gives the same bytes on every platform.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.h"

namespace kvtier::replay {

// Parameters of a workload. Every field is settable by name (TracePreset::Set), so presets are
// just named values of this struct.
struct TraceParams {
  uint64_t requests = 4000;  // requests written (the first ones by timestamp)

  // Arrivals of sessions: Poisson at sessions_per_s, or, when bursty, switching between
  // burst_factor x and 1/burst_factor x that rate in on/off periods of burst_period_s each.
  double sessions_per_s = 2.0;
  uint32_t bursty = 0;  // 0 flat, 1 bursty
  double burst_factor = 6.0;
  double burst_period_s = 60.0;

  // System prompts: sys_prompts of them, chosen per session with Zipf(sys_zipf) popularity;
  // each sys_blocks_min..max whole blocks long (drawn once per prompt).
  uint32_t sys_prompts = 1;
  double sys_zipf = 1.0;
  uint32_t sys_blocks_min = 1;
  uint32_t sys_blocks_max = 1;

  // Turns per session: 1 + geometric with mean turns_mean - 1, at most turns_max. Time between
  // a turn and the next: exponential, mean think_s (plus the answer's generation, ignored).
  double turns_mean = 1.0;
  uint32_t turns_max = 1;
  double think_s = 30.0;
  // Fresh user text per turn and answer length, tokens, uniform in [min, max].
  uint32_t user_tokens_min = 200;
  uint32_t user_tokens_max = 2000;
  uint32_t output_tokens_min = 50;
  uint32_t output_tokens_max = 600;
  uint32_t block_aligned = 0;  // 1: pad every appended piece to whole blocks

  // RAG: the first turn of a session carries docs_min..docs_max documents after the system
  // prompt, drawn Zipf(doc_zipf) from `docs`, each doc_blocks_min..max blocks. 0 docs = off.
  uint32_t docs = 0;
  double doc_zipf = 1.0;
  uint32_t doc_blocks_min = 4;
  uint32_t doc_blocks_max = 16;
  uint32_t docs_min = 1;
  uint32_t docs_max = 1;

  // One-off long prompts: this share of sessions is a single request of the system prompt plus
  // oneoff_blocks_min..max blocks of fresh text, never seen again.
  double oneoff_share = 0.0;
  uint32_t oneoff_blocks_min = 64;
  uint32_t oneoff_blocks_max = 192;

  // Ok, or InvalidArgument naming the first field out of range and its range.
  Status Validate() const;
};

struct TracePreset {
  std::string name;
  std::string summary;  // one line: the reuse structure it stands for
  TraceParams params;
};

// The named presets, in a fixed order.
const std::vector<TracePreset>& TracePresets();
// The preset called `name`; InvalidArgument listing the names otherwise.
Result<TracePreset> FindTracePreset(std::string_view name);

// Sets field `name` of `params` from `value` (a number). InvalidArgument naming the field (or
// listing the fields) when the name is unknown or the value is not a number of the field's type.
// Does not validate ranges (call Validate after the last one).
Status SetTraceParam(TraceParams& params, std::string_view name, std::string_view value);
// Every field as "name = value" lines, in declaration order, with a comment each.
std::string DescribeTraceParams(const TraceParams& params);

// Writes the workload as Mooncake JSONL: per request {"timestamp" (ms), "input_length",
// "output_length", "hash_ids"}, in timestamp order. REQUIRES: params.Validate() is Ok.
// IOError when `out` fails.
Status GenerateTrace(const TraceParams& params, uint64_t seed, std::ostream& out);

}  // namespace kvtier::replay

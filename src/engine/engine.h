// Engine: runs requests on a LlamaModel with a paged KV cache, reusing prompt prefixes through
// kvtier's connector API (include/kvtier/connector.h), or recomputing everything when it has
// no BlockManager.
//
// One request, with a manager:
//   Lookup -> PrepareLoad(the request's G1 blocks) -> StartLoad
//   -> prefill of the prompt past the loaded prefix, calling WaitLayer(l) before layer l, so
//      layer 0 computes while later layers still arrive
//   -> Commit(prompt) -> StartSave -> greedy decode -> Commit(all tokens) -> StartSave
//   -> RequestFinished: the G1 blocks are freed now, or once Finished() lists the request.
// A load that fails (WaitLayer not ok, or LoadedTokens short of the plan) is not an error: the
// engine recomputes from the last position that arrived intact.
//
// Not thread-safe: one thread runs requests.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/model.h"
#include "kvtier/connector.h"

namespace kvtier::engine {

struct RequestOutcome {
  std::vector<TokenId> generated;    // greedy tokens (stop token included when hit)
  std::vector<float> prompt_logits;  // logits of the last prompt token
  uint32_t g1_reused_tokens = 0;     // prompt tokens whose KV was still in G1 (the session's)
  uint32_t offered_tokens = 0;       // Lookup said kvtier could load this many
  uint32_t loaded_tokens = 0;        // prompt tokens whose KV came from kvtier
  uint32_t computed_tokens = 0;      // prompt tokens the engine prefilled
  double ttft_seconds = 0;           // request start to the first token's logits
  double load_wait_seconds = 0;      // of which: waiting for layers to arrive (WaitLayer)
  double compute_seconds = 0;        // of which: prefill compute (the forward passes, no waits)
};

class Engine {
 public:
  // `model` must outlive the engine; `manager` (may be null: recompute only) too. Builds a KV
  // cache of g1_blocks blocks of tokens_per_block tokens with `kv_dtype` (fp32 or bf16) values
  // and registers it with the manager. InvalidArgument when the manager's layout is not
  // model->MakeKvLayout(tokens_per_block, kv_dtype); the cache's and RegisterDeviceMemory's
  // errors otherwise.
  static Result<std::unique_ptr<Engine>> Create(const LlamaModel* model, BlockManager* manager,
                                                uint32_t g1_blocks, uint32_t tokens_per_block,
                                                DType kv_dtype = DType::kFp32);

  // Runs `request` (its prompt must be non-empty) and generates up to max_new tokens greedily,
  // stopping after stop_id when >= 0. ResourceExhausted when G1 cannot hold the sequence (the
  // request is then abandoned and its blocks returned); the model's and the manager's errors
  // otherwise.
  Result<RequestOutcome> Run(const RequestSpec& request, uint32_t max_new, int64_t stop_id);

  // The same, with the engine's own G1 prefix reuse (as vLLM's prefix cache): the request's KV
  // stays in G1 afterwards under `session`, and a later Run with that session whose prompt
  // starts with those tokens computes only past them (their block-aligned part, and never the
  // prompt's last token), telling kvtier through Lookup's num_computed_tokens; kvtier then
  // loads what it holds past that. Retained sessions give their blocks back when G1 runs short
  // (waiting for saves that still read them). An empty session is Run above.
  Result<RequestOutcome> Run(const RequestSpec& request, uint32_t max_new, int64_t stop_id,
                             const std::string& session);

  // Frees the blocks of finished requests whose saves are done (Finished().saves_done); with
  // wait, waits for every save first. Returns how many requests' blocks were freed.
  uint32_t ReleaseFinished(bool wait);

  PagedKvCache& cache() { return *cache_; }
  uint32_t held_requests() const { return static_cast<uint32_t>(held_.size()); }

 private:
  Engine(const LlamaModel* model, BlockManager* manager, std::unique_ptr<PagedKvCache> cache)
      : model_(model), manager_(manager), cache_(std::move(cache)) {}
  // Prefills prompt[from, n) and returns the last token's logits; with a load in flight, waits
  // for each layer before computing it and falls back to recompute when the load fails.
  Result<std::vector<float>> Prefill(const RequestSpec& request, SequenceState& seq,
                                     uint32_t computed, uint32_t planned, RequestOutcome& out);
  // Frees every retained session's blocks (after the saves that read them).
  void DropSessions();
  void Abandon(const std::string& id, SequenceState& seq);

  const LlamaModel* model_;
  BlockManager* manager_;
  std::unique_ptr<PagedKvCache> cache_;
  std::map<std::string, std::vector<uint32_t>> held_;  // kept for saves in flight
  struct Session {
    std::vector<TokenId> tokens;  // positions with KV in `blocks`
    std::vector<uint32_t> blocks;
    bool saves_pending = false;  // RequestFinished said saves still read the blocks
  };
  std::map<std::string, Session> sessions_;
};

}  // namespace kvtier::engine

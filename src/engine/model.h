// LlamaModel: a Llama-architecture decoder on the CPU: token embedding, RMSNorm, rotary
// position embedding, grouped-query attention over a paged KV cache, SwiGLU feed-forward,
// output norm and LM head (tied to the embedding when the model has no output matrix).
// Weights are f32 (quantized GGUF tensors are dequantized at load); matrix products go
// through OpenBLAS.
//
// Weight matrices are stored as GGUF stores them: row-major [out][in] (GGUF ne = [in, out]),
// so y = W x. Rotary embedding uses the GGUF "normal" llama layout: it rotates adjacent pairs
// (x[2i], x[2i+1]) by pos * theta^(-2i / rope_dim), for i < rope_dim / 2. (Hugging Face's
// Llama rotates the halves (x[i], x[i + d/2]); the GGUF converter permutes the rows of the Q
// and K weights so that the adjacent-pair rotation gives the same result, so weights from
// GGUF are used as they are.)
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "engine/gguf.h"
#include "engine/kv_cache.h"
#include "kvtier/block_key.h"
#include "kvtier/layout.h"
#include "kvtier/status.h"

namespace kvtier::engine {

struct LlamaConfig {
  uint32_t num_layers = 2;
  uint32_t dim = 64;  // embedding width
  uint32_t num_heads = 4;
  uint32_t num_kv_heads = 2;  // divides num_heads
  uint32_t head_dim = 16;
  uint32_t ffn_dim = 128;
  uint32_t vocab_size = 256;
  uint32_t rope_dim = 16;  // even, <= head_dim; the dimensions rotated in each head
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  bool tied_embeddings = false;  // LM head = token embedding

  // Ok, or InvalidArgument naming the first field out of range.
  Status Validate() const;
};

struct LlamaLayerWeights {
  std::vector<float> attn_norm;  // [dim]
  std::vector<float> wq;         // [num_heads * head_dim][dim]
  std::vector<float> wk;         // [num_kv_heads * head_dim][dim]
  std::vector<float> wv;         // [num_kv_heads * head_dim][dim]
  std::vector<float> wo;         // [dim][num_heads * head_dim]
  std::vector<float> ffn_norm;   // [dim]
  std::vector<float> w_gate;     // [ffn_dim][dim]
  std::vector<float> w_up;       // [ffn_dim][dim]
  std::vector<float> w_down;     // [dim][ffn_dim]
};

struct LlamaWeights {
  std::vector<float> token_embd;  // [vocab][dim]
  std::vector<LlamaLayerWeights> layers;
  std::vector<float> output_norm;  // [dim]
  std::vector<float> output;       // [vocab][dim]; empty when tied
  const float* lm_head() const { return output.empty() ? token_embd.data() : output.data(); }
};

struct ForwardOptions {
  // Logits of every token ([n][vocab]) instead of the last one only ([vocab]).
  bool all_logits = false;
  // Called before layer l reads or writes the cache (kvtier's WaitLayer goes here); a non-ok
  // status aborts the forward pass and is returned.
  std::function<Status(uint32_t layer)> before_layer;
};

class LlamaModel {
 public:
  // Loads general.architecture = "llama" models: hyper-parameters from llama.* metadata,
  // tensors by their GGUF names (token_embd, blk.N.attn_q, ..., output_norm, output).
  // InvalidArgument for another architecture, a bad shape or an undequantizable tensor type;
  // NotFound naming a missing metadata key or tensor.
  static Result<std::unique_ptr<LlamaModel>> FromGguf(const GgufFile& file);
  // Deterministic random weights of any shape: the same config and seed give the same
  // weights on every machine. InvalidArgument when config.Validate() fails.
  static Result<std::unique_ptr<LlamaModel>> Random(const LlamaConfig& config, uint64_t seed);
  // InvalidArgument when a weight has the wrong size for `config`.
  static Result<std::unique_ptr<LlamaModel>> FromWeights(const LlamaConfig& config,
                                                         LlamaWeights weights);

  const LlamaConfig& config() const { return config_; }
  const LlamaWeights& weights() const { return weights_; }

  // The KV layout of this model in the layer-separate arrangement, with fp32 KV (default) or
  // bf16 KV (the engine converts on write and read; computation stays fp32).
  KvLayout MakeKvLayout(uint32_t tokens_per_block, DType kv_dtype = DType::kFp32) const;

  // Runs `tokens` at positions start_pos, start_pos + 1, ... of a sequence whose KV lives in
  // `cache` at the blocks of `block_table` (block i holds positions [i*T, (i+1)*T)). Writes
  // the tokens' K and V; reads the K and V of positions [0, start_pos), which must be there
  // already (computed, or loaded by kvtier). Returns the logits of the last token, or of
  // every token with options.all_logits.
  // InvalidArgument: no tokens, a token id >= vocab_size, a block table too short for
  // start_pos + tokens.size() or naming a block outside the cache, or a cache whose layout
  // does not match MakeKvLayout. Thread-safe for calls on different sequences.
  Result<std::vector<float>> Forward(PagedKvCache& cache, std::span<const uint32_t> block_table,
                                     std::span<const TokenId> tokens, uint32_t start_pos,
                                     const ForwardOptions& options = {}) const;

 private:
  LlamaModel(const LlamaConfig& config, LlamaWeights weights)
      : config_(config), weights_(std::move(weights)) {}

  LlamaConfig config_;
  LlamaWeights weights_;
};

// Index of the largest logit (the first one on ties). REQUIRES: !logits.empty().
TokenId Argmax(std::span<const float> logits);

// A sequence's growing KV: its block table in `cache` and how many positions hold KV.
// Greedy decoding helper shared by tests and the engine.
struct SequenceState {
  std::vector<uint32_t> block_table;
  uint32_t num_tokens = 0;  // positions [0, num_tokens) hold KV
};

// Appends blocks from `cache` until `seq` can hold `num_positions` positions.
// ResourceExhausted when the cache runs out (the sequence keeps what it had).
Status EnsureCapacity(PagedKvCache& cache, SequenceState& seq, uint32_t num_positions);

// Greedy decoding: starting from `logits` (those of the last token in `seq`), appends up to
// `max_new` argmax tokens, running each through the model, and stops after `stop_id` (when
// >= 0). Returns the generated tokens (stop token included when hit). Every returned token but
// the last has been run (its KV is in `seq`); seq.num_tokens counts the positions with KV.
Result<std::vector<TokenId>> GreedyDecode(const LlamaModel& model, PagedKvCache& cache,
                                          SequenceState& seq, std::vector<float> logits,
                                          uint32_t max_new, int64_t stop_id);

}  // namespace kvtier::engine

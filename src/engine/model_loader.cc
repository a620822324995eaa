// LlamaConfig validation and the three ways to get weights: GGUF, random, given.
#include <cmath>

#include "engine/model.h"

namespace kvtier::engine {
namespace {

Status Bad(const std::string& what) { return Status::InvalidArgument("llama config: " + what); }

// splitmix64: a tiny, fully specified generator, so random weights are identical everywhere
// (std:: distributions are not specified bit for bit).
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t Next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1).
  float Uniform() { return static_cast<float>(Next() >> 40) / static_cast<float>(1 << 23) - 1.0f; }

 private:
  uint64_t s_;
};

std::vector<float> RandomVector(Rng& rng, size_t n, float scale, float offset = 0.0f) {
  std::vector<float> v(n);
  for (float& x : v) x = offset + scale * rng.Uniform();
  return v;
}

Result<std::vector<float>> LoadTensor(const GgufFile& file, const std::string& name,
                                      std::vector<uint64_t> ne) {
  const GgufTensorInfo* t = file.FindTensor(name);
  if (t == nullptr) return Status::NotFound("GGUF model has no tensor '" + name + "'");
  if (t->ne != ne) {
    std::string want, got;
    for (uint64_t d : ne) want += (want.empty() ? "" : ", ") + std::to_string(d);
    for (uint64_t d : t->ne) got += (got.empty() ? "" : ", ") + std::to_string(d);
    return Status::InvalidArgument("GGUF tensor '" + name + "' has shape [" + got +
                                   "], expected [" + want + "]");
  }
  return GgufFile::Dequantize(*t);
}

Status CheckSize(const std::vector<float>& v, uint64_t n, const std::string& name) {
  if (v.size() != n) {
    return Status::InvalidArgument("llama weight " + name + " has " + std::to_string(v.size()) +
                                   " elements, expected " + std::to_string(n));
  }
  return Status::Ok();
}

}  // namespace

Status LlamaConfig::Validate() const {
  if (num_layers == 0 || num_layers > KvLayout::kMaxLayers) {
    return Bad("num_layers " + std::to_string(num_layers) + " outside [1, 1024]");
  }
  if (dim == 0 || dim > 65536) return Bad("dim " + std::to_string(dim) + " outside [1, 65536]");
  if (num_heads == 0 || num_kv_heads == 0 || num_heads % num_kv_heads != 0 ||
      num_kv_heads > KvLayout::kMaxKvHeads) {
    return Bad("num_heads " + std::to_string(num_heads) + " must be a positive multiple of " +
               "num_kv_heads " + std::to_string(num_kv_heads) + " (<= 1024)");
  }
  if (head_dim == 0 || head_dim > KvLayout::kMaxHeadDim) {
    return Bad("head_dim " + std::to_string(head_dim) + " outside [1, 8192]");
  }
  if (rope_dim == 0 || rope_dim % 2 != 0 || rope_dim > head_dim) {
    return Bad("rope_dim " + std::to_string(rope_dim) + " must be even and <= head_dim");
  }
  if (ffn_dim == 0 || ffn_dim > 1u << 20) return Bad("ffn_dim " + std::to_string(ffn_dim));
  if (vocab_size == 0 || vocab_size > 1u << 24) {
    return Bad("vocab_size " + std::to_string(vocab_size));
  }
  if (!(rope_theta > 0.0f) || !(norm_eps > 0.0f)) return Bad("rope_theta and norm_eps must be > 0");
  return Status::Ok();
}

Result<std::unique_ptr<LlamaModel>> LlamaModel::FromWeights(const LlamaConfig& c, LlamaWeights w) {
  KVTIER_RETURN_IF_ERROR(c.Validate());
  const uint64_t D = c.dim, Q = uint64_t{c.num_heads} * c.head_dim,
                 KV = uint64_t{c.num_kv_heads} * c.head_dim, F = c.ffn_dim, V = c.vocab_size;
  KVTIER_RETURN_IF_ERROR(CheckSize(w.token_embd, V * D, "token_embd"));
  KVTIER_RETURN_IF_ERROR(CheckSize(w.output_norm, D, "output_norm"));
  if (!c.tied_embeddings) KVTIER_RETURN_IF_ERROR(CheckSize(w.output, V * D, "output"));
  if (c.tied_embeddings && !w.output.empty()) {
    return Status::InvalidArgument("llama weights: tied embeddings but an output matrix given");
  }
  if (w.layers.size() != c.num_layers) {
    return Status::InvalidArgument("llama weights have " + std::to_string(w.layers.size()) +
                                   " layers, config " + std::to_string(c.num_layers));
  }
  for (const LlamaLayerWeights& l : w.layers) {
    KVTIER_RETURN_IF_ERROR(CheckSize(l.attn_norm, D, "attn_norm"));
    KVTIER_RETURN_IF_ERROR(CheckSize(l.wq, Q * D, "wq"));
    KVTIER_RETURN_IF_ERROR(CheckSize(l.wk, KV * D, "wk"));
    KVTIER_RETURN_IF_ERROR(CheckSize(l.wv, KV * D, "wv"));
    KVTIER_RETURN_IF_ERROR(CheckSize(l.wo, D * Q, "wo"));
    KVTIER_RETURN_IF_ERROR(CheckSize(l.ffn_norm, D, "ffn_norm"));
    KVTIER_RETURN_IF_ERROR(CheckSize(l.w_gate, F * D, "w_gate"));
    KVTIER_RETURN_IF_ERROR(CheckSize(l.w_up, F * D, "w_up"));
    KVTIER_RETURN_IF_ERROR(CheckSize(l.w_down, D * F, "w_down"));
  }
  return std::unique_ptr<LlamaModel>(new LlamaModel(c, std::move(w)));
}

Result<std::unique_ptr<LlamaModel>> LlamaModel::Random(const LlamaConfig& c, uint64_t seed) {
  KVTIER_RETURN_IF_ERROR(c.Validate());
  Rng rng(seed);
  const size_t D = c.dim, Q = size_t{c.num_heads} * c.head_dim,
               KV = size_t{c.num_kv_heads} * c.head_dim, F = c.ffn_dim, V = c.vocab_size;
  // Uniform(-a, a) with a = sqrt(3 / fan_in) keeps activations near unit variance.
  auto fan = [](size_t in) { return std::sqrt(3.0f / static_cast<float>(in)); };
  LlamaWeights w;
  w.token_embd = RandomVector(rng, V * D, 1.0f);
  for (uint32_t l = 0; l < c.num_layers; ++l) {
    LlamaLayerWeights L;
    L.attn_norm = RandomVector(rng, D, 0.1f, 1.0f);
    L.wq = RandomVector(rng, Q * D, fan(D));
    L.wk = RandomVector(rng, KV * D, fan(D));
    L.wv = RandomVector(rng, KV * D, fan(D));
    L.wo = RandomVector(rng, D * Q, fan(Q));
    L.ffn_norm = RandomVector(rng, D, 0.1f, 1.0f);
    L.w_gate = RandomVector(rng, F * D, fan(D));
    L.w_up = RandomVector(rng, F * D, fan(D));
    L.w_down = RandomVector(rng, D * F, fan(F));
    w.layers.push_back(std::move(L));
  }
  w.output_norm = RandomVector(rng, D, 0.1f, 1.0f);
  if (!c.tied_embeddings) w.output = RandomVector(rng, V * D, fan(D));
  return FromWeights(c, std::move(w));
}

Result<std::unique_ptr<LlamaModel>> LlamaModel::FromGguf(const GgufFile& file) {
  KVTIER_ASSIGN_OR_RETURN(std::string arch, file.GetString("general.architecture"));
  if (arch != "llama") {
    return Status::InvalidArgument("GGUF architecture '" + arch + "' is not supported (llama)");
  }
  LlamaConfig c;
  KVTIER_ASSIGN_OR_RETURN(c.num_layers, file.GetUint32("llama.block_count"));
  KVTIER_ASSIGN_OR_RETURN(c.dim, file.GetUint32("llama.embedding_length"));
  KVTIER_ASSIGN_OR_RETURN(c.ffn_dim, file.GetUint32("llama.feed_forward_length"));
  KVTIER_ASSIGN_OR_RETURN(c.num_heads, file.GetUint32("llama.attention.head_count"));
  c.num_kv_heads = c.num_heads;
  if (file.Find("llama.attention.head_count_kv") != nullptr) {
    KVTIER_ASSIGN_OR_RETURN(c.num_kv_heads, file.GetUint32("llama.attention.head_count_kv"));
  }
  if (c.num_heads == 0 || c.dim % c.num_heads != 0) {
    return Status::InvalidArgument("llama.embedding_length " + std::to_string(c.dim) +
                                   " is not a multiple of head_count " +
                                   std::to_string(c.num_heads));
  }
  c.head_dim = c.dim / c.num_heads;
  if (file.Find("llama.attention.key_length") != nullptr) {
    KVTIER_ASSIGN_OR_RETURN(c.head_dim, file.GetUint32("llama.attention.key_length"));
  }
  c.rope_dim = c.head_dim;
  if (file.Find("llama.rope.dimension_count") != nullptr) {
    KVTIER_ASSIGN_OR_RETURN(c.rope_dim, file.GetUint32("llama.rope.dimension_count"));
  }
  if (file.Find("llama.rope.freq_base") != nullptr) {
    KVTIER_ASSIGN_OR_RETURN(c.rope_theta, file.GetFloat32("llama.rope.freq_base"));
  }
  KVTIER_ASSIGN_OR_RETURN(c.norm_eps, file.GetFloat32("llama.attention.layer_norm_rms_epsilon"));
  const GgufTensorInfo* embd = file.FindTensor("token_embd.weight");
  if (embd == nullptr) return Status::NotFound("GGUF model has no tensor 'token_embd.weight'");
  if (embd->ne.size() != 2 || embd->ne[0] != c.dim || embd->ne[1] > (1u << 24)) {
    return Status::InvalidArgument("GGUF tensor 'token_embd.weight' has a bad shape");
  }
  c.vocab_size = static_cast<uint32_t>(embd->ne[1]);
  c.tied_embeddings = file.FindTensor("output.weight") == nullptr;
  KVTIER_RETURN_IF_ERROR(c.Validate());

  const uint64_t D = c.dim, Q = uint64_t{c.num_heads} * c.head_dim,
                 KV = uint64_t{c.num_kv_heads} * c.head_dim, F = c.ffn_dim, V = c.vocab_size;
  LlamaWeights w;
  KVTIER_ASSIGN_OR_RETURN(w.token_embd, LoadTensor(file, "token_embd.weight", {D, V}));
  KVTIER_ASSIGN_OR_RETURN(w.output_norm, LoadTensor(file, "output_norm.weight", {D}));
  if (!c.tied_embeddings) {
    KVTIER_ASSIGN_OR_RETURN(w.output, LoadTensor(file, "output.weight", {D, V}));
  }
  for (uint32_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LlamaLayerWeights L;
    KVTIER_ASSIGN_OR_RETURN(L.attn_norm, LoadTensor(file, p + "attn_norm.weight", {D}));
    KVTIER_ASSIGN_OR_RETURN(L.wq, LoadTensor(file, p + "attn_q.weight", {D, Q}));
    KVTIER_ASSIGN_OR_RETURN(L.wk, LoadTensor(file, p + "attn_k.weight", {D, KV}));
    KVTIER_ASSIGN_OR_RETURN(L.wv, LoadTensor(file, p + "attn_v.weight", {D, KV}));
    KVTIER_ASSIGN_OR_RETURN(L.wo, LoadTensor(file, p + "attn_output.weight", {Q, D}));
    KVTIER_ASSIGN_OR_RETURN(L.ffn_norm, LoadTensor(file, p + "ffn_norm.weight", {D}));
    KVTIER_ASSIGN_OR_RETURN(L.w_gate, LoadTensor(file, p + "ffn_gate.weight", {D, F}));
    KVTIER_ASSIGN_OR_RETURN(L.w_up, LoadTensor(file, p + "ffn_up.weight", {D, F}));
    KVTIER_ASSIGN_OR_RETURN(L.w_down, LoadTensor(file, p + "ffn_down.weight", {F, D}));
    w.layers.push_back(std::move(L));
  }
  return FromWeights(c, std::move(w));
}

KvLayout LlamaModel::MakeKvLayout(uint32_t tokens_per_block, DType kv_dtype) const {
  KvLayout k;
  k.num_layers = config_.num_layers;
  k.num_planes = 2;
  k.num_kv_heads = config_.num_kv_heads;
  k.head_dim = config_.head_dim;
  k.tokens_per_block = tokens_per_block;
  k.dtype = kv_dtype;
  k.g1_arrangement = G1Arrangement::kLayerSeparate;
  return k;
}

}  // namespace kvtier::engine

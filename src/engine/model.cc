// The forward pass. Activations are row-major [tokens][width]; every product with a weight
// matrix W ([out][in]) is C = A W^T through cblas_sgemm (cblas_sgemv for one token).
//
// Attention for kv head g and a chunk of queries: the queries of g's heads are gathered into
// one matrix (rows: head-major, then token), and for each KV block of the sequence the scores
// against that block's keys (read in place through the block table, stride kv_heads *
// head_dim) are one sgemm; after a causal softmax over the chunk's context, the output
// accumulates one sgemm per block against the values. Small query counts (decode) use plain
// loops over the same block table instead: many tiny sgemm calls cost more than they save.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "engine/model.h"

namespace kvtier::engine {
namespace {

// Queries per attention chunk: bounds the score matrix at rows x context.
constexpr uint32_t kQueryChunk = 256;
// Below this many query rows per kv head, attention runs as loops.
constexpr uint32_t kMinGemmRows = 8;

// C[n][out] = A[n][in] * W^T, W = [out][in].
void MatMul(const float* a, const float* w, float* c, uint32_t n, uint32_t in, uint32_t out) {
  if (n == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(out), static_cast<int>(in), 1.0f, w,
                static_cast<int>(in), a, 1, 0.0f, c, 1);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(out),
                static_cast<int>(in), 1.0f, a, static_cast<int>(in), w, static_cast<int>(in), 0.0f,
                c, static_cast<int>(out));
  }
}

void RmsNorm(const float* x, const float* weight, float* out, uint32_t n, uint32_t dim, float eps) {
  for (uint32_t t = 0; t < n; ++t) {
    const float* xr = x + size_t{t} * dim;
    float* o = out + size_t{t} * dim;
    double ss = 0;
    for (uint32_t k = 0; k < dim; ++k) ss += double{xr[k]} * xr[k];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / dim + eps));
    for (uint32_t k = 0; k < dim; ++k) o[k] = xr[k] * inv * weight[k];
  }
}

// Rotates adjacent pairs of the first rope_dim dims of each head of each token row.
void ApplyRope(float* x, uint32_t n, uint32_t heads, uint32_t head_dim, uint32_t rope_dim,
               const std::vector<float>& cos_t, const std::vector<float>& sin_t) {
  const uint32_t half = rope_dim / 2;
  for (uint32_t t = 0; t < n; ++t) {
    const float* c = cos_t.data() + size_t{t} * half;
    const float* s = sin_t.data() + size_t{t} * half;
    for (uint32_t h = 0; h < heads; ++h) {
      float* v = x + (size_t{t} * heads + h) * head_dim;
      for (uint32_t i = 0; i < half; ++i) {
        const float a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * c[i] - b * s[i];
        v[2 * i + 1] = a * s[i] + b * c[i];
      }
    }
  }
}

struct AttnShape {
  uint32_t heads, kv_heads, head_dim, tpb, layer;
  uint32_t q_width() const { return heads * head_dim; }
  uint32_t kv_width() const { return kv_heads * head_dim; }
};

// fp32 -> bf16, round to nearest even (NaN stays NaN).
uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float FromBf16(uint16_t h) {
  const uint32_t u = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The K and V chunks (fp32) of one layer for block-table entries [0, blocks): pointers into an
// fp32 cache, or into `scratch` where a bf16 cache's chunks were widened.
struct KvView {
  std::vector<const float*> k, v;
  std::vector<float> scratch;

  void Build(const PagedKvCache& cache, std::span<const uint32_t> table, uint32_t layer,
             uint32_t blocks) {
    k.resize(blocks);
    v.resize(blocks);
    if (!cache.bf16()) {
      for (uint32_t b = 0; b < blocks; ++b) {
        k[b] = cache.Chunk(table[b], layer, 0);
        v[b] = cache.Chunk(table[b], layer, 1);
      }
      return;
    }
    const KvLayout& kl = cache.layout();
    const size_t elems = size_t{kl.tokens_per_block} * kl.num_kv_heads * kl.head_dim;
    scratch.resize(2 * size_t{blocks} * elems);
    for (uint32_t b = 0; b < blocks; ++b) {
      for (uint32_t p = 0; p < 2; ++p) {
        const uint16_t* src = cache.ChunkBf16(table[b], layer, p);
        float* dst = scratch.data() + (2 * size_t{b} + p) * elems;
        for (size_t i = 0; i < elems; ++i) dst[i] = FromBf16(src[i]);
        (p == 0 ? k : v)[b] = dst;
      }
    }
  }
};

// Softmax of row[0, valid) in place; row[valid, len) set to 0.
void CausalSoftmax(float* row, uint32_t valid, uint32_t len) {
  float mx = -std::numeric_limits<float>::infinity();
  for (uint32_t k = 0; k < valid; ++k) mx = std::max(mx, row[k]);
  double sum = 0;
  for (uint32_t k = 0; k < valid; ++k) {
    row[k] = std::exp(row[k] - mx);
    sum += row[k];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (uint32_t k = 0; k < valid; ++k) row[k] *= inv;
  for (uint32_t k = valid; k < len; ++k) row[k] = 0.0f;
}

// Attention of queries q[t] (position start + t, t in [t0, t1)) into out, loops version.
void AttendLoops(const KvView& kv, const AttnShape& s, const float* q, float* out, uint32_t start,
                 uint32_t t0, uint32_t t1, std::vector<float>& scores) {
  const uint32_t group = s.heads / s.kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  for (uint32_t t = t0; t < t1; ++t) {
    const uint32_t ctx = start + t + 1;
    scores.resize(ctx);
    for (uint32_t h = 0; h < s.heads; ++h) {
      const uint32_t g = h / group;
      const float* qh = q + size_t{t} * s.q_width() + size_t{h} * s.head_dim;
      for (uint32_t p = 0; p < ctx; ++p) {
        const float* k = kv.k[p / s.tpb] + (size_t{p % s.tpb} * s.kv_heads + g) * s.head_dim;
        float dot = 0;
        for (uint32_t d = 0; d < s.head_dim; ++d) dot += qh[d] * k[d];
        scores[p] = dot * scale;
      }
      CausalSoftmax(scores.data(), ctx, ctx);
      float* o = out + size_t{t} * s.q_width() + size_t{h} * s.head_dim;
      std::fill(o, o + s.head_dim, 0.0f);
      for (uint32_t p = 0; p < ctx; ++p) {
        const float* v = kv.v[p / s.tpb] + (size_t{p % s.tpb} * s.kv_heads + g) * s.head_dim;
        const float w = scores[p];
        for (uint32_t d = 0; d < s.head_dim; ++d) o[d] += w * v[d];
      }
    }
  }
}

// Attention for queries t in [t0, t1), BLAS version (see the file comment).
void AttendGemm(const KvView& kv, const AttnShape& s, const float* q, float* out, uint32_t start,
                uint32_t t0, uint32_t t1, std::vector<float>& qg, std::vector<float>& scores,
                std::vector<float>& og) {
  const uint32_t group = s.heads / s.kv_heads;
  const uint32_t nt = t1 - t0;
  const uint32_t rows = group * nt;
  const uint32_t ctx = start + t1;  // keys needed by the chunk's last query
  const uint32_t hd = s.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  qg.resize(size_t{rows} * hd);
  og.resize(size_t{rows} * hd);
  scores.resize(size_t{rows} * ctx);
  for (uint32_t g = 0; g < s.kv_heads; ++g) {
    for (uint32_t j = 0; j < group; ++j) {
      for (uint32_t t = 0; t < nt; ++t) {
        const float* src = q + size_t{t0 + t} * s.q_width() + size_t{g * group + j} * hd;
        std::copy(src, src + hd, qg.data() + (size_t{j} * nt + t) * hd);
      }
    }
    for (uint32_t b = 0; b * s.tpb < ctx; ++b) {
      const uint32_t nk = std::min(s.tpb, ctx - b * s.tpb);
      const float* k = kv.k[b] + size_t{g} * hd;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows),
                  static_cast<int>(nk), static_cast<int>(hd), scale, qg.data(),
                  static_cast<int>(hd), k, static_cast<int>(s.kv_width()), 0.0f,
                  scores.data() + size_t{b} * s.tpb, static_cast<int>(ctx));
    }
    for (uint32_t j = 0; j < group; ++j) {
      for (uint32_t t = 0; t < nt; ++t) {
        CausalSoftmax(scores.data() + (size_t{j} * nt + t) * ctx, start + t0 + t + 1, ctx);
      }
    }
    for (uint32_t b = 0; b * s.tpb < ctx; ++b) {
      const uint32_t nk = std::min(s.tpb, ctx - b * s.tpb);
      const float* v = kv.v[b] + size_t{g} * hd;
      cblas_sgemm(
          CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), static_cast<int>(hd),
          static_cast<int>(nk), 1.0f, scores.data() + size_t{b} * s.tpb, static_cast<int>(ctx), v,
          static_cast<int>(s.kv_width()), b == 0 ? 0.0f : 1.0f, og.data(), static_cast<int>(hd));
    }
    for (uint32_t j = 0; j < group; ++j) {
      for (uint32_t t = 0; t < nt; ++t) {
        const float* src = og.data() + (size_t{j} * nt + t) * hd;
        std::copy(src, src + hd, out + size_t{t0 + t} * s.q_width() + size_t{g * group + j} * hd);
      }
    }
  }
}

}  // namespace

Result<std::vector<float>> LlamaModel::Forward(PagedKvCache& cache, std::span<const uint32_t> table,
                                               std::span<const TokenId> tokens, uint32_t start_pos,
                                               const ForwardOptions& options) const {
  const LlamaConfig& c = config_;
  const KvLayout& kl = cache.layout();
  if (tokens.empty()) return Status::InvalidArgument("Forward needs at least one token");
  if (kl.num_layers != c.num_layers || kl.num_kv_heads != c.num_kv_heads ||
      kl.head_dim != c.head_dim || (kl.dtype != DType::kFp32 && kl.dtype != DType::kBf16) ||
      kl.num_planes != 2 || kl.g1_arrangement != G1Arrangement::kLayerSeparate) {
    return Status::InvalidArgument("KV cache layout " + kl.ToString() +
                                   " does not match the model's");
  }
  const uint32_t tpb = kl.tokens_per_block;
  const uint64_t end_pos = uint64_t{start_pos} + tokens.size();
  if (end_pos > uint64_t{table.size()} * tpb) {
    return Status::InvalidArgument("block table of " + std::to_string(table.size()) +
                                   " blocks cannot hold " + std::to_string(end_pos) + " positions");
  }
  for (uint64_t b = 0; b * tpb < end_pos; ++b) {
    if (table[b] >= cache.num_blocks()) {
      return Status::InvalidArgument("block table names block " + std::to_string(table[b]) +
                                     " of a " + std::to_string(cache.num_blocks()) +
                                     "-block cache");
    }
  }
  for (TokenId id : tokens) {
    if (id >= c.vocab_size) {
      return Status::InvalidArgument("token id " + std::to_string(id) + " >= vocab size " +
                                     std::to_string(c.vocab_size));
    }
  }

  const auto n = static_cast<uint32_t>(tokens.size());
  const uint32_t D = c.dim, F = c.ffn_dim;
  const AttnShape shape0{c.num_heads, c.num_kv_heads, c.head_dim, tpb, 0};
  const uint32_t QW = shape0.q_width(), KW = shape0.kv_width();

  std::vector<float> x(size_t{n} * D), h(size_t{n} * D), q(size_t{n} * QW), k(size_t{n} * KW),
      v(size_t{n} * KW), att(size_t{n} * QW), gate(size_t{n} * F), up(size_t{n} * F);
  std::vector<float> qg, scores, og;
  KvView kv;
  for (uint32_t t = 0; t < n; ++t) {
    const float* e = weights_.token_embd.data() + size_t{tokens[t]} * D;
    std::copy(e, e + D, x.data() + size_t{t} * D);
  }
  // Rotation angles per (token, pair), in double so long positions stay accurate.
  const uint32_t half = c.rope_dim / 2;
  std::vector<float> cos_t(size_t{n} * half), sin_t(size_t{n} * half);
  for (uint32_t t = 0; t < n; ++t) {
    for (uint32_t i = 0; i < half; ++i) {
      const double freq = std::pow(double{c.rope_theta}, -2.0 * i / c.rope_dim);
      const double angle = static_cast<double>(start_pos + t) * freq;
      cos_t[size_t{t} * half + i] = static_cast<float>(std::cos(angle));
      sin_t[size_t{t} * half + i] = static_cast<float>(std::sin(angle));
    }
  }

  for (uint32_t l = 0; l < c.num_layers; ++l) {
    if (options.before_layer) KVTIER_RETURN_IF_ERROR(options.before_layer(l));
    const LlamaLayerWeights& w = weights_.layers[l];
    RmsNorm(x.data(), w.attn_norm.data(), h.data(), n, D, c.norm_eps);
    MatMul(h.data(), w.wq.data(), q.data(), n, D, QW);
    MatMul(h.data(), w.wk.data(), k.data(), n, D, KW);
    MatMul(h.data(), w.wv.data(), v.data(), n, D, KW);
    ApplyRope(q.data(), n, c.num_heads, c.head_dim, c.rope_dim, cos_t, sin_t);
    ApplyRope(k.data(), n, c.num_kv_heads, c.head_dim, c.rope_dim, cos_t, sin_t);
    for (uint32_t t = 0; t < n; ++t) {
      const uint32_t pos = start_pos + t;
      const size_t slot = size_t{pos % tpb} * KW;
      if (cache.bf16()) {
        uint16_t* kd = cache.ChunkBf16(table[pos / tpb], l, 0) + slot;
        uint16_t* vd = cache.ChunkBf16(table[pos / tpb], l, 1) + slot;
        for (uint32_t i = 0; i < KW; ++i) {
          kd[i] = ToBf16(k[size_t{t} * KW + i]);
          vd[i] = ToBf16(v[size_t{t} * KW + i]);
        }
      } else {
        std::copy_n(k.data() + size_t{t} * KW, KW, cache.Chunk(table[pos / tpb], l, 0) + slot);
        std::copy_n(v.data() + size_t{t} * KW, KW, cache.Chunk(table[pos / tpb], l, 1) + slot);
      }
    }
    kv.Build(cache, table, l, static_cast<uint32_t>((end_pos + tpb - 1) / tpb));
    AttnShape shape = shape0;
    shape.layer = l;
    for (uint32_t t0 = 0; t0 < n; t0 += kQueryChunk) {
      const uint32_t t1 = std::min(n, t0 + kQueryChunk);
      if ((t1 - t0) * (c.num_heads / c.num_kv_heads) < kMinGemmRows) {
        AttendLoops(kv, shape, q.data(), att.data(), start_pos, t0, t1, scores);
      } else {
        AttendGemm(kv, shape, q.data(), att.data(), start_pos, t0, t1, qg, scores, og);
      }
    }
    MatMul(att.data(), w.wo.data(), h.data(), n, QW, D);
    for (size_t i = 0; i < x.size(); ++i) x[i] += h[i];

    RmsNorm(x.data(), w.ffn_norm.data(), h.data(), n, D, c.norm_eps);
    MatMul(h.data(), w.w_gate.data(), gate.data(), n, D, F);
    MatMul(h.data(), w.w_up.data(), up.data(), n, D, F);
    for (size_t i = 0; i < gate.size(); ++i) {
      const float g = gate[i];
      gate[i] = g / (1.0f + std::exp(-g)) * up[i];  // SiLU(gate) * up
    }
    MatMul(gate.data(), w.w_down.data(), h.data(), n, F, D);
    for (size_t i = 0; i < x.size(); ++i) x[i] += h[i];
  }

  const uint32_t first = options.all_logits ? 0 : n - 1;
  const uint32_t rows = n - first;
  RmsNorm(x.data() + size_t{first} * D, weights_.output_norm.data(), h.data(), rows, D, c.norm_eps);
  std::vector<float> logits(size_t{rows} * c.vocab_size);
  MatMul(h.data(), weights_.lm_head(), logits.data(), rows, D, c.vocab_size);
  return logits;
}

TokenId Argmax(std::span<const float> logits) {
  return static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Status EnsureCapacity(PagedKvCache& cache, SequenceState& seq, uint32_t num_positions) {
  const uint32_t tpb = cache.tokens_per_block();
  const uint32_t need = (num_positions + tpb - 1) / tpb;
  if (need <= seq.block_table.size()) return Status::Ok();
  KVTIER_ASSIGN_OR_RETURN(std::vector<uint32_t> more,
                          cache.Allocate(need - static_cast<uint32_t>(seq.block_table.size())));
  seq.block_table.insert(seq.block_table.end(), more.begin(), more.end());
  return Status::Ok();
}

Result<std::vector<TokenId>> GreedyDecode(const LlamaModel& model, PagedKvCache& cache,
                                          SequenceState& seq, std::vector<float> logits,
                                          uint32_t max_new, int64_t stop_id) {
  std::vector<TokenId> out;
  for (uint32_t k = 0; k < max_new; ++k) {
    const TokenId next = Argmax(logits);
    out.push_back(next);
    if (stop_id >= 0 && next == static_cast<TokenId>(stop_id)) break;
    if (k + 1 == max_new) break;
    KVTIER_RETURN_IF_ERROR(EnsureCapacity(cache, seq, seq.num_tokens + 1));
    const TokenId one[] = {next};
    KVTIER_ASSIGN_OR_RETURN(logits, model.Forward(cache, seq.block_table, one, seq.num_tokens));
    ++seq.num_tokens;
  }
  return out;
}

}  // namespace kvtier::engine

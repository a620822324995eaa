// Helpers for the engine tests: a GGUF writer (so tests build their own model files) and
// a temporary directory.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <cmath>
#include <span>

#include <gtest/gtest.h>

#include "engine/gguf.h"
#include "engine/model.h"
#include "kvtier/connector.h"

namespace kvtier::engine::testing {

// `n` pseudo-random tokens below `vocab` (a linear congruential sequence from `seed`).
inline std::vector<TokenId> Tokens(uint32_t n, uint32_t seed, uint32_t vocab) {
  std::vector<TokenId> t(n);
  uint32_t s = seed;
  for (TokenId& x : t) {
    s = s * 1664525u + 1013904223u;
    x = (s >> 8) % vocab;
  }
  return t;
}

// Options for a manager of the engine's blocks (`layout`) with a G2 of `g2_blocks` slots,
// unlocked and prefaulted by one thread, for model "random-llama"; tests add their own settings.
inline ManagerOptions EngineManagerOptions(const KvLayout& layout, uint64_t g2_blocks) {
  ManagerOptions o;
  o.layout = layout;
  o.model_id = "random-llama";
  const uint64_t slot = 4096 + layout.BlockBytes();
  EXPECT_TRUE(o.config.Set("g2.capacity_bytes", std::to_string(g2_blocks * slot)).ok());
  EXPECT_TRUE(o.config.Set("g2.lock_memory", "false").ok());
  EXPECT_TRUE(o.config.Set("g2.prefault_threads", "1").ok());
  return o;
}

// The manager `o` makes, or nullptr (a failed expectation) when it cannot be created.
inline std::unique_ptr<BlockManager> CreateManager(const ManagerOptions& o) {
  auto m = BlockManager::Create(o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(*m) : nullptr;
}

// A directory under $TMPDIR removed (with its contents) at destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kvtier-engine-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data()) ? tmpl : std::string();
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Builds a GGUF file in memory: metadata first, then tensors; Bytes() lays them out per the
// spec (header, kv pairs, tensor infos, padding to `alignment`, data with each tensor aligned).
class GgufWriter {
 public:
  explicit GgufWriter(uint32_t version = 3, uint64_t alignment = 32)
      : version_(version), alignment_(alignment) {}

  template <typename T>
  static void Put(std::vector<uint8_t>& out, T v) {
    uint8_t b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out.insert(out.end(), b, b + sizeof(T));
  }
  static void PutString(std::vector<uint8_t>& out, const std::string& s) {
    Put<uint64_t>(out, s.size());
    out.insert(out.end(), s.begin(), s.end());
  }

  // Raw key-value pair: the caller encodes the value (for unusual or corrupt entries).
  void AddRaw(const std::string& key, uint32_t type, const std::vector<uint8_t>& value) {
    ++n_kv_;
    PutString(kv_, key);
    Put<uint32_t>(kv_, type);
    kv_.insert(kv_.end(), value.begin(), value.end());
  }
  void AddU32(const std::string& key, uint32_t v) { AddScalar(key, GgufValueType::kUint32, v); }
  void AddI32(const std::string& key, int32_t v) { AddScalar(key, GgufValueType::kInt32, v); }
  void AddU64(const std::string& key, uint64_t v) { AddScalar(key, GgufValueType::kUint64, v); }
  void AddF32(const std::string& key, float v) { AddScalar(key, GgufValueType::kFloat32, v); }
  void AddBool(const std::string& key, bool v) {
    AddScalar(key, GgufValueType::kBool, static_cast<uint8_t>(v));
  }
  void AddString(const std::string& key, const std::string& v) {
    std::vector<uint8_t> b;
    PutString(b, v);
    AddRaw(key, static_cast<uint32_t>(GgufValueType::kString), b);
  }
  void AddStringArray(const std::string& key, const std::vector<std::string>& v) {
    std::vector<uint8_t> b;
    Put<uint32_t>(b, static_cast<uint32_t>(GgufValueType::kString));
    Put<uint64_t>(b, v.size());
    for (const std::string& s : v) PutString(b, s);
    AddRaw(key, static_cast<uint32_t>(GgufValueType::kArray), b);
  }
  void AddI32Array(const std::string& key, const std::vector<int32_t>& v) {
    std::vector<uint8_t> b;
    Put<uint32_t>(b, static_cast<uint32_t>(GgufValueType::kInt32));
    Put<uint64_t>(b, v.size());
    for (int32_t x : v) Put<int32_t>(b, x);
    AddRaw(key, static_cast<uint32_t>(GgufValueType::kArray), b);
  }

  // A tensor with dims `ne` (innermost first) of ggml type `type` and raw bytes `data`.
  void AddTensor(const std::string& name, const std::vector<uint64_t>& ne, uint32_t type,
                 const std::vector<uint8_t>& data) {
    tensors_.push_back({name, ne, type, data});
  }
  void AddF32Tensor(const std::string& name, const std::vector<uint64_t>& ne,
                    const std::vector<float>& v) {
    std::vector<uint8_t> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    AddTensor(name, ne, static_cast<uint32_t>(GgmlType::kF32), b);
  }

  std::vector<uint8_t> Bytes() const {
    std::vector<uint8_t> out(4);
    std::memcpy(out.data(), "GGUF", 4);
    Put<uint32_t>(out, version_);
    Put<uint64_t>(out, tensors_.size());
    Put<uint64_t>(out, n_kv_);
    out.insert(out.end(), kv_.begin(), kv_.end());
    uint64_t offset = 0;
    std::vector<uint64_t> offsets;
    for (const Tensor& t : tensors_) {
      PutString(out, t.name);
      Put<uint32_t>(out, t.ne.size());
      for (uint64_t d : t.ne) Put<uint64_t>(out, d);
      Put<uint32_t>(out, t.type);
      Put<uint64_t>(out, offset);
      offsets.push_back(offset);
      offset = AlignUp(offset + t.data.size());
    }
    out.resize(AlignUp(out.size()), 0);
    const uint64_t data_start = out.size();
    for (size_t k = 0; k < tensors_.size(); ++k) {
      out.resize(data_start + offsets[k], 0);
      out.insert(out.end(), tensors_[k].data.begin(), tensors_[k].data.end());
    }
    return out;
  }

  // Writes Bytes() to `path`; returns false on an I/O error.
  bool Write(const std::string& path) const { return WriteFile(path, Bytes()); }

  static bool WriteFile(const std::string& path, const std::vector<uint8_t>& bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
    return static_cast<bool>(f);
  }

 private:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> ne;
    uint32_t type;
    std::vector<uint8_t> data;
  };
  template <typename T>
  void AddScalar(const std::string& key, GgufValueType type, T v) {
    std::vector<uint8_t> b;
    Put<T>(b, v);
    AddRaw(key, static_cast<uint32_t>(type), b);
  }
  uint64_t AlignUp(uint64_t x) const { return (x + alignment_ - 1) / alignment_ * alignment_; }

  uint32_t version_;
  uint64_t alignment_;
  uint64_t n_kv_ = 0;
  std::vector<uint8_t> kv_;
  std::vector<Tensor> tensors_;
};

// The reference forward pass: plain loops in double precision, contiguous KV, no BLAS, no
// paging, written independently of model.cc. Returns the logits of every token of `tokens`
// (positions 0, 1, ...), [n][vocab].
inline std::vector<float> ReferenceForward(const LlamaModel& model,
                                           std::span<const TokenId> tokens) {
  const LlamaConfig& c = model.config();
  const LlamaWeights& w = model.weights();
  const size_t n = tokens.size(), D = c.dim, hd = c.head_dim, H = c.num_heads, G = c.num_kv_heads,
               F = c.ffn_dim, V = c.vocab_size;
  auto matvec = [](const std::vector<float>& W, const std::vector<double>& x, size_t out) {
    std::vector<double> y(out, 0.0);
    const size_t in = x.size();
    for (size_t o = 0; o < out; ++o) {
      for (size_t i = 0; i < in; ++i) y[o] += double{W[o * in + i]} * x[i];
    }
    return y;
  };
  auto rmsnorm = [&](const std::vector<double>& x, const std::vector<float>& g) {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + c.norm_eps);
    std::vector<double> y(x.size());
    for (size_t k = 0; k < x.size(); ++k) y[k] = x[k] * inv * g[k];
    return y;
  };
  auto rope = [&](std::vector<double>& v, size_t heads, size_t pos) {
    for (size_t h = 0; h < heads; ++h) {
      for (size_t i = 0; i < c.rope_dim / 2; ++i) {
        const double angle =
            static_cast<double>(pos) * std::pow(double{c.rope_theta}, -2.0 * i / c.rope_dim);
        double& a = v[h * hd + 2 * i];
        double& b = v[h * hd + 2 * i + 1];
        const double ra = a * std::cos(angle) - b * std::sin(angle);
        const double rb = a * std::sin(angle) + b * std::cos(angle);
        a = ra;
        b = rb;
      }
    }
  };
  std::vector<std::vector<double>> x(n, std::vector<double>(D));
  for (size_t t = 0; t < n; ++t) {
    for (size_t k = 0; k < D; ++k) x[t][k] = w.token_embd[tokens[t] * D + k];
  }
  for (size_t l = 0; l < c.num_layers; ++l) {
    const LlamaLayerWeights& L = w.layers[l];
    std::vector<std::vector<double>> K(n), Vv(n), Q(n);
    for (size_t t = 0; t < n; ++t) {
      auto h = rmsnorm(x[t], L.attn_norm);
      Q[t] = matvec(L.wq, h, H * hd);
      K[t] = matvec(L.wk, h, G * hd);
      Vv[t] = matvec(L.wv, h, G * hd);
      rope(Q[t], H, t);
      rope(K[t], G, t);
    }
    for (size_t t = 0; t < n; ++t) {
      std::vector<double> att(H * hd, 0.0);
      for (size_t h = 0; h < H; ++h) {
        const size_t g = h / (H / G);
        std::vector<double> s(t + 1);
        double mx = -1e300;
        for (size_t p = 0; p <= t; ++p) {
          double dot = 0;
          for (size_t d = 0; d < hd; ++d) dot += Q[t][h * hd + d] * K[p][g * hd + d];
          s[p] = dot / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[p]);
        }
        double sum = 0;
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (size_t p = 0; p <= t; ++p) {
          for (size_t d = 0; d < hd; ++d) att[h * hd + d] += s[p] / sum * Vv[p][g * hd + d];
        }
      }
      auto o = matvec(L.wo, att, D);
      for (size_t k = 0; k < D; ++k) x[t][k] += o[k];
      auto h2 = rmsnorm(x[t], L.ffn_norm);
      auto gate = matvec(L.w_gate, h2, F);
      auto up = matvec(L.w_up, h2, F);
      for (size_t k = 0; k < F; ++k) gate[k] = gate[k] / (1.0 + std::exp(-gate[k])) * up[k];
      auto down = matvec(L.w_down, gate, D);
      for (size_t k = 0; k < D; ++k) x[t][k] += down[k];
    }
  }
  std::vector<float> logits(n * V);
  const std::vector<float> head(w.lm_head(), w.lm_head() + V * D);
  for (size_t t = 0; t < n; ++t) {
    auto y = matvec(head, rmsnorm(x[t], w.output_norm), V);
    for (size_t k = 0; k < V; ++k) logits[t * V + k] = static_cast<float>(y[k]);
  }
  return logits;
}

// max |a - b| / max |b|: the error of `a` relative to the scale of the reference `b`.
inline double RelativeError(std::span<const float> a, std::span<const float> b) {
  double diff = 0, scale = 1e-30;
  for (size_t k = 0; k < a.size() && k < b.size(); ++k) {
    diff = std::max(diff, std::abs(double{a[k]} - b[k]));
    scale = std::max(scale, std::abs(double{b[k]}));
  }
  return a.size() == b.size() ? diff / scale : 1e30;
}

}  // namespace kvtier::engine::testing

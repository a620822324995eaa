#include <gtest/gtest.h>

#include <numeric>

#include "engine/kv_cache.h"
#include "engine/model.h"
#include "engine_test_util.h"

namespace kvtier::engine {
namespace {

using testing::GgufWriter;
using testing::ReferenceForward;
using testing::RelativeError;
using testing::TempDir;

constexpr double kTol = 1e-4;

LlamaConfig SmallConfig() {
  LlamaConfig c;  // 2 layers, dim 64, 4 heads / 2 kv heads of 16, ffn 128, vocab 256
  return c;
}

std::vector<TokenId> Prompt(uint32_t n, uint32_t vocab, uint32_t seed = 1) {
  return testing::Tokens(n, seed, vocab);
}

struct Harness {
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<PagedKvCache> cache;
};

Harness Make(const LlamaConfig& c, uint32_t tpb, uint32_t blocks, uint64_t seed = 42) {
  Harness h;
  auto m = LlamaModel::Random(c, seed);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  h.model = std::move(*m);
  auto cache = PagedKvCache::Create(h.model->MakeKvLayout(tpb), blocks);
  EXPECT_TRUE(cache.ok()) << cache.status().ToString();
  h.cache = std::move(*cache);
  return h;
}

// Takes `n` blocks and hands them out in a scrambled order, so a sequence's blocks are never
// contiguous or ascending in the cache.
std::vector<uint32_t> ScrambledBlocks(PagedKvCache& cache, uint32_t n) {
  auto b = *cache.Allocate(n);
  for (size_t k = 0; k + 1 < b.size(); k += 2) std::swap(b[k], b[k + 1]);
  std::reverse(b.begin(), b.end());
  return b;
}

std::span<const float> Row(const std::vector<float>& all, uint32_t t, uint32_t vocab) {
  return std::span<const float>(all).subspan(size_t{t} * vocab, vocab);
}

void ExpectMatchesReference(const LlamaConfig& c, uint32_t tpb, uint32_t n) {
  SCOPED_TRACE("tpb " + std::to_string(tpb) + ", " + std::to_string(n) + " tokens");
  const uint32_t blocks = (n + tpb - 1) / tpb;
  Harness h = Make(c, tpb, blocks + 3);
  const auto prompt = Prompt(n, c.vocab_size);
  const auto ref = ReferenceForward(*h.model, prompt);
  const auto table = ScrambledBlocks(*h.cache, blocks);
  ForwardOptions all;
  all.all_logits = true;
  auto got = h.model->Forward(*h.cache, table, prompt, 0, all);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->size(), ref.size());
  for (uint32_t t = 0; t < n; ++t) {
    ASSERT_LT(RelativeError(Row(*got, t, c.vocab_size), Row(ref, t, c.vocab_size)), kTol)
        << "token " << t;
  }
}

TEST(LlamaModelTest, PagedBlasForwardMatchesNaiveReference) {
  ExpectMatchesReference(SmallConfig(), 16, 37);
  ExpectMatchesReference(SmallConfig(), 64, 70);
  ExpectMatchesReference(SmallConfig(), 1, 9);
  ExpectMatchesReference(SmallConfig(), 24, 61);  // not a power of two: a partial last block
  ExpectMatchesReference(SmallConfig(), 3, 10);
  LlamaConfig mha = SmallConfig();  // multi-head, partial rope, tied embeddings
  mha.num_kv_heads = 4;
  mha.rope_dim = 8;
  mha.tied_embeddings = true;
  mha.rope_theta = 100000.0f;
  ExpectMatchesReference(mha, 16, 33);
  LlamaConfig gqa = SmallConfig();  // 8 query heads per kv head, head_dim 8
  gqa.num_heads = 8;
  gqa.num_kv_heads = 1;
  gqa.head_dim = 8;
  gqa.rope_dim = 8;
  gqa.num_layers = 3;
  ExpectMatchesReference(gqa, 16, 20);
}

TEST(LlamaModelTest, LongPrefillSpansSeveralQueryChunks) {
  LlamaConfig c = SmallConfig();
  c.num_layers = 1;
  ExpectMatchesReference(c, 16, 300);  // > 256 queries: two attention chunks
}

TEST(LlamaModelTest, IncrementalDecodeMatchesReference) {
  const LlamaConfig c = SmallConfig();
  Harness h = Make(c, 16, 8);
  const auto prompt = Prompt(40, c.vocab_size);
  const auto ref = ReferenceForward(*h.model, prompt);
  const auto table = ScrambledBlocks(*h.cache, 3);
  // 5 tokens, then one at a time (the loop attention path), then a chunk of 10.
  uint32_t pos = 0;
  for (uint32_t len : {5u, 1u, 1u, 1u, 1u, 1u, 10u, 1u, 19u}) {
    std::span<const TokenId> part(prompt.data() + pos, len);
    auto got = h.model->Forward(*h.cache, table, part, pos);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    pos += len;
    ASSERT_LT(RelativeError(*got, Row(ref, pos - 1, c.vocab_size)), kTol) << "at " << pos;
  }
  EXPECT_EQ(pos, 40u);
}

// Prefill of the whole prompt vs prefill of a block-aligned prefix, then the suffix reusing the
// prefix's KV blocks; and vs the prefix's blocks copied elsewhere (what a kvtier load does).
TEST(LlamaModelTest, PrefixReuseAndCopiedBlocksGiveTheSameLogitsAndContinuation) {
  const LlamaConfig c = SmallConfig();
  for (uint32_t tpb : {16u, 64u}) {
    SCOPED_TRACE("tpb " + std::to_string(tpb));
    Harness h = Make(c, tpb, 64);
    const uint32_t n = 2 * tpb + 11, prefix = 2 * tpb;
    const auto prompt = Prompt(n, c.vocab_size, 9);
    const std::span<const TokenId> all(prompt);

    SequenceState whole;
    ASSERT_TRUE(EnsureCapacity(*h.cache, whole, n).ok());
    auto l_whole = h.model->Forward(*h.cache, whole.block_table, all, 0);
    ASSERT_TRUE(l_whole.ok());
    whole.num_tokens = n;

    SequenceState split;
    ASSERT_TRUE(EnsureCapacity(*h.cache, split, n).ok());
    ASSERT_TRUE(h.model->Forward(*h.cache, split.block_table, all.first(prefix), 0).ok());
    auto l_split = h.model->Forward(*h.cache, split.block_table, all.subspan(prefix), prefix);
    ASSERT_TRUE(l_split.ok());
    split.num_tokens = n;
    EXPECT_LT(RelativeError(*l_split, *l_whole), 1e-5);

    // "Load": copy the prefix blocks of `split` into fresh blocks of a new sequence.
    SequenceState loaded;
    ASSERT_TRUE(EnsureCapacity(*h.cache, loaded, n).ok());
    for (uint32_t b = 0; b < prefix / tpb; ++b) {
      h.cache->CopyBlock(split.block_table[b], loaded.block_table[b]);
    }
    auto l_loaded = h.model->Forward(*h.cache, loaded.block_table, all.subspan(prefix), prefix);
    ASSERT_TRUE(l_loaded.ok());
    loaded.num_tokens = n;
    EXPECT_LT(RelativeError(*l_loaded, *l_whole), 1e-5);

    auto g_whole = GreedyDecode(*h.model, *h.cache, whole, *l_whole, 12, -1);
    auto g_split = GreedyDecode(*h.model, *h.cache, split, *l_split, 12, -1);
    auto g_loaded = GreedyDecode(*h.model, *h.cache, loaded, *l_loaded, 12, -1);
    ASSERT_TRUE(g_whole.ok() && g_split.ok() && g_loaded.ok());
    EXPECT_EQ(g_whole->size(), 12u);
    EXPECT_EQ(*g_split, *g_whole);
    EXPECT_EQ(*g_loaded, *g_whole);
    EXPECT_EQ(whole.num_tokens, n + 11);

    // Without the prefix's KV (fresh zeroed blocks) the suffix gives other logits: the test
    // above can fail.
    SequenceState empty;
    ASSERT_TRUE(EnsureCapacity(*h.cache, empty, n).ok());
    auto l_empty = h.model->Forward(*h.cache, empty.block_table, all.subspan(prefix), prefix);
    ASSERT_TRUE(l_empty.ok());
    EXPECT_GT(RelativeError(*l_empty, *l_whole), 1e-3);
  }
}

TEST(LlamaModelTest, RandomWeightsAreDeterministic) {
  auto a = LlamaModel::Random(SmallConfig(), 5);
  auto b = LlamaModel::Random(SmallConfig(), 5);
  auto c = LlamaModel::Random(SmallConfig(), 6);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ((*a)->weights().layers[1].wq, (*b)->weights().layers[1].wq);
  EXPECT_NE((*a)->weights().layers[1].wq, (*c)->weights().layers[1].wq);
  EXPECT_EQ((*a)->weights().token_embd[0], (*b)->weights().token_embd[0]);
}

TEST(LlamaModelTest, ForwardRejectsBadArguments) {
  const LlamaConfig c = SmallConfig();
  Harness h = Make(c, 16, 4);
  const auto table = *h.cache->Allocate(2);
  const TokenId ok[] = {1, 2};
  const TokenId bad[] = {1, 256};
  auto invalid = [](const Result<std::vector<float>>& r) {
    return r.status().Is(StatusCode::kInvalidArgument);
  };
  EXPECT_TRUE(invalid(h.model->Forward(*h.cache, table, {}, 0)));
  EXPECT_TRUE(invalid(h.model->Forward(*h.cache, table, bad, 0)));
  EXPECT_TRUE(invalid(h.model->Forward(*h.cache, table, ok, 31)));  // needs 33 positions
  const uint32_t outside[] = {0, 99};
  EXPECT_TRUE(invalid(h.model->Forward(*h.cache, outside, ok, 15)));
  LlamaConfig other = c;
  other.num_kv_heads = 4;
  auto other_cache =
      PagedKvCache::Create(LlamaModel::Random(other, 1).value()->MakeKvLayout(16), 2);
  ASSERT_TRUE(other_cache.ok());
  EXPECT_TRUE(invalid(h.model->Forward(**other_cache, table, ok, 0)));

  // before_layer: called once per layer in order; an error aborts and is returned.
  std::vector<uint32_t> seen;
  ForwardOptions opts;
  opts.before_layer = [&](uint32_t l) {
    seen.push_back(l);
    return l == 1 ? Status::Unavailable("load failed") : Status::Ok();
  };
  auto r = h.model->Forward(*h.cache, table, ok, 0, opts);
  EXPECT_TRUE(r.status().Is(StatusCode::kUnavailable));
  EXPECT_EQ(seen, (std::vector<uint32_t>{0, 1}));
}

TEST(LlamaModelTest, ConfigAndWeightValidation) {
  auto bad = [](auto mutate) {
    LlamaConfig c;
    mutate(c);
    return LlamaModel::Random(c, 1).status().Is(StatusCode::kInvalidArgument);
  };
  EXPECT_TRUE(bad([](LlamaConfig& c) { c.num_layers = 0; }));
  EXPECT_TRUE(bad([](LlamaConfig& c) { c.num_kv_heads = 3; }));
  EXPECT_TRUE(bad([](LlamaConfig& c) { c.rope_dim = 7; }));
  EXPECT_TRUE(bad([](LlamaConfig& c) { c.rope_dim = 32; }));
  EXPECT_TRUE(bad([](LlamaConfig& c) { c.head_dim = 0; }));
  EXPECT_TRUE(bad([](LlamaConfig& c) { c.vocab_size = 0; }));
  EXPECT_TRUE(bad([](LlamaConfig& c) { c.norm_eps = 0; }));
  LlamaWeights w = LlamaModel::Random(SmallConfig(), 1).value()->weights();
  w.layers[1].w_up.pop_back();
  auto r = LlamaModel::FromWeights(SmallConfig(), w);
  EXPECT_TRUE(r.status().Is(StatusCode::kInvalidArgument));
  EXPECT_NE(r.status().message().find("w_up"), std::string::npos);
}

TEST(PagedKvCacheTest, AllocatesFreesAndDescribesItsMemory) {
  const LlamaConfig c = SmallConfig();
  auto m = LlamaModel::Random(c, 1);
  auto cache = PagedKvCache::Create((*m)->MakeKvLayout(16), 4);
  ASSERT_TRUE(cache.ok());
  PagedKvCache& kv = **cache;
  EXPECT_TRUE(kv.memory().Validate().ok());
  EXPECT_EQ(kv.memory().regions.size(), 2u * c.num_layers);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(kv.Chunk(3, 1, 1)),
            kv.memory().regions[3].base + 3 * kv.layout().ChunkBytes());
  auto a = kv.Allocate(3);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_TRUE(kv.Allocate(2).status().Is(StatusCode::kResourceExhausted));
  EXPECT_EQ(kv.free_blocks(), 1u);
  const uint32_t twice[] = {0, 0};
  EXPECT_TRUE(kv.Free(twice).Is(StatusCode::kInvalidArgument));
  const uint32_t unallocated[] = {3};
  EXPECT_TRUE(kv.Free(unallocated).Is(StatusCode::kInvalidArgument));
  const uint32_t outside[] = {9};
  EXPECT_TRUE(kv.Free(outside).Is(StatusCode::kInvalidArgument));
  EXPECT_EQ(kv.free_blocks(), 1u);
  EXPECT_TRUE(kv.Free(*a).ok());
  EXPECT_EQ(kv.free_blocks(), 4u);
  kv.Chunk(1, 0, 0)[5] = 3.5f;
  kv.Chunk(1, 1, 1)[7] = -2.0f;
  kv.CopyBlock(1, 2);
  EXPECT_EQ(kv.Chunk(2, 0, 0)[5], 3.5f);
  EXPECT_EQ(kv.Chunk(2, 1, 1)[7], -2.0f);

  SequenceState seq;
  EXPECT_TRUE(EnsureCapacity(kv, seq, 40).ok());
  EXPECT_EQ(seq.block_table.size(), 3u);
  EXPECT_TRUE(EnsureCapacity(kv, seq, 80).Is(StatusCode::kResourceExhausted));
  EXPECT_EQ(seq.block_table.size(), 3u);

  KvLayout l = (*m)->MakeKvLayout(16);
  l.dtype = DType::kFp16;
  EXPECT_TRUE(PagedKvCache::Create(l, 4).status().Is(StatusCode::kInvalidArgument));
  l = (*m)->MakeKvLayout(16);
  l.g1_arrangement = G1Arrangement::kBlockContiguous;
  EXPECT_TRUE(PagedKvCache::Create(l, 4).status().Is(StatusCode::kInvalidArgument));
  EXPECT_TRUE(
      PagedKvCache::Create((*m)->MakeKvLayout(16), 0).status().Is(StatusCode::kInvalidArgument));
  EXPECT_TRUE(PagedKvCache::Create((*m)->MakeKvLayout(KvLayout::kMaxTokensPerBlock + 1), 4)
                  .status()
                  .Is(StatusCode::kInvalidArgument));  // past the largest block size
}

// Writes a random model as an F32 GGUF file with the real tensor names.
GgufWriter ModelGguf(const LlamaModel& m, const std::string& arch = "llama") {
  const LlamaConfig& c = m.config();
  const LlamaWeights& w = m.weights();
  GgufWriter g;
  g.AddString("general.architecture", arch);
  g.AddU32("llama.block_count", c.num_layers);
  g.AddU32("llama.embedding_length", c.dim);
  g.AddU32("llama.feed_forward_length", c.ffn_dim);
  g.AddU32("llama.attention.head_count", c.num_heads);
  g.AddU32("llama.attention.head_count_kv", c.num_kv_heads);
  g.AddU32("llama.rope.dimension_count", c.rope_dim);
  g.AddF32("llama.rope.freq_base", c.rope_theta);
  g.AddF32("llama.attention.layer_norm_rms_epsilon", c.norm_eps);
  const uint64_t D = c.dim, Q = c.num_heads * c.head_dim, KV = c.num_kv_heads * c.head_dim,
                 F = c.ffn_dim, V = c.vocab_size;
  g.AddF32Tensor("token_embd.weight", {D, V}, w.token_embd);
  for (uint32_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const LlamaLayerWeights& L = w.layers[l];
    g.AddF32Tensor(p + "attn_norm.weight", {D}, L.attn_norm);
    g.AddF32Tensor(p + "attn_q.weight", {D, Q}, L.wq);
    g.AddF32Tensor(p + "attn_k.weight", {D, KV}, L.wk);
    g.AddF32Tensor(p + "attn_v.weight", {D, KV}, L.wv);
    g.AddF32Tensor(p + "attn_output.weight", {Q, D}, L.wo);
    g.AddF32Tensor(p + "ffn_norm.weight", {D}, L.ffn_norm);
    g.AddF32Tensor(p + "ffn_gate.weight", {D, F}, L.w_gate);
    g.AddF32Tensor(p + "ffn_up.weight", {D, F}, L.w_up);
    g.AddF32Tensor(p + "ffn_down.weight", {F, D}, L.w_down);
  }
  g.AddF32Tensor("output_norm.weight", {D}, w.output_norm);
  if (!c.tied_embeddings) g.AddF32Tensor("output.weight", {D, V}, w.output);
  return g;
}

TEST(LlamaModelTest, LoadsGgufModelsExactly) {
  TempDir dir;
  for (bool tied : {false, true}) {
    LlamaConfig c = SmallConfig();
    c.tied_embeddings = tied;
    auto m = LlamaModel::Random(c, 77);
    ASSERT_TRUE(m.ok());
    ASSERT_TRUE(ModelGguf(**m).Write(dir.File("m.gguf")));
    auto f = GgufFile::Open(dir.File("m.gguf"));
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    auto loaded = LlamaModel::FromGguf(**f);
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    EXPECT_EQ((*loaded)->config().tied_embeddings, tied);
    EXPECT_EQ((*loaded)->config().head_dim, c.head_dim);
    EXPECT_EQ((*loaded)->weights().layers[1].w_down, (*m)->weights().layers[1].w_down);
    EXPECT_EQ((*loaded)->weights().output, (*m)->weights().output);
  }
}

TEST(LlamaModelTest, GgufLoaderReportsWhatIsWrong) {
  TempDir dir;
  auto m = LlamaModel::Random(SmallConfig(), 3);
  ASSERT_TRUE(m.ok());
  auto load = [&](const GgufWriter& w) {
    EXPECT_TRUE(w.Write(dir.File("m.gguf")));
    auto f = GgufFile::Open(dir.File("m.gguf"));
    EXPECT_TRUE(f.ok()) << f.status().ToString();
    return LlamaModel::FromGguf(**f).status();
  };
  Status s = load(ModelGguf(**m, "gemma"));
  EXPECT_TRUE(s.Is(StatusCode::kInvalidArgument)) << s.ToString();

  GgufWriter no_eps;
  no_eps.AddString("general.architecture", "llama");
  no_eps.AddU32("llama.block_count", 2);
  s = load(no_eps);
  EXPECT_TRUE(s.Is(StatusCode::kNotFound)) << s.ToString();
  EXPECT_NE(s.message().find("llama.embedding_length"), std::string::npos);

  // Metadata for 3 layers; tensors added step by step.
  GgufWriter meta3;
  meta3.AddString("general.architecture", "llama");
  meta3.AddU32("llama.block_count", 3);
  meta3.AddU32("llama.embedding_length", 64);
  meta3.AddU32("llama.feed_forward_length", 128);
  meta3.AddU32("llama.attention.head_count", 4);
  meta3.AddU32("llama.attention.head_count_kv", 2);
  meta3.AddF32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  s = load(meta3);
  EXPECT_TRUE(s.Is(StatusCode::kNotFound)) << s.ToString();
  EXPECT_NE(s.message().find("token_embd.weight"), std::string::npos);
  const auto& w = (*m)->weights();
  meta3.AddF32Tensor("token_embd.weight", {64, 256}, w.token_embd);
  meta3.AddF32Tensor("output_norm.weight", {64}, w.output_norm);
  meta3.AddF32Tensor("output.weight", {64, 256}, w.output);
  s = load(meta3);
  EXPECT_TRUE(s.Is(StatusCode::kNotFound)) << s.ToString();
  EXPECT_NE(s.message().find("blk.0.attn_norm.weight"), std::string::npos);

  // A wrong shape, and an undequantizable type.
  meta3.AddF32Tensor("blk.0.attn_norm.weight", {32}, std::vector<float>(32, 1.0f));
  s = load(meta3);
  EXPECT_TRUE(s.Is(StatusCode::kInvalidArgument)) << s.ToString();
  EXPECT_NE(s.message().find("shape"), std::string::npos);

  GgufWriter q6;
  q6.AddString("general.architecture", "llama");
  q6.AddU32("llama.block_count", 1);
  q6.AddU32("llama.embedding_length", 256);
  q6.AddU32("llama.feed_forward_length", 256);
  q6.AddU32("llama.attention.head_count", 4);
  q6.AddF32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  q6.AddTensor("token_embd.weight", {256, 4}, 14, std::vector<uint8_t>(4 * 210));
  s = load(q6);
  EXPECT_TRUE(s.Is(StatusCode::kInvalidArgument)) << s.ToString();
  EXPECT_NE(s.message().find("Q6_K"), std::string::npos);
}

}  // namespace
}  // namespace kvtier::engine

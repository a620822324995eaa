#include "kvtier/layout.h"

#include <gtest/gtest.h>

namespace kvtier {
namespace {

TEST(LayoutTest, DefaultIsLlama3_8BWithTwoMiBBlocks) {
  KvLayout l;
  ASSERT_TRUE(l.Validate().ok());
  EXPECT_EQ(l.ChunkBytes(), 16u * 8 * 128 * 2);
  EXPECT_EQ(l.BlockBytes(), 2u << 20);
  EXPECT_EQ(l.ChunkOffset(1, 1), 3 * l.ChunkBytes());
}

// Computed independently (Python hashlib) from the documented canonical serialization.
TEST(LayoutTest, FingerprintKnownAnswers) {
  EXPECT_EQ(KvLayout{}.Fingerprint(), 0x1c62e317dbe2e2e2ull);
  const KvLayout mla{.num_layers = 61,
                     .num_planes = 1,
                     .num_kv_heads = 1,
                     .head_dim = 576,
                     .tokens_per_block = 64,
                     .dtype = DType::kBf16};
  EXPECT_EQ(mla.Fingerprint(), 0xe66cced9149d3719ull);
}

TEST(LayoutTest, FingerprintIgnoresG1ArrangementButNotShape) {
  KvLayout a, b;
  b.g1_arrangement = G1Arrangement::kBlockContiguous;
  EXPECT_EQ(a.Fingerprint(), b.Fingerprint());
  b.dtype = DType::kBf16;  // same size, different bytes
  EXPECT_NE(a.Fingerprint(), b.Fingerprint());
}

struct BadCase {
  const char* field;
  void (*mutate)(KvLayout&);
};

TEST(LayoutTest, InvalidValuesNameTheFieldAndRange) {
  const BadCase cases[] = {
      {"num_layers", [](KvLayout& l) { l.num_layers = 0; }},
      {"num_layers", [](KvLayout& l) { l.num_layers = 2000; }},
      {"num_planes", [](KvLayout& l) { l.num_planes = 3; }},
      {"num_kv_heads", [](KvLayout& l) { l.num_kv_heads = 0; }},
      {"head_dim", [](KvLayout& l) { l.head_dim = 0; }},
      {"tokens_per_block", [](KvLayout& l) { l.tokens_per_block = 0; }},
      {"tokens_per_block", [](KvLayout& l) { l.tokens_per_block = 4097; }},
      {"dtype", [](KvLayout& l) { l.dtype = static_cast<DType>(9); }},
      {"block bytes",
       [](KvLayout& l) {
         l.num_layers = 1024;
         l.num_kv_heads = 1024;
         l.head_dim = 1024;
       }},
  };
  for (const BadCase& c : cases) {
    KvLayout l;
    c.mutate(l);
    Status s = l.Validate();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(s.message().find(c.field), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("allowed"), std::string::npos) << s.message();
  }
}

// vLLM's block sizes are not all powers of two: 528 and 784 for hybrid models (attention pages
// padded to the state-space page), any multiple of 32 on the CPU backend (96), and small odd
// sizes in tests. Every size up to kMaxTokensPerBlock is a layout; past it, a clear refusal.
TEST(LayoutTest, AnyBlockSizeUpToTheMaximum) {
  for (uint32_t tpb : {1u, 3u, 48u, 96u, 528u, 784u, 1000u, 1320u, 1321u, 2048u, 4095u, 4096u}) {
    KvLayout l;
    l.num_layers = 2;
    l.tokens_per_block = tpb;
    ASSERT_TRUE(l.Validate().ok()) << tpb << ": " << l.Validate().ToString();
    EXPECT_EQ(l.ChunkBytes(), uint64_t{tpb} * 8 * 128 * 2) << tpb;
    EXPECT_EQ(l.ChunkOffset(1, 1), 3 * l.ChunkBytes()) << tpb;
  }
  KvLayout a, b;
  a.tokens_per_block = 96;
  b.tokens_per_block = 128;
  EXPECT_NE(a.Fingerprint(), b.Fingerprint()) << "the block size is part of the fingerprint";

  KvLayout big;
  big.tokens_per_block = KvLayout::kMaxTokensPerBlock + 1;
  const Status s = big.Validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tokens_per_block = 4097"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("1..4096"), std::string::npos) << s.message();
}

TEST(LayoutTest, ParsesNames) {
  EXPECT_EQ(*ParseDType("bf16"), DType::kBf16);
  EXPECT_EQ(ParseDType("int4").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*ParseG1Arrangement("block-contiguous"), G1Arrangement::kBlockContiguous);
  EXPECT_FALSE(ParseG1Arrangement("interleaved").ok());
}

}  // namespace
}  // namespace kvtier

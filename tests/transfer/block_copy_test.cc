#include "transfer/block_copy.h"

#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace kvtier {
namespace {

// A G1 of `blocks` blocks over `mem`, with a padded stride so a copy that ignores the stride
// (or runs past its chunk) lands in bytes the test checks.
G1Memory MakeG1(const KvLayout& l, uint32_t blocks, std::vector<uint8_t>& mem) {
  G1Memory g1{l, blocks, {}, false};
  if (l.g1_arrangement == G1Arrangement::kBlockContiguous) {
    const uint64_t stride = l.BlockBytes() + 64;
    mem.assign(stride * blocks, 0);
    g1.regions.push_back({mem.data(), stride});
  } else {
    const uint64_t stride = l.ChunkBytes() + 64;
    const uint32_t regions = l.num_layers * l.num_planes;
    mem.assign(stride * blocks * regions, 0);
    for (uint32_t r = 0; r < regions; ++r)
      g1.regions.push_back({mem.data() + r * stride * blocks, stride});
  }
  EXPECT_TRUE(g1.Validate().ok()) << g1.Validate().ToString();
  return g1;
}

// 3 layers x 2 planes x 2 heads of 64 bf16, G1 arranged as `arrangement`.
KvLayout CopyLayout(G1Arrangement arrangement) {
  return KvLayout{.num_layers = 3,
                  .num_kv_heads = 2,
                  .head_dim = 64,
                  .dtype = DType::kBf16,
                  .g1_arrangement = arrangement};
}

class BlockCopyTest : public ::testing::TestWithParam<G1Arrangement> {};

TEST_P(BlockCopyTest, GatherScatterRoundTripIsByteExact) {
  const KvLayout l = CopyLayout(GetParam());
  std::vector<uint8_t> src_mem, dst_mem;
  G1Memory src = MakeG1(l, 5, src_mem);
  G1Memory dst = MakeG1(l, 5, dst_mem);
  std::mt19937 rng(42);
  for (auto& b : src_mem) b = static_cast<uint8_t>(rng());

  std::vector<uint8_t> slot(l.BlockBytes());
  GatherBlock(src, 3, slot.data());
  // The canonical order: layer-major, then plane, each chunk exactly as G1 holds it.
  for (uint32_t layer = 0; layer < l.num_layers; ++layer) {
    for (uint32_t plane = 0; plane < l.num_planes; ++plane) {
      ASSERT_EQ(std::memcmp(slot.data() + l.ChunkOffset(layer, plane), src.Chunk(3, layer, plane),
                            l.ChunkBytes()),
                0)
          << "layer " << layer << " plane " << plane;
    }
  }
  const std::vector<uint8_t> before = dst_mem;
  ScatterBlock(dst, slot.data(), 1);
  size_t changed_outside = 0;
  for (uint32_t layer = 0; layer < l.num_layers; ++layer) {
    for (uint32_t plane = 0; plane < l.num_planes; ++plane) {
      ASSERT_EQ(std::memcmp(dst.Chunk(1, layer, plane), src.Chunk(3, layer, plane), l.ChunkBytes()),
                0);
    }
  }
  // Nothing but block 1's chunks changed.
  for (size_t i = 0; i < dst_mem.size(); ++i) {
    bool inside = false;
    for (uint32_t layer = 0; layer < l.num_layers && !inside; ++layer) {
      for (uint32_t plane = 0; plane < l.num_planes && !inside; ++plane) {
        const uint8_t* c = dst.Chunk(1, layer, plane);
        inside = dst_mem.data() + i >= c && dst_mem.data() + i < c + l.ChunkBytes();
      }
    }
    if (!inside && dst_mem[i] != before[i]) ++changed_outside;
  }
  EXPECT_EQ(changed_outside, 0u);
}

TEST_P(BlockCopyTest, ScatterLayerTouchesOnlyThatLayer) {
  KvLayout l;
  l.num_layers = 4;
  l.num_kv_heads = 1;
  l.head_dim = 32;
  l.g1_arrangement = GetParam();
  std::vector<uint8_t> mem;
  G1Memory g1 = MakeG1(l, 2, mem);
  std::vector<uint8_t> slot(l.BlockBytes());
  for (size_t i = 0; i < slot.size(); ++i) slot[i] = static_cast<uint8_t>(1 + i % 251);
  ScatterLayer(g1, slot.data(), 0, 2);
  for (uint32_t layer = 0; layer < l.num_layers; ++layer) {
    for (uint32_t plane = 0; plane < l.num_planes; ++plane) {
      const uint8_t* c = g1.Chunk(0, layer, plane);
      if (layer == 2) {
        EXPECT_EQ(std::memcmp(c, slot.data() + l.ChunkOffset(layer, plane), l.ChunkBytes()), 0);
      } else {
        EXPECT_EQ(c[0], 0) << "layer " << layer << " was written";
      }
    }
  }
}

TEST_P(BlockCopyTest, BlockPiecesAreTheCanonicalOrderInPlace) {
  const KvLayout l = CopyLayout(GetParam());
  std::vector<uint8_t> mem;
  G1Memory g1 = MakeG1(l, 5, mem);
  std::mt19937 rng(7);
  for (auto& b : mem) b = static_cast<uint8_t>(rng());
  std::vector<std::span<uint8_t>> pieces;
  AppendBlockPieces(g1, 2, &pieces);
  // The pieces, concatenated, are the gathered block; and they are G1's own memory.
  std::vector<uint8_t> joined;
  for (const auto& p : pieces) {
    EXPECT_GE(p.data(), mem.data());
    EXPECT_LE(p.data() + p.size(), mem.data() + mem.size());
    joined.insert(joined.end(), p.begin(), p.end());
  }
  std::vector<uint8_t> gathered(l.BlockBytes());
  GatherBlock(g1, 2, gathered.data());
  EXPECT_EQ(joined, gathered);
  EXPECT_EQ(pieces.size(), GetParam() == G1Arrangement::kBlockContiguous
                               ? 1u
                               : size_t{l.num_layers} * l.num_planes);
  // Appends: a second block's pieces follow the first's.
  AppendBlockPieces(g1, 4, &pieces);
  EXPECT_EQ(pieces.size(), GetParam() == G1Arrangement::kBlockContiguous
                               ? 2u
                               : 2 * size_t{l.num_layers} * l.num_planes);
}

INSTANTIATE_TEST_SUITE_P(Arrangements, BlockCopyTest,
                         ::testing::Values(G1Arrangement::kLayerSeparate,
                                           G1Arrangement::kBlockContiguous));

TEST(CopyLargeTest, CopiesUnalignedRangesExactly) {
  std::vector<uint8_t> src(1 << 20), dst((1 << 20) + 2);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 31 + 7);
  for (uint64_t len : {0ull, 1ull, 63ull, 4097ull, 200000ull, (1ull << 20) - 3}) {
    std::fill(dst.begin(), dst.end(), 0);
    CopyLarge(dst.data() + 1, src.data() + 2, len);
    EXPECT_EQ(std::memcmp(dst.data() + 1, src.data() + 2, len), 0) << len;
    EXPECT_EQ(dst[0], 0);
    if (len + 1 < dst.size()) {
      EXPECT_EQ(dst[len + 1], 0) << "wrote past the end for len " << len;
    }
  }
}

// Every skew of dst against src (the vector loop takes ranges whose skew is not 0 mod 64, memcpy
// the rest), every tail length past the last whole 64 bytes, and sizes on both sides of the
// loop's bounds (256 bytes, 1 MiB): byte-exact, and nothing written outside the range.
// Streaming (non-temporal) stores too: they start at dst's first 64-byte boundary and stop at
// the last whole step (128 bytes with AVX2, 64 without), the head and tail copied as cached.
class CopyLargeStoresTest : public ::testing::TestWithParam<Stores> {};

TEST_P(CopyLargeStoresTest, EverySkewAndTailIsByteExact) {
  const size_t cap = (size_t{1} << 20) + 256;
  std::vector<uint8_t> src(cap + 64), dst(cap + 128);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + (i >> 8));
  for (uint64_t len :
       {0ull, 1ull, 63ull, 64ull, 127ull, 128ull, 129ull, 191ull, 255ull, 256ull, 257ull,
        4096ull + 13, 32768ull, 32768ull + 63, (1ull << 20) - 1, 1ull << 20, (1ull << 20) + 255}) {
    for (size_t so : {0u, 1u, 16u, 63u}) {
      for (size_t dof : {0u, 1u, 16u, 48u, 63u}) {
        std::fill(dst.begin(), dst.end(), 0xEE);
        CopyLarge(dst.data() + 32 + dof, src.data() + so, len, GetParam());
        ASSERT_EQ(std::memcmp(dst.data() + 32 + dof, src.data() + so, len), 0)
            << "len " << len << " src+" << so << " dst+" << dof;
        for (size_t i = 0; i < 32 + dof; ++i) ASSERT_EQ(dst[i], 0xEE) << "wrote before dst";
        ASSERT_EQ(dst[32 + dof + len], 0xEE) << "wrote past the end, len " << len;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Stores, CopyLargeStoresTest,
                         ::testing::Values(Stores::kCached, Stores::kStreaming));

// A streamed scatter lands exactly what a cached one does.
TEST(StreamingScatterTest, MatchesCachedScatter) {
  KvLayout l;
  l.num_layers = 4;
  l.num_kv_heads = 2;
  l.head_dim = 72;  // 144-byte rows: chunks that end off a 64-byte boundary
  l.dtype = DType::kBf16;
  std::vector<uint8_t> a_mem, b_mem;
  G1Memory a = MakeG1(l, 3, a_mem);
  G1Memory b = MakeG1(l, 3, b_mem);
  std::vector<uint8_t> slot(l.BlockBytes() + 5);
  std::mt19937 rng(7);
  for (auto& x : slot) x = static_cast<uint8_t>(rng());
  for (uint32_t layer = 0; layer < l.num_layers; ++layer) {
    ScatterLayer(a, slot.data() + 5, 2, layer, Stores::kCached);
    ScatterLayer(b, slot.data() + 5, 2, layer, Stores::kStreaming);
  }
  ScatterBlock(a, slot.data() + 5, 0, Stores::kCached);
  ScatterBlock(b, slot.data() + 5, 0, Stores::kStreaming);
  EXPECT_EQ(a_mem, b_mem);
}

TEST(StreamLoadBytesTest, FollowsTheSetting) {
  EXPECT_EQ(StreamLoadBytes("cached"), UINT64_MAX);
  EXPECT_EQ(StreamLoadBytes("streaming"), 0u);
  const uint64_t llc = StreamLoadBytes("auto");
  EXPECT_GE(llc, uint64_t{1} << 20);
  EXPECT_LT(llc, UINT64_MAX);
}

}  // namespace
}  // namespace kvtier

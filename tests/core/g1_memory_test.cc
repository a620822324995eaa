#include "kvtier/g1_memory.h"

#include <vector>

#include <gtest/gtest.h>

namespace kvtier {
namespace {

TEST(G1MemoryTest, ValidatesRegionsAgainstArrangement) {
  KvLayout l;
  l.num_layers = 2;
  std::vector<uint8_t> mem(l.BlockBytes() * 4);
  G1Memory g1{l, 4, {}, false};
  EXPECT_NE(g1.Validate().message().find("needs 4"), std::string::npos) << g1.Validate().message();
  for (int r = 0; r < 4; ++r)
    g1.regions.push_back({mem.data() + r * 4 * l.ChunkBytes(), l.ChunkBytes()});
  EXPECT_TRUE(g1.Validate().ok()) << g1.Validate().ToString();
  g1.regions[2].block_stride = l.ChunkBytes() - 1;
  EXPECT_NE(g1.Validate().message().find("block_stride"), std::string::npos);
  g1.regions[2].block_stride = l.ChunkBytes();
  g1.regions[3].base = nullptr;
  EXPECT_NE(g1.Validate().message().find("null"), std::string::npos);
  g1.regions[3].base = mem.data();
  g1.num_blocks = 0;
  EXPECT_FALSE(g1.Validate().ok());
}

TEST(G1MemoryTest, ChunkAddressesFollowTheArrangement) {
  KvLayout l;
  l.num_layers = 2;
  std::vector<uint8_t> mem(l.BlockBytes() * 4);
  G1Memory sep{l, 4, {}, false};
  for (int r = 0; r < 4; ++r)
    sep.regions.push_back({mem.data() + r * 4 * l.ChunkBytes(), l.ChunkBytes()});
  EXPECT_EQ(sep.Chunk(3, 1, 0), mem.data() + (2 * 4 + 3) * l.ChunkBytes());
  l.g1_arrangement = G1Arrangement::kBlockContiguous;
  G1Memory contig{l, 4, {{mem.data(), l.BlockBytes()}}, false};
  ASSERT_TRUE(contig.Validate().ok());
  EXPECT_EQ(contig.Chunk(2, 1, 1), mem.data() + 2 * l.BlockBytes() + 3 * l.ChunkBytes());
}

}  // namespace
}  // namespace kvtier

// UseCountGhost (src/index/use_count_ghost.h): the use counts of the last N keys remembered,
// FIFO over remembering, Take forgets, remembering again renews, capacity 0 remembers nothing.
#include "index/use_count_ghost.h"

#include <gtest/gtest.h>

namespace kvtier {
namespace {

BlockKey K(uint64_t i) { return BlockKey{i * 0x9e3779b97f4a7c15ull + 1, i}; }

TEST(UseCountGhostTest, ForgetsTheOldestOnceFullAndTakeForgets) {
  UseCountGhost g(3);
  g.Remember(K(1), 1);
  g.Remember(K(2), 2);
  g.Remember(K(3), 3);
  EXPECT_EQ(g.size(), 3u);
  g.Remember(K(4), 4);  // K(1) is the oldest: forgotten
  EXPECT_FALSE(g.Contains(K(1)));
  EXPECT_EQ(g.Peek(K(2)), 2u);
  EXPECT_EQ(g.Take(K(2)), 2u);
  EXPECT_EQ(g.Take(K(2)), 0u) << "taken once";
  EXPECT_EQ(g.Peek(K(9)), 0u);
  // K(3) remembered again renews its place: of the next two, one reuses K(3)'s old (now stale)
  // slot without forgetting it, the other forgets K(4).
  g.Remember(K(3), 7);
  g.Remember(K(5), 5);
  g.Remember(K(6), 6);
  EXPECT_EQ(g.Peek(K(3)), 7u);
  EXPECT_FALSE(g.Contains(K(4)));
  EXPECT_EQ(g.Peek(K(5)), 5u);
  EXPECT_EQ(g.Peek(K(6)), 6u);
  EXPECT_LE(g.size(), g.capacity());
}

TEST(UseCountGhostTest, CapacityZeroRemembersNothing) {
  UseCountGhost g(0);
  g.Remember(K(1), 3);
  EXPECT_EQ(g.size(), 0u);
  EXPECT_EQ(g.Take(K(1)), 0u);
}

TEST(UseCountGhostTest, StaysBoundedUnderChurn) {
  UseCountGhost g(100);
  for (uint64_t i = 0; i < 10000; ++i) {
    g.Remember(K(i % 250), static_cast<uint32_t>(i));
    if (i % 7 == 0) g.Take(K((i * 13) % 250));
    ASSERT_LE(g.size(), 100u);
  }
  EXPECT_EQ(g.Peek(K(9999 % 250)), 9999u);
}

}  // namespace
}  // namespace kvtier

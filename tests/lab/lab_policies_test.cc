// The lab's eviction policies (lab/policies; docs/policies.md says why they are not the
// product's): lineage-aware LRU and its leaf-only variant, and S3-FIFO. The contract every
// policy keeps, and the differential test against a model, are in eviction_policy_test.cc.
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "index/lru_policy.h"
#include "policies/lineage_lru_policy.h"
#include "policies/s3fifo_policy.h"
#include "policy_test_util.h"

namespace kvtier {
namespace {

using namespace policy_test;

// ---------------------------------------------------------------------------------------------
// Lineage-aware LRU.

TEST(LineageLruPolicyTest, LeavesGoBeforeTheirParents) {
  LineageLruPolicy policy;
  // A -> B -> C, inserted (and so touched) parent first: plain LRU would take A first.
  policy.OnInsert(K(1), kRoot);
  policy.OnInsert(K(2), K(1));
  policy.OnInsert(K(3), K(2));
  EXPECT_EQ(policy.ChildCount(K(1)), 1u);
  EXPECT_EQ(policy.ChildCount(K(3)), 0u);
  EXPECT_EQ(policy.Victim(Any), K(3));
  policy.OnRemove(K(3));
  EXPECT_EQ(policy.Victim(Any), K(2));
  policy.OnRemove(K(2));
  EXPECT_EQ(policy.Victim(Any), K(1));
}

TEST(LineageLruPolicyTest, OldestLeafGoesFirst) {
  LineageLruPolicy policy;
  policy.OnInsert(K(1), kRoot);  // shared parent
  policy.OnInsert(K(2), K(1));   // leaf, tick 2
  policy.OnInsert(K(3), K(1));   // leaf, tick 3
  policy.OnInsert(K(4), kRoot);  // leaf, tick 4
  EXPECT_EQ(policy.Victim(Any), K(2));
  policy.OnAccess(K(2));
  EXPECT_EQ(policy.Victim(Any), K(3));
  policy.OnAccess(K(1));  // touching an inner block does not make it a candidate
  policy.OnAccess(K(3));
  EXPECT_EQ(policy.Victim(Any), K(4));
}

TEST(LineageLruPolicyTest, ParentBecomesLeafWithItsOwnTick) {
  {
    LineageLruPolicy policy;
    policy.OnInsert(K(1), kRoot);  // P, tick 1
    policy.OnInsert(K(2), K(1));   // Q child of P, tick 2
    policy.OnInsert(K(3), kRoot);  // R, tick 3
    policy.OnRemove(K(2));
    // P is a leaf again, and older than R.
    EXPECT_EQ(policy.Victim(Any), K(1));
  }
  {
    LineageLruPolicy policy;
    policy.OnInsert(K(1), kRoot);
    policy.OnInsert(K(2), K(1));
    policy.OnInsert(K(3), kRoot);
    policy.OnAccess(K(1));  // P touched after R
    policy.OnRemove(K(2));
    EXPECT_EQ(policy.Victim(Any), K(3));
  }
}

TEST(LineageLruPolicyTest, ChildArrivingBeforeItsParentKeepsTheParentInner) {
  // A lower tier receives G2's leaves first: the child is tracked before its parent.
  LineageLruPolicy policy;
  policy.OnInsert(K(2), K(1));
  EXPECT_EQ(policy.ChildCount(K(1)), 1u);
  policy.OnInsert(K(1), kRoot);
  EXPECT_EQ(policy.Victim(Any), K(2)) << "the child is the only leaf, though it is older";
  policy.OnRemove(K(2));
  EXPECT_EQ(policy.ChildCount(K(1)), 0u);
  EXPECT_EQ(policy.Victim(Any), K(1));
}

TEST(LineageLruPolicyTest, RemovingAnInnerBlockKeepsItsChildrenCounted) {
  LineageLruPolicy policy;
  policy.OnInsert(K(1), kRoot);
  policy.OnInsert(K(2), K(1));
  policy.OnRemove(K(1));  // invalidated, say
  EXPECT_TRUE(policy.Contains(K(2)));
  EXPECT_EQ(policy.ChildCount(K(1)), 1u);
  policy.OnInsert(K(3), kRoot);
  policy.OnInsert(K(1), kRoot);  // comes back: still the parent of a tracked block
  EXPECT_EQ(policy.Victim(AllBut({K(2)})), K(3));
  policy.OnRemove(K(2));
  EXPECT_EQ(policy.Victim(AllBut({K(3)})), K(1));
}

TEST(LineageLruPolicyTest, FallsBackToOldestInnerBlockWhenLeavesArePinned) {
  LineageLruPolicy policy;
  policy.OnInsert(K(1), kRoot);  // A, tick 1
  policy.OnInsert(K(2), K(1));   // B, tick 2
  policy.OnInsert(K(3), K(2));   // C, tick 3: the only leaf
  policy.OnAccess(K(1));         // A, tick 4
  EXPECT_EQ(policy.Victim(AllBut({K(3)})), K(2)) << "B is the least recent inner block";
  EXPECT_EQ(policy.Victim(AllBut({K(3), K(2)})), K(1));
  EXPECT_EQ(policy.Victim(AllBut({K(1), K(2), K(3)})), std::nullopt);
  // The fallback never hides an evictable leaf.
  EXPECT_EQ(policy.Victim(Any), K(3));
}

TEST(LineageLruPolicyTest, IgnoresASelfParent) {
  LineageLruPolicy policy;
  policy.OnInsert(K(1), K(1));
  EXPECT_EQ(policy.ChildCount(K(1)), 0u);
  EXPECT_EQ(policy.Victim(Any), K(1));
  policy.OnRemove(K(1));
  EXPECT_EQ(policy.size(), 0u);
}

// A shared system prompt A -> B, two conversations under it (C1 -> C2, D1 -> D2), each request
// touching its chain parent first, then unrelated prompts (X, Y, Z) that push blocks out of an
// 8-slot tier. Recency-only LRU evicts A, the oldest block of the latest conversation, while B,
// D1 and D2 below it are still held, so none of them can ever match again. Lineage-aware LRU
// gives up conversation leaves first and keeps the shared prefix.
TEST(LineageLruPolicyTest, KeepsASharedPrefixThatLruEvicts) {
  const BlockKey a = K(1), b = K(2), c1 = K(11), c2 = K(12), d1 = K(21), d2 = K(22);
  const BlockKey x1 = K(31), x2 = K(32), y1 = K(41), y2 = K(42), z1 = K(51), e1 = K(61);
  auto run = [&](EvictionPolicy* policy) {
    auto sim = std::make_unique<TierSim>(policy, 8);
    sim->Request({a, b, c1, c2});
    sim->Request({a, b, d1, d2});
    sim->Request({x1, x2});
    sim->Request({y1, y2});
    sim->Request({z1});
    return sim;
  };

  LruPolicy lru;
  auto lru_sim = run(&lru);
  // Oldest first after the two conversations: C1 C2 A B D1 D2; the three misses evict C1, C2, A.
  EXPECT_EQ(lru_sim->evicted(), (std::vector<BlockKey>{c1, c2, a}));
  EXPECT_FALSE(lru.Contains(a));
  EXPECT_TRUE(lru.Contains(b));
  EXPECT_TRUE(lru.Contains(d1));
  EXPECT_TRUE(lru.Contains(d2));
  EXPECT_EQ(lru_sim->Unreachable(), 3u);  // B, D1, D2: held, unreachable
  EXPECT_EQ(lru_sim->PrefixHit({a, b, e1}), 0u);
  EXPECT_EQ(lru_sim->PrefixHit({a, b, d1, d2}), 0u);

  LineageLruPolicy lineage;
  auto lineage_sim = run(&lineage);
  // Leaves by tick: C2(4) D2(8) X2(10); C2 goes, C1 becomes a leaf at its tick 3 and goes next,
  // then D2 (8).
  EXPECT_EQ(lineage_sim->evicted(), (std::vector<BlockKey>{c2, c1, d2}));
  EXPECT_TRUE(lineage.Contains(a));
  EXPECT_TRUE(lineage.Contains(b));
  EXPECT_EQ(lineage_sim->Unreachable(), 0u);
  EXPECT_EQ(lineage_sim->PrefixHit({a, b, e1}), 2u);
  EXPECT_EQ(lineage_sim->PrefixHit({a, b, d1, d2}), 3u);
}

// ---------------------------------------------------------------------------------------------
// S3-FIFO.

TEST(S3FifoPolicyTest, SizesItsQueuesFromCapacity) {
  EXPECT_EQ(S3FifoPolicy(100).small_target(), 10u);
  EXPECT_EQ(S3FifoPolicy(100).ghost_capacity(), 100u);
  EXPECT_EQ(S3FifoPolicy(5).small_target(), 1u);
  EXPECT_EQ(S3FifoPolicy(0).small_target(), 1u);
  EXPECT_EQ(S3FifoPolicy(0).ghost_capacity(), 1u);
}

TEST(S3FifoPolicyTest, NewBlocksLeaveSmallInFifoOrderUnlessUsed) {
  S3FifoPolicy policy(10);
  for (uint64_t i = 1; i <= 3; ++i) policy.OnInsert(K(i), kRoot);
  EXPECT_EQ(policy.QueueOf(K(1)), S3FifoPolicy::Queue::kSmall);
  EXPECT_EQ(policy.Victim(Any), K(1));
  policy.OnAccess(K(1));
  EXPECT_EQ(policy.Frequency(K(1)), 1);
  // K(1) was used: the search promotes it to main with a fresh counter and takes K(2).
  EXPECT_EQ(policy.Victim(Any), K(2));
  EXPECT_EQ(policy.QueueOf(K(1)), S3FifoPolicy::Queue::kMain);
  EXPECT_EQ(policy.Frequency(K(1)), 0);
  EXPECT_EQ(policy.small_size(), 2u);
  EXPECT_EQ(policy.main_size(), 1u);
}

TEST(S3FifoPolicyTest, FrequencySaturatesAtThree) {
  S3FifoPolicy policy(10);
  policy.OnInsert(K(1), kRoot);
  for (int i = 0; i < 10; ++i) policy.OnAccess(K(1));
  EXPECT_EQ(policy.Frequency(K(1)), S3FifoPolicy::kMaxFreq);
}

TEST(S3FifoPolicyTest, OneHitWondersGoBeforeABlockUsedTwice) {
  // H is referenced twice, then 30 blocks are referenced once each through a 10-slot tier.
  auto run = [](EvictionPolicy* policy) {
    TierSim sim(policy, 10);
    sim.Reference(K(1000));
    sim.Reference(K(1000));
    for (uint64_t i = 0; i < 30; ++i) sim.Reference(K(i));
    return sim.evicted();
  };
  S3FifoPolicy s3fifo(10);
  std::vector<BlockKey> evicted = run(&s3fifo);
  EXPECT_EQ(evicted.size(), 21u);
  EXPECT_TRUE(s3fifo.Contains(K(1000))) << "the reused block must survive the scan";
  EXPECT_EQ(std::count(evicted.begin(), evicted.end(), K(1000)), 0);

  LruPolicy lru;  // The contrast: recency alone lets the scan flush it.
  evicted = run(&lru);
  EXPECT_FALSE(lru.Contains(K(1000)));
}

TEST(S3FifoPolicyTest, GhostHitGoesStraightToMain) {
  S3FifoPolicy policy(10);
  policy.OnInsert(K(1), kRoot);
  policy.OnInsert(K(2), kRoot);
  ASSERT_EQ(policy.Victim(Any), K(1));
  policy.OnRemove(K(1));
  EXPECT_TRUE(policy.InGhost(K(1)));
  EXPECT_EQ(policy.ghost_size(), 1u);

  policy.OnInsert(K(1), kRoot);
  EXPECT_EQ(policy.QueueOf(K(1)), S3FifoPolicy::Queue::kMain);
  EXPECT_FALSE(policy.InGhost(K(1)));
  EXPECT_EQ(policy.ghost_size(), 0u);
  // Small (K(2)) is at its target, so the next victim comes from small, not main.
  EXPECT_EQ(policy.Victim(Any), K(2));
}

TEST(S3FifoPolicyTest, MainGivesWhileSmallIsUnderItsTarget) {
  S3FifoPolicy policy(100);  // small target 10
  policy.OnInsert(K(1), kRoot);
  policy.OnRemove(K(1));
  policy.OnInsert(K(1), kRoot);  // main
  policy.OnInsert(K(2), kRoot);  // small, 1 of 10
  EXPECT_EQ(policy.Victim(Any), K(1));
  for (uint64_t i = 3; i <= 11; ++i) policy.OnInsert(K(i), kRoot);  // small reaches 10
  EXPECT_EQ(policy.Victim(Any), K(2));
}

TEST(S3FifoPolicyTest, OnlyBlocksLeavingSmallAreRemembered) {
  S3FifoPolicy policy(10);
  policy.OnInsert(K(1), kRoot);
  policy.OnRemove(K(1));
  policy.OnInsert(K(1), kRoot);  // ghost hit: main
  ASSERT_EQ(policy.QueueOf(K(1)), S3FifoPolicy::Queue::kMain);
  policy.OnRemove(K(1));
  EXPECT_FALSE(policy.InGhost(K(1)));
}

TEST(S3FifoPolicyTest, GhostForgetsTheOldestBeyondCapacity) {
  S3FifoPolicy policy(4);
  for (uint64_t i = 0; i < 20; ++i) {
    policy.OnInsert(K(i), kRoot);
    policy.OnRemove(K(i));
  }
  EXPECT_EQ(policy.ghost_size(), 4u);
  EXPECT_FALSE(policy.InGhost(K(15)));
  for (uint64_t i = 16; i < 20; ++i) EXPECT_TRUE(policy.InGhost(K(i)));
}

TEST(S3FifoPolicyTest, MainReinsertsUsedBlocksWithOneUseLess) {
  S3FifoPolicy policy(10);
  // Put K(1) then K(2) in main through the ghost.
  for (uint64_t i : {1, 2}) {
    policy.OnInsert(K(i), kRoot);
    policy.OnRemove(K(i));
    policy.OnInsert(K(i), kRoot);
  }
  ASSERT_EQ(policy.main_size(), 2u);
  ASSERT_EQ(policy.small_size(), 0u);
  policy.OnAccess(K(1));
  policy.OnAccess(K(1));
  // Small is empty (under target): main's tail K(1) has two uses, goes around with one.
  EXPECT_EQ(policy.Victim(Any), K(2));
  EXPECT_EQ(policy.Frequency(K(1)), 1);
  policy.OnRemove(K(2));
  EXPECT_EQ(policy.Victim(Any), K(1)) << "alone in main, it runs out of uses";
  EXPECT_EQ(policy.Frequency(K(1)), 0);
}

TEST(S3FifoPolicyTest, VictimTerminatesWhenNothingIsEvictable) {
  S3FifoPolicy policy(10);
  // A mix: blocks in main with every counter value, used and unused blocks in small.
  for (uint64_t i = 0; i < 20; ++i) {
    policy.OnInsert(K(i), kRoot);
    policy.OnRemove(K(i));
    policy.OnInsert(K(i), kRoot);
    for (uint64_t j = 0; j < i % 5; ++j) policy.OnAccess(K(i));
  }
  for (uint64_t i = 100; i < 120; ++i) {
    policy.OnInsert(K(i), kRoot);
    if (i % 2) policy.OnAccess(K(i));
  }
  int calls = 0;
  auto refuse = [&](const BlockKey&) {
    ++calls;
    return false;
  };
  EXPECT_EQ(policy.Victim(refuse), std::nullopt);
  EXPECT_LE(calls, 40);
  EXPECT_EQ(policy.size(), 40u);
  // And the same blocks, all evictable, do yield one.
  EXPECT_TRUE(policy.Victim(Any).has_value());
}

TEST(S3FifoPolicyTest, FindsTheOnlyEvictableBlockWhereverItIs) {
  // Small under target, main full of pinned blocks with counters: the only evictable block is in
  // small and has been used. The search must still return it rather than jam the tier.
  S3FifoPolicy policy(100);  // small target 10
  std::set<BlockKey> pinned;
  for (uint64_t i = 0; i < 20; ++i) {
    policy.OnInsert(K(i), kRoot);
    policy.OnRemove(K(i));
    policy.OnInsert(K(i), kRoot);
    policy.OnAccess(K(i));
    pinned.insert(K(i));
  }
  policy.OnInsert(K(500), kRoot);
  policy.OnAccess(K(500));
  ASSERT_LT(policy.small_size(), policy.small_target());
  EXPECT_EQ(policy.Victim(AllBut(pinned)), K(500));
}

}  // namespace
}  // namespace kvtier

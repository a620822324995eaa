#include "index/eviction_policy.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "index/lineage_lru_policy.h"
#include "index/lru_policy.h"
#include "index/s3fifo_policy.h"
#include "sim/belady_policy.h"

namespace kvtier {

// Readable parameter names in GoogleTest's failure messages (found by argument-dependent lookup).
void PrintTo(PolicyKind kind, std::ostream* os) { *os << PolicyKindName(kind); }

namespace {

using Predicate = EvictionPolicy::EvictablePredicate;

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Block `i`: a uniformly spread key, like the hasher's, named by a small number for the reader.
BlockKey K(uint64_t i) { return BlockKey{SplitMix64(2 * i), SplitMix64(2 * i + 1)}; }

// The hasher's root stand-in: the parent of every prompt's first block.
const BlockKey kRoot = K(999'999);

bool Any(const BlockKey&) { return true; }
bool None(const BlockKey&) { return false; }

Predicate AllBut(std::set<BlockKey> pinned) {
  return [pinned = std::move(pinned)](const BlockKey& k) { return !pinned.contains(k); };
}

std::unique_ptr<EvictionPolicy> Make(PolicyKind kind, size_t capacity_blocks = 16) {
  if (kind == PolicyKind::kBelady) return MakeBeladyPolicy({});
  auto policy = MakeEvictionPolicy(kind, capacity_blocks);
  EXPECT_TRUE(policy.ok()) << policy.status().ToString();
  return std::move(policy).value();
}

// A tier of `capacity` slots in front of `policy`: a reference to a held block is a hit (an
// access); a miss evicts victims until there is room, then inserts. Nothing is pinned.
class TierSim {
 public:
  TierSim(EvictionPolicy* policy, size_t capacity) : policy_(policy), capacity_(capacity) {}

  // Returns whether the reference hit.
  bool Reference(const BlockKey& key, const BlockKey& parent = kRoot) {
    if (policy_->Contains(key)) {
      policy_->OnAccess(key);
      ++hits_;
      return true;
    }
    while (policy_->size() >= capacity_) {
      std::optional<BlockKey> victim = policy_->Victim(Any);
      EXPECT_TRUE(victim.has_value()) << "a full tier with nothing pinned must yield a victim";
      if (!victim) return false;
      EXPECT_TRUE(policy_->Contains(*victim));
      policy_->OnRemove(*victim);
      parents_.erase(*victim);
      evicted_.push_back(*victim);
    }
    policy_->OnInsert(key, parent);
    parents_[key] = parent;
    return false;
  }

  // References every block of a chain, parent first, as an engine touches a prompt's prefix.
  void Request(const std::vector<BlockKey>& chain, const BlockKey& parent = kRoot) {
    BlockKey prev = parent;
    for (const BlockKey& key : chain) {
      Reference(key, prev);
      prev = key;
    }
  }

  // How many leading blocks of `chain` a prefix match would find in the tier.
  size_t PrefixHit(const std::vector<BlockKey>& chain) const {
    size_t n = 0;
    while (n < chain.size() && policy_->Contains(chain[n])) ++n;
    return n;
  }

  // Held blocks that no prefix match can reach: some block between them and the root is gone.
  size_t Unreachable() const {
    size_t n = 0;
    for (const auto& [key, parent] : parents_) {
      BlockKey up = parent;
      while (up != kRoot && parents_.contains(up)) up = parents_.at(up);
      if (up != kRoot) ++n;
    }
    return n;
  }

  size_t hits() const { return hits_; }
  const std::vector<BlockKey>& evicted() const { return evicted_; }

 private:
  EvictionPolicy* policy_;
  size_t capacity_;
  size_t hits_ = 0;
  std::vector<BlockKey> evicted_;
  std::map<BlockKey, BlockKey> parents_;
};

// ---------------------------------------------------------------------------------------------
// Names and factories.

TEST(PolicyKindTest, NamesRoundTrip) {
  for (PolicyKind kind :
       {PolicyKind::kLru, PolicyKind::kLineageLru, PolicyKind::kS3Fifo, PolicyKind::kBelady,
        PolicyKind::kCreditLru, PolicyKind::kArc, PolicyKind::kWTinyLfu, PolicyKind::kLeafFirstLru,
        PolicyKind::kAdaptive, PolicyKind::kHitDensity}) {
    auto parsed = ParsePolicyKind(PolicyKindName(kind));
    ASSERT_TRUE(parsed.ok()) << PolicyKindName(kind);
    EXPECT_EQ(*parsed, kind);
  }
  EXPECT_STREQ(PolicyKindName(PolicyKind::kLineageLru), "lineage-lru");
  EXPECT_STREQ(PolicyKindName(PolicyKind::kS3Fifo), "s3fifo");
}

TEST(PolicyKindTest, ParseRejectsUnknownNameListingTheAcceptedOnes) {
  auto parsed = ParsePolicyKind("LRU");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
  const std::string& msg = parsed.status().message();
  EXPECT_NE(msg.find("'LRU'"), std::string::npos) << msg;
  for (const char* name : {"lru", "lineage-lru", "s3fifo", "belady"}) {
    EXPECT_NE(msg.find(name), std::string::npos) << msg;
  }
}

TEST(MakeEvictionPolicyTest, BuildsTheAskedKind) {
  for (PolicyKind kind : {PolicyKind::kLru, PolicyKind::kLineageLru, PolicyKind::kS3Fifo}) {
    auto policy = MakeEvictionPolicy(kind, 100);
    ASSERT_TRUE(policy.ok()) << policy.status().ToString();
    EXPECT_EQ((*policy)->kind(), kind);
    EXPECT_EQ((*policy)->size(), 0u);
  }
  EXPECT_EQ(MakeBeladyPolicy({})->kind(), PolicyKind::kBelady);
}

TEST(MakeEvictionPolicyTest, BeladyNeedsTheFuture) {
  auto policy = MakeEvictionPolicy(PolicyKind::kBelady, 100);
  ASSERT_FALSE(policy.ok());
  EXPECT_EQ(policy.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(policy.status().message().find("MakeBeladyPolicy"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// The contract every policy keeps.

class EveryPolicyTest : public testing::TestWithParam<PolicyKind> {};

TEST_P(EveryPolicyTest, TracksInsertsAndRemoves) {
  auto policy = Make(GetParam());
  EXPECT_FALSE(policy->Contains(K(1)));
  policy->OnInsert(K(1), kRoot);
  policy->OnInsert(K(2), K(1));
  policy->OnInsert(K(3), kRoot);
  EXPECT_EQ(policy->size(), 3u);
  EXPECT_TRUE(policy->Contains(K(2)));

  policy->OnRemove(K(2));
  EXPECT_EQ(policy->size(), 2u);
  EXPECT_FALSE(policy->Contains(K(2)));

  // Untracked keys are no-ops.
  policy->OnRemove(K(2));
  policy->OnRemove(K(42));
  policy->OnAccess(K(42));
  EXPECT_EQ(policy->size(), 2u);
  EXPECT_FALSE(policy->Contains(K(42)));

  // A removed key can come back.
  policy->OnInsert(K(2), K(1));
  EXPECT_TRUE(policy->Contains(K(2)));
  EXPECT_EQ(policy->size(), 3u);
}

TEST_P(EveryPolicyTest, VictimIsNulloptWhenEmptyOrAllPinned) {
  auto policy = Make(GetParam());
  EXPECT_EQ(policy->Victim(Any), std::nullopt);
  for (uint64_t i = 0; i < 8; ++i) policy->OnInsert(K(i), kRoot);
  EXPECT_EQ(policy->Victim(None), std::nullopt);
  EXPECT_EQ(policy->size(), 8u) << "Victim must not stop tracking anything";
}

TEST_P(EveryPolicyTest, VictimSkipsPinnedBlocks) {
  auto policy = Make(GetParam());
  std::set<BlockKey> all;
  for (uint64_t i = 0; i < 8; ++i) {
    policy->OnInsert(K(i), i == 0 ? kRoot : K(i - 1));
    all.insert(K(i));
  }
  // Whichever block is left unpinned is the one that goes, leaf or not.
  for (uint64_t i = 0; i < 8; ++i) {
    std::set<BlockKey> pinned = all;
    pinned.erase(K(i));
    EXPECT_EQ(policy->Victim(AllBut(pinned)), K(i)) << "only block " << i << " is evictable";
  }
  auto victim = policy->Victim(Any);
  ASSERT_TRUE(victim.has_value());
  EXPECT_TRUE(policy->Contains(*victim));
}

TEST_P(EveryPolicyTest, VictimAsksAtMostOncePerBlock) {
  auto policy = Make(GetParam(), 10);
  for (uint64_t i = 0; i < 40; ++i) {
    policy->OnInsert(K(i), kRoot);
    for (uint64_t j = 0; j < i % 4; ++j) policy->OnAccess(K(i));
  }
  std::map<BlockKey, int> asked;
  auto refuse_all = [&](const BlockKey& k) {
    ++asked[k];
    return false;
  };
  EXPECT_EQ(policy->Victim(refuse_all), std::nullopt);
  EXPECT_EQ(asked.size(), 40u) << "every block must be considered before giving up";
  for (const auto& [key, n] : asked) EXPECT_EQ(n, 1) << key.ToHex();
}

INSTANTIATE_TEST_SUITE_P(Policies, EveryPolicyTest,
                         testing::Values(PolicyKind::kLru, PolicyKind::kLineageLru,
                                         PolicyKind::kS3Fifo, PolicyKind::kBelady, PolicyKind::kArc,
                                         PolicyKind::kWTinyLfu, PolicyKind::kAdaptive,
                                         PolicyKind::kHitDensity),
                         [](const testing::TestParamInfo<PolicyKind>& info) {
                           std::string name = PolicyKindName(info.param);
                           name.erase(std::remove(name.begin(), name.end(), '-'), name.end());
                           return name;
                         });

// ---------------------------------------------------------------------------------------------
// LRU.

TEST(LruPolicyTest, EvictsLeastRecentlyInserted) {
  LruPolicy lru;
  for (uint64_t i = 1; i <= 3; ++i) lru.OnInsert(K(i), kRoot);
  EXPECT_EQ(lru.Victim(Any), K(1));
  lru.OnRemove(K(1));
  EXPECT_EQ(lru.Victim(Any), K(2));
  lru.OnRemove(K(2));
  EXPECT_EQ(lru.Victim(Any), K(3));
}

TEST(LruPolicyTest, AccessRefreshes) {
  LruPolicy lru;
  for (uint64_t i = 1; i <= 3; ++i) lru.OnInsert(K(i), kRoot);
  lru.OnAccess(K(1));
  EXPECT_EQ(lru.Victim(Any), K(2));
  lru.OnAccess(K(2));
  EXPECT_EQ(lru.Victim(Any), K(3));
  lru.OnAccess(K(3));
  EXPECT_EQ(lru.Victim(Any), K(1));
}

TEST(LruPolicyTest, SkipsPinnedInRecencyOrder) {
  LruPolicy lru;
  for (uint64_t i = 1; i <= 4; ++i) lru.OnInsert(K(i), kRoot);
  EXPECT_EQ(lru.Victim(AllBut({K(1)})), K(2));
  EXPECT_EQ(lru.Victim(AllBut({K(1), K(2)})), K(3));
}

TEST(LruPolicyTest, RemoveInTheMiddleKeepsTheOrder) {
  LruPolicy lru;
  for (uint64_t i = 1; i <= 4; ++i) lru.OnInsert(K(i), kRoot);
  lru.OnRemove(K(2));
  lru.OnRemove(K(1));
  EXPECT_EQ(lru.Victim(Any), K(3));
}

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

// ---------------------------------------------------------------------------------------------
// Belady.

std::vector<BlockKey> Trace(const std::vector<int>& ids) {
  std::vector<BlockKey> trace;
  for (int id : ids) trace.push_back(K(id));
  return trace;
}

size_t Replay(EvictionPolicy* policy, const std::vector<BlockKey>& trace, size_t capacity) {
  TierSim sim(policy, capacity);
  for (const BlockKey& key : trace) sim.Reference(key);
  return sim.hits();
}

TEST(BeladyPolicyTest, HitsTheHandComputedOptimum) {
  const std::vector<BlockKey> trace = Trace({1, 2, 3, 4, 1, 2, 5, 1, 2, 3, 4, 5});
  // OPT with 3 slots, by hand (next use in parentheses, "-" = never):
  //   1 2 3    miss x3                      {1 2 3}
  //   4        miss, evict 3 (1@4 2@5 3@9)  {1 2 4}
  //   1 2      hit, hit                     (2 hits)
  //   5        miss, evict 4 (1@7 2@8 4@10) {1 2 5}
  //   1 2      hit, hit                     (4 hits)
  //   3        miss, evict 1 or 2 (both -)  {2 5 3} or {1 5 3}
  //   4        miss, evict a "-" block      {5 4 .}
  //   5        hit                          (5 hits)
  // 12 references, 7 misses, 5 hits.
  constexpr size_t kOptHits = 5;
  // LRU, by hand: misses until the second "1 2" after 5 (2 hits), then 3 4 5 all miss.
  constexpr size_t kLruHits = 2;

  auto belady = MakeBeladyPolicy(trace);
  const size_t opt = Replay(belady.get(), trace, 3);
  EXPECT_EQ(opt, kOptHits);
  LruPolicy lru;
  const size_t lru_hits = Replay(&lru, trace, 3);
  EXPECT_EQ(lru_hits, kLruHits);
  EXPECT_GE(opt, lru_hits);
}

TEST(BeladyPolicyTest, EvictsTheBlockUsedFurthestAway) {
  const std::vector<BlockKey> trace = Trace({1, 2, 3, 2, 1, 3, 3});
  BeladyPolicy policy(trace);
  policy.OnInsert(K(1), kRoot);  // position 0, next use 4
  policy.OnInsert(K(2), kRoot);  // position 1, next use 3
  EXPECT_EQ(policy.NextUse(K(1)), 4u);
  EXPECT_EQ(policy.NextUse(K(2)), 3u);
  EXPECT_EQ(policy.Victim(Any), K(1));
  policy.OnInsert(K(3), kRoot);  // position 2, next use 5
  EXPECT_EQ(policy.Victim(Any), K(3));
  EXPECT_EQ(policy.Victim(AllBut({K(3)})), K(1));
  policy.OnAccess(K(2));  // position 3, never again
  EXPECT_EQ(policy.NextUse(K(2)), BeladyPolicy::kNever);
  EXPECT_EQ(policy.Victim(Any), K(2));
  EXPECT_EQ(policy.cursor(), 4u);
}

TEST(BeladyPolicyTest, RepeatedReferencesAdvanceOneAtATime) {
  const std::vector<BlockKey> trace = Trace({1, 1, 1});
  BeladyPolicy policy(trace);
  policy.OnInsert(K(1), kRoot);
  EXPECT_EQ(policy.NextUse(K(1)), 1u);
  policy.OnAccess(K(1));
  EXPECT_EQ(policy.NextUse(K(1)), 2u);
  policy.OnAccess(K(1));
  EXPECT_EQ(policy.NextUse(K(1)), BeladyPolicy::kNever);
}

TEST(BeladyPolicyTest, KeyOffTheTraceIsNeverUsedAgainAndLeavesTheCursor) {
  const std::vector<BlockKey> trace = Trace({1, 2, 1});
  BeladyPolicy policy(trace);
  policy.OnInsert(K(1), kRoot);
  EXPECT_EQ(policy.cursor(), 1u);
  policy.OnInsert(K(7), kRoot);  // not in the trace
  EXPECT_EQ(policy.cursor(), 1u);
  EXPECT_EQ(policy.NextUse(K(7)), BeladyPolicy::kNever);
  EXPECT_EQ(policy.Victim(Any), K(7));
  policy.OnInsert(K(2), kRoot);  // still matches position 1
  EXPECT_EQ(policy.cursor(), 2u);
}

TEST(BeladyPolicyTest, KeyReferencedOnlyBehindTheCursorIsNeverUsedAgain) {
  const std::vector<BlockKey> trace = Trace({1, 2, 1, 3});
  BeladyPolicy policy(trace);
  policy.OnInsert(K(1), kRoot);  // position 0
  policy.OnInsert(K(2), kRoot);  // position 1
  policy.OnAccess(K(1));         // position 2
  policy.OnRemove(K(2));
  policy.OnInsert(K(2), kRoot);  // out of order: its only reference is behind the cursor
  EXPECT_EQ(policy.NextUse(K(2)), BeladyPolicy::kNever);
  EXPECT_EQ(policy.cursor(), 3u);
  policy.OnInsert(K(3), kRoot);  // position 3
  EXPECT_EQ(policy.cursor(), 4u);
}

TEST(BeladyPolicyTest, NoOnlinePolicyBeatsItOnRandomTraces) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 30; ++round) {
    std::uniform_int_distribution<int> id(0, 4 + round % 12);
    std::vector<int> ids(300);
    for (int& i : ids) i = id(rng);
    const std::vector<BlockKey> trace = Trace(ids);
    const size_t capacity = 2 + round % 6;

    auto belady = MakeBeladyPolicy(trace);
    const size_t opt = Replay(belady.get(), trace, capacity);
    for (PolicyKind kind : {PolicyKind::kLru, PolicyKind::kLineageLru, PolicyKind::kS3Fifo}) {
      auto policy = Make(kind, capacity);
      EXPECT_GE(opt, Replay(policy.get(), trace, capacity))
          << PolicyKindName(kind) << " round " << round;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Randomized differential test: every policy against a reference model of the tier.

// What the model knows of each tracked block.
struct ModelBlock {
  BlockKey parent;
  uint64_t tick;
};

// The victim LRU must pick: the evictable block with the oldest tick.
std::optional<BlockKey> ModelLru(const std::map<BlockKey, ModelBlock>& blocks,
                                 const Predicate& evictable) {
  std::optional<BlockKey> best;
  uint64_t best_tick = UINT64_MAX;
  for (const auto& [key, b] : blocks) {
    if (evictable(key) && b.tick < best_tick) {
      best = key;
      best_tick = b.tick;
    }
  }
  return best;
}

// The victim lineage-LRU must pick: the oldest evictable leaf, else the oldest evictable block.
std::optional<BlockKey> ModelLineage(const std::map<BlockKey, ModelBlock>& blocks,
                                     const Predicate& evictable) {
  std::set<BlockKey> parents;
  for (const auto& [key, b] : blocks) {
    if (b.parent != key) parents.insert(b.parent);
  }
  std::map<BlockKey, ModelBlock> leaves;
  for (const auto& [key, b] : blocks) {
    if (!parents.contains(key)) leaves.emplace(key, b);
  }
  if (auto leaf = ModelLru(leaves, evictable)) return leaf;
  return ModelLru(blocks, evictable);
}

class DifferentialTest : public testing::TestWithParam<PolicyKind> {};

TEST_P(DifferentialTest, RandomOperationsKeepTheInvariants) {
  const PolicyKind kind = GetParam();
  constexpr size_t kCapacity = 24;
  auto policy = Make(kind, kCapacity);
  std::mt19937_64 rng(1234 + static_cast<int>(kind));
  std::uniform_int_distribution<uint64_t> key_id(0, 63);
  std::uniform_int_distribution<int> op(0, 99);

  std::map<BlockKey, ModelBlock> blocks;
  uint64_t tick = 0;
  std::set<BlockKey> pinned;
  size_t victims = 0;

  for (int step = 0; step < 20000; ++step) {
    const BlockKey key = K(key_id(rng));
    const int o = op(rng);
    if (o < 35) {  // insert, with a parent among the tracked blocks or the root
      if (blocks.contains(key)) continue;
      BlockKey parent = kRoot;
      if (!blocks.empty() && rng() % 4 != 0) {
        auto it = blocks.begin();
        std::advance(it, rng() % blocks.size());
        if (it->first != key) parent = it->first;
      }
      policy->OnInsert(key, parent);
      blocks[key] = {parent, ++tick};
    } else if (o < 60) {  // access
      policy->OnAccess(key);
      if (auto it = blocks.find(key); it != blocks.end()) it->second.tick = ++tick;
    } else if (o < 70) {  // remove (an invalidation)
      policy->OnRemove(key);
      blocks.erase(key);
    } else if (o < 80) {  // pin or unpin
      if (!pinned.erase(key)) pinned.insert(key);
    } else {  // evict, as the owner would when the tier needs room
      const Predicate evictable = AllBut(pinned);
      size_t asked = 0;
      const Predicate counting = [&](const BlockKey& k) {
        ++asked;
        EXPECT_TRUE(blocks.contains(k)) << "asked about an untracked key";
        return evictable(k);
      };
      const std::optional<BlockKey> victim = policy->Victim(counting);
      EXPECT_LE(asked, blocks.size());
      const std::optional<BlockKey> any = ModelLru(blocks, evictable);
      ASSERT_EQ(victim.has_value(), any.has_value()) << "step " << step;
      if (kind == PolicyKind::kLru) {
        EXPECT_EQ(victim, any) << "step " << step;
      }
      if (kind == PolicyKind::kLineageLru) {
        EXPECT_EQ(victim, ModelLineage(blocks, evictable)) << "step " << step;
      }
      if (victim) {
        ASSERT_TRUE(blocks.contains(*victim));
        ASSERT_TRUE(evictable(*victim));
        if (rng() % 8 != 0) {  // usually evicted; sometimes the owner changes its mind
          policy->OnRemove(*victim);
          blocks.erase(*victim);
          ++victims;
        }
      }
    }
    ASSERT_EQ(policy->size(), blocks.size()) << "step " << step;
    ASSERT_EQ(policy->Contains(key), blocks.contains(key)) << "step " << step;
    if (kind == PolicyKind::kS3Fifo) {
      auto* s3 = static_cast<S3FifoPolicy*>(policy.get());
      ASSERT_EQ(s3->small_size() + s3->main_size(), blocks.size());
      ASSERT_LE(s3->ghost_size(), kCapacity);
      ASSERT_FALSE(s3->InGhost(key) && blocks.contains(key));
    }
  }
  EXPECT_GT(victims, 1000u);  // the run did exercise eviction
}

INSTANTIATE_TEST_SUITE_P(Policies, DifferentialTest,
                         testing::Values(PolicyKind::kLru, PolicyKind::kLineageLru,
                                         PolicyKind::kS3Fifo),
                         [](const testing::TestParamInfo<PolicyKind>& info) {
                           std::string name = PolicyKindName(info.param);
                           name.erase(std::remove(name.begin(), name.end(), '-'), name.end());
                           return name;
                         });

}  // namespace
}  // namespace kvtier

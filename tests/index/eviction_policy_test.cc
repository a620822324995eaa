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

#include "index/lru_policy.h"
#include "index/policy_names.h"
#include "policies/lab_policies.h"
#include "policies/s3fifo_policy.h"
#include "policy_test_util.h"
#include "sim/belady_policy.h"

namespace kvtier {

// Readable parameter names in GoogleTest's failure messages (found by argument-dependent lookup).
void PrintTo(PolicyKind kind, std::ostream* os) { *os << PolicyKindName(kind); }

namespace {

using namespace policy_test;

// Any policy, the lab's included (these tests hold the product's and the lab's to one contract).
std::unique_ptr<EvictionPolicy> Make(PolicyKind kind, size_t capacity_blocks = 16) {
  if (kind == PolicyKind::kBelady) return MakeBeladyPolicy({});
  auto policy = MakeLabEvictionPolicy(kind, capacity_blocks);
  EXPECT_TRUE(policy.ok()) << policy.status().ToString();
  return std::move(policy).value();
}

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

constexpr PolicyKind kProductKinds[] = {PolicyKind::kAdaptive, PolicyKind::kCreditLru,
                                        PolicyKind::kLru,      PolicyKind::kArc,
                                        PolicyKind::kWTinyLfu, PolicyKind::kHitDensity};
constexpr PolicyKind kLabOnlineKinds[] = {PolicyKind::kLineageLru, PolicyKind::kLeafFirstLru,
                                          PolicyKind::kS3Fifo};

TEST(MakeEvictionPolicyTest, BuildsTheAskedKind) {
  for (PolicyKind kind : kProductKinds) {
    auto policy = MakeEvictionPolicy(kind, 100);
    ASSERT_TRUE(policy.ok()) << policy.status().ToString();
    EXPECT_EQ((*policy)->kind(), kind);
    EXPECT_EQ((*policy)->size(), 0u);
  }
  // The lab's, through the lab's factory (lab/policies/lab_policies.h).
  for (PolicyKind kind : kLabOnlineKinds) {
    auto policy = MakeLabEvictionPolicy(kind, 100);
    ASSERT_TRUE(policy.ok()) << policy.status().ToString();
    EXPECT_EQ((*policy)->kind(), kind);
    EXPECT_EQ((*policy)->size(), 0u);
  }
  EXPECT_EQ(MakeBeladyPolicy({})->kind(), PolicyKind::kBelady);
  EXPECT_EQ(MakeLabEvictionPolicy(PolicyKind::kBelady, 100).status().code(),
            StatusCode::kInvalidArgument)
      << "the oracle needs the future: MakeBeladyPolicy";
}

// Which policies are the product's is decided in docs/policies.md; the others are the lab's.
// index/policy_names.h keeps the two lists by name (the config schema's); every kind is in exactly
// one, and every name there is a kind.
TEST(MakeEvictionPolicyTest, EveryKindIsTheProductsOrTheLabs) {
  for (PolicyKind kind : kProductKinds) EXPECT_FALSE(IsLabPolicy(kind)) << PolicyKindName(kind);
  for (PolicyKind kind : kLabOnlineKinds) EXPECT_TRUE(IsLabPolicy(kind)) << PolicyKindName(kind);
  EXPECT_TRUE(IsLabPolicy(PolicyKind::kBelady));
  const std::vector<std::string>& product = ProductPolicyNames();
  size_t kinds = 0;
  for (int i = 0; i < 256; ++i) {
    const std::string name = PolicyKindName(static_cast<PolicyKind>(i));
    if (name == "unknown") continue;
    ++kinds;
    const bool in_product = std::find(product.begin(), product.end(), name) != product.end();
    EXPECT_NE(in_product, IsLabPolicyName(name)) << name << ": in exactly one list";
  }
  EXPECT_EQ(kinds, product.size() + LabPolicyNames().size());
  for (const std::vector<std::string>* list : {&product, &LabPolicyNames()}) {
    for (const std::string& name : *list) EXPECT_TRUE(ParsePolicyKind(name).ok()) << name;
  }
  EXPECT_EQ(product.front(), "adaptive") << "the default first";
}

// This binary never enables the lab's policies (EnableLabPolicies), so the product's factory
// refuses them, saying where they run.
TEST(MakeEvictionPolicyTest, RefusesTheLabsPoliciesNamingWhereToRunThem) {
  for (PolicyKind kind : kLabOnlineKinds) {
    auto policy = MakeEvictionPolicy(kind, 100);
    ASSERT_FALSE(policy.ok()) << PolicyKindName(kind);
    EXPECT_EQ(policy.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(policy.status().message(),
              std::string(PolicyKindName(kind)) +
                  " is a lab policy (docs/policy-study.md): use it with kvtier sim / replay; the "
                  "product offers: adaptive, credit-lru, lru, arc, w-tinylfu, hit-density");
  }
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

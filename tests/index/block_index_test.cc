#include "index/block_index.h"

#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "policies/lab_policies.h"
#include "sim/belady_policy.h"

namespace kvtier {
namespace {

BlockKey K(uint64_t i) { return BlockKey{i * 0x9e3779b97f4a7c15ull + 1, i}; }

// An index whose tiers run `policy`. A lab policy (lineage-lru, the default here) is installed
// with ReplacePolicy, as a replay installs Belady's oracle: BlockIndex::Create refuses it.
std::unique_ptr<BlockIndex> MakeIndex(PolicyKind policy = PolicyKind::kLineageLru) {
  BlockIndex::Config cfg;
  cfg.num_shards = 8;
  for (auto& t : cfg.tiers) {
    t.policy = IsLabPolicy(policy) ? PolicyKind::kLru : policy;
    t.capacity_blocks = 64;
  }
  auto index = BlockIndex::Create(cfg);
  EXPECT_TRUE(index.ok()) << index.status().ToString();
  if (IsLabPolicy(policy)) {
    for (TierId t = 0; t < kNumTiers; ++t) {
      auto lab = MakeLabEvictionPolicy(policy, 64);
      EXPECT_TRUE(lab.ok()) << lab.status().ToString();
      EXPECT_TRUE((*index)->ReplacePolicy(t, std::move(lab).value()).ok());
    }
  }
  return std::move(index).value();
}

// Inserts the chain K(first)..K(first+n-1) into `tier`, slots starting at `slot0`.
std::vector<BlockKey> InsertChain(BlockIndex& index, uint64_t first, uint64_t n, TierId tier,
                                  uint32_t slot0, BlockKey parent = BlockKey{}) {
  std::vector<BlockKey> keys;
  for (uint64_t i = 0; i < n; ++i) {
    keys.push_back(K(first + i));
    EXPECT_TRUE(index.Insert(keys.back(), parent, tier, slot0 + static_cast<uint32_t>(i)).ok());
    parent = keys.back();
  }
  return keys;
}

TEST(BlockIndexTest, InsertGetRemove) {
  auto index = MakeIndex();
  EXPECT_TRUE(index->Insert(K(1), BlockKey{}, kTierG2, 7).ok());
  EXPECT_EQ(index->Insert(K(1), BlockKey{}, kTierG2, 8).code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(index->Insert(K(1), BlockKey{}, kTierG3, 9).ok());
  auto info = index->Get(K(1));
  ASSERT_TRUE(info.has_value());
  EXPECT_TRUE(info->InTier(kTierG2));
  EXPECT_TRUE(info->InTier(kTierG3));
  EXPECT_FALSE(info->InTier(kTierG1));
  EXPECT_EQ(info->slot[kTierG2], 7u);
  EXPECT_EQ(info->slot[kTierG3], 9u);
  EXPECT_EQ(index->TierCount(kTierG2), 1u);
  EXPECT_EQ(*index->Remove(K(1), kTierG2), 7u);
  EXPECT_EQ(index->Remove(K(1), kTierG2).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(index->KeyCount(), 1u);
  EXPECT_EQ(*index->Remove(K(1), kTierG3), 9u);
  EXPECT_EQ(index->KeyCount(), 0u);
  EXPECT_FALSE(index->Get(K(1)).has_value());
  EXPECT_EQ(index->Insert(K(2), BlockKey{}, 9, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(index->Insert(K(2), BlockKey{}, kTierG2, kNoSlot).code(), StatusCode::kInvalidArgument);
}

TEST(BlockIndexTest, MatchReturnsLongestRunWithFastestTier) {
  auto index = MakeIndex();
  std::vector<BlockKey> prompt;
  for (uint64_t i = 0; i < 6; ++i) prompt.push_back(K(i));
  InsertChain(*index, 0, 3, kTierG3, 0);                    // blocks 0..2 on SSD
  EXPECT_TRUE(index->Insert(K(1), K(0), kTierG2, 5).ok());  // block 1 also in DRAM
  EXPECT_TRUE(index->Insert(K(4), K(3), kTierG2, 6).ok());  // block 4 cached, block 3 not
  MatchResult m = index->Match(prompt);
  ASSERT_EQ(m.num_blocks(), 3u) << "the run stops at the first block no tier holds";
  EXPECT_EQ(m.tiers[0], kTierG3);
  EXPECT_EQ(m.tiers[1], kTierG2);
  EXPECT_EQ(m.tiers[2], kTierG3);
  // A mask restricts the tiers that count.
  EXPECT_EQ(index->Match(prompt, 1u << kTierG2).num_blocks(), 0u);
  // Match is read-only.
  EXPECT_EQ(index->Get(K(0))->hits, 0u);
  EXPECT_EQ(index->Get(K(0))->pins, 0u);
}

TEST(BlockIndexTest, PinnedBlocksAreNeverEvictedOrRemoved) {
  auto index = MakeIndex(PolicyKind::kLru);
  auto keys = InsertChain(*index, 0, 4, kTierG2, 0);
  MatchResult m = index->MatchAndPin(std::span<const BlockKey>(keys).subspan(0, 2));
  ASSERT_EQ(m.num_blocks(), 2u);
  EXPECT_EQ(index->TotalPins(), 2u);
  EXPECT_EQ(index->Remove(keys[0], kTierG2).status().code(), StatusCode::kFailedPrecondition);
  std::vector<BlockKey> evicted;
  while (auto e = index->EvictOne(kTierG2)) evicted.push_back(e->key);
  EXPECT_EQ(evicted, (std::vector<BlockKey>{keys[2], keys[3]}));
  EXPECT_EQ(index->TierCount(kTierG2), 2u);
  EXPECT_TRUE(index->Unpin(std::span<const BlockKey>(keys).subspan(0, 2)).ok());
  EXPECT_EQ(index->TotalPins(), 0u);
  EXPECT_EQ(index->Unpin(std::span<const BlockKey>(keys).subspan(0, 1)).code(),
            StatusCode::kFailedPrecondition);
  auto e = index->EvictOne(kTierG2);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->key, keys[0]);
  EXPECT_EQ(e->slot, 0u);
}

TEST(BlockIndexTest, TouchCountsHitsAndRefreshesRecency) {
  auto index = MakeIndex(PolicyKind::kLru);
  auto keys = InsertChain(*index, 0, 3, kTierG2, 0);
  index->Touch(std::span<const BlockKey>(keys).subspan(0, 1));
  EXPECT_EQ(index->Get(keys[0])->hits, 1u);
  EXPECT_GT(index->Get(keys[0])->last_access, 0u);
  // keys[0] is now the most recent: LRU evicts keys[1] first.
  EXPECT_EQ(index->EvictOne(kTierG2)->key, keys[1]);
}

TEST(BlockIndexTest, LineageLruEvictsLeavesBeforeTheirPrefix) {
  auto index = MakeIndex(PolicyKind::kLineageLru);
  auto keys = InsertChain(*index, 0, 4, kTierG2, 0);
  // Touch in prefix order: the root is least recent, yet it has a cached child.
  index->Touch(keys);
  EXPECT_EQ(index->EvictOne(kTierG2)->key, keys[3]);
  EXPECT_EQ(index->EvictOne(kTierG2)->key, keys[2]);
}

TEST(BlockIndexTest, ConfigValidation) {
  BlockIndex::Config cfg;
  cfg.num_shards = 12;
  EXPECT_NE(BlockIndex::Create(cfg).status().message().find("num_shards"), std::string::npos);
  cfg.num_shards = 16;
  cfg.tiers[kTierG2].policy = PolicyKind::kBelady;
  EXPECT_EQ(BlockIndex::Create(cfg).status().code(), StatusCode::kInvalidArgument);
}

// The manager builds its index from g2.policy / g3.policy: a lab policy that reached it (the
// config refuses them too) is refused by name, with where to run it.
TEST(BlockIndexTest, RefusesALabPolicyNamingWhereToRunIt) {
  BlockIndex::Config cfg;
  cfg.num_shards = 8;
  for (PolicyKind lab : {PolicyKind::kLineageLru, PolicyKind::kLeafFirstLru, PolicyKind::kS3Fifo}) {
    cfg.tiers[kTierG3].policy = lab;
    auto index = BlockIndex::Create(cfg);
    ASSERT_FALSE(index.ok()) << PolicyKindName(lab);
    EXPECT_EQ(index.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(index.status().message().find(std::string(PolicyKindName(lab)) +
                                            " is a lab policy (docs/policy-study.md): use it "
                                            "with kvtier sim / replay; the product offers: "
                                            "adaptive,"),
              std::string::npos)
        << index.status().message();
  }
}

TEST(BlockIndexTest, ReplacePolicyOnlyWhenEmpty) {
  auto index = MakeIndex();
  std::vector<BlockKey> refs = {K(1), K(2)};
  EXPECT_TRUE(index->ReplacePolicy(kTierG2, MakeBeladyPolicy(refs)).ok());
  InsertChain(*index, 1, 1, kTierG2, 0);
  EXPECT_EQ(index->ReplacePolicy(kTierG2, MakeBeladyPolicy(refs)).code(),
            StatusCode::kFailedPrecondition);
}

// Many threads insert, match-and-pin, touch, unpin, evict and remove over a small key space
// in two tiers. At the end the invariants must hold: counts agree with entries, no pin leaks,
// and every evicted or removed slot was one that had been inserted and not yet freed.
TEST(BlockIndexStressTest, ConcurrentOperationsKeepInvariants) {
  auto index = MakeIndex(PolicyKind::kLineageLru);
  constexpr int kThreads = 4;
  constexpr int kOps = 20000;
  constexpr uint64_t kKeys = 256;
  // held[tier][key]: successful inserts minus successful removals. It may be briefly off by one
  // between an index call and the counter update, but must end at 0 or 1, as the index says.
  std::vector<std::atomic<int>> held(2 * kKeys);
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(1000 + t);
      for (int i = 0; i < kOps; ++i) {
        const uint64_t k = rng() % kKeys;
        const TierId tier = (rng() & 1) ? kTierG2 : kTierG3;
        const int ti = tier == kTierG2 ? 0 : 1;
        switch (rng() % 6) {
          case 0:
          case 1: {
            Status s =
                index->Insert(K(k), k ? K(k - 1) : BlockKey{}, tier, static_cast<uint32_t>(k));
            if (s.ok()) {
              held[ti * kKeys + k].fetch_add(1);
            } else if (s.code() != StatusCode::kAlreadyExists) {
              ++errors;
            }
            break;
          }
          case 2: {
            std::vector<BlockKey> prompt;
            const uint64_t start = rng() % kKeys;
            for (uint64_t j = start; j < std::min(kKeys, start + 8); ++j) prompt.push_back(K(j));
            MatchResult m = index->MatchAndPin(prompt);
            index->Touch(std::span<const BlockKey>(prompt).subspan(0, m.num_blocks()));
            // A pinned block cannot be evicted or removed while we hold it.
            for (size_t j = 0; j < m.num_blocks(); ++j) {
              if (!index->Get(prompt[j]).has_value()) ++errors;
            }
            if (!index->Unpin(std::span<const BlockKey>(prompt).subspan(0, m.num_blocks())).ok())
              ++errors;
            break;
          }
          case 3: {
            if (auto e = index->EvictOne(tier)) {
              const uint64_t ek = e->slot;
              if (e->key != K(ek)) ++errors;
              held[ti * kKeys + ek].fetch_sub(1);
            }
            break;
          }
          case 4: {
            auto r = index->Remove(K(k), tier);
            if (r.ok()) {
              if (*r != k) ++errors;
              held[ti * kKeys + k].fetch_sub(1);
            } else if (r.status().code() != StatusCode::kNotFound &&
                       r.status().code() != StatusCode::kFailedPrecondition) {
              ++errors;
            }
            break;
          }
          default:
            (void)index->Match(std::vector<BlockKey>{K(k), K(k + 1)});
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(index->TotalPins(), 0u);
  uint64_t g2 = 0, g3 = 0, keys = 0;
  for (uint64_t k = 0; k < kKeys; ++k) {
    ASSERT_TRUE(held[k].load() == 0 || held[k].load() == 1)
        << "G2 key " << k << ": " << held[k].load();
    ASSERT_TRUE(held[kKeys + k].load() == 0 || held[kKeys + k].load() == 1) << "G3 key " << k;
    g2 += held[k].load();
    g3 += held[kKeys + k].load();
    keys += (held[k].load() | held[kKeys + k].load());
    auto info = index->Get(K(k));
    EXPECT_EQ(info.has_value(), held[k].load() || held[kKeys + k].load());
    if (info) {
      EXPECT_EQ(info->InTier(kTierG2), held[k].load() == 1);
      EXPECT_EQ(info->InTier(kTierG3), held[kKeys + k].load() == 1);
    }
  }
  EXPECT_EQ(index->TierCount(kTierG2), g2);
  EXPECT_EQ(index->TierCount(kTierG3), g3);
  EXPECT_EQ(index->KeyCount(), keys);
  // Everything left is evictable, and eviction drains the tiers completely.
  uint64_t drained = 0;
  while (index->EvictOne(kTierG2)) ++drained;
  while (index->EvictOne(kTierG3)) ++drained;
  EXPECT_EQ(drained, g2 + g3);
  EXPECT_EQ(index->KeyCount(), 0u);
}

}  // namespace
}  // namespace kvtier

namespace kvtier {
namespace {

TEST(BlockIndexTest, InvalidateRemovesEvenWhenPinnedAndUnpinForgets) {
  auto index = MakeIndex();
  auto keys = InsertChain(*index, 0, 2, kTierG3, 4);
  ASSERT_EQ(index->MatchAndPin(keys).num_blocks(), 2u);
  EXPECT_EQ(index->Remove(keys[1], kTierG3).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(*index->Invalidate(keys[1], kTierG3), 5u);
  EXPECT_EQ(index->TierCount(kTierG3), 1u);
  EXPECT_EQ(index->Match(keys).num_blocks(), 1u) << "an invalidated block is never matched";
  EXPECT_EQ(index->Invalidate(keys[1], kTierG3).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(index->KeyCount(), 2u) << "the pinned key is kept until unpinned";
  ASSERT_TRUE(index->Unpin(keys).ok());
  EXPECT_EQ(index->KeyCount(), 1u);
  EXPECT_EQ(index->TotalPins(), 0u);
}

}  // namespace
}  // namespace kvtier

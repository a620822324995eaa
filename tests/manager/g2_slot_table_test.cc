// G2SlotTable (src/manager/g2_slot_table.h): the records of what each G2 slot holds, and the
// namespace share's per-namespace slot counts that eviction consults.
#include "manager/g2_slot_table.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <vector>

namespace kvtier {
namespace {

constexpr uint32_t kTpb = 4;

BlockKey Key(uint64_t n) { return BlockKey{n, n + 1}; }

G2SlotTable::Meta MetaOf(uint64_t ns, uint64_t n = 1) {
  G2SlotTable::Meta m;
  m.key = Key(n);
  m.parent = Key(n + 100);
  m.namespace_id = ns;
  return m;
}

TEST(G2SlotTableTest, NamespaceSharesCountEachSlotOnceForItsLatestNamespace) {
  G2SlotTable t(/*num_slots=*/8, kTpb, /*namespace_share=*/0.5);
  const std::vector<TokenId> tokens{1, 2, 3, 4};
  t.Set(0, MetaOf(11), tokens);
  t.Set(1, MetaOf(11), tokens);
  t.Set(2, MetaOf(22), tokens);
  EXPECT_EQ(t.SlotsOf(11), 2u);
  EXPECT_EQ(t.SlotsOf(22), 1u);
  EXPECT_EQ(t.Namespaces(), 2u);
  // A slot set again for the same namespace is not counted twice; for another, it moves.
  t.Set(1, MetaOf(11), tokens);
  EXPECT_EQ(t.SlotsOf(11), 2u);
  t.Set(0, MetaOf(22), tokens);
  EXPECT_EQ(t.SlotsOf(11), 1u);
  EXPECT_EQ(t.SlotsOf(22), 2u);
  // Free gives the slot back once; a namespace left with none is no longer a holder.
  t.Free(1);
  t.Free(1);
  EXPECT_EQ(t.SlotsOf(11), 0u);
  EXPECT_EQ(t.Namespaces(), 1u);
  t.Free(99);  // out of range: ignored
  EXPECT_EQ(t.SlotsOf(22), 2u);
  // Namespace 0 is "none": never counted.
  t.Set(3, MetaOf(0), tokens);
  EXPECT_EQ(t.SlotsOf(0), 0u);
  EXPECT_EQ(t.Namespaces(), 1u);
}

TEST(G2SlotTableTest, ANamespaceWithinItsShareIsNotEvictedForAnother) {
  // 8 slots, share 0.5: with two namespaces holding blocks, each is guaranteed 0.5 x 8 / 2 = 2.
  G2SlotTable t(8, kTpb, 0.5);
  const std::vector<TokenId> tokens{1};
  for (uint32_t s = 0; s < 6; ++s) t.Set(s, MetaOf(/*ns=*/1), tokens);  // over its share
  t.Set(6, MetaOf(/*ns=*/2), tokens);                                   // within its share
  EXPECT_TRUE(t.EvictableFor(2, 0));   // ns 1 holds 6 > 2: its blocks go for ns 2's
  EXPECT_FALSE(t.EvictableFor(1, 6));  // ns 2 holds 1 <= 2: kept from ns 1
  EXPECT_TRUE(t.EvictableFor(2, 6));   // a namespace's own block: as the policy picks
  EXPECT_TRUE(t.EvictableFor(0, 6));   // no namespace: every victim
  EXPECT_TRUE(t.EvictableFor(1, 7));   // a free slot
  EXPECT_TRUE(t.EvictableFor(1, 99));  // out of range
  // A third namespace with no block yet counts as a holder: 0.5 x 8 / 3 = 1.33 each, and ns 2's
  // one block is still kept from it.
  EXPECT_FALSE(t.EvictableFor(3, 6));
  EXPECT_TRUE(t.EvictableFor(3, 0));

  G2SlotTable off(8, kTpb, 0);
  off.Set(6, MetaOf(2), tokens);
  EXPECT_FALSE(off.share_on());
  EXPECT_TRUE(off.EvictableFor(1, 6));
}

TEST(G2SlotTableTest, RecordsKeepPaddedTokensAndTheCommitChecksumUntilTheNextSet) {
  G2SlotTable t(2, kTpb, 0);
  G2SlotTable::Meta m = MetaOf(7);
  m.store_tiers = 1u << kTierG2;
  t.Set(1, m, std::vector<TokenId>{5, 6});  // short: zero-padded
  t.SetCommitChecksum(1, 0xabc);
  G2SlotTable::WriteRecord r = t.CopyForWrite(1);
  EXPECT_EQ(r.namespace_id, 7u);
  EXPECT_EQ(r.commit_checksum, 0xabcu);
  EXPECT_EQ(r.tokens, (std::vector<TokenId>{5, 6, 0, 0}));
  EXPECT_EQ(t.StoreTiers(1), 1u << kTierG2);
  // Free gives back the namespace only; the record is read by writes still in flight.
  t.Free(1);
  EXPECT_EQ(t.CopyForWrite(1).tokens, (std::vector<TokenId>{5, 6, 0, 0}));
  // The next Set replaces all of it (long tokens: cut at tokens_per_block; checksum: the Meta's).
  t.Set(1, MetaOf(8), std::vector<TokenId>{1, 2, 3, 4, 5, 6});
  r = t.CopyForWrite(1);
  EXPECT_EQ(r.namespace_id, 8u);
  EXPECT_EQ(r.commit_checksum, 0u);
  EXPECT_EQ(r.tokens, (std::vector<TokenId>{1, 2, 3, 4}));
  EXPECT_EQ(t.StoreTiers(1), kAllTiers);
  EXPECT_EQ(t.CopyForWrite(0).tokens, (std::vector<TokenId>(kTpb, 0)));  // untouched slot
}

TEST(G2SlotTableTest, CountsStayExactUnderConcurrentSetsAndFrees) {
  constexpr uint32_t kThreads = 4, kSlotsEach = 64, kRounds = 200;
  G2SlotTable t(kThreads * kSlotsEach, kTpb, 0.5);
  std::vector<std::thread> threads;
  for (uint32_t th = 0; th < kThreads; ++th) {
    threads.emplace_back([&t, th] {
      const std::vector<TokenId> tokens{th};
      for (uint32_t round = 0; round < kRounds; ++round) {
        for (uint32_t i = 0; i < kSlotsEach; ++i) {
          const uint32_t slot = th * kSlotsEach + i;
          if ((i + round) % 3 == 0) {
            t.Free(slot);
          } else {
            t.Set(slot, MetaOf(1 + (i + round) % 5), tokens);
          }
          (void)t.EvictableFor(1 + round % 5, (slot + 1) % (kThreads * kSlotsEach));
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  // Recompute what the last round left: slot i of every thread, round kRounds - 1.
  std::vector<uint32_t> want(6, 0);
  for (uint32_t i = 0; i < kSlotsEach; ++i) {
    const uint32_t r = kRounds - 1;
    if ((i + r) % 3 != 0) want[1 + (i + r) % 5] += kThreads;
  }
  size_t holders = 0;
  for (uint64_t ns = 1; ns <= 5; ++ns) {
    EXPECT_EQ(t.SlotsOf(ns), want[ns]) << "namespace " << ns;
    holders += want[ns] > 0 ? 1 : 0;
  }
  EXPECT_EQ(t.Namespaces(), holders);
}

}  // namespace
}  // namespace kvtier

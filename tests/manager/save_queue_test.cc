// SaveQueue (src/manager/save_queue.h) on its own: claims, the deferred bound and deadline,
// what TakeQueued hands out per instance, and the outstanding count.
#include "manager/save_queue.h"

#include <gtest/gtest.h>

#include <chrono>
#include <unordered_set>

namespace kvtier {
namespace {

BlockKey Key(uint64_t i) { return BlockKey{i, i * 7 + 1}; }

PendingSave Queued(uint32_t instance, const std::string& request, uint64_t key) {
  PendingSave p;
  p.instance = instance;
  p.request_id = request;
  p.key = Key(key);
  p.g2_slot = static_cast<uint32_t>(key);
  return p;
}

TEST(SaveQueueTest, AKeyIsClaimedOnceUntilItsSaveEndsOrIsDropped) {
  SaveQueue q;
  q.Configure(4, std::chrono::milliseconds(500));
  EXPECT_TRUE(q.Claim(Key(1)));
  EXPECT_FALSE(q.Claim(Key(1))) << "a second Commit of the same block must not save it again";
  EXPECT_TRUE(q.Claimed(Key(1)));
  q.Queue(Queued(0, "r", 1));
  std::vector<PendingSave> taken = q.TakeQueued(SaveQueue::kAll, {});
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(q.outstanding(), 1u);
  EXPECT_TRUE(q.Claimed(Key(1))) << "claimed while the transfer engine runs it";
  EXPECT_TRUE(q.End(Key(1)));
  EXPECT_FALSE(q.Claimed(Key(1)));
  EXPECT_EQ(q.outstanding(), 0u);
  EXPECT_TRUE(q.Claim(Key(1)));
}

TEST(SaveQueueTest, TakeQueuedHandsOutOneInstanceAndTheGoneOnes) {
  SaveQueue q;
  q.Configure(4, std::chrono::milliseconds(500));
  for (uint64_t k = 1; k <= 6; ++k) {
    ASSERT_TRUE(q.Claim(Key(k)));
    q.Queue(Queued(static_cast<uint32_t>(k % 3), "r" + std::to_string(k), k));
  }
  EXPECT_EQ(q.Waiting(1), 2u);
  std::vector<PendingSave> mine = q.TakeQueued(1, /*gone=*/{2});
  ASSERT_EQ(mine.size(), 4u) << "instance 1's two and gone instance 2's two";
  for (const PendingSave& p : mine) EXPECT_TRUE(p.instance == 1 || p.instance == 2);
  EXPECT_EQ(q.outstanding(), 4u);
  EXPECT_EQ(q.Waiting(1), 0u);
  EXPECT_EQ(q.Waiting(0), 2u) << "another engine's saves wait for its own StartSave";
  EXPECT_FALSE(q.End(Key(1)));
  EXPECT_EQ(q.outstanding(), 3u);
}

TEST(SaveQueueTest, DeferredSavesAreBoundedCarryADeadlineAndKeepTheirOrder) {
  SaveQueue q;
  q.Configure(2, std::chrono::milliseconds(300));
  const auto before = std::chrono::steady_clock::now();
  for (uint64_t k = 1; k <= 2; ++k) {
    ASSERT_TRUE(q.CanDefer());
    ASSERT_TRUE(q.Claim(Key(k)));
    DeferredSave d;
    d.key = Key(k);
    d.request_id = "r";
    q.Defer(std::move(d));
  }
  EXPECT_FALSE(q.CanDefer()) << "the bound: deferred saves hold G1 blocks";
  EXPECT_EQ(q.deferred(), 2u);
  std::deque<DeferredSave> taken = q.TakeDeferred();
  ASSERT_EQ(taken.size(), 2u);
  EXPECT_FALSE(q.HasDeferred());
  EXPECT_EQ(taken[0].key, Key(1)) << "oldest first";
  EXPECT_GE(taken[0].deadline, before + std::chrono::milliseconds(300));
  // Given back newest first, the order is kept.
  q.Return(std::move(taken[1]));
  q.Return(std::move(taken[0]));
  taken = q.TakeDeferred();
  EXPECT_EQ(taken[0].key, Key(1));
  EXPECT_EQ(taken[1].key, Key(2));
}

TEST(SaveQueueTest, DroppingASaveUnclaimsItsKey) {
  SaveQueue q;
  q.Configure(4, std::chrono::milliseconds(500));
  for (uint64_t k = 1; k <= 4; ++k) ASSERT_TRUE(q.Claim(Key(k)));
  q.Queue(Queued(0, "a", 1));
  q.Queue(Queued(0, "b", 2));
  DeferredSave d;
  d.key = Key(3);
  d.request_id = "a";
  q.Defer(std::move(d));
  auto of_a = [](const auto& s) { return s.request_id == "a"; };
  EXPECT_EQ(q.DropDeferred(of_a).size(), 1u);
  std::vector<PendingSave> dropped = q.DropQueued(of_a);
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].g2_slot, 1u) << "the caller gets the slot back to release";
  EXPECT_FALSE(q.Claimed(Key(1)));
  EXPECT_FALSE(q.Claimed(Key(3)));
  EXPECT_TRUE(q.Claimed(Key(2)));
  EXPECT_TRUE(q.Claimed(Key(4)));
  EXPECT_FALSE(q.Empty());
  EXPECT_EQ(q.TakeQueued(SaveQueue::kAll, {}).size(), 1u);
  EXPECT_TRUE(q.Empty());
}

}  // namespace
}  // namespace kvtier

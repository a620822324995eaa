// ManagerEvents (src/manager/manager_events.h): the embedded manager's subscribers, the blocks
// G3 recovered at start-up, and the kStored event's details. The wire publisher is events_test's.
#include "manager/manager_events.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace kvtier {
namespace {

constexpr uint32_t kTpb = 4;

BlockKey Key(uint64_t n) { return BlockKey{n, n + 1}; }

struct Heard {
  std::vector<std::vector<KvEvent>> batches;
  KvEventCallback Callback() {
    return [this](std::span<const KvEvent> e) { batches.emplace_back(e.begin(), e.end()); };
  }
};

class ManagerEventsUnitTest : public ::testing::Test {
 protected:
  HasherCache hashers_{"model", /*layout_fingerprint=*/42, kTpb, HashAlgorithm::kSha256,
                       /*capacity=*/4};
  ManagerEvents events_{kTpb, &hashers_};
};

TEST_F(ManagerEventsUnitTest, OnlyTheFirstSubscriberHearsTheRecoveredBlocksAndOnlyOnce) {
  std::vector<KvEvent> recovered;
  for (uint64_t n = 1; n <= 2; ++n) {
    recovered.push_back(ManagerEvents::Event(KvEvent::Kind::kStored, Key(n), Key(0), kTierG3));
  }
  events_.SetRecovered(recovered);
  Heard first, second;
  events_.Subscribe(first.Callback());
  ASSERT_EQ(first.batches.size(), 1u);  // on Subscribe's thread, before it returns
  ASSERT_EQ(first.batches[0].size(), 2u);
  EXPECT_EQ(first.batches[0][1].key, Key(2));
  events_.Subscribe(second.Callback());
  EXPECT_TRUE(second.batches.empty());
  events_.Emit({ManagerEvents::Event(KvEvent::Kind::kRemoved, Key(1), Key(0), kTierG3)});
  ASSERT_EQ(first.batches.size(), 2u);
  ASSERT_EQ(second.batches.size(), 1u);
  EXPECT_EQ(second.batches[0][0].kind, KvEvent::Kind::kRemoved);
  // Only what was emitted is counted (the recovered blocks are not events_emitted).
  EXPECT_EQ(events_.emitted(), 1u);
  events_.Emit({});
  EXPECT_EQ(first.batches.size(), 2u);
  EXPECT_EQ(events_.emitted(), 1u);
}

TEST_F(ManagerEventsUnitTest, ACallbackMaySubscribeAgainWhileBeingCalled) {
  // No lock is held while a callback runs: one that calls back in does not deadlock.
  Heard late;
  int calls = 0;
  events_.Subscribe([&](std::span<const KvEvent>) {
    if (++calls == 1) events_.Subscribe(late.Callback());
  });
  events_.Emit({ManagerEvents::Event(KvEvent::Kind::kStored, Key(1), Key(0), kTierG2)});
  EXPECT_TRUE(late.batches.empty());  // subscribed after that Emit took its list
  events_.Emit({ManagerEvents::Event(KvEvent::Kind::kStored, Key(2), Key(1), kTierG2)});
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(late.batches.size(), 1u);
}

TEST_F(ManagerEventsUnitTest, StoredCarriesTheBlocksDetailsOnceSomeoneListens) {
  auto hasher = hashers_.Get("salt", "adapter");
  ASSERT_TRUE(hasher.ok());
  const BlockKey root = (*hasher)->root();
  const std::vector<TokenId> tokens{1, 2, 3, 4};
  EXPECT_FALSE(events_.wanted());
  KvEvent quiet = events_.Stored(Key(5), root, kTierG2, root.hi, tokens);
  EXPECT_TRUE(quiet.token_ids.empty());
  EXPECT_EQ(quiet.key, Key(5));
  EXPECT_EQ(quiet.kind, KvEvent::Kind::kStored);
  EXPECT_EQ(events_.Stored(Key(5), root, kTierG3, root.hi, tokens, /*always=*/true).token_ids,
            tokens);

  events_.Subscribe([](std::span<const KvEvent>) {});
  EXPECT_TRUE(events_.wanted());
  KvEvent e = events_.Stored(Key(5), root, kTierG2, root.hi, tokens);
  EXPECT_EQ(e.token_ids, tokens);
  EXPECT_EQ(e.block_size, kTpb);
  EXPECT_TRUE(e.parent_is_root);
  EXPECT_TRUE(e.namespace_known);
  EXPECT_EQ(e.lora_name, "adapter");
  EXPECT_EQ(e.cache_salt, "salt");
  // A namespace this process never named (a block G3 recovered): its names are not known.
  KvEvent unknown = events_.Stored(Key(6), Key(5), kTierG3, root.hi + 1, tokens);
  EXPECT_FALSE(unknown.namespace_known);
  EXPECT_FALSE(unknown.parent_is_root);
}

TEST_F(ManagerEventsUnitTest, NoEndpointStartsNoPublisher) {
  EventOptions off;
  ASSERT_TRUE(events_.StartPublisher(off).ok());
  EXPECT_FALSE(events_.wanted());
  ManagerStats s;
  events_.AddPublisherStats(&s);
  EXPECT_EQ(s.events_published, 0u);
}

}  // namespace
}  // namespace kvtier

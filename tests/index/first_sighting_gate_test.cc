// FirstSightingGate (src/index/first_sighting_gate.h): probes are always written; the gate
// opens or closes on the hits of *resolved* probes only (at the horizon, or when they leave G3);
// counts decay; bad settings are refused by name; concurrent callers are safe.
#include "index/first_sighting_gate.h"

#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace kvtier {
namespace {

// Key i; a probe (1 in 16) exactly when i % 16 == 0.
BlockKey K(uint64_t i) { return BlockKey{0x1234 + i * 7, i}; }

std::unique_ptr<FirstSightingGate> MakeGate(double max_writes_per_hit, uint64_t horizon,
                                            uint64_t min_resolved = 4, uint64_t window = 1024) {
  FirstSightingGate::Config c;
  c.max_writes_per_hit = max_writes_per_hit;
  c.probe_one_in = 16;
  c.horizon = horizon;
  c.min_resolved = min_resolved;
  c.window = window;
  auto g = FirstSightingGate::Create(c);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return std::move(g).value();
}

TEST(FirstSightingGateTest, OpenWhileWarmingUpThenClosedWhenProbesNeverHit) {
  auto gate = MakeGate(4, /*horizon=*/32);
  uint64_t refused = 0;
  for (uint64_t i = 0; i < 16 * 40; ++i) {
    const bool admitted = gate->Admit(K(i));
    if (i % 16 == 0) {
      EXPECT_TRUE(admitted) << "a probe is always written";
    }
    refused += admitted ? 0 : 1;
  }
  const FirstSightingGate::Counts c = gate->counts();
  EXPECT_FALSE(c.open) << "no probe was ever hit";
  EXPECT_EQ(c.resolved_hits, 0);
  // 40 probes; those written 32 decisions ago or more have resolved (38 of them).
  EXPECT_EQ(c.resolved_writes, 38);
  EXPECT_EQ(c.live_probes, 2u);
  EXPECT_GT(refused, 0u);
  EXPECT_EQ(c.admitted + c.refused, 16u * 40);
  // Until 4 probes resolved (decision 3 x 16 + 32 = 80), everything was admitted.
  EXPECT_GE(c.admitted, 81u);
}

TEST(FirstSightingGateTest, OpensWhenResolvedProbesHitOftenEnough) {
  auto gate = MakeGate(4, /*horizon=*/32);
  // Each probe is hit once, right after its write: 1 hit per write, better than 1 per 4.
  for (uint64_t i = 0; i < 16 * 40; ++i) {
    gate->Admit(K(i));
    if (i % 16 == 0) gate->OnHit(K(i));
  }
  FirstSightingGate::Counts c = gate->counts();
  EXPECT_TRUE(c.open);
  EXPECT_EQ(c.refused, 0u);
  EXPECT_EQ(c.resolved_hits, c.resolved_writes);
  // A hit on a key that is not a live probe counts nothing.
  gate->OnHit(K(1));
  gate->OnHit(K(0));  // resolved long ago
  EXPECT_EQ(gate->counts().resolved_hits, c.resolved_hits);
}

TEST(FirstSightingGateTest, HitsAreJudgedOnlyOnceAProbeResolves) {
  // Probes hit *late* (after 20 more decisions) still count: their yield is judged at the
  // horizon (32), not at the write. A gate that counted hits as they come would have seen a
  // yield of 0 for the youngest probes.
  auto gate = MakeGate(1, /*horizon=*/32, /*min_resolved=*/2);
  std::vector<uint64_t> pending;
  for (uint64_t i = 0; i < 16 * 30; ++i) {
    gate->Admit(K(i));
    if (i % 16 == 0) pending.push_back(i);
    while (!pending.empty() && i - pending.front() >= 20) {
      gate->OnHit(K(pending.front()));
      pending.erase(pending.begin());
    }
  }
  const FirstSightingGate::Counts c = gate->counts();
  EXPECT_TRUE(c.open) << c.resolved_writes << " writes, " << c.resolved_hits << " hits";
  EXPECT_EQ(c.resolved_writes, c.resolved_hits);
}

TEST(FirstSightingGateTest, ARemovedProbeResolvesAtOnceWithWhatItHad) {
  auto gate = MakeGate(4, /*horizon=*/1u << 20, /*min_resolved=*/1);
  ASSERT_TRUE(gate->Admit(K(0)));
  gate->OnHit(K(0));
  gate->OnHit(K(0));
  EXPECT_EQ(gate->counts().resolved_writes, 0) << "not resolved before the horizon";
  gate->OnRemoved(K(0));
  FirstSightingGate::Counts c = gate->counts();
  EXPECT_EQ(c.resolved_writes, 1);
  EXPECT_EQ(c.resolved_hits, 2);
  EXPECT_EQ(c.live_probes, 0u);
  gate->OnRemoved(K(0));  // twice: nothing more
  gate->OnRemoved(K(3));  // not a probe: nothing
  EXPECT_EQ(gate->counts().resolved_writes, 1);
}

TEST(FirstSightingGateTest, CountsDecaySoTheGateFollowsAChange) {
  // Phase 1: every probe hit (open). Phase 2: none hit. With a window of 64 resolutions the
  // gate closes within a few windows instead of remembering phase 1 forever.
  auto gate = MakeGate(4, /*horizon=*/16, /*min_resolved=*/4, /*window=*/64);
  uint64_t i = 0;
  for (; i < 16 * 300; ++i) {
    gate->Admit(K(i));
    if (i % 16 == 0) gate->OnHit(K(i));
  }
  ASSERT_TRUE(gate->counts().open);
  for (; i < 16 * 600; ++i) gate->Admit(K(i));
  const FirstSightingGate::Counts c = gate->counts();
  EXPECT_FALSE(c.open);
  EXPECT_LT(c.resolved_writes, 64);
}

TEST(FirstSightingGateTest, BadSettingsAreRefusedByName) {
  FirstSightingGate::Config c;
  c.max_writes_per_hit = 0;
  auto g = FirstSightingGate::Create(c);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("max_writes_per_hit"), std::string::npos);
  c = FirstSightingGate::Config();
  c.probe_one_in = 0;
  EXPECT_NE(FirstSightingGate::Create(c).status().message().find("probe_one_in"),
            std::string::npos);
  c = FirstSightingGate::Config();
  c.window = c.min_resolved;  // below 2 x min_resolved
  EXPECT_NE(FirstSightingGate::Create(c).status().message().find("window"), std::string::npos);
  c = FirstSightingGate::Config();
  c.horizon = 0;
  EXPECT_NE(FirstSightingGate::Create(c).status().message().find("horizon"), std::string::npos);
}

TEST(FirstSightingGateTest, ConcurrentCallersKeepTheCountsConsistent) {
  auto gate = MakeGate(4, /*horizon=*/64);
  std::vector<std::thread> threads;
  for (uint64_t t = 0; t < 4; ++t) {
    threads.emplace_back([&gate, t] {
      for (uint64_t i = 0; i < 4096; ++i) {
        const BlockKey k = K(t * 100000 + i);
        gate->Admit(k);
        gate->OnHit(k);
        if (i % 3 == 0) gate->OnRemoved(k);
      }
    });
  }
  for (auto& th : threads) th.join();
  const FirstSightingGate::Counts c = gate->counts();
  EXPECT_EQ(c.admitted + c.refused, 4u * 4096);
  EXPECT_TRUE(c.open) << "every probe was hit";
}

}  // namespace
}  // namespace kvtier

// Many threads run multi-turn conversations with shared system prompts against small tiers,
// with faults injected under G3 (I/O errors, bit flips both ways, torn and short transfers).
// Every block a load delivers is compared byte for byte with what its key implies; at the end
// no pin, G2 slot or G1 block may be leaked.
//
// KVTIER_TEST_STRESS_SECONDS sets the duration (default 3; CI runs it for 30 under TSan).
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>

#include <gtest/gtest.h>

#include "faulty_g3_manager.h"
#include "manager_test_util.h"
#include "tier/fault_injecting_io.h"

namespace kvtier {
namespace {

using testing::FaultyG3Manager;
using testing::MiniEngine;
using testing::Prompt;
using testing::SmallConfig;
using testing::TempDirectory;

double StressSeconds() {
  const char* v = std::getenv("KVTIER_TEST_STRESS_SECONDS");
  return v != nullptr ? std::atof(v) : 3.0;
}

TEST(ManagerStressTest, ConcurrentConversationsWithG3FaultsServeOnlyCorrectBytes) {
  TempDirectory dir;
  Config config = SmallConfig(dir.path(), /*g2_blocks=*/24, /*g3_blocks=*/96);
  ASSERT_TRUE(config.Set("g3.reprobe_interval_ms", "100").ok());
  ASSERT_TRUE(config.Set("g3.quarantine_after_errors", "4").ok());
  ASSERT_TRUE(config.Set("transfer.max_queued_saves", "64").ok());
  // Four threads share a 512-block G1 and a slow, faulty G3: deferred saves (which hold their
  // requests' G1 blocks) must give up quickly here, or G1 runs out.
  ASSERT_TRUE(config.Set("transfer.max_defer_ms", "20").ok());
  FaultPlan plan;
  plan.read_error = 0.03;
  plan.write_error = 0.03;
  plan.read_bit_flip = 0.05;
  plan.write_bit_flip = 0.05;
  plan.torn_write = 0.02;
  plan.short_read = 0.02;
  plan.seed = 20261129;
  FaultInjectingIo* faults = nullptr;
  auto mgr = FaultyG3Manager(config, &faults, plan);
  ASSERT_NE(mgr, nullptr);
  BlockManager& manager = *mgr;
  ASSERT_NE(faults, nullptr) << "G3 did not open";
  MiniEngine engine(&manager, /*g1_blocks=*/512);

  constexpr int kThreads = 4;
  const auto start = std::chrono::steady_clock::now();
  const auto planned = start + std::chrono::duration<double>(StressSeconds());
  // G3 hits come from conversations whose blocks G2 evicted and G3 admitted before their next
  // turn: on a loaded machine a short run can see none (0 to 26 in 3 s runs), so the run goes
  // on, up to 4 times as long, until it has some.
  const auto longest = start + 4 * std::chrono::duration<double>(StressSeconds());
  std::atomic<bool> g3_hit{false};
  auto running = [&] {
    const auto now = std::chrono::steady_clock::now();
    return now < planned || (!g3_hit.load() && now < longest);
  };
  std::atomic<uint64_t> requests{0}, loaded_blocks{0}, mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      uint32_t conversation = 0;
      while (running()) {
        if (t == 0 && !g3_hit.load()) g3_hit = manager.Stats().hit_blocks[kTierG3] > 0;
        // A conversation: 2 system prompts shared by everyone, 3 to 6 turns that each append.
        const uint32_t user = t * 100000 + conversation++;
        const uint32_t system = user % 2;
        const size_t system_tokens = 16 * 3;
        size_t len = system_tokens + 16 + user % 13;
        for (int turn = 0; turn < 3 + static_cast<int>(user % 4); ++turn) {
          std::vector<TokenId> prompt = Prompt(user, len, system_tokens, 7000 + system);
          const std::string id = std::to_string(user) + "/" + std::to_string(turn);
          MiniEngine::Outcome o = engine.Run(id, prompt, "", /*wait_saves=*/false);
          engine.DrainFinished(false);
          requests.fetch_add(1);
          loaded_blocks.fetch_add(o.loaded_tokens / 16);
          mismatches.fetch_add(o.mismatched_blocks);
          len += 16 + (turn * 7 + user) % 20;
          if (!running()) break;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  manager.WaitForSaves();
  engine.DrainFinished(true);

  const ManagerStats s = manager.Stats();
  const FaultCounts fc = faults->counts();
  std::printf(
      "stress: %llu requests, %llu blocks loaded (G2 %llu, G3 %llu), %llu load failures, "
      "%llu corrupt caught, %llu faults injected (%llu silent), %llu demoted, "
      "%llu dropped saves, %llu quarantines\n",
      static_cast<unsigned long long>(requests.load()),
      static_cast<unsigned long long>(loaded_blocks.load()),
      static_cast<unsigned long long>(s.hit_blocks[kTierG2]),
      static_cast<unsigned long long>(s.hit_blocks[kTierG3]),
      static_cast<unsigned long long>(s.load_failures),
      static_cast<unsigned long long>(s.corrupt_blocks),
      static_cast<unsigned long long>(fc.total()), static_cast<unsigned long long>(fc.silent()),
      static_cast<unsigned long long>(s.demoted_blocks),
      static_cast<unsigned long long>(s.dropped_saves),
      static_cast<unsigned long long>(s.g3_quarantines));
  EXPECT_EQ(mismatches.load(), 0u) << "a load delivered bytes its key does not imply";
  EXPECT_GT(requests.load(), 20u);
  EXPECT_GT(loaded_blocks.load(), 0u);
  EXPECT_GT(s.hit_blocks[kTierG3], 0u) << "the run never exercised G3 loads";
  EXPECT_GT(fc.total(), 0u) << "no fault was injected";
  EXPECT_EQ(s.pinned_blocks, 0u) << "leaked pins";
  EXPECT_EQ(s.g2_blocks + s.g2_free_slots + s.g2_staging_slots, s.g2_slots) << "leaked G2 slots";
  EXPECT_EQ(engine.held_requests(), 0u) << "requests whose saves never reported done";
  EXPECT_EQ(engine.free_blocks(), 512u) << "leaked G1 blocks";
}

}  // namespace
}  // namespace kvtier

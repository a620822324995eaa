// BlockManager with G4, over a shared directory (real files) and over a real redis-server
// started by the test: a second manager (fresh G2, no G3) finds and loads, byte-exact, what the
// first committed; a repeated Lookup reuses G4's answer; tenants never share; loads stage
// through the pool; without write-through G4 is fed by G2 and G3 victims. Corrupt and vanished
// objects, and Redis killed, restarted and paused mid-run: tests/manager/manager_g4_faults_test.cc.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "manager/rejected_keys.h"
#include "manager_g4_fixture.h"
#include "manager_test_util.h"
#include "redis_test_util.h"
#include "tier/block_format.h"
#include "tier/remote_store.h"

namespace kvtier {
namespace {

using namespace testing;  // NOLINT: the helpers of the manager and G4 tests

// Worker A commits a 10-block prompt; worker B (a fresh manager on the same G4) is offered 9
// blocks (the last token is always computed) from G4 and loads them byte-exact; B's second
// run finds them in its own G2.
void CrossWorkerRoundTrip(const Config& config) {
  const std::vector<TokenId> prompt = Prompt(1, 10 * kTpb + 3);
  {
    auto a = MakeTestManager(config);
    ASSERT_NE(a, nullptr);
    MiniEngine ea(a.get(), kG1Blocks);
    auto out = ea.Run("a1", prompt);
    EXPECT_EQ(out.offered_tokens, 0u);
    a->WaitForSaves();
    const ManagerStats s = a->Stats();
    EXPECT_TRUE(s.g4_enabled);
    EXPECT_EQ(s.g4_saved_blocks, 10u);
    EXPECT_EQ(s.g4_save_failures, 0u);
    EXPECT_EQ(s.pinned_blocks, 0u) << "write-through pins are all dropped";
  }
  auto b = MakeTestManager(config);
  ASSERT_NE(b, nullptr);
  MiniEngine eb(b.get(), kG1Blocks);
  auto lr = b->Lookup({"probe", prompt, "", "", {}}, 0);
  ASSERT_TRUE(lr.ok());
  EXPECT_EQ(lr->blocks_by_tier[kTierG4], 10u);
  EXPECT_TRUE(b->RequestFinished("probe") == false);
  auto out = eb.Run("b1", prompt);
  EXPECT_EQ(out.offered_tokens, 10 * kTpb);
  EXPECT_EQ(out.loaded_tokens, 10 * kTpb);
  EXPECT_EQ(out.mismatched_blocks, 0u);
  EXPECT_FALSE(out.load_error);
  b->WaitForSaves();
  ManagerStats s = b->Stats();
  EXPECT_EQ(s.hit_blocks[kTierG4], 10u);
  EXPECT_EQ(s.promoted_blocks, 10u) << "loaded G4 blocks are promoted into G2";
  EXPECT_EQ(s.g4_load_failures, 0u);
  // Again on B: G2 now, no G4 traffic.
  auto again = eb.Run("b2", prompt);
  EXPECT_EQ(again.loaded_tokens, 10 * kTpb);
  EXPECT_EQ(again.mismatched_blocks, 0u);
  b->WaitForSaves();
  s = b->Stats();
  EXPECT_EQ(s.hit_blocks[kTierG2], 10u);
  EXPECT_EQ(s.hit_blocks[kTierG4], 10u);
  EXPECT_EQ(s.pinned_blocks, 0u);
}

TEST(ManagerG4Fs, AnotherManagerFindsAndLoadsTheCommittedPrefixByteExact) {
  TempDirectory dir;
  CrossWorkerRoundTrip(FsConfig(dir.path() + "/g4"));
}

TEST(ManagerG4Redis, AnotherManagerFindsAndLoadsTheCommittedPrefixByteExact) {
  KVTIER_REQUIRE_REDIS();
  RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  CrossWorkerRoundTrip(RedisConfig(server.endpoint()));
}

TEST(ManagerG4Fs, ARepeatedLookupReusesTheG4AnswerForASecond) {
  TempDirectory dir;
  // This test counts G4 queries; a query past the 20 ms default deadline on a loaded machine
  // is a miss that adds nothing to the count, which is not what is tested here.
  const Config config = PatientReads(FsConfig(dir.path() + "/g4"));
  const std::vector<TokenId> prompt = Prompt(10, 5 * kTpb + 1);
  SavedByWorkerA(config, prompt);
  auto b = MakeTestManager(config);
  // vLLM asks again for a request it cannot schedule yet: one G4 query, not one per ask.
  for (int i = 0; i < 5; ++i) {
    auto lr = b->Lookup({"waiting", prompt, "", "", {}}, 0);
    ASSERT_TRUE(lr.ok());
    EXPECT_EQ(lr->blocks_by_tier[kTierG4], 5u);
  }
  EXPECT_EQ(b->Stats().g4_lookup_blocks, 5u) << "asked G4 once";
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  ASSERT_TRUE(b->Lookup({"waiting", prompt, "", "", {}}, 0).ok());
  EXPECT_EQ(b->Stats().g4_lookup_blocks, 10u) << "a stale answer is asked again";
  (void)b->RequestFinished("waiting");
}

// An answer that lacked blocks is reused for 50 ms only: blocks still being written (a P/D
// producer's write-through, its consumer asking every scheduler step) are seen soon after they
// land, not a second later.
TEST(ManagerG4Fs, APartialG4AnswerIsAskedAgainWithin50Ms) {
  TempDirectory dir;
  const Config config = PatientReads(FsConfig(dir.path() + "/g4"));
  const std::vector<TokenId> prompt = Prompt(11, 5 * kTpb + 1);
  auto a = MakeTestManager(config);
  MiniEngine ea(a.get(), kG1Blocks);
  // The producer has written the first 2 blocks so far.
  ea.Run("a2", std::vector<TokenId>(prompt.begin(), prompt.begin() + 2 * kTpb + 1));
  a->WaitForSaves();
  auto b = MakeTestManager(config);
  auto lr = b->Lookup({"waiting", prompt, "", "", {}}, 0);
  ASSERT_TRUE(lr.ok());
  EXPECT_EQ(lr->blocks_by_tier[kTierG4], 2u);
  const uint64_t asked = b->Stats().g4_lookup_blocks;
  // Asked again at once: the answer is reused (no second query).
  lr = b->Lookup({"waiting", prompt, "", "", {}}, 0);
  ASSERT_TRUE(lr.ok());
  EXPECT_EQ(lr->blocks_by_tier[kTierG4], 2u);
  EXPECT_EQ(b->Stats().g4_lookup_blocks, asked) << "a query within 50 ms";
  // The rest lands; 60 ms on, the consumer sees all 5 (a second's reuse would still say 2).
  ea.Run("a5", prompt);
  a->WaitForSaves();
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  lr = b->Lookup({"waiting", prompt, "", "", {}}, 0);
  ASSERT_TRUE(lr.ok());
  EXPECT_EQ(lr->blocks_by_tier[kTierG4], 5u);
  (void)b->RequestFinished("waiting");
}

// g4.load_gbps with g4.recompute_tokens_per_s: G4 blocks are offered only where loading one is
// estimated faster than recomputing it. A fresh worker on the same G4: at a slow G4 it is not
// asked (the engine recomputes; counted), at a fast one it is; with only one of the two keys
// set, G4 is always asked (as without them).
TEST(ManagerG4Fs, G4BlocksAreOfferedOnlyWhereLoadingBeatsRecompute) {
  TempDirectory dir;
  const Config base = FsConfig(dir.path() + "/g4");
  const std::vector<TokenId> prompt = Prompt(12, 6 * kTpb + 1);
  SavedByWorkerA(base, prompt);
  // A block of the test layout recomputes in 16 tokens / 1e6 tokens/s = 16 us.
  struct Case {
    const char* load_gbps;
    const char* recompute_tps;
    uint32_t offered_g4;
    uint64_t skipped;
  };
  const Case cases[] = {
      {"0.001", "1000000", 0, 1},  // loads in ms: slower, not offered
      {"1000", "1000000", 6, 0},   // loads in ns: faster, offered
      {"0.001", "0", 6, 0},        // only one key: always offered
      {"0", "0", 6, 0},            // neither (the default): always offered
  };
  for (const Case& c : cases) {
    Config config = base;
    ASSERT_TRUE(config.Set("g4.load_gbps", c.load_gbps).ok());
    ASSERT_TRUE(config.Set("g4.recompute_tokens_per_s", c.recompute_tps).ok());
    MiniEngine::Outcome out;
    ManagerStats s;
    ASSERT_NO_FATAL_FAILURE(RunOnFreshWorker(config, "b", prompt, &out, &s));
    EXPECT_EQ(out.loaded_tokens, c.offered_g4 * kTpb) << c.load_gbps << " " << c.recompute_tps;
    EXPECT_EQ(out.mismatched_blocks, 0u);
    EXPECT_EQ(s.hit_blocks[kTierG4], c.offered_g4) << c.load_gbps << " " << c.recompute_tps;
    EXPECT_EQ(s.g4_skipped_lookups, c.skipped) << c.load_gbps << " " << c.recompute_tps;
  }
  Config bad = base;
  EXPECT_FALSE(bad.Set("g4.load_gbps", "-1").ok()) << "negative bandwidth";
  EXPECT_FALSE(bad.Set("g4.recompute_tokens_per_s", "nan").ok());
}

TEST(ManagerG4Fs, TenantsAndModelsNeverShareG4Blocks) {
  TempDirectory dir;
  const Config config = FsConfig(dir.path() + "/g4");
  const std::vector<TokenId> prompt = Prompt(2, 6 * kTpb + 1);
  SavedByWorkerA(config, prompt, "tenant-a");
  auto b = MakeTestManager(config);
  MiniEngine eb(b.get(), kG1Blocks);
  EXPECT_EQ(eb.Run("b", prompt, "tenant-b").offered_tokens, 0u) << "another salt: a miss";
  EXPECT_EQ(eb.Run("c", prompt, "tenant-a").loaded_tokens, 6 * kTpb);
}

TEST(ManagerG4Fs, LoadsStageThroughThePoolWhenG2HasNoFreeSlot) {
  TempDirectory dir;
  const std::vector<TokenId> prompt = Prompt(9, 6 * kTpb + 1);
  SavedByWorkerA(FsConfig(dir.path() + "/g4"), prompt);
  // 8 G2 slots: 4 staging, 4 cache. Four G4 blocks stage through free cache slots (and are
  // promoted), the other two through the pool (not promoted).
  ManagerStats s;
  ASSERT_NO_FATAL_FAILURE(
      FreshWorkerLoads(FsConfig(dir.path() + "/g4", 8), "b", prompt, 6 * kTpb, &s));
  EXPECT_EQ(s.hit_blocks[kTierG4], 6u);
  EXPECT_EQ(s.staged_via_pool, 2u);
  EXPECT_EQ(s.promoted_blocks, 4u);
  EXPECT_EQ(s.pinned_blocks, 0u);
  EXPECT_EQ(s.g2_staging_slots, 4u) << "every pool slot came back";
}

// Worker A, on a config without write-through, runs `first` (G4 gets none of it yet), then
// `fillers` prompts from seed `filler_seed` that push it out of G2; A's stats once every save
// ended.
ManagerStats FirstThenFillers(const Config& config, const std::vector<TokenId>& first,
                              uint32_t fillers, uint32_t filler_seed) {
  auto a = MakeTestManager(config);
  EXPECT_NE(a, nullptr);
  if (a == nullptr) return {};
  MiniEngine ea(a.get(), kG1Blocks);
  ea.Run("a", first);
  a->WaitForSaves();
  EXPECT_EQ(a->Stats().g4_saved_blocks, 0u) << "no write-through";
  for (uint32_t i = 0; i < fillers; ++i)
    ea.Run("x" + std::to_string(i), Prompt(filler_seed + i, 4 * kTpb + 1));
  a->WaitForSaves();
  return a->Stats();
}

TEST(ManagerG4Fs, WithoutWriteThroughBlocksLeavingG2GoToG4) {
  TempDirectory dir;
  Config config = FsConfig(dir.path() + "/g4", 8);  // 8 G2 slots, no G3
  ASSERT_TRUE(config.Set("g4.write_through", "false").ok());
  const std::vector<TokenId> first = Prompt(7, 4 * kTpb + 1);
  {
    const ManagerStats s = FirstThenFillers(config, first, 6, 200);
    EXPECT_GT(s.evicted_blocks_g2, 0u);
    EXPECT_EQ(s.g4_saved_blocks, s.evicted_blocks_g2) << "every block leaving G2 went to G4";
  }
  ASSERT_NO_FATAL_FAILURE(FreshWorkerLoads(config, "b", first, 4 * kTpb));
}

// Without write-through, with G3: G4 is fed by demotion. Blocks pushed through G2 into G3 and
// then out of G3 too (both small) are still in G4, so a fresh manager (its own empty G2/G3)
// loads the first prompt from G4, byte-exact.
TEST(ManagerG4Fs, WithoutWriteThroughG3VictimsAreInG4) {
  TempDirectory dir;
  Config config = FsConfig(dir.path() + "/g4", 12);  // 12 G2 slots: 4 staging, 8 cache
  ASSERT_TRUE(config.Set("g4.write_through", "false").ok());
  ASSERT_TRUE(config.Set("g3.enabled", "true").ok());
  ASSERT_TRUE(config.Set("g3.dir", dir.path() + "/g3a").ok());
  ASSERT_TRUE(config
                  .Set("g3.capacity_bytes",
                       std::to_string(8 * (4096 + TestLayout().BlockBytes()) + (1 << 20)))
                  .ok());
  ASSERT_TRUE(config.Set("g3.admit_min_seen", "1").ok());
  const std::vector<TokenId> first = Prompt(9, 4 * kTpb + 1);
  {
    const ManagerStats s = FirstThenFillers(config, first, 30, 300);
    EXPECT_GT(s.demoted_blocks, 0u);
    EXPECT_GT(s.evicted_blocks_g3, 0u) << "G3 had to drop blocks too";
    EXPECT_GE(s.g4_saved_blocks, s.demoted_blocks) << "every block demoted to G3 went to G4";
    EXPECT_EQ(s.pinned_blocks, 0u);
  }
  Config fresh = config;
  ASSERT_TRUE(fresh.Set("g3.dir", dir.path() + "/g3b").ok());  // nothing local
  ManagerStats s;
  ASSERT_NO_FATAL_FAILURE(FreshWorkerLoads(fresh, "b", first, 4 * kTpb, &s));
  EXPECT_EQ(s.hit_blocks[kTierG4], 4u);
}

TEST(ManagerG4Config, IncompleteG4ConfigIsRefusedClearly) {
  Config fs = SmallConfig("", 16, 0);
  ASSERT_TRUE(fs.Set("g4.backend", "fs").ok());
  ManagerOptions o = testing::TestManagerOptions(fs, "m");
  auto m = BlockManager::Create(o);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("g4.dir"), std::string::npos) << m.status().ToString();
  Config redis = SmallConfig("", 16, 0);
  ASSERT_TRUE(redis.Set("g4.backend", "redis").ok());
  o.config = redis;
  m = BlockManager::Create(o);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("g4.endpoints"), std::string::npos);
  // A malformed endpoint is refused by the configuration itself (so `kvtier config` refuses it
  // too), before any manager is built.
  const Status bad = redis.Set("g4.endpoints", "not-an-endpoint");
  EXPECT_TRUE(bad.Is(StatusCode::kInvalidArgument)) << bad.ToString();
  EXPECT_NE(bad.message().find("'not-an-endpoint' has no :port"), std::string::npos)
      << bad.ToString();
  EXPECT_FALSE(fs.Set("g4.backend", "s3").ok());
}

}  // namespace
}  // namespace kvtier

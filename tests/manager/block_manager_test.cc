#include "kvtier/connector.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "faulty_g3_manager.h"
#include "hang_guard.h"
#include "manager/block_manager_impl.h"
#include "manager/embedded_manager.h"
#include "manager_test_util.h"
#include "tier/fault_injecting_io.h"

namespace kvtier {
namespace {

using testing::FaultyG3Manager;
using testing::KeyContent;
using testing::MakeTestManager;
using testing::MiniEngine;
using testing::Prompt;
using testing::SmallConfig;
using testing::TempDirectory;
using testing::TestLayout;
using testing::WaitFor;

// `n` prompts of 65 tokens with the seeds after `seed` (requests "f1".."fn"), then every save
// and demotion ended: what G2 evicted meanwhile, the oldest blocks first, is in G3.
void RunFillers(MiniEngine& engine, BlockManager& manager, uint32_t seed, uint32_t n) {
  for (uint32_t i = 1; i <= n; ++i) {
    engine.Run("f" + std::to_string(i), Prompt(seed + i, 16 * 4 + 1));
  }
  manager.WaitForSaves();
}

TEST(BlockManagerTest, SecondRequestLoadsTheFirstOnesPrefixFromG2ByteExact) {
  auto mgr = MakeTestManager(SmallConfig("", 32, 0));
  MiniEngine engine(mgr.get(), 64);
  const auto prompt = Prompt(1, 16 * 5 + 3);  // 5 full blocks and a tail
  auto first = engine.Run("a", prompt);
  EXPECT_EQ(first.offered_tokens, 0u);
  EXPECT_EQ(mgr->Stats().saved_blocks, 5u);
  auto second = engine.Run("b", prompt);
  EXPECT_EQ(second.offered_tokens, 16u * 5);
  EXPECT_EQ(second.loaded_tokens, 16u * 5);
  EXPECT_EQ(second.mismatched_blocks, 0u);
  const ManagerStats s = mgr->Stats();
  EXPECT_EQ(s.hit_blocks[kTierG2], 5u);
  EXPECT_EQ(s.saved_blocks, 5u) << "loaded blocks are not saved again";
  EXPECT_EQ(s.pinned_blocks, 0u);
}

// transfer.load_stores = streaming: the loads are copied with non-temporal stores (as auto does
// for loads larger than the last-level cache), and land byte-exact all the same.
TEST(BlockManagerTest, StreamingLoadsAreByteExact) {
  Config config = SmallConfig("", 32, 0);
  ASSERT_TRUE(config.Set("transfer.load_stores", "streaming").ok());
  EXPECT_FALSE(config.Set("transfer.load_stores", "sometimes").ok());
  auto mgr = MakeTestManager(config);
  MiniEngine engine(mgr.get(), 64);
  const auto prompt = Prompt(2, 16 * 7 + 5);
  (void)engine.Run("a", prompt);
  auto second = engine.Run("b", prompt);
  EXPECT_EQ(second.loaded_tokens, 16u * 7);
  EXPECT_EQ(second.mismatched_blocks, 0u);
}

TEST(BlockManagerTest, TheLastPromptTokenIsAlwaysLeftToCompute) {
  auto mgr = MakeTestManager(SmallConfig("", 32, 0));
  MiniEngine engine(mgr.get(), 64);
  const auto prompt = Prompt(2, 16 * 4);  // exactly 4 blocks
  engine.Run("a", prompt);
  auto again = engine.Run("b", prompt);
  EXPECT_EQ(again.offered_tokens, 16u * 3);
  EXPECT_EQ(again.loaded_tokens, 16u * 3);
}

TEST(BlockManagerTest, SharedPrefixIsReusedAcrossDifferentPrompts) {
  auto mgr = MakeTestManager(SmallConfig("", 32, 0));
  MiniEngine engine(mgr.get(), 64);
  engine.Run("a", Prompt(10, 16 * 6, /*shared_prefix=*/16 * 3));
  auto b = engine.Run("b", Prompt(11, 16 * 6, 16 * 3));
  EXPECT_EQ(b.loaded_tokens, 16u * 3);
  EXPECT_EQ(b.mismatched_blocks, 0u);
}

TEST(BlockManagerTest, TenantsNeverSeeEachOthersBlocks) {
  auto mgr = MakeTestManager(SmallConfig("", 32, 0));
  MiniEngine engine(mgr.get(), 64);
  const auto prompt = Prompt(3, 16 * 4 + 1);
  engine.Run("a", prompt, "tenant-a");
  EXPECT_EQ(engine.Run("b", prompt, "tenant-b").offered_tokens, 0u);
  EXPECT_EQ(engine.Run("c", prompt, "tenant-a").offered_tokens, 16u * 4);
}

// Prompt embeddings reach the connector with token ids of zeros, and the same text with another
// image has the same token ids: block_extra (their hashes) must tell them apart.
TEST(BlockManagerTest, BlockExtrasSeparateEqualTokensWithOtherInputs) {
  auto mgr = MakeTestManager(SmallConfig("", 32, 0));
  MiniEngine engine(mgr.get(), 64);  // registers G1
  const std::vector<TokenId> zeros(16 * 4 + 1, 0);
  const std::vector<uint32_t> g1 = {0, 1, 2, 3, 4};
  auto run = [&](const std::string& id, std::vector<std::string> extra) {
    RequestSpec spec{id, zeros, "", "", std::move(extra)};
    Result<LookupResult> r = mgr->Lookup(spec, 0);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    const uint32_t offered = r.ok() ? r->num_tokens : 0;
    EXPECT_TRUE(mgr->Commit(id, zeros, g1).ok());
    EXPECT_TRUE(mgr->StartSave().ok());
    mgr->WaitForSaves();
    mgr->RequestFinished(id);
    return offered;
  };
  const std::vector<std::string> a = {"emb-a0", "emb-a1", "emb-a2", "emb-a3"};
  std::vector<std::string> b = a;
  b[2] = "emb-b2";
  EXPECT_EQ(run("a", a), 0u);
  EXPECT_EQ(mgr->Stats().saved_blocks, 4u);
  EXPECT_EQ(run("b", b), 16u * 2) << "only the blocks before the first other embedding match";
  EXPECT_EQ(run("plain", {}), 0u) << "no extras is another prompt";
  EXPECT_EQ(run("a-again", a), 16u * 4);
}

// A hybrid model's sliding-window group no longer holds the blocks that left its window (vLLM
// shows its null block): the connector passes kNoG1Block for them. Commit neither saves nor
// reuses such a block, and the blocks after it are still saved; a load stops at the first one.
TEST(BlockManagerTest, BlocksTheEngineDoesNotHoldAreNeitherSavedNorLoaded) {
  auto mgr = MakeTestManager(SmallConfig("", 32, 0));
  MiniEngine engine(mgr.get(), 64);  // registers G1
  const auto prompt = Prompt(21, 16 * 5 + 1);
  auto commit = [&](const std::string& id, const std::vector<uint32_t>& g1) {
    RequestSpec spec{id, prompt, "", "", {}};
    Result<LookupResult> r = mgr->Lookup(spec, 0);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(mgr->Commit(id, prompt, g1).ok());
    EXPECT_TRUE(mgr->StartSave().ok());
    mgr->WaitForSaves();
    mgr->RequestFinished(id);
    return r.ok() ? r->num_tokens : 0;
  };
  EXPECT_EQ(commit("holes", {0, kNoG1Block, 2, kNoG1Block, 4, 5}), 0u);
  EXPECT_EQ(mgr->Stats().saved_blocks, 3u) << "blocks 0, 2 and 4 only";
  EXPECT_EQ(mgr->Stats().dedup_blocks, 0u);
  // A lookup counts from the block at num_computed_tokens (the engine holds those before it, as
  // a state group's boundary states are held only here and there): from block 2 one block
  // (2; 3 is nowhere), from block 4 one (4), from block 3 none.
  auto from = [&](const std::string& id, uint32_t block) -> uint32_t {
    RequestSpec spec{id, prompt, "", "", {}};
    Result<LookupResult> r = mgr->Lookup(spec, block * 16);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    mgr->RequestFinished(id);
    return r.ok() ? r->num_tokens : 0;
  };
  EXPECT_EQ(from("from-2", 2), 16u);
  EXPECT_EQ(from("from-4", 4), 16u) << "block 4, the last before the prompt's last token";
  EXPECT_EQ(from("from-3", 3), 0u);
  // Block 1 is nowhere: a lookup finds block 0 alone.
  EXPECT_EQ(commit("after-holes", {0, 1, 2, 3, 4, 5}), 16u);
  EXPECT_EQ(mgr->Stats().saved_blocks, 5u) << "blocks 1 and 3 saved now";
  // Everything is held now; a load into a table with a hole stops at the hole.
  RequestSpec spec{"load", prompt, "", "", {}};
  Result<LookupResult> r = mgr->Lookup(spec, 0);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->num_tokens, 16u * 5);
  const std::vector<uint32_t> g1 = {10, 11, kNoG1Block, 13, 14, 15};
  Result<uint32_t> planned = mgr->PrepareLoad("load", g1, 16 * 5);
  ASSERT_TRUE(planned.ok()) << planned.status().ToString();
  EXPECT_EQ(*planned, 16u * 2);
  ASSERT_TRUE(mgr->StartLoad().ok());
  EXPECT_EQ(mgr->LoadedTokens("load"), 16u * 2);
  mgr->RequestFinished("load");
  EXPECT_EQ(mgr->Stats().pinned_blocks, 0u) << "the blocks past the hole were unpinned";
}

// kv_transfer_params' load_tiers / store_tiers: where one request may load from and store to.
TEST(BlockManagerTest, RequestTierMasksLimitWhereItLoadsFromAndStoresTo) {
  TempDirectory dir;
  auto mgr = MakeTestManager(SmallConfig(dir.path(), 12, 64));  // 8 cache slots in G2
  MiniEngine engine(mgr.get(), 64);                             // registers G1
  const std::vector<uint32_t> g1 = {0, 1, 2, 3, 4};
  constexpr uint8_t kG2 = 1u << kTierG2, kG3 = 1u << kTierG3;
  auto run = [&](const std::string& id, const std::vector<TokenId>& prompt, uint8_t load,
                 uint8_t store) {
    RequestSpec spec{id, prompt, "", "", {}};
    spec.load_tiers = load;
    spec.store_tiers = store;
    Result<LookupResult> r = mgr->Lookup(spec, 0);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(mgr->Commit(id, prompt, g1).ok());
    EXPECT_TRUE(mgr->StartSave().ok());
    mgr->WaitForSaves();
    mgr->RequestFinished(id);
    return r.ok() ? r->num_tokens : 0;
  };
  const auto g2_only = Prompt(60, 16 * 4 + 1), everywhere = Prompt(61, 16 * 4 + 1);
  const auto no_g2 = Prompt(62, 16 * 4 + 1);
  const uint64_t saved0 = mgr->Stats().saved_blocks;
  run("no-g2", no_g2, kAllTiers, kAllTiers & ~kG2);
  EXPECT_EQ(mgr->Stats().saved_blocks, saved0) << "without G2 nothing is saved";
  run("g2-only", g2_only, kAllTiers, kG2);
  run("everywhere", everywhere, kAllTiers, kAllTiers);
  EXPECT_EQ(mgr->Stats().saved_blocks, saved0 + 8);
  // Push both out of G2: "everywhere" is demoted to G3, "g2-only" is not.
  for (uint32_t i = 0; i < 4; ++i)
    run("filler" + std::to_string(i), Prompt(70 + i, 16 * 4 + 1), kAllTiers, kG2);
  mgr->WaitForSaves();
  EXPECT_EQ(run("g2-only-again", g2_only, kAllTiers, kAllTiers), 0u) << "never written to G3";
  EXPECT_EQ(run("no-g3-load", everywhere, kG2, kAllTiers), 0u) << "its blocks are in G3 only";
  EXPECT_EQ(run("g3-load", everywhere, kG2 | kG3, kAllTiers), 16u * 4);
  EXPECT_EQ(run("no-load", everywhere, 0, kAllTiers), 0u) << "load_tiers none: a lookup only";
  EXPECT_EQ(mgr->Stats().pinned_blocks, 0u);
}

TEST(BlockManagerTest, G2VictimsAreDemotedToG3AndLoadBackExactly) {
  TempDirectory dir;
  // 12 slots: 4 in the staging reserve, 8 for the cache.
  auto mgr = MakeTestManager(SmallConfig(dir.path(), 12, 64));
  MiniEngine engine(mgr.get(), 64);
  const auto first = Prompt(20, 16 * 4 + 1);
  engine.Run("p0", first);
  RunFillers(engine, *mgr, 20, 6);
  ManagerStats s = mgr->Stats();
  EXPECT_GT(s.demoted_blocks, 0u);
  EXPECT_GT(s.evicted_blocks_g2, 0u);
  EXPECT_EQ(s.g2_blocks + s.g2_free_slots + s.g2_staging_slots, s.g2_slots) << "no G2 slot leaked";
  auto back = engine.Run("again", first);
  // G3 loads stage through the reserve, so the whole prefix is planned even though every cache
  // slot is taken.
  EXPECT_EQ(back.planned_tokens, 16u * 4);
  EXPECT_EQ(back.loaded_tokens, back.planned_tokens);
  EXPECT_EQ(back.mismatched_blocks, 0u);
  s = mgr->Stats();
  EXPECT_GT(s.hit_blocks[kTierG3], 0u);
  EXPECT_GT(s.promoted_blocks, 0u);
  EXPECT_EQ(s.pinned_blocks, 0u);
}

TEST(BlockManagerTest, WarmRestartServesWhatG3Held) {
  TempDirectory dir;
  const auto prompt = Prompt(30, 16 * 4 + 1);
  {
    auto mgr = MakeTestManager(SmallConfig(dir.path(), 4, 64));
    MiniEngine engine(mgr.get(), 64);
    engine.Run("a", prompt);
    // Push the prompt out of G2 into G3.
    RunFillers(engine, *mgr, 30, 3);
    ASSERT_GT(mgr->Stats().g3_blocks, 0u);
  }
  // Events arrive on the threads that made the changes (the transfer workers too): lock. Declared
  // before the manager, so they outlive the events its shutdown may still emit.
  std::mutex mu;
  std::vector<KvEvent> events;
  auto mgr = MakeTestManager(SmallConfig(dir.path(), 4, 64));
  mgr->SubscribeEvents([&](std::span<const KvEvent> e) {
    std::lock_guard<std::mutex> lock(mu);
    events.insert(events.end(), e.begin(), e.end());
  });
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_GT(events.size(), 0u) << "the first subscriber hears of the recovered blocks";
    for (const KvEvent& e : events) EXPECT_EQ(e.tier, kTierG3);
  }
  MiniEngine engine(mgr.get(), 64);
  auto r = engine.Run("after-restart", prompt);
  EXPECT_GT(r.loaded_tokens, 0u);
  EXPECT_EQ(r.mismatched_blocks, 0u);
}

// A commit larger than G2's free room: the saves that find no slot wait for the slots that
// the demotions to G3 free (deferred), and all of them land: none dropped. Without G3 they wait
// for the earlier saves to land and evict them (G2 keeps what its policy prefers); either way
// every save ends, nothing stays pinned and G2 never holds more than its slots.
TEST(BlockManagerTest, SavesWaitForSlotsFreedByDemotionInsteadOfDropping) {
  TempDirectory dir;
  auto mgr = MakeTestManager(SmallConfig(dir.path(), 12, 64));  // 4 staging + 8 cache slots
  MiniEngine engine(mgr.get(), 64);
  // 16 blocks: 8 find a slot, 8 wait (the bound: at most as many as G2 caches).
  const auto prompt = Prompt(60, 16 * 16 + 1);
  engine.Run("big", prompt);
  mgr->WaitForSaves();
  ManagerStats s = mgr->Stats();
  EXPECT_EQ(s.dropped_saves, 0u);
  EXPECT_GT(s.deferred_saves, 0u);
  EXPECT_EQ(s.saved_blocks, 16u);
  EXPECT_EQ(s.g2_blocks + s.g3_blocks, 16u) << "every block is in G2 or G3";
  auto back = engine.Run("again", prompt);
  EXPECT_EQ(back.loaded_tokens, 16u * 16);
  EXPECT_EQ(back.mismatched_blocks, 0u);
  EXPECT_EQ(mgr->Stats().pinned_blocks, 0u);

  // Beyond the bound the excess is dropped and counted, never held.
  TempDirectory dir2;
  auto bounded = MakeTestManager(SmallConfig(dir2.path(), 12, 64));
  MiniEngine e3(bounded.get(), 64);
  e3.Run("bigger", Prompt(61, 16 * 24 + 1));
  bounded->WaitForSaves();
  s = bounded->Stats();
  EXPECT_GT(s.dropped_saves, 0u);
  EXPECT_EQ(s.saved_blocks + s.dropped_saves, 24u);
  EXPECT_EQ(s.pinned_blocks, 0u);

  auto g2_only = MakeTestManager(SmallConfig("", 8, 0));
  MiniEngine e2(g2_only.get(), 64);
  e2.Run("big", prompt);
  g2_only->WaitForSaves();
  s = g2_only->Stats();
  EXPECT_EQ(s.saved_blocks + s.dropped_saves, 16u);
  EXPECT_LE(s.g2_blocks, 8u);
  EXPECT_EQ(s.g2_blocks + s.g2_free_slots + s.g2_staging_slots, s.g2_slots);
  EXPECT_EQ(s.pinned_blocks, 0u);
}

// With G3 behind G2, Commit evicts nothing when G2 is full: its saves are deferred, and the
// StartSave that follows evicts for them (demoting what G3 admits) and they all land. Evicting
// inside Commit had made its p99 90-260 us under demotion load (bench manager). Without G3 a
// Commit still evicts for itself (its victim's slot frees at once): nothing is deferred.
TEST(BlockManagerTest, WithG3CommitEvictsNothingAndStartSaveEvictsForItsSaves) {
  for (const bool with_g3 : {true, false}) {
    SCOPED_TRACE(with_g3 ? "G2 + G3" : "G2 only");
    TempDirectory dir;
    auto mgr = MakeTestManager(with_g3 ? SmallConfig(dir.path(), 12, 64) : SmallConfig("", 8, 0));
    MiniEngine engine(mgr.get(), 64);
    engine.Run("fill", Prompt(90, 16 * 8 + 1));  // G2's 8 cache slots
    mgr->WaitForSaves();
    const ManagerStats before = mgr->Stats();
    ASSERT_EQ(before.g2_blocks, 8u);
    ASSERT_EQ(before.dropped_saves, 0u);

    const auto prompt = Prompt(91, 16 * 4 + 1);
    std::vector<uint32_t> blocks = engine.AllocBlocks(5);
    ASSERT_TRUE(mgr->Lookup({"next", prompt, "", "", {}}, 0).ok());
    ASSERT_TRUE(mgr->PrepareLoad("next", blocks, 0).ok());
    ASSERT_TRUE(mgr->StartLoad().ok());
    for (uint32_t b = 0; b < 4; ++b) engine.FillBlock(blocks[b], static_cast<uint8_t>(b + 1));
    ASSERT_TRUE(mgr->Commit("next", prompt, blocks).ok());
    const ManagerStats committed = mgr->Stats();
    if (with_g3) {
      EXPECT_EQ(committed.evicted_blocks_g2, before.evicted_blocks_g2) << "Commit evicted";
      EXPECT_EQ(committed.deferred_saves, before.deferred_saves + 4);
    } else {
      EXPECT_GE(committed.evicted_blocks_g2, before.evicted_blocks_g2 + 4);
      EXPECT_EQ(committed.deferred_saves, before.deferred_saves);
    }
    ASSERT_TRUE(mgr->StartSave().ok());
    if (with_g3) {
      EXPECT_GT(mgr->Stats().evicted_blocks_g2, before.evicted_blocks_g2);
    }
    (void)mgr->RequestFinished("next");
    mgr->WaitForSaves();
    (void)mgr->Finished();
    const ManagerStats after = mgr->Stats();
    EXPECT_EQ(after.dropped_saves, 0u);
    EXPECT_EQ(after.saved_blocks, before.saved_blocks + 4);
    if (with_g3) {
      EXPECT_EQ(after.g2_blocks + after.g3_blocks, 12u) << "every block is in G2 or G3";
      EXPECT_GT(after.demoted_blocks, before.demoted_blocks);
    }
    EXPECT_EQ(after.pinned_blocks, 0u);
    engine.FreeBlocks(blocks);
  }
}

// Demotion writes that never complete (stalled under G3): slots "are coming" but never come, so
// deferred saves must not hold the engine's G1 blocks forever: after transfer.max_defer_ms they
// are dropped and the request is reported done.
TEST(BlockManagerTest, DeferredSavesAreDroppedAfterTheirDeadline) {
  TempDirectory dir;
  Config config = SmallConfig(dir.path(), 12, 64);
  ASSERT_TRUE(config.Set("transfer.max_defer_ms", "30").ok());
  FaultPlan plan;
  plan.stall = 1.0;  // every I/O completion is held back until ReleaseStalled()
  FaultInjectingIo* faults = nullptr;
  auto mgr = FaultyG3Manager(config, &faults, plan);
  ASSERT_NE(mgr, nullptr);
  BlockManager& manager = *mgr;
  ASSERT_NE(faults, nullptr);
  MiniEngine engine(&manager, 64);
  // 8 cache slots fill; the next commit demotes (stalled) and defers the rest.
  engine.Run("a", Prompt(70, 16 * 8 + 1), "", /*wait_saves=*/false);
  engine.DrainFinished(false);
  const auto prompt = Prompt(71, 16 * 6 + 1);
  engine.Run("b", prompt, "", /*wait_saves=*/false);
  EXPECT_GT(manager.Stats().deferred_saves, 0u);
  const auto start = std::chrono::steady_clock::now();
  while (engine.held_requests() > 0 &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(5)) {
    engine.DrainFinished(false);  // Finished() retries, and drops what waited too long
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(engine.held_requests(), 0u) << "deferred saves held G1 past their deadline";
  EXPECT_GT(manager.Stats().dropped_saves, 0u);
  faults->SetPlan(FaultPlan{});  // no more stalls (the shutdown flush writes too)
  faults->ReleaseStalled();
  manager.WaitForSaves();
  EXPECT_EQ(manager.Stats().pinned_blocks, 0u);
}

// g3.flush_on_close: what only G2 held survives a clean restart (it is written to G3 at
// shutdown); with the flush off it does not, which shows the flush is what kept it.
TEST(BlockManagerTest, CleanShutdownWritesG2ToG3SoARestartFindsIt) {
  for (const bool flush : {true, false}) {
    SCOPED_TRACE(flush ? "flush on" : "flush off");
    TempDirectory dir;
    Config config = SmallConfig(dir.path(), 32, 64);
    ASSERT_TRUE(config.Set("g3.flush_on_close", flush ? "true" : "false").ok());
    const auto prompt = Prompt(40, 16 * 4 + 1);
    {
      auto mgr = MakeTestManager(config);
      MiniEngine engine(mgr.get(), 64);
      engine.Run("a", prompt);
      mgr->WaitForSaves();
      ASSERT_EQ(mgr->Stats().g3_blocks, 0u) << "G2 is large enough: nothing was demoted";
    }
    auto mgr = MakeTestManager(config);
    MiniEngine engine(mgr.get(), 64);
    auto r = engine.Run("after-restart", prompt);
    EXPECT_EQ(r.loaded_tokens, flush ? 16u * 4 : 0u);
    EXPECT_EQ(r.mismatched_blocks, 0u);
    EXPECT_EQ(mgr->Stats().hit_blocks[kTierG3], flush ? 4u : 0u);
  }
}

// Corrupt every G3 slot's payload on disk: loads must fail verification and never deliver
// the bytes; the engine recomputes and the blocks leave the index.
TEST(BlockManagerTest, CorruptG3BlocksAreMissesNeverServed) {
  TempDirectory dir;
  auto mgr = MakeTestManager(SmallConfig(dir.path(), 4, 64));
  MiniEngine engine(mgr.get(), 64);
  const auto prompt = Prompt(40, 16 * 4 + 1);
  engine.Run("a", prompt);
  RunFillers(engine, *mgr, 40, 3);
  ASSERT_GT(testing::CorruptG3Payloads(dir.path()), 0);
  const uint64_t g2_hits_before = mgr->Stats().hit_blocks[kTierG2];
  auto r = engine.Run("again", prompt);
  EXPECT_EQ(r.mismatched_blocks, 0u) << "no corrupt byte was ever delivered as a hit";
  const ManagerStats s = mgr->Stats();
  const uint64_t g2_hits = s.hit_blocks[kTierG2] - g2_hits_before;
  EXPECT_LT(r.loaded_tokens / 16, r.planned_tokens / 16 + 1);
  if (r.planned_tokens / 16 > g2_hits) {
    EXPECT_GT(s.corrupt_blocks, 0u);
    EXPECT_GT(s.load_failures, 0u);
  }
  EXPECT_EQ(s.pinned_blocks, 0u);
}

// A G3 block that fails verification leaves the index (Invalidate) when its load fails, so the
// next Lookup stops before it instead of offering a load that would fail again, forever.
TEST(BlockManagerTest, ACorruptG3BlockIsNeverOfferedAgain) {
  TempDirectory dir;
  auto mgr = MakeTestManager(SmallConfig(dir.path(), 4, 64));
  MiniEngine engine(mgr.get(), 64);
  const auto prompt = Prompt(45, 16 * 4 + 1);
  engine.Run("a", prompt);
  RunFillers(engine, *mgr, 45, 3);
  auto probe = mgr->Lookup({"probe", prompt, "", "", {}}, 0);
  ASSERT_TRUE(probe.ok());
  ASSERT_EQ(probe->blocks_by_tier[kTierG3], 4u) << "the first prompt is in G3 only";
  EXPECT_FALSE(mgr->RequestFinished("probe"));
  ASSERT_GT(testing::CorruptG3Payloads(dir.path()), 0);

  // Loaded and refused, nothing committed (so nothing is saved again).
  auto lr = mgr->Lookup({"load", prompt, "", "", {}}, 0);
  ASSERT_TRUE(lr.ok());
  ASSERT_EQ(lr->num_tokens, 16u * 4);
  const std::vector<uint32_t> blocks = engine.AllocBlocks(5);
  ASSERT_TRUE(mgr->PrepareLoad("load", blocks, lr->num_tokens).ok());
  ASSERT_TRUE(mgr->StartLoad().ok());
  for (uint32_t l = 0; l < TestLayout().num_layers; ++l) (void)mgr->WaitLayer(l);
  EXPECT_EQ(mgr->LoadedTokens("load"), 0u);
  EXPECT_FALSE(mgr->RequestFinished("load"));
  engine.FreeBlocks(blocks);
  ManagerStats s = mgr->Stats();
  EXPECT_GE(s.corrupt_blocks, 1u);
  EXPECT_EQ(s.pinned_blocks, 0u);

  auto again = mgr->Lookup({"again", prompt, "", "", {}}, 0);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->blocks_by_tier[kTierG3], 0u) << "a block refused once is never offered again";
  EXPECT_EQ(again->num_tokens, 0u);
  EXPECT_FALSE(mgr->RequestFinished("again"));
  EXPECT_EQ(mgr->Stats().load_failures, s.load_failures);
}

// A quarantined G3 fails every load at once: Lookup must not offer its blocks (they would be
// counted as load failures, and the engine would plan loads that cannot happen).
TEST(BlockManagerTest, AQuarantinedG3IsNotOfferedByLookup) {
  TempDirectory dir;
  Config config = SmallConfig(dir.path(), 12, 64);
  ASSERT_TRUE(config.Set("g3.quarantine_after_errors", "2").ok());
  ASSERT_TRUE(config.Set("g3.reprobe_interval_ms", "3600000").ok());  // no probe of its own
  FaultInjectingIo* faults = nullptr;
  auto mgr = FaultyG3Manager(config, &faults);
  ASSERT_NE(mgr, nullptr);
  BlockManager& manager = *mgr;
  ASSERT_NE(faults, nullptr);
  MiniEngine engine(&manager, 64);
  const auto first = Prompt(90, 16 * 4 + 1);
  engine.Run("p0", first);
  RunFillers(engine, manager, 90, 4);
  auto probe = manager.Lookup({"probe", first, "", "", {}}, 0);
  ASSERT_TRUE(probe.ok());
  ASSERT_GT(probe->blocks_by_tier[kTierG3], 0u) << "the first prompt went to G3";
  const uint32_t from_g2 = probe->blocks_by_tier[kTierG2];
  manager.RequestFinished("probe");

  // Two failed writes in a row quarantine G3.
  faults->FailNext(IoKind::kWrite, EIO, 2);
  for (uint32_t i = 5; i <= 7 && !manager.Stats().g3_quarantined; ++i) {
    engine.Run("p" + std::to_string(i), Prompt(90 + i, 16 * 4 + 1));
    manager.WaitForSaves();
  }
  ManagerStats s = manager.Stats();
  ASSERT_TRUE(s.g3_quarantined);
  const uint64_t failures_before = s.load_failures;

  auto offered = manager.Lookup({"q", first, "", "", {}}, 0);
  ASSERT_TRUE(offered.ok());
  EXPECT_EQ(offered->blocks_by_tier[kTierG3], 0u) << "a quarantined tier is not offered";
  EXPECT_LE(offered->blocks_by_tier[kTierG2], from_g2);
  manager.RequestFinished("q");
  auto r = engine.Run("again", first);
  EXPECT_FALSE(r.load_error);
  EXPECT_EQ(r.loaded_tokens, r.planned_tokens);
  EXPECT_EQ(r.mismatched_blocks, 0u);
  s = manager.Stats();
  EXPECT_EQ(s.load_failures, failures_before) << "no load was planned from the quarantined G3";
  EXPECT_EQ(s.pinned_blocks, 0u);
  // "again" computed the blocks only the quarantined G3 held: they were saved to G2 (not
  // counted as already stored), so the next request finds the whole prefix.
  auto next = manager.Lookup({"next", first, "", "", {}}, 0);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->blocks_by_tier[kTierG2], 4u);
  manager.RequestFinished("next");
}

// The engine aborts a request while its load is in flight. RequestFinished answers about saves
// only (none read its blocks: false); the load keeps its pins and lands; Finished().loads_done
// lists the request once it has (the engine frees the G1 blocks the load was writing then),
// LoadedTokens still answers in that step, and the entry is gone at the next Finished(): no
// pin and no request entry left behind.
TEST(BlockManagerTest, ARequestFinishedWithItsLoadInFlightIsReportedThenForgotten) {
  TempDirectory dir;
  FaultInjectingIo* faults = nullptr;
  auto mgr = FaultyG3Manager(SmallConfig(dir.path(), 12, 64), &faults);
  ASSERT_NE(mgr, nullptr);
  ASSERT_NE(faults, nullptr);
  MiniEngine engine(mgr.get(), 64);
  const auto prompt = Prompt(80, 16 * 4 + 1);
  engine.Run("a", prompt);
  RunFillers(engine, *mgr, 80, 3);
  auto probe = mgr->Lookup({"probe", prompt, "", "", {}}, 0);
  ASSERT_TRUE(probe.ok());
  ASSERT_EQ(probe->blocks_by_tier[kTierG3], 4u) << "the first prompt is in G3 only";
  EXPECT_FALSE(mgr->RequestFinished("probe"));
  EXPECT_EQ(mgr->Stats().tracked_requests, 0u);

  FaultPlan stall;
  stall.stall = 1.0;  // G3 reads complete only once released
  faults->SetPlan(stall);
  auto lr = mgr->Lookup({"x", prompt, "", "", {}}, 0);
  ASSERT_TRUE(lr.ok());
  const std::vector<uint32_t> blocks = engine.AllocBlocks(5);
  ASSERT_EQ(*mgr->PrepareLoad("x", blocks, lr->num_tokens), 16u * 4);
  ASSERT_TRUE(mgr->StartLoad().ok());
  EXPECT_FALSE(mgr->RequestFinished("x")) << "no save reads its blocks; the load is not a save";
  EXPECT_EQ(mgr->Stats().pinned_blocks, 4u) << "the load keeps its pins";
  EXPECT_EQ(mgr->Stats().tracked_requests, 1u) << "kept while its load is in flight";
  EXPECT_TRUE(mgr->Finished().loads_done.empty());

  faults->SetPlan(FaultPlan{});
  faults->ReleaseStalled();
  std::vector<std::string> loads_done, saves_done;
  ASSERT_TRUE(WaitFor([&] {
    FinishedRequests f = mgr->Finished();
    loads_done.insert(loads_done.end(), f.loads_done.begin(), f.loads_done.end());
    saves_done.insert(saves_done.end(), f.saves_done.begin(), f.saves_done.end());
    return !loads_done.empty();
  }));
  EXPECT_EQ(loads_done, std::vector<std::string>{"x"});
  EXPECT_TRUE(saves_done.empty()) << "RequestFinished said false: no saves_done to wait for";
  EXPECT_EQ(mgr->LoadedTokens("x"), 16u * 4) << "still answered in the step that listed it";
  const std::vector<BlockKey> keys = engine.Keys(prompt);
  std::vector<uint8_t> expect(TestLayout().BlockBytes());
  for (uint32_t i = 0; i < 4; ++i) {
    KeyContent(keys[i], expect.data(), expect.size());
    EXPECT_EQ(engine.BlockBytes(blocks[i]), expect) << "block " << i;
  }
  engine.FreeBlocks(blocks);
  EXPECT_TRUE(mgr->Finished().loads_done.empty()) << "listed once";
  const ManagerStats s = mgr->Stats();
  EXPECT_EQ(s.pinned_blocks, 0u);
  EXPECT_EQ(s.tracked_requests, 0u) << "no request entry leaked";
  EXPECT_EQ(mgr->LoadedTokens("x"), 0u) << "forgotten";
}

// vLLM preemption: the engine is about to reuse a request's G1 blocks. WaitForRequestSaves
// drops that request's saves that have not started (here: deferred behind demotions to a G3
// whose writes are held) and returns, while another request's deferred saves still wait; after
// it returns kvtier never reads those G1 blocks again (overwritten by the test, they never
// reach a tier: what is stored is the original bytes or nothing).
TEST(BlockManagerTest, WaitForRequestSavesReturnsWhileOtherRequestsSavesWait) {
  TempDirectory dir;
  Config config = SmallConfig(dir.path(), 12, 64);
  ASSERT_TRUE(config.Set("transfer.max_defer_ms", "60000").ok());  // deferred until released
  FaultInjectingIo* faults = nullptr;
  auto mgr = FaultyG3Manager(config, &faults);
  ASSERT_NE(mgr, nullptr);
  ASSERT_NE(faults, nullptr);
  MiniEngine engine(mgr.get(), 64);
  engine.Run("a", Prompt(100, 16 * 8 + 1));  // G2's 8 cache slots full
  mgr->WaitForSaves();
  FaultPlan stall;
  stall.stall = 1.0;  // demotion writes to G3 never complete until released
  faults->SetPlan(stall);
  engine.Run("other", Prompt(101, 16 * 2 + 1), "", /*wait_saves=*/false);
  const uint64_t deferred_other = mgr->Stats().deferred_saves;
  ASSERT_GT(deferred_other, 0u) << "the other request's saves wait for demotions";

  // The preempted request: computed into its G1 blocks, committed, saves deferred.
  const auto prompt = Prompt(102, 16 * 4 + 1);
  ASSERT_TRUE(mgr->Lookup({"p", prompt, "", "", {}}, 0).ok());
  const std::vector<uint32_t> blocks = engine.AllocBlocks(5);
  ASSERT_TRUE(mgr->PrepareLoad("p", blocks, 0).ok());
  for (uint32_t i = 0; i < 5; ++i) engine.FillBlock(blocks[i], static_cast<uint8_t>(0x10 + i));
  std::vector<std::vector<uint8_t>> original;
  for (uint32_t i = 0; i < 4; ++i) original.push_back(engine.BlockBytes(blocks[i]));
  ASSERT_TRUE(mgr->Commit("p", prompt, blocks).ok());
  ASSERT_TRUE(mgr->StartSave().ok());
  const ManagerStats before = mgr->Stats();
  ASSERT_EQ(before.deferred_saves, deferred_other + 4) << "all 4 of its saves deferred";

  const auto call =
      testing::RunGuarded([&] { mgr->WaitForRequestSaves("p"); }, std::chrono::seconds(5),
                          [&] {
                            faults->SetPlan(FaultPlan{});
                            faults->ReleaseStalled();
                          });
  EXPECT_TRUE(call.returned_in_time)
      << "WaitForRequestSaves waited " << call.took.count()
      << " ms for other requests' saves and demotions (released by the test)";
  const ManagerStats after = mgr->Stats();
  if (call.returned_in_time) {
    EXPECT_EQ(after.dropped_saves, before.dropped_saves + 4) << "its unstarted saves dropped";
    engine.DrainFinished(false);
    EXPECT_EQ(engine.held_requests(), 1u) << "the other request's saves still wait";
  }
  // The engine reuses the blocks at once.
  for (uint32_t b : blocks) engine.FillBlock(b, 0xee);
  EXPECT_FALSE(mgr->RequestFinished("p")) << "no save of it is left";

  faults->SetPlan(FaultPlan{});
  faults->ReleaseStalled();
  mgr->WaitForSaves();
  engine.DrainFinished(false);
  EXPECT_EQ(engine.held_requests(), 0u);
  // Whatever of `prompt` a tier holds is the bytes computed before the reuse.
  auto lr = mgr->Lookup({"check", prompt, "", "", {}}, 0);
  ASSERT_TRUE(lr.ok());
  const std::vector<uint32_t> into = engine.AllocBlocks(5);
  ASSERT_TRUE(mgr->PrepareLoad("check", into, lr->num_tokens).ok());
  ASSERT_TRUE(mgr->StartLoad().ok());
  const uint32_t loaded = mgr->LoadedTokens("check") / 16;
  if (call.returned_in_time) {
    EXPECT_EQ(loaded, 0u) << "its saves were dropped";
  }
  for (uint32_t i = 0; i < loaded; ++i) {
    EXPECT_EQ(engine.BlockBytes(into[i]), original[i]) << "block " << i << " is a torn mix";
  }
  EXPECT_FALSE(mgr->RequestFinished("check"));
  engine.FreeBlocks(into);
  EXPECT_EQ(mgr->Stats().pinned_blocks, 0u);
}

// A Lookup whose request the engine never finishes (it arrived after the request's end, over a
// channel) does not stay forever: after manager.idle_request_ttl_ms with nothing in flight and
// no call for it, a later Lookup drops its entry (counted). An entry called for since stays.
TEST(BlockManagerTest, LookupsNeverFinishedExpireAfterTheIdleTtl) {
  Config config = SmallConfig("", 32, 0);
  ASSERT_TRUE(config.Set("manager.idle_request_ttl_ms", "300").ok());
  auto mgr = MakeTestManager(config);
  MiniEngine engine(mgr.get(), 64);
  constexpr uint32_t kOrphans = 50;
  for (uint32_t i = 0; i < kOrphans; ++i) {
    ASSERT_TRUE(
        mgr->Lookup({"orphan" + std::to_string(i), Prompt(110 + i, 16 * 2 + 1), "", "", {}}, 0)
            .ok());
  }
  const auto busy_prompt = Prompt(109, 16 * 2 + 1);
  ASSERT_TRUE(mgr->Lookup({"busy", busy_prompt, "", "", {}}, 0).ok());
  const std::vector<uint32_t> blocks = engine.AllocBlocks(3);
  ASSERT_TRUE(mgr->PrepareLoad("busy", blocks, 0).ok());
  EXPECT_EQ(mgr->Stats().tracked_requests, kOrphans + 1);

  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  // The busy request is called for again; then any Lookup sweeps.
  ASSERT_TRUE(mgr->Commit("busy", busy_prompt, blocks).ok());
  ASSERT_TRUE(mgr->StartSave().ok());
  ASSERT_TRUE(mgr->Lookup({"next", Prompt(108, 16 * 2 + 1), "", "", {}}, 0).ok());
  ManagerStats s = mgr->Stats();
  EXPECT_EQ(s.expired_requests, kOrphans);
  EXPECT_EQ(s.tracked_requests, 2u) << "busy and next";
  EXPECT_TRUE(mgr->PrepareLoad("orphan0", blocks, 0).status().Is(StatusCode::kNotFound));
  mgr->WaitForSaves();
  EXPECT_FALSE(mgr->RequestFinished("busy"));
  EXPECT_FALSE(mgr->RequestFinished("next"));
  EXPECT_EQ(mgr->Stats().tracked_requests, 0u);
  engine.FreeBlocks(blocks);
}

TEST(BlockManagerTest, RequestFinishedHoldsG1BlocksUntilSavesEnd) {
  auto mgr = MakeTestManager(SmallConfig("", 32, 0));
  MiniEngine engine(mgr.get(), 64);
  const auto prompt = Prompt(50, 16 * 3 + 1);
  std::vector<uint32_t> g1 = {0, 1, 2, 3};
  ASSERT_TRUE(mgr->Lookup({"r", prompt, "", "", {}}, 0).ok());
  ASSERT_TRUE(mgr->PrepareLoad("r", g1, 0).ok());
  ASSERT_TRUE(mgr->StartLoad().ok());
  ASSERT_TRUE(mgr->Commit("r", prompt, g1).ok());
  // Saves are queued but not started: the engine must keep the blocks.
  EXPECT_TRUE(mgr->RequestFinished("r"));
  EXPECT_TRUE(mgr->Finished().saves_done.empty());
  ASSERT_TRUE(mgr->StartSave().ok());
  mgr->WaitForSaves();
  EXPECT_EQ(mgr->Finished().saves_done, std::vector<std::string>{"r"});
  EXPECT_FALSE(mgr->RequestFinished("r")) << "forgotten once reported";
}

TEST(BlockManagerTest, CommittingWhatIsStoredIsDeduplicated) {
  auto mgr = MakeTestManager(SmallConfig("", 32, 0));
  MiniEngine engine(mgr.get(), 64);
  const auto prompt = Prompt(60, 16 * 3 + 1);
  engine.Run("a", prompt);
  // A request that does not load (asks for 0 tokens) and computes everything again.
  std::vector<uint32_t> g1 = {10, 11, 12, 13};
  ASSERT_TRUE(mgr->Lookup({"b", prompt, "", "", {}}, 0).ok());
  ASSERT_TRUE(mgr->PrepareLoad("b", g1, 0).ok());
  ASSERT_TRUE(mgr->Commit("b", prompt, g1).ok());
  ASSERT_TRUE(mgr->StartSave().ok());
  mgr->WaitForSaves();
  EXPECT_EQ(mgr->Stats().dedup_blocks, 3u);
  EXPECT_EQ(mgr->Stats().saved_blocks, 3u);
}

// Only a copy in G2 makes a commit redundant: blocks that G3 alone holds and the engine computed
// again (here: a request that loads nothing; in vLLM, a prefix match cut short by a damaged
// block ahead of them) are saved to G2, and the next request finds them there.
TEST(BlockManagerTest, BlocksOnlyG3HoldsAreSavedToG2WhenComputedAgain) {
  TempDirectory dir;
  auto mgr = MakeTestManager(SmallConfig(dir.path(), 12, 64));
  MiniEngine engine(mgr.get(), 64);
  const auto first = Prompt(70, 16 * 4 + 1);
  engine.Run("p0", first);
  RunFillers(engine, *mgr, 70, 4);
  auto probe = mgr->Lookup({"probe", first, "", "", {}}, 0);
  ASSERT_TRUE(probe.ok());
  ASSERT_EQ(probe->blocks_by_tier[kTierG3], 4u) << "the first prompt went to G3 alone";
  mgr->RequestFinished("probe");

  const ManagerStats before = mgr->Stats();
  std::vector<uint32_t> g1 = {20, 21, 22, 23, 24};
  ASSERT_TRUE(mgr->Lookup({"again", first, "", "", {}}, 0).ok());
  ASSERT_TRUE(mgr->PrepareLoad("again", g1, 0).ok());  // loads nothing: computes the prompt
  ASSERT_TRUE(mgr->Commit("again", first, g1).ok());
  ASSERT_TRUE(mgr->StartSave().ok());
  mgr->WaitForSaves();
  const ManagerStats after = mgr->Stats();
  EXPECT_EQ(after.saved_blocks - before.saved_blocks, 4u);
  EXPECT_EQ(after.dedup_blocks, before.dedup_blocks) << "a G3-only copy is no reason to skip";
  mgr->RequestFinished("again");
  auto g3_only = mgr->Lookup({"g3-only", first, "", "", {}, 1u << kTierG3}, 0);
  ASSERT_TRUE(g3_only.ok());
  EXPECT_EQ(g3_only->blocks_by_tier[kTierG3], 0u) << "the fresh copies replace G3's";
  mgr->RequestFinished("g3-only");

  auto next = mgr->Lookup({"next", first, "", "", {}}, 0);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->blocks_by_tier[kTierG2], 4u) << "the fresh copies are found first";
  mgr->RequestFinished("next");
  // Committed again now, they are in G2: deduplicated.
  std::vector<uint32_t> g1b = {30, 31, 32, 33, 34};
  ASSERT_TRUE(mgr->Lookup({"third", first, "", "", {}}, 0).ok());
  ASSERT_TRUE(mgr->PrepareLoad("third", g1b, 0).ok());
  ASSERT_TRUE(mgr->Commit("third", first, g1b).ok());
  EXPECT_EQ(mgr->Stats().dedup_blocks - after.dedup_blocks, 4u);
  mgr->RequestFinished("third");
  // The shutdown flush writes the fresh copies to G3: a restart finds them there.
  mgr.reset();
  auto restarted = MakeTestManager(SmallConfig(dir.path(), 12, 64));
  auto found = restarted->Lookup({"found", first, "", "", {}}, 0);
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(found->blocks_by_tier[kTierG3], 4u);
  restarted->RequestFinished("found");
}

TEST(BlockManagerTest, EventsReportStoresAndRemovals) {
  std::vector<KvEvent> events;  // before the manager: they must outlive it
  std::mutex mu;
  auto mgr = MakeTestManager(SmallConfig("", 4, 0));
  mgr->SubscribeEvents([&](std::span<const KvEvent> e) {
    std::lock_guard<std::mutex> lock(mu);
    events.insert(events.end(), e.begin(), e.end());
  });
  MiniEngine engine(mgr.get(), 64);
  engine.Run("a", Prompt(70, 16 * 3 + 1));
  engine.Run("b", Prompt(71, 16 * 3 + 1));  // evicts a's blocks from the 4-slot G2
  std::lock_guard<std::mutex> lock(mu);
  size_t stored = 0, removed = 0;
  for (const KvEvent& e : events) {
    EXPECT_EQ(e.tier, kTierG2);
    EXPECT_GT(e.time_ns, 0u);
    (e.kind == KvEvent::Kind::kStored ? stored : removed)++;
  }
  EXPECT_EQ(stored, 6u);
  EXPECT_GE(removed, 2u);
  EXPECT_EQ(removed, stored - mgr->Stats().g2_blocks) << "every block not held was announced gone";
  EXPECT_EQ(mgr->Stats().events_emitted, events.size());
  // Each stored block names its lineage parent: block i's parent is block i-1.
  const auto keys = engine.Keys(Prompt(70, 16 * 3 + 1));
  size_t checked = 0;
  for (const KvEvent& e : events) {
    for (size_t i = 1; i < keys.size(); ++i) {
      if (e.kind == KvEvent::Kind::kStored && e.key == keys[i]) {
        EXPECT_EQ(e.parent, keys[i - 1]) << "block " << i;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 2u);
}

// A save batch enters the index in commit order (a request's blocks in prefix order), however
// its copies were spread over the workers: lineage-aware policies need a parent before its
// child, and a replay must build the same index on every run. Four copy workers, 20 requests of
// 24 blocks: every request's kStored events come in prefix order.
TEST(BlockManagerTest, SavedBlocksEnterTheIndexInPrefixOrderWhateverTheWorkers) {
  std::vector<KvEvent> events;
  std::mutex mu;
  Config config = SmallConfig("", 512, 0);
  ASSERT_TRUE(config.Set("transfer.copy_threads", "4").ok());
  auto mgr = MakeTestManager(config);
  mgr->SubscribeEvents([&](std::span<const KvEvent> e) {
    std::lock_guard<std::mutex> lock(mu);
    events.insert(events.end(), e.begin(), e.end());
  });
  MiniEngine engine(mgr.get(), 64);
  for (int r = 0; r < 20; ++r) {
    const auto prompt = Prompt(300 + r, 16 * 24 + 1);
    engine.Run("r" + std::to_string(r), prompt);
    const auto keys = engine.Keys(prompt);
    std::vector<BlockKey> stored;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (const KvEvent& e : events) {
        if (e.kind == KvEvent::Kind::kStored) stored.push_back(e.key);
      }
      events.clear();
    }
    ASSERT_EQ(stored.size(), 24u) << "request " << r;
    for (size_t i = 0; i < 24; ++i)
      ASSERT_EQ(stored[i], keys[i]) << "request " << r << ", block " << i;
  }
}

TEST(BlockManagerTest, BadCallsGetClearErrors) {
  auto mgr = MakeTestManager(SmallConfig("", 8, 0));
  const auto prompt = Prompt(80, 40);
  EXPECT_EQ(mgr->Lookup({"", prompt, "", "", {}}, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(mgr->Lookup({"x", prompt, "", "", {}}, 5).status().message().find("multiple"),
            std::string::npos);
  std::vector<uint32_t> g1 = {0, 1, 2};
  EXPECT_EQ(mgr->PrepareLoad("nobody", g1, 0).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(mgr->Commit("nobody", prompt, g1).code(), StatusCode::kNotFound);
  ASSERT_TRUE(mgr->Lookup({"x", prompt, "", "", {}}, 0).ok());
  EXPECT_EQ(mgr->PrepareLoad("x", g1, 16).status().code(), StatusCode::kInvalidArgument)
      << "more than Lookup offered";
  EXPECT_EQ(mgr->Commit("x", prompt, std::vector<uint32_t>{0}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(mgr->WaitLayer(99).code(), StatusCode::kInvalidArgument);
  ManagerOptions bad;
  bad.layout = TestLayout();
  bad.model_id = "";
  EXPECT_EQ(BlockManager::Create(bad).status().code(), StatusCode::kInvalidArgument);
  bad.model_id = "m";
  bad.layout.tokens_per_block = KvLayout::kMaxTokensPerBlock + 1;  // any size up to 4096 is fine
  EXPECT_EQ(BlockManager::Create(bad).status().code(), StatusCode::kInvalidArgument);
}

// A G3 that cannot open: tests/manager/manager_g3_open_test.cc (an explicit g3.dir fails Create;
// the default one is left out with a warning, and the manager runs on G2 alone).

}  // namespace
}  // namespace kvtier

// BlockManager with G3 behind G2: demotion and loads back, warm restarts, saves deferred for
// demotions, corrupt and quarantined G3, loads and saves in flight over a faulty G3. The G2-only
// cases: tests/manager/block_manager_test.cc.
#include "kvtier/connector.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "block_manager_fixture.h"
#include "faulty_g3_manager.h"
#include "hang_guard.h"
#include "manager_test_util.h"
#include "tier/fault_injecting_io.h"

namespace kvtier {
namespace {

using testing::EventSink;
using testing::FaultyG3Rig;
using testing::G3Rig;
using testing::KeyContent;
using testing::LookupNothingAndCommit;
using testing::MakeTestManager;
using testing::MiniEngine;
using testing::ProbeG3;
using testing::Prompt;
using testing::PushToG3;
using testing::RunFillers;
using testing::SmallConfig;
using testing::TempDirectory;
using testing::TestLayout;
using testing::WaitFor;

TEST(BlockManagerTest, G2VictimsAreDemotedToG3AndLoadBackExactly) {
  // 12 slots: 4 in the staging reserve, 8 for the cache.
  G3Rig rig(12);
  auto& [dir, mgr, engine] = rig;
  const auto first = PushToG3(engine, *mgr, "p0", 20, 6);
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
    RunFillers(engine, *mgr, 30, 3);  // pushes the prompt out of G2 into G3
    ASSERT_GT(mgr->Stats().g3_blocks, 0u);
  }
  EventSink sink;  // before the manager: it outlives the events its shutdown may still emit
  auto mgr = MakeTestManager(SmallConfig(dir.path(), 4, 64));
  sink.Attach(*mgr);
  {
    std::lock_guard<std::mutex> lock(sink.mu);
    const std::vector<KvEvent>& events = sink.events;
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
  G3Rig rig(12);  // 4 staging + 8 cache slots
  auto& [dir, mgr, engine] = rig;
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
  FaultyG3Rig rig;
  ASSERT_NO_FATAL_FAILURE(rig.Start(config, plan));
  BlockManager& manager = *rig.mgr;
  FaultInjectingIo* faults = rig.faults;
  MiniEngine& engine = *rig.engine;
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
  G3Rig rig(4);
  auto& [dir, mgr, engine] = rig;
  const auto prompt = PushToG3(engine, *mgr, "a", 40, 3);
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
  G3Rig rig(4);
  auto& [dir, mgr, engine] = rig;
  const auto prompt = PushToG3(engine, *mgr, "a", 45, 3);
  bool probe_held = true;
  ASSERT_NO_FATAL_FAILURE(ProbeG3(*mgr, prompt, 4, "the first prompt is in G3 only", &probe_held));
  EXPECT_FALSE(probe_held);
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
  FaultyG3Rig rig;
  ASSERT_NO_FATAL_FAILURE(rig.Start(config));
  BlockManager& manager = *rig.mgr;
  FaultInjectingIo* faults = rig.faults;
  MiniEngine& engine = *rig.engine;
  const auto first = PushToG3(engine, manager, "p0", 90, 4);
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
  FaultyG3Rig rig;
  ASSERT_NO_FATAL_FAILURE(rig.Start(SmallConfig(dir.path(), 12, 64)));
  std::unique_ptr<BlockManager>& mgr = rig.mgr;
  FaultInjectingIo* faults = rig.faults;
  MiniEngine& engine = *rig.engine;
  const auto prompt = PushToG3(engine, *mgr, "a", 80, 3);
  bool probe_held = true;
  ASSERT_NO_FATAL_FAILURE(ProbeG3(*mgr, prompt, 4, "the first prompt is in G3 only", &probe_held));
  EXPECT_FALSE(probe_held);
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
  FaultyG3Rig rig;
  ASSERT_NO_FATAL_FAILURE(rig.Start(config));
  std::unique_ptr<BlockManager>& mgr = rig.mgr;
  FaultInjectingIo* faults = rig.faults;
  MiniEngine& engine = *rig.engine;
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

// Only a copy in G2 makes a commit redundant: blocks that G3 alone holds and the engine computed
// again (here: a request that loads nothing; in vLLM, a prefix match cut short by a damaged
// block ahead of them) are saved to G2, and the next request finds them there.
TEST(BlockManagerTest, BlocksOnlyG3HoldsAreSavedToG2WhenComputedAgain) {
  G3Rig rig(12);
  auto& [dir, mgr, engine] = rig;
  const auto first = PushToG3(engine, *mgr, "p0", 70, 4);
  ASSERT_NO_FATAL_FAILURE(ProbeG3(*mgr, first, 4, "the first prompt went to G3 alone"));

  const ManagerStats before = mgr->Stats();
  std::vector<uint32_t> g1 = {20, 21, 22, 23, 24};
  // Loads nothing: computes the prompt.
  ASSERT_NO_FATAL_FAILURE(LookupNothingAndCommit(*mgr, "again", first, g1));
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
  ASSERT_NO_FATAL_FAILURE(LookupNothingAndCommit(*mgr, "third", first, g1b));
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

}  // namespace
}  // namespace kvtier

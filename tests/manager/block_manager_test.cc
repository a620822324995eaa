#include "kvtier/connector.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "block_manager_fixture.h"
#include "manager/block_manager_impl.h"
#include "manager/embedded_manager.h"
#include "manager_test_util.h"

// BlockManager on G2 (and G3 where a test asks for it): loads, prefixes, tenants, tier masks,
// request bookkeeping, events and bad calls. G3 demotion, restarts, corruption and faulty G3:
// tests/manager/block_manager_g3_test.cc.
namespace kvtier {
namespace {

using testing::CommitAndFinish;
using testing::EventSink;
using testing::G3Rig;
using testing::LookupNothingAndCommit;
using testing::MakeTestManager;
using testing::MiniEngine;
using testing::Prompt;
using testing::SmallConfig;
using testing::TempDirectory;
using testing::TestLayout;

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
    return CommitAndFinish(*mgr, {id, zeros, "", "", std::move(extra)}, g1);
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
    return CommitAndFinish(*mgr, {id, prompt, "", "", {}}, g1);
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
  G3Rig rig(12);  // 8 cache slots in G2; the engine registers G1
  auto& [dir, mgr, engine] = rig;
  const std::vector<uint32_t> g1 = {0, 1, 2, 3, 4};
  constexpr uint8_t kG2 = 1u << kTierG2, kG3 = 1u << kTierG3;
  auto run = [&](const std::string& id, const std::vector<TokenId>& prompt, uint8_t load,
                 uint8_t store) {
    RequestSpec spec{id, prompt, "", "", {}};
    spec.load_tiers = load;
    spec.store_tiers = store;
    return CommitAndFinish(*mgr, spec, g1);
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
  ASSERT_NO_FATAL_FAILURE(LookupNothingAndCommit(*mgr, "b", prompt, g1));
  ASSERT_TRUE(mgr->StartSave().ok());
  mgr->WaitForSaves();
  EXPECT_EQ(mgr->Stats().dedup_blocks, 3u);
  EXPECT_EQ(mgr->Stats().saved_blocks, 3u);
}

TEST(BlockManagerTest, EventsReportStoresAndRemovals) {
  EventSink sink;  // before the manager: the events must outlive it
  std::vector<KvEvent>& events = sink.events;
  auto mgr = MakeTestManager(SmallConfig("", 4, 0));
  sink.Attach(*mgr);
  MiniEngine engine(mgr.get(), 64);
  engine.Run("a", Prompt(70, 16 * 3 + 1));
  engine.Run("b", Prompt(71, 16 * 3 + 1));  // evicts a's blocks from the 4-slot G2
  std::lock_guard<std::mutex> lock(sink.mu);
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
  EventSink sink;
  std::vector<KvEvent>& events = sink.events;
  Config config = SmallConfig("", 512, 0);
  ASSERT_TRUE(config.Set("transfer.copy_threads", "4").ok());
  auto mgr = MakeTestManager(config);
  sink.Attach(*mgr);
  MiniEngine engine(mgr.get(), 64);
  for (int r = 0; r < 20; ++r) {
    const auto prompt = Prompt(300 + r, 16 * 24 + 1);
    engine.Run("r" + std::to_string(r), prompt);
    const auto keys = engine.Keys(prompt);
    std::vector<BlockKey> stored;
    {
      std::lock_guard<std::mutex> lock(sink.mu);
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

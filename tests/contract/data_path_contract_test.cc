// The BlockManager contract (include/kvtier/connector.h), its data path, over both
// implementations (contract_fixture.h): Lookup, PrepareLoad, StartLoad, WaitLayer,
// LoadedTokens, Commit, StartSave, WaitForSaves, and what RequestSpec keys a block by.
#include <algorithm>
#include <string>
#include <vector>

#include "contract_fixture.h"

namespace kvtier::contract {
namespace {

using testing::KeyContent;
using testing::MiniEngine;
using testing::Prompt;

constexpr uint32_t kTpb = 16;  // testing::TestLayout()'s tokens per block

class DataPathContract : public BlockManagerContract {};

// Looks `spec` up from token 0, commits all of its prompt from G1 blocks `g1`, saves and waits
// for the saves; returns the tokens the Lookup offered. The request is finished.
uint32_t CommitWhole(BlockManager& m, const RequestSpec& spec, const std::vector<uint32_t>& g1) {
  const std::vector<TokenId> tokens(spec.prompt.begin(), spec.prompt.end());
  Result<LookupResult> r = m.Lookup(spec, 0);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  Status s = m.Commit(spec.request_id, tokens, g1);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(m.StartSave().ok());
  m.WaitForSaves();
  if (m.RequestFinished(spec.request_id)) {
    EXPECT_TRUE(WaitSavesDone(m, spec.request_id)) << spec.request_id;
  }
  return r.ok() ? r->num_tokens : 0;
}

// The bytes MiniEngine::FillBlock(block, byte) leaves.
std::vector<uint8_t> Filled(uint8_t byte) {
  return std::vector<uint8_t>(testing::TestLayout().BlockBytes(), byte);
}

TEST_P(DataPathContract, SecondRequestLoadsTheFirstOnesPrefixByteExact) {
  auto m = Make(Tiers(32));
  ASSERT_NE(m, nullptr);
  MiniEngine engine(m.get(), 64);
  const auto prompt = Prompt(1, kTpb * 5 + 3);  // 5 full blocks and a tail
  auto first = engine.Run("a", prompt);
  EXPECT_EQ(first.offered_tokens, 0u);
  EXPECT_EQ(m->Stats().saved_blocks, 5u);
  auto second = engine.Run("b", prompt);
  EXPECT_EQ(second.offered_tokens, kTpb * 5);
  EXPECT_EQ(second.planned_tokens, kTpb * 5);
  EXPECT_EQ(second.loaded_tokens, kTpb * 5);
  EXPECT_EQ(second.mismatched_blocks, 0u);
  EXPECT_FALSE(second.load_error);
  const ManagerStats s = m->Stats();
  EXPECT_EQ(s.hit_blocks[kTierG2], 5u);
  EXPECT_EQ(s.saved_blocks, 5u) << "loaded blocks are not saved again";
  EXPECT_EQ(s.pinned_blocks, 0u);
}

TEST_P(DataPathContract, TheLastPromptTokenIsAlwaysLeftToCompute) {
  auto m = Make(Tiers(32));
  ASSERT_NE(m, nullptr);
  MiniEngine engine(m.get(), 64);
  const auto prompt = Prompt(2, kTpb * 4);  // exactly 4 blocks
  engine.Run("a", prompt);
  auto again = engine.Run("b", prompt);
  EXPECT_EQ(again.offered_tokens, kTpb * 3);
  EXPECT_EQ(again.loaded_tokens, kTpb * 3);
  EXPECT_EQ(again.mismatched_blocks, 0u);
}

// Lookup: no I/O, no pins; may be asked again for a request that cannot be scheduled yet, and
// a request id has one entry, which RequestFinished forgets when nothing of it is in flight.
TEST_P(DataPathContract, LookupPinsNothingAndMayBeAskedAgain) {
  auto m = Make(Tiers(32));
  ASSERT_NE(m, nullptr);
  MiniEngine engine(m.get(), 64);
  const auto prompt = Prompt(3, kTpb * 4 + 1);
  engine.Run("a", prompt);
  for (int i = 0; i < 3; ++i) {
    Result<LookupResult> r = m->Lookup(Spec("again", prompt), 0);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->num_tokens, kTpb * 4);
    EXPECT_EQ(r->blocks_by_tier[kTierG2], 4u);
    EXPECT_EQ(r->blocks_by_tier[kTierG3], 0u);
  }
  const ManagerStats s = m->Stats();
  EXPECT_EQ(s.pinned_blocks, 0u) << "a lookup pins nothing";
  EXPECT_EQ(s.tracked_requests, 1u) << "one entry per request id";
  EXPECT_FALSE(m->RequestFinished("again"));
  EXPECT_EQ(m->Stats().tracked_requests, 0u) << "forgotten: nothing of it was in flight";
  EXPECT_FALSE(m->RequestFinished("again")) << "unknown now";
}

// RequestSpec: the same tokens under another salt, another adapter or other per-block extras
// are other blocks; with the same ones, the same blocks.
TEST_P(DataPathContract, SaltAdapterAndBlockExtrasKeyOtherBlocks) {
  auto m = Make(Tiers(64));
  ASSERT_NE(m, nullptr);
  MiniEngine engine(m.get(), 64);  // registers G1
  const std::vector<uint32_t> g1 = {0, 1, 2, 3, 4};
  const auto prompt = Prompt(4, kTpb * 4 + 1);
  auto spec = [&](const std::string& id, const std::string& salt, const std::string& adapter) {
    RequestSpec s = Spec(id, prompt);
    s.cache_salt = salt;
    s.adapter_id = adapter;
    return s;
  };
  EXPECT_EQ(CommitWhole(*m, spec("a", "tenant-a", ""), g1), 0u);
  EXPECT_EQ(m->Stats().saved_blocks, 4u);
  EXPECT_EQ(CommitWhole(*m, spec("b", "tenant-b", ""), g1), 0u) << "another tenant";
  EXPECT_EQ(CommitWhole(*m, spec("c", "tenant-a", "lora-1"), g1), 0u) << "another adapter";
  EXPECT_EQ(CommitWhole(*m, spec("d", "", ""), g1), 0u) << "no salt is a tenant too";
  EXPECT_EQ(CommitWhole(*m, spec("e", "tenant-a", ""), g1), kTpb * 4);
  EXPECT_EQ(CommitWhole(*m, spec("f", "tenant-a", "lora-1"), g1), kTpb * 4);
  EXPECT_EQ(m->Stats().saved_blocks, 16u) << "four identities, four blocks each";

  // Prompt embeddings reach the connector as token ids of zeros: the extras tell them apart.
  const std::vector<TokenId> zeros(kTpb * 4 + 1, 0);
  auto extra = [&](const std::string& id, std::vector<std::string> e) {
    RequestSpec s = Spec(id, zeros);
    s.block_extra = std::move(e);
    return s;
  };
  const std::vector<std::string> a = {"emb-a0", "emb-a1", "emb-a2", "emb-a3"};
  std::vector<std::string> b = a;
  b[2] = "emb-b2";
  EXPECT_EQ(CommitWhole(*m, extra("x-a", a), g1), 0u);
  EXPECT_EQ(CommitWhole(*m, extra("x-b", b), g1), kTpb * 2)
      << "only the blocks before the first other extra match";
  EXPECT_EQ(CommitWhole(*m, extra("x-plain", {}), g1), 0u) << "no extras is another prompt";
  EXPECT_EQ(CommitWhole(*m, extra("x-a-again", a), g1), kTpb * 4);
  EXPECT_EQ(m->Stats().pinned_blocks, 0u);
}

// kNoG1Block (a hybrid model's sliding-window group no longer holds the blocks that left its
// window): Commit neither saves nor reuses such a block and still saves the blocks after it;
// a Lookup counts from the block at num_computed_tokens (the blocks before it are the
// engine's); a load stops at the first kNoG1Block in its range, and the ids before its range
// may be kNoG1Block. None of them is refused (as a G1 id past the engine's blocks, say).
TEST_P(DataPathContract, BlocksTheEngineDoesNotHoldAreNeitherSavedNorLoaded) {
  auto m = Make(Tiers(32));
  ASSERT_NE(m, nullptr);
  MiniEngine engine(m.get(), 64);  // registers G1
  const auto prompt = Prompt(21, kTpb * 5 + 1);
  for (uint32_t b = 0; b < 6; ++b) engine.FillBlock(b, static_cast<uint8_t>(0x30 + b));
  EXPECT_EQ(CommitWhole(*m, Spec("holes", prompt), {kNoG1Block, 1, 2, kNoG1Block, 4, 5}), 0u);
  EXPECT_EQ(m->Stats().saved_blocks, 3u) << "blocks 1, 2 and 4 only";
  EXPECT_EQ(m->Stats().dedup_blocks, 0u);
  auto from = [&](const std::string& id, uint32_t block) -> uint32_t {
    Result<LookupResult> r = m->Lookup(Spec(id, prompt), block * kTpb);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    m->RequestFinished(id);
    return r.ok() ? r->num_tokens : 0;
  };
  EXPECT_EQ(from("from-0", 0), 0u) << "block 0 is nowhere";
  EXPECT_EQ(from("from-1", 1), kTpb * 2) << "blocks 1 and 2; 3 is nowhere";
  EXPECT_EQ(from("from-2", 2), kTpb);
  EXPECT_EQ(from("from-3", 3), 0u);
  EXPECT_EQ(from("from-4", 4), kTpb) << "block 4, the last before the prompt's last token";
  EXPECT_EQ(CommitWhole(*m, Spec("whole", prompt), {0, 1, 2, 3, 4, 5}), 0u);
  EXPECT_EQ(m->Stats().saved_blocks, 5u) << "blocks 0 and 3 saved now";
  EXPECT_EQ(m->Stats().dedup_blocks, 3u) << "blocks 1, 2 and 4 were held";

  // Everything is held now. A load into a table with a hole stops at the hole.
  Result<LookupResult> r = m->Lookup(Spec("load", prompt), 0);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->num_tokens, kTpb * 5);
  const std::vector<uint32_t> table = {10, 11, kNoG1Block, 13, 14, 15};
  Result<uint32_t> planned = m->PrepareLoad("load", table, r->num_tokens);
  ASSERT_TRUE(planned.ok()) << planned.status().ToString();
  EXPECT_EQ(*planned, kTpb * 2);
  ASSERT_TRUE(m->StartLoad().ok());
  EXPECT_TRUE(WaitAllLayers(*m).ok());
  EXPECT_EQ(m->LoadedTokens("load"), kTpb * 2);
  EXPECT_EQ(engine.BlockBytes(10), Filled(0x30));
  EXPECT_EQ(engine.BlockBytes(11), Filled(0x31));
  EXPECT_FALSE(m->RequestFinished("load"));
  EXPECT_EQ(m->Stats().pinned_blocks, 0u) << "the blocks past the hole were unpinned";

  // From block 2 (a window's start: the engine holds blocks 0-1 itself, shown as kNoG1Block),
  // with a hole after two blocks: two blocks land, intact.
  r = m->Lookup(Spec("window", prompt), 2 * kTpb);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->num_tokens, kTpb * 3);
  const std::vector<uint32_t> window = {kNoG1Block, kNoG1Block, 20, 21, kNoG1Block, 23};
  planned = m->PrepareLoad("window", window, r->num_tokens);
  ASSERT_TRUE(planned.ok()) << planned.status().ToString();
  EXPECT_EQ(*planned, kTpb * 2);
  ASSERT_TRUE(m->StartLoad().ok());
  EXPECT_TRUE(WaitAllLayers(*m).ok());
  EXPECT_EQ(m->LoadedTokens("window"), kTpb * 2);
  EXPECT_EQ(engine.BlockBytes(20), Filled(0x32));
  EXPECT_EQ(engine.BlockBytes(21), Filled(0x33));
  EXPECT_FALSE(m->RequestFinished("window"));
  EXPECT_EQ(m->Stats().pinned_blocks, 0u);
}

// PrepareLoad returns the tokens that will actually load: fewer than the Lookup offered when
// blocks left kvtier since (a Lookup pins nothing). What it promises lands intact.
TEST_P(DataPathContract, PrepareLoadPromisesOnlyWhatIsStillHeld) {
  auto m = Make(Tiers(4));
  ASSERT_NE(m, nullptr);
  MiniEngine engine(m.get(), 64);
  const auto prompt = Prompt(40, kTpb * 3 + 1);
  engine.Run("a", prompt);
  Result<LookupResult> offered = m->Lookup(Spec("x", prompt), 0);
  ASSERT_TRUE(offered.ok()) << offered.status().ToString();
  ASSERT_EQ(offered->num_tokens, kTpb * 3);
  for (uint32_t i = 1; i <= 4; ++i) engine.Run("f" + std::to_string(i), Prompt(40 + i, kTpb * 3));
  Result<LookupResult> probe = m->Lookup(Spec("probe", prompt), 0);
  ASSERT_TRUE(probe.ok());
  ASSERT_LT(probe->num_tokens, kTpb * 3) << "the fillers did not push the prompt out of G2";
  m->RequestFinished("probe");

  const std::vector<uint32_t> blocks = engine.AllocBlocks(4);
  Result<uint32_t> planned = m->PrepareLoad("x", blocks, offered->num_tokens);
  ASSERT_TRUE(planned.ok()) << planned.status().ToString();
  EXPECT_LE(*planned, probe->num_tokens);
  ASSERT_TRUE(m->StartLoad().ok());
  EXPECT_TRUE(WaitAllLayers(*m).ok());
  EXPECT_EQ(m->LoadedTokens("x"), *planned);
  const std::vector<BlockKey> keys = engine.Keys(prompt);
  std::vector<uint8_t> expect(testing::TestLayout().BlockBytes());
  for (uint32_t i = 0; i < *planned / kTpb; ++i) {
    KeyContent(keys[i], expect.data(), expect.size());
    EXPECT_EQ(engine.BlockBytes(blocks[i]), expect) << "block " << i;
  }
  EXPECT_FALSE(m->RequestFinished("x"));
  engine.FreeBlocks(blocks);
  EXPECT_EQ(m->Stats().pinned_blocks, 0u);
}

// One StartLoad starts every load PrepareLoad bound since the last call: a synchronous one,
// which WaitLayer waits for (its bytes are in G1 once every layer returned), and an
// asynchronous one, which LoadedTokens waits for and Finished().loads_done reports.
TEST_P(DataPathContract, OneStartLoadStartsEveryPreparedLoad) {
  auto m = Make(Tiers(32));
  ASSERT_NE(m, nullptr);
  MiniEngine engine(m.get(), 64);
  const auto sync_prompt = Prompt(50, kTpb * 4 + 1), async_prompt = Prompt(51, kTpb * 4 + 1);
  engine.Run("a", sync_prompt);
  engine.Run("b", async_prompt);
  Result<LookupResult> x = m->Lookup(Spec("x", sync_prompt), 0);
  Result<LookupResult> y = m->Lookup(Spec("y", async_prompt), 0);
  ASSERT_TRUE(x.ok() && y.ok());
  ASSERT_EQ(x->num_tokens, kTpb * 4);
  ASSERT_EQ(y->num_tokens, kTpb * 4);
  const std::vector<uint32_t> bx = engine.AllocBlocks(5), by = engine.AllocBlocks(5);
  for (uint32_t b : bx) engine.FillBlock(b, 0);
  for (uint32_t b : by) engine.FillBlock(b, 0);
  Result<uint32_t> px = m->PrepareLoad("x", bx, x->num_tokens);
  Result<uint32_t> py = m->PrepareLoad("y", by, y->num_tokens, /*async_load=*/true);
  ASSERT_TRUE(px.ok() && py.ok());
  EXPECT_EQ(*px, kTpb * 4);
  EXPECT_EQ(*py, kTpb * 4);
  ASSERT_TRUE(m->StartLoad().ok());
  ASSERT_TRUE(WaitAllLayers(*m).ok());
  std::vector<uint8_t> expect(testing::TestLayout().BlockBytes());
  const std::vector<BlockKey> xk = engine.Keys(sync_prompt), yk = engine.Keys(async_prompt);
  for (uint32_t i = 0; i < 4; ++i) {
    KeyContent(xk[i], expect.data(), expect.size());
    EXPECT_EQ(engine.BlockBytes(bx[i]), expect) << "synchronous block " << i << " after WaitLayer";
  }
  EXPECT_EQ(m->LoadedTokens("y"), kTpb * 4);
  for (uint32_t i = 0; i < 4; ++i) {
    KeyContent(yk[i], expect.data(), expect.size());
    EXPECT_EQ(engine.BlockBytes(by[i]), expect) << "asynchronous block " << i;
  }
  EXPECT_EQ(m->LoadedTokens("x"), kTpb * 4);
  std::vector<std::string> loads_done;
  ASSERT_TRUE(testing::WaitFor([&] {
    for (const std::string& id : m->Finished().loads_done) loads_done.push_back(id);
    return loads_done.size() >= 2;
  })) << "Finished() did not list both loads";
  std::sort(loads_done.begin(), loads_done.end());
  EXPECT_EQ(loads_done, (std::vector<std::string>{"x", "y"}));
  EXPECT_FALSE(m->RequestFinished("x"));
  EXPECT_FALSE(m->RequestFinished("y"));
  engine.FreeBlocks(bx);
  engine.FreeBlocks(by);
  EXPECT_EQ(m->Stats().pinned_blocks, 0u);
}

// Commit keys the full blocks not committed before (tokens are everything so far, step after
// step); blocks G2 already holds count as reuse instead of being saved again.
TEST_P(DataPathContract, CommitSavesEachNewFullBlockOnceAndReusesWhatG2Holds) {
  auto m = Make(Tiers(32));
  ASSERT_NE(m, nullptr);
  MiniEngine engine(m.get(), 64);
  const auto prompt = Prompt(60, kTpb * 4 + 1);
  ASSERT_TRUE(m->Lookup(Spec("r", prompt), 0).ok());
  const std::vector<uint32_t> g1 = engine.AllocBlocks(5);
  ASSERT_TRUE(m->PrepareLoad("r", g1, 0).ok());
  for (uint32_t i = 0; i < 5; ++i) engine.FillBlock(g1[i], static_cast<uint8_t>(0x50 + i));
  const std::span<const TokenId> all(prompt);
  ASSERT_TRUE(m->Commit("r", all.first(kTpb * 2 + 3), g1).ok());  // step 1: two full blocks
  ASSERT_TRUE(m->StartSave().ok());
  m->WaitForSaves();
  EXPECT_EQ(m->Stats().saved_blocks, 2u);
  ASSERT_TRUE(m->Commit("r", all, g1).ok());  // step 2: two more
  ASSERT_TRUE(m->StartSave().ok());
  m->WaitForSaves();
  ASSERT_TRUE(m->Commit("r", all, g1).ok());  // nothing new
  ASSERT_TRUE(m->StartSave().ok());
  m->WaitForSaves();
  ManagerStats s = m->Stats();
  EXPECT_EQ(s.saved_blocks, 4u);
  EXPECT_EQ(s.dedup_blocks, 0u) << "a request's own earlier blocks are not committed again";
  if (m->RequestFinished("r")) {
    EXPECT_TRUE(WaitSavesDone(*m, "r"));
  }
  engine.FreeBlocks(g1);

  // Another request computes the same prompt again (it loads nothing): stored, so reused.
  const std::vector<uint32_t> again = engine.AllocBlocks(5);
  for (uint32_t i = 0; i < 5; ++i) engine.FillBlock(again[i], 0xaa);
  EXPECT_EQ(CommitWhole(*m, Spec("s", prompt), again), kTpb * 4);
  s = m->Stats();
  EXPECT_EQ(s.dedup_blocks, 4u);
  EXPECT_EQ(s.saved_blocks, 4u);
  // What loads is the first request's bytes.
  Result<LookupResult> r = m->Lookup(Spec("t", prompt), 0);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(m->PrepareLoad("t", again, r->num_tokens).ok());
  ASSERT_TRUE(m->StartLoad().ok());
  EXPECT_EQ(m->LoadedTokens("t"), kTpb * 4);
  for (uint32_t i = 0; i < 4; ++i) {
    EXPECT_EQ(engine.BlockBytes(again[i]), Filled(static_cast<uint8_t>(0x50 + i))) << i;
  }
  EXPECT_FALSE(m->RequestFinished("t"));
  engine.FreeBlocks(again);
}

// RequestSpec's load_tiers / store_tiers (kv_transfer_params): where one request may load
// from and store to. Blocks other requests store are not affected.
TEST_P(DataPathContract, RequestTierMasksLimitWhereItLoadsFromAndStoresTo) {
  auto m = Make(Tiers(12, Dir("g3"), 64));  // 8 cache slots in G2
  ASSERT_NE(m, nullptr);
  MiniEngine engine(m.get(), 64);  // registers G1
  const std::vector<uint32_t> g1 = {0, 1, 2, 3, 4};
  constexpr uint8_t kG2 = 1u << kTierG2, kG3 = 1u << kTierG3;
  auto run = [&](const std::string& id, const std::vector<TokenId>& prompt, uint8_t load,
                 uint8_t store) {
    RequestSpec spec = Spec(id, prompt);
    spec.load_tiers = load;
    spec.store_tiers = store;
    return CommitWhole(*m, spec, g1);
  };
  const auto g2_only = Prompt(60, kTpb * 4 + 1), everywhere = Prompt(61, kTpb * 4 + 1);
  const auto no_g2 = Prompt(62, kTpb * 4 + 1);
  const uint64_t saved0 = m->Stats().saved_blocks;
  run("no-g2", no_g2, kAllTiers, kAllTiers & ~kG2);
  EXPECT_EQ(m->Stats().saved_blocks, saved0) << "without G2 nothing is saved";
  run("g2-only", g2_only, kAllTiers, kG2);
  run("everywhere", everywhere, kAllTiers, kAllTiers);
  EXPECT_EQ(m->Stats().saved_blocks, saved0 + 8);
  // Push both out of G2: "everywhere" is demoted to G3, "g2-only" is not.
  for (uint32_t i = 0; i < 4; ++i) {
    run("filler" + std::to_string(i), Prompt(70 + i, kTpb * 4 + 1), kAllTiers, kG2);
  }
  m->WaitForSaves();
  EXPECT_EQ(run("g2-only-again", g2_only, kAllTiers, kAllTiers), 0u) << "never written to G3";
  EXPECT_EQ(run("no-g3-load", everywhere, kG2, kAllTiers), 0u) << "its blocks are in G3 only";
  EXPECT_EQ(run("g3-load", everywhere, kG2 | kG3, kAllTiers), kTpb * 4);
  EXPECT_EQ(run("no-load", everywhere, 0, kAllTiers), 0u) << "load_tiers none: a lookup only";
  EXPECT_EQ(m->Stats().pinned_blocks, 0u);
}

// G2's victims go to G3 (WaitForSaves waits for those demotions too); a prefix G3 alone holds
// is planned whole (staged through G2) and loads byte for byte.
TEST_P(DataPathContract, G2VictimsGoToG3AndLoadBackByteExact) {
  auto m = Make(Tiers(12, Dir("g3"), 64));  // 4 staging slots, 8 for the cache
  ASSERT_NE(m, nullptr);
  MiniEngine engine(m.get(), 64);
  const auto first = Prompt(20, kTpb * 4 + 1);
  engine.Run("p0", first);
  for (uint32_t i = 1; i <= 6; ++i)
    engine.Run("p" + std::to_string(i), Prompt(20 + i, kTpb * 4 + 1));
  m->WaitForSaves();
  ManagerStats s = m->Stats();
  EXPECT_GT(s.demoted_blocks, 0u);
  EXPECT_GT(s.evicted_blocks_g2, 0u);
  EXPECT_EQ(s.g2_blocks + s.g2_free_slots + s.g2_staging_slots, s.g2_slots) << "no G2 slot leaked";
  Result<LookupResult> probe = m->Lookup(Spec("probe", first), 0);
  ASSERT_TRUE(probe.ok());
  EXPECT_EQ(probe->blocks_by_tier[kTierG3], 4u) << "the first prompt is in G3 alone";
  m->RequestFinished("probe");
  auto back = engine.Run("again", first);
  EXPECT_EQ(back.planned_tokens, kTpb * 4) << "G3 loads stage through the reserve";
  EXPECT_EQ(back.loaded_tokens, back.planned_tokens);
  EXPECT_EQ(back.mismatched_blocks, 0u);
  s = m->Stats();
  EXPECT_GT(s.hit_blocks[kTierG3], 0u);
  // Not checked: promoted_blocks. Whether a G3 load stays in G2 (promoted) depends on a free
  // cache slot at that moment, else it is staged through the reserve (block_manager_impl.h);
  // under ASan on a busy machine it was 0 once. block_manager_test checks promotion itself.
  EXPECT_EQ(s.pinned_blocks, 0u);
}

INSTANTIATE_TEST_SUITE_P(BothModes, DataPathContract,
                         ::testing::Values(Mode::kEmbedded, Mode::kAttached), ModeName);

}  // namespace
}  // namespace kvtier::contract

// The BlockManager contract (include/kvtier/connector.h), a request's life and the errors, over
// both implementations (contract_fixture.h): Create, RegisterDeviceMemory, RequestFinished and
// Finished, WaitForRequestSaves, the idle-request sweep, the ordering calls' refusals, and the
// error each call returns for bad arguments.
#include <filesystem>
#include <string>
#include <vector>

#include "contract_fixture.h"

namespace kvtier::contract {
namespace {

using testing::KeyContent;
using testing::MiniEngine;
using testing::Prompt;

constexpr uint32_t kTpb = 16;  // testing::TestLayout()'s tokens per block

class RequestContract : public BlockManagerContract {};

// Create: InvalidArgument for a bad layout or an empty model id (attached too, before it
// reaches for the daemon); a manager made keeps the layout it was given and says which it is.
TEST_P(RequestContract, CreateRefusesABadLayoutOrModelIdAndKeepsItsLayout) {
  ManagerOptions bad = Options(Tiers(8));
  bad.model_id = "";
  EXPECT_EQ(BlockManager::Create(bad).status().code(), StatusCode::kInvalidArgument);
  bad.model_id = "m";
  bad.layout.tokens_per_block = KvLayout::kMaxTokensPerBlock + 1;
  EXPECT_EQ(BlockManager::Create(bad).status().code(), StatusCode::kInvalidArgument);
  bad.layout = testing::TestLayout();
  bad.layout.num_layers = 0;
  EXPECT_EQ(BlockManager::Create(bad).status().code(), StatusCode::kInvalidArgument);

  auto m = Make(Tiers(8));
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->attached(), attached());
  const KvLayout want = testing::TestLayout();
  EXPECT_EQ(m->layout().Fingerprint(), want.Fingerprint());
  EXPECT_EQ(m->layout().num_layers, want.num_layers);
  EXPECT_EQ(m->layout().tokens_per_block, want.tokens_per_block);
  EXPECT_EQ(m->layout().g1_arrangement, want.g1_arrangement);
}

// Each call's error for bad arguments; unknown request ids answer as the contract says.
TEST_P(RequestContract, BadArgumentsGetTheirErrors) {
  auto m = Make(Tiers(8));
  ASSERT_NE(m, nullptr);
  MiniEngine engine(m.get(), 16);
  const auto prompt = Prompt(80, 40);  // 2 full blocks and 8 tokens
  EXPECT_EQ(m->Lookup(Spec("", prompt), 0).status().code(), StatusCode::kInvalidArgument)
      << "an empty request id";
  Result<LookupResult> misaligned = m->Lookup(Spec("x", prompt), 5);
  EXPECT_EQ(misaligned.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(misaligned.status().message().find("multiple"), std::string::npos)
      << misaligned.status().ToString();
  const std::vector<uint32_t> g1 = {0, 1, 2};
  EXPECT_EQ(m->PrepareLoad("nobody", g1, 0).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(m->Commit("nobody", prompt, g1).code(), StatusCode::kNotFound);
  EXPECT_FALSE(m->RequestFinished("nobody"));
  EXPECT_EQ(m->LoadedTokens("nobody"), 0u);
  m->WaitForRequestSaves("nobody");  // returns at once
  ASSERT_TRUE(m->Lookup(Spec("x", prompt), 0).ok());
  EXPECT_EQ(m->PrepareLoad("x", g1, kTpb).status().code(), StatusCode::kInvalidArgument)
      << "more than Lookup offered";
  EXPECT_EQ(m->Commit("x", prompt, std::vector<uint32_t>{0}).code(), StatusCode::kInvalidArgument)
      << "two full blocks, one G1 id";
  EXPECT_EQ(m->WaitLayer(m->layout().num_layers).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m->WaitLayer(99).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m->LoadedTokens("x"), 0u) << "none planned";
  EXPECT_FALSE(m->RequestFinished("x"));

  // Too few G1 ids for what the Lookup offered.
  engine.Run("a", prompt);
  Result<LookupResult> found = m->Lookup(Spec("y", prompt), 0);
  ASSERT_TRUE(found.ok());
  ASSERT_EQ(found->num_tokens, 2 * kTpb);
  EXPECT_EQ(m->PrepareLoad("y", std::vector<uint32_t>{5}, found->num_tokens).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_FALSE(m->RequestFinished("y"));
  EXPECT_EQ(m->Stats().pinned_blocks, 0u);
}

// RegisterDeviceMemory refuses a G1 of another layout; the ordering calls need a device G1:
// FailedPrecondition before any G1 is registered, InvalidArgument for a host G1, and the host
// G1's saves are started all the same.
TEST_P(RequestContract, RegisterDeviceMemoryAndTheOrderingCallsRefuseWhatTheyCannotDo) {
  auto m = Make(Tiers(16));
  ASSERT_NE(m, nullptr);
  constexpr uintptr_t kStream = 0x1234;
  Status s = m->StartSave(kStream);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  s = m->StartLoad(kStream);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();

  // A G1 of another layout (two layers, not four).
  KvLayout other = testing::TestLayout();
  other.num_layers = 2;
  other.g1_arrangement = G1Arrangement::kBlockContiguous;
  std::vector<uint8_t> other_bytes(other.BlockBytes() * 4);
  G1Memory wrong;
  wrong.layout = other;
  wrong.num_blocks = 4;
  wrong.regions = {G1Region{other_bytes.data(), other.BlockBytes()}};
  ASSERT_TRUE(wrong.Validate().ok());
  s = m->RegisterDeviceMemory(wrong);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();

  // Device memory with no CUDA device to reach it: Unavailable. (Where a GPU exists, device
  // G1s are cuda_backend_test's.)
  if (!std::filesystem::exists("/dev/nvidiactl")) {
    const KvLayout l = testing::TestLayout();  // layer-separate: a region per layer and plane
    std::vector<uint8_t> bytes(l.BlockBytes() * 4);
    G1Memory device;
    device.layout = l;
    device.num_blocks = 4;
    device.on_device = true;
    for (uint32_t r = 0; r < l.num_layers * l.num_planes; ++r) {
      device.regions.push_back({bytes.data() + r * l.ChunkBytes() * 4, l.ChunkBytes()});
    }
    ASSERT_TRUE(device.Validate().ok());
    s = m->RegisterDeviceMemory(device);
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  }

  MiniEngine engine(m.get(), 16);  // a host G1: registered
  s = m->StartSave(0);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  s = m->StartLoad(kStream);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  const auto prompt = Prompt(6, kTpb * 4 + 1);
  ASSERT_TRUE(m->Lookup(Spec("a", prompt), 0).ok());
  const std::vector<uint32_t> blocks = engine.AllocBlocks(5);
  ASSERT_TRUE(m->PrepareLoad("a", blocks, 0).ok());
  ASSERT_TRUE(m->Commit("a", prompt, blocks).ok());
  EXPECT_EQ(m->StartSave(kStream).code(), StatusCode::kInvalidArgument);
  m->WaitForSaves();
  EXPECT_EQ(m->Stats().saved_blocks, 4u) << "started all the same";
  if (m->RequestFinished("a")) {
    EXPECT_TRUE(WaitSavesDone(*m, "a"));
  }
}

// RequestFinished is true while saves still read the request's G1 blocks (queued, not
// started): the engine keeps them until Finished() lists the request in saves_done; then the
// request is forgotten.
TEST_P(RequestContract, RequestFinishedHoldsG1BlocksUntilSavesEnd) {
  auto m = Make(Tiers(32));
  ASSERT_NE(m, nullptr);
  MiniEngine engine(m.get(), 64);
  const auto prompt = Prompt(50, kTpb * 3 + 1);
  const std::vector<uint32_t> g1 = {0, 1, 2, 3};
  ASSERT_TRUE(m->Lookup(Spec("r", prompt), 0).ok());
  ASSERT_TRUE(m->PrepareLoad("r", g1, 0).ok());
  ASSERT_TRUE(m->StartLoad().ok());
  ASSERT_TRUE(m->Commit("r", prompt, g1).ok());
  EXPECT_TRUE(m->RequestFinished("r")) << "its saves are queued, not started";
  EXPECT_TRUE(m->Finished().saves_done.empty());
  ASSERT_TRUE(m->StartSave().ok());
  m->WaitForSaves();
  EXPECT_EQ(m->Finished().saves_done, std::vector<std::string>{"r"});
  EXPECT_FALSE(m->RequestFinished("r")) << "forgotten once reported";
  EXPECT_EQ(m->Stats().saved_blocks, 3u);
  EXPECT_EQ(m->Stats().tracked_requests, 0u);
}

// A request finished right after its load started: RequestFinished answers about saves only
// (none: false); Finished().loads_done lists the request once its load ended, once, and its
// blocks are written then (the engine may free them); the entry is gone by the next
// Finished(), with no pin left. (Whether the load is still in flight at RequestFinished is up
// to the machine; block_manager_test holds one in flight with a stalled G3 to check that
// LoadedTokens still answers in the step that lists it.)
TEST_P(RequestContract, ARequestFinishedAfterItsLoadStartedIsListedOnceThenForgotten) {
  auto m = Make(Tiers(32));
  ASSERT_NE(m, nullptr);
  MiniEngine engine(m.get(), 64);
  const auto prompt = Prompt(81, kTpb * 4 + 1);
  engine.Run("a", prompt);
  Result<LookupResult> r = m->Lookup(Spec("x", prompt), 0);
  ASSERT_TRUE(r.ok());
  const std::vector<uint32_t> blocks = engine.AllocBlocks(5);
  Result<uint32_t> planned = m->PrepareLoad("x", blocks, r->num_tokens);
  ASSERT_TRUE(planned.ok()) << planned.status().ToString();
  ASSERT_EQ(*planned, kTpb * 4);
  ASSERT_TRUE(m->StartLoad().ok());
  EXPECT_FALSE(m->RequestFinished("x")) << "no save reads its blocks; the load is not a save";

  std::vector<std::string> loads_done, saves_done;
  ASSERT_TRUE(testing::WaitFor([&] {
    FinishedRequests f = m->Finished();
    loads_done.insert(loads_done.end(), f.loads_done.begin(), f.loads_done.end());
    saves_done.insert(saves_done.end(), f.saves_done.begin(), f.saves_done.end());
    return !loads_done.empty();
  }));
  EXPECT_EQ(loads_done, std::vector<std::string>{"x"});
  EXPECT_TRUE(saves_done.empty()) << "RequestFinished said false: no saves_done to wait for";
  const std::vector<BlockKey> keys = engine.Keys(prompt);
  std::vector<uint8_t> expect(testing::TestLayout().BlockBytes());
  for (uint32_t i = 0; i < 4; ++i) {
    KeyContent(keys[i], expect.data(), expect.size());
    EXPECT_EQ(engine.BlockBytes(blocks[i]), expect) << "block " << i;
  }
  engine.FreeBlocks(blocks);
  EXPECT_TRUE(m->Finished().loads_done.empty()) << "listed once";
  const ManagerStats s = m->Stats();
  EXPECT_EQ(s.pinned_blocks, 0u);
  EXPECT_EQ(s.tracked_requests, 0u) << "no request entry left";
  EXPECT_EQ(m->LoadedTokens("x"), 0u) << "forgotten";
}

// vLLM preemption: WaitForRequestSaves drops the request's saves that have not started
// (queued for StartSave: counted as dropped_saves), and kvtier never reads those G1 blocks
// again; another request's queued saves are neither dropped nor waited for.
TEST_P(RequestContract, WaitForRequestSavesDropsOnlyThatRequestsUnstartedSaves) {
  auto m = Make(Tiers(32));
  ASSERT_NE(m, nullptr);
  MiniEngine engine(m.get(), 64);
  const auto preempted = Prompt(102, kTpb * 4 + 1), other = Prompt(103, kTpb * 4 + 1);
  auto commit = [&](const std::string& id, const std::vector<TokenId>& prompt) {
    EXPECT_TRUE(m->Lookup(Spec(id, prompt), 0).ok());
    const std::vector<uint32_t> blocks = engine.AllocBlocks(5);
    EXPECT_TRUE(m->PrepareLoad(id, blocks, 0).ok());
    for (uint32_t b : blocks) engine.FillBlock(b, 0x77);
    EXPECT_TRUE(m->Commit(id, prompt, blocks).ok());
    return blocks;
  };
  const std::vector<uint32_t> pb = commit("p", preempted), ob = commit("o", other);
  const ManagerStats before = m->Stats();
  const auto t0 = std::chrono::steady_clock::now();
  m->WaitForRequestSaves("p");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(m->Stats().dropped_saves, before.dropped_saves + 4) << "its 4 queued saves";
  for (uint32_t b : pb) engine.FillBlock(b, 0xee);  // the engine reuses its blocks at once
  EXPECT_FALSE(m->RequestFinished("p")) << "no save of it is left";

  ASSERT_TRUE(m->StartSave().ok());
  m->WaitForSaves();
  EXPECT_EQ(m->Stats().saved_blocks, before.saved_blocks + 4) << "the other request's 4";
  if (m->RequestFinished("o")) {
    EXPECT_TRUE(WaitSavesDone(*m, "o"));
  }
  Result<LookupResult> gone = m->Lookup(Spec("check-p", preempted), 0);
  ASSERT_TRUE(gone.ok());
  EXPECT_EQ(gone->num_tokens, 0u) << "nothing of the preempted request was stored";
  m->RequestFinished("check-p");
  Result<LookupResult> kept = m->Lookup(Spec("check-o", other), 0);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->num_tokens, kTpb * 4);
  m->RequestFinished("check-o");
  engine.FreeBlocks(pb);
  engine.FreeBlocks(ob);
  EXPECT_EQ(m->Stats().pinned_blocks, 0u);
}

// A Lookup whose request the engine never finishes is dropped after
// manager.idle_request_ttl_ms without a call for it (expired_requests); one called for since
// stays.
TEST_P(RequestContract, LookupsNeverFinishedExpireAfterTheIdleTtl) {
  Settings settings = Tiers(32);
  settings.push_back({"manager.idle_request_ttl_ms", "300"});
  auto m = Make(settings);
  ASSERT_NE(m, nullptr);
  MiniEngine engine(m.get(), 64);
  constexpr uint32_t kOrphans = 20;
  for (uint32_t i = 0; i < kOrphans; ++i) {
    const auto prompt = Prompt(110 + i, kTpb * 2 + 1);
    ASSERT_TRUE(m->Lookup(Spec("orphan" + std::to_string(i), prompt), 0).ok());
  }
  const auto busy_prompt = Prompt(109, kTpb * 2 + 1);
  ASSERT_TRUE(m->Lookup(Spec("busy", busy_prompt), 0).ok());
  const std::vector<uint32_t> blocks = engine.AllocBlocks(3);
  ASSERT_TRUE(m->PrepareLoad("busy", blocks, 0).ok());
  EXPECT_EQ(m->Stats().tracked_requests, kOrphans + 1);

  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  // The busy request is called for again; then any Lookup sweeps.
  ASSERT_TRUE(m->Commit("busy", busy_prompt, blocks).ok());
  ASSERT_TRUE(m->StartSave().ok());
  const auto next_prompt = Prompt(108, kTpb * 2 + 1);
  ASSERT_TRUE(m->Lookup(Spec("next", next_prompt), 0).ok());
  const ManagerStats s = m->Stats();
  EXPECT_EQ(s.expired_requests, kOrphans);
  EXPECT_EQ(s.tracked_requests, 2u) << "busy and next";
  EXPECT_EQ(m->PrepareLoad("orphan0", blocks, 0).status().code(), StatusCode::kNotFound);
  m->WaitForSaves();
  if (m->RequestFinished("busy")) {
    EXPECT_TRUE(WaitSavesDone(*m, "busy"));
  }
  EXPECT_FALSE(m->RequestFinished("next"));
  EXPECT_EQ(m->Stats().tracked_requests, 0u);
  engine.FreeBlocks(blocks);
}

INSTANTIATE_TEST_SUITE_P(BothModes, RequestContract,
                         ::testing::Values(Mode::kEmbedded, Mode::kAttached), ModeName);

}  // namespace
}  // namespace kvtier::contract

// The engine on kvtier with every local tier: a prefix loaded from G2 or from G3 (after a warm
// restart) gives the recompute-only logits (within 1e-4 relative) and greedy continuation, on
// models of several shapes (16- and 64-token blocks, GQA ratios, depths, fp32 and bf16 KV);
// a load that fails
// verification falls back to recompute and still gives the same answer; and a long
// conversation plus others, together larger than G1, reuse their whole prefix every turn.
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/engine.h"
#include "engine_test_util.h"
#include "kvtier/connector.h"

namespace kvtier::engine {
namespace {

using testing::RelativeError;
using testing::TempDir;
using testing::Tokens;

struct Shape {
  const char* name;
  LlamaConfig config;
  uint32_t tpb;
  DType kv = DType::kFp32;
};

std::vector<Shape> Shapes() {
  LlamaConfig wide;
  wide.num_layers = 4;
  wide.dim = 128;
  wide.num_heads = 8;
  wide.num_kv_heads = 2;
  wide.head_dim = 16;
  wide.ffn_dim = 192;
  wide.rope_dim = 8;
  LlamaConfig mha;  // no grouping: kv heads = heads
  mha.num_layers = 3;
  mha.num_heads = 4;
  mha.num_kv_heads = 4;
  return {{"default_16", LlamaConfig{}, 16},
          {"gqa4_64", wide, 64},
          {"mha_32", mha, 32},
          {"gqa4_64_bf16", wide, 64, DType::kBf16},
          {"default_16_bf16", LlamaConfig{}, 16, DType::kBf16}};
}

// A manager with G2 of g2_blocks blocks and, when g3_dir is set, G3 there.
std::unique_ptr<BlockManager> MakeManager(const KvLayout& layout, uint64_t g2_blocks,
                                          const std::string& g3_dir) {
  ManagerOptions o = testing::EngineManagerOptions(layout, g2_blocks);
  const uint64_t slot = 4096 + layout.BlockBytes();
  EXPECT_TRUE(o.config.Set("g2.staging_slots", "4").ok());
  // A save that finds G2 full waits for a demotion to free a slot, up to max_defer_ms, then is
  // dropped. These tests assert that saves wait rather than drop; on a loaded machine (CI, or
  // 2 cores shared with other builds) a demotion to G3 can take longer than the 500 ms default,
  // which dropped 8 saves in 2 of 4 runs beside 4 busy processes. The bound itself is tested in
  // block_manager_test.
  EXPECT_TRUE(o.config.Set("transfer.max_defer_ms", "20000").ok());
  if (g3_dir.empty()) {
    EXPECT_TRUE(o.config.Set("g3.enabled", "false").ok());
  } else {
    EXPECT_TRUE(o.config.Set("g3.dir", g3_dir).ok());
    EXPECT_TRUE(o.config.Set("g3.capacity_bytes", std::to_string(256 * slot + (1 << 20))).ok());
    EXPECT_TRUE(o.config.Set("g3.admit_min_seen", "1").ok());
  }
  return testing::CreateManager(o);
}

void ExpectSameResult(const RequestOutcome& got, const RequestOutcome& want) {
  EXPECT_LT(RelativeError(got.prompt_logits, want.prompt_logits), 1e-4);
  EXPECT_EQ(got.generated, want.generated);
}

class EngineTiersTest : public ::testing::TestWithParam<Shape> {};

// Run A computes and commits; kvtier restarts (G2 written to G3 at the clean shutdown, recovered
// by the new process); run B loads the whole prefix from G3, then run C from G2 (promoted).
TEST_P(EngineTiersTest, PrefixFromG3AndG2MatchesRecompute) {
  const Shape& shape = GetParam();
  const uint32_t tpb = shape.tpb;
  auto model = LlamaModel::Random(shape.config, 77);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const KvLayout layout = (*model)->MakeKvLayout(tpb, shape.kv);
  TempDir dir;
  const auto prompt = Tokens(4 * tpb + 5, 11, shape.config.vocab_size);
  auto recompute = Engine::Create(model->get(), nullptr, 16, tpb, shape.kv);
  ASSERT_TRUE(recompute.ok());
  auto ref = (*recompute)->Run({"ref", prompt, "", "", {}}, 12, -1);
  ASSERT_TRUE(ref.ok());
  {
    auto manager = MakeManager(layout, 32, dir.path());
    auto engine = Engine::Create(model->get(), manager.get(), 16, tpb, shape.kv);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    auto a = (*engine)->Run({"a", prompt, "", "", {}}, 12, -1);
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(a->loaded_tokens, 0u);
    ExpectSameResult(*a, *ref);
    (*engine)->ReleaseFinished(true);
    EXPECT_EQ(manager->Stats().g3_blocks, 0u) << "everything is still in G2 before the restart";
  }
  auto manager = MakeManager(layout, 32, dir.path());
  auto engine = Engine::Create(model->get(), manager.get(), 16, tpb, shape.kv);
  ASSERT_TRUE(engine.ok());
  auto b = (*engine)->Run({"b", prompt, "", "", {}}, 12, -1);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->loaded_tokens, 4 * tpb);
  EXPECT_EQ(b->computed_tokens, 5u);
  EXPECT_EQ(manager->Stats().hit_blocks[kTierG3], 4u);
  ExpectSameResult(*b, *ref);
  (*engine)->ReleaseFinished(true);

  auto c = (*engine)->Run({"c", prompt, "", "", {}}, 12, -1);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->loaded_tokens, 4 * tpb);
  EXPECT_EQ(manager->Stats().hit_blocks[kTierG2], 4u) << "the G3 load promoted the blocks";
  ExpectSameResult(*c, *ref);
  (*engine)->ReleaseFinished(true);
  EXPECT_EQ(manager->Stats().pinned_blocks, 0u);
}

// Every G3 payload is damaged on disk after the restart: the planned load fails verification,
// the engine recomputes from what arrived intact, and the answer is still the recompute one.
TEST_P(EngineTiersTest, FailedLoadFallsBackToRecomputeWithTheSameAnswer) {
  const Shape& shape = GetParam();
  const uint32_t tpb = shape.tpb;
  auto model = LlamaModel::Random(shape.config, 78);
  ASSERT_TRUE(model.ok());
  const KvLayout layout = (*model)->MakeKvLayout(tpb, shape.kv);
  TempDir dir;
  const auto prompt = Tokens(3 * tpb + 2, 12, shape.config.vocab_size);
  auto recompute = Engine::Create(model->get(), nullptr, 16, tpb, shape.kv);
  ASSERT_TRUE(recompute.ok());
  auto ref = (*recompute)->Run({"ref", prompt, "", "", {}}, 8, -1);
  ASSERT_TRUE(ref.ok());
  {
    auto manager = MakeManager(layout, 32, dir.path());
    auto engine = Engine::Create(model->get(), manager.get(), 16, tpb, shape.kv);
    ASSERT_TRUE(engine.ok());
    ASSERT_TRUE((*engine)->Run({"a", prompt, "", "", {}}, 8, -1).ok());
    (*engine)->ReleaseFinished(true);
  }
  // Damage the payload of every slot in the G3 files (headers stay valid: the damage is only
  // found by the payload checksum, during the load).
  const uint64_t stride = (4096 + layout.BlockBytes() + 4095) / 4096 * 4096;
  int damaged = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir.path())) {
    if (f.path().extension() != ".kvt") continue;
    const int fd = ::open(f.path().c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    for (uint64_t k = 0; k < 256; ++k) {
      const uint8_t junk[8] = {0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4};
      if (::pwrite(fd, junk, sizeof(junk), 8192 + k * stride + 4096 + 64) == sizeof(junk))
        ++damaged;
    }
    ::close(fd);
  }
  ASSERT_GT(damaged, 0);
  auto manager = MakeManager(layout, 32, dir.path());
  auto engine = Engine::Create(model->get(), manager.get(), 16, tpb, shape.kv);
  ASSERT_TRUE(engine.ok());
  auto b = (*engine)->Run({"b", prompt, "", "", {}}, 8, -1);
  ASSERT_TRUE(b.ok()) << "a failed load is not an error: " << b.status().ToString();
  EXPECT_EQ(b->offered_tokens, 3 * tpb) << "the restart recovered the (valid) headers";
  EXPECT_EQ(b->loaded_tokens, 0u);
  EXPECT_EQ(b->computed_tokens, prompt.size());
  ExpectSameResult(*b, *ref);
  (*engine)->ReleaseFinished(true);
  const ManagerStats s = manager->Stats();
  EXPECT_GT(s.corrupt_blocks, 0u);
  EXPECT_GT(s.load_failures, 0u);
  EXPECT_EQ(s.hit_blocks[kTierG3], 0u);
  EXPECT_EQ(s.pinned_blocks, 0u);
}

// bf16 KV really is bf16: half the bytes per block, and logits close to (not equal to) fp32 KV's.
TEST(EngineTiersBf16Test, Bf16KvIsHalfTheBytesAndCloseToFp32) {
  auto model = LlamaModel::Random(LlamaConfig{}, 80);
  ASSERT_TRUE(model.ok());
  EXPECT_EQ((*model)->MakeKvLayout(16, DType::kBf16).BlockBytes() * 2,
            (*model)->MakeKvLayout(16).BlockBytes());
  const auto prompt = Tokens(50, 13, LlamaConfig{}.vocab_size);
  auto fp32 = Engine::Create(model->get(), nullptr, 8, 16);
  auto bf16 = Engine::Create(model->get(), nullptr, 8, 16, DType::kBf16);
  ASSERT_TRUE(fp32.ok() && bf16.ok());
  auto a = (*fp32)->Run({"a", prompt, "", "", {}}, 1, -1);
  auto b = (*bf16)->Run({"b", prompt, "", "", {}}, 1, -1);
  ASSERT_TRUE(a.ok() && b.ok());
  const double err = RelativeError(b->prompt_logits, a->prompt_logits);
  EXPECT_GT(err, 0.0) << "bf16 KV rounds: the logits cannot be bit-equal";
  EXPECT_LT(err, 0.05);
  EXPECT_FALSE(Engine::Create(model->get(), nullptr, 8, 16, DType::kFp16).ok())
      << "fp16 KV is refused with a clear error";
}

// A prefix from G1: the engine keeps a conversation's KV in G1 between turns (a session), so
// the next turn tells kvtier that many tokens are computed already (Lookup's
// num_computed_tokens), kvtier offers only what follows, and the result equals recompute. Then
// the session is lost (another engine, same manager): the same turn loads from kvtier instead,
// with the same answer.
TEST(EngineTiersG1Test, PrefixKeptInG1MatchesRecomputeAndKvtierLoadsOnlyWhatFollows) {
  constexpr uint32_t kTpb = 16;
  auto model = LlamaModel::Random(LlamaConfig{}, 81);
  ASSERT_TRUE(model.ok());
  TempDir dir;
  auto manager = MakeManager((*model)->MakeKvLayout(kTpb), 64, dir.path());
  auto engine = Engine::Create(model->get(), manager.get(), 32, kTpb);
  auto recompute = Engine::Create(model->get(), nullptr, 32, kTpb);
  ASSERT_TRUE(engine.ok() && recompute.ok());
  auto conv = Tokens(3 * kTpb + 7, 21, LlamaConfig{}.vocab_size);
  auto t1 = (*engine)->Run({"t1", conv, "", "", {}}, 10, -1, "user-1");
  ASSERT_TRUE(t1.ok()) << t1.status().ToString();
  EXPECT_EQ(t1->g1_reused_tokens, 0u);
  (*engine)->ReleaseFinished(true);
  conv.insert(conv.end(), t1->generated.begin(), t1->generated.end() - 1);
  const auto more = Tokens(20, 22, LlamaConfig{}.vocab_size);
  conv.insert(conv.end(), more.begin(), more.end());
  const uint32_t kept = (3 * kTpb + 7 + 10 - 1) / kTpb * kTpb;  // block-aligned, in G1

  auto t2 = (*engine)->Run({"t2", conv, "", "", {}}, 8, -1, "user-1");
  ASSERT_TRUE(t2.ok()) << t2.status().ToString();
  EXPECT_EQ(t2->g1_reused_tokens, kept);
  EXPECT_EQ(t2->loaded_tokens, 0u) << "kvtier loads nothing the engine still holds";
  EXPECT_EQ(t2->computed_tokens, conv.size() - kept);
  auto ref = (*recompute)->Run({"ref", conv, "", "", {}}, 8, -1);
  ASSERT_TRUE(ref.ok());
  ExpectSameResult(*t2, *ref);
  (*engine)->ReleaseFinished(true);

  // A different engine (no session): the committed prefix now comes from kvtier.
  engine->reset();
  auto other = Engine::Create(model->get(), manager.get(), 32, kTpb);
  ASSERT_TRUE(other.ok());
  auto t3 = (*other)->Run({"t3", conv, "", "", {}}, 8, -1, "user-1");
  ASSERT_TRUE(t3.ok());
  EXPECT_EQ(t3->g1_reused_tokens, 0u);
  EXPECT_GE(t3->loaded_tokens, kept);
  ExpectSameResult(*t3, *ref);
  (*other)->ReleaseFinished(true);
  EXPECT_EQ(manager->Stats().pinned_blocks, 0u);
}

INSTANTIATE_TEST_SUITE_P(Shapes, EngineTiersTest, ::testing::ValuesIn(Shapes()),
                         [](const auto& info) { return std::string(info.param.name); });

// One long conversation and three short ones take turns; together they need far more KV than
// G1 holds (G1 holds one conversation at a time) and more than G2 holds, so blocks move through
// G2 and G3. Every returning turn loads its whole committed prefix (nothing recomputed but the
// new message and the unfinished tail block), and its answer equals recompute.
TEST(EngineTiersLongContextTest, EveryReturningTurnReusesItsWholePrefix) {
  constexpr uint32_t kTpb = 16;
  LlamaConfig c;
  c.num_layers = 2;
  auto model = LlamaModel::Random(c, 79);
  ASSERT_TRUE(model.ok());
  const KvLayout layout = (*model)->MakeKvLayout(kTpb);
  TempDir dir;
  constexpr uint32_t kG1Blocks = 80;  // the long conversation reaches ~72 blocks
  auto manager = MakeManager(layout, 48, dir.path());
  auto engine = Engine::Create(model->get(), manager.get(), kG1Blocks, kTpb);
  auto recompute = Engine::Create(model->get(), nullptr, kG1Blocks, kTpb);
  ASSERT_TRUE(engine.ok() && recompute.ok());

  const std::vector<uint32_t> first_len = {900, 150, 150, 150};  // tokens of the first turn
  std::vector<std::vector<TokenId>> convs(first_len.size());
  std::vector<uint32_t> committed(first_len.size(), 0);  // tokens committed by the last turn
  uint64_t total_tokens = 0;
  for (uint32_t turn = 0; turn < 3; ++turn) {
    for (uint32_t u = 0; u < convs.size(); ++u) {
      SCOPED_TRACE("conversation " + std::to_string(u) + " turn " + std::to_string(turn));
      const auto msg = Tokens(turn == 0 ? first_len[u] : 40, 100 * u + turn, c.vocab_size);
      convs[u].insert(convs[u].end(), msg.begin(), msg.end());
      const std::string id = "c" + std::to_string(u) + "t" + std::to_string(turn);
      auto out = (*engine)->Run({id, convs[u], "", "", {}}, 6, -1);
      ASSERT_TRUE(out.ok()) << out.status().ToString();
      auto ref = (*recompute)->Run({id + "-ref", convs[u], "", "", {}}, 6, -1);
      ASSERT_TRUE(ref.ok());
      ExpectSameResult(*out, *ref);
      if (turn > 0) {
        EXPECT_EQ(out->loaded_tokens, committed[u] / kTpb * kTpb)
            << "the whole committed prefix was loaded";
        EXPECT_LE(out->computed_tokens, 40u + kTpb);
      }
      (*engine)->ReleaseFinished(true);
      // The answer joins the conversation; the last generated token was never fed back, so
      // the committed tokens are the prompt plus all generated tokens but the last.
      committed[u] = static_cast<uint32_t>(convs[u].size() + out->generated.size() - 1);
      convs[u].insert(convs[u].end(), out->generated.begin(), out->generated.end() - 1);
    }
  }
  for (const auto& conv : convs) total_tokens += conv.size();
  ASSERT_GT(total_tokens / kTpb, uint64_t{kG1Blocks}) << "the conversations exceed G1";
  const ManagerStats s = manager->Stats();
  EXPECT_GT(s.hit_blocks[kTierG3], 0u) << "some prefixes came back from G3";
  EXPECT_GT(s.hit_blocks[kTierG2], 0u);
  EXPECT_EQ(s.load_failures, 0u);
  EXPECT_EQ(s.dropped_saves, 0u) << "saves wait for G2 slots freed by demotion, not dropped";
  EXPECT_GT(s.staged_via_pool, 0u) << "G3 loads larger than the staging pool reused its slots";
  EXPECT_EQ(s.pinned_blocks, 0u);
}

}  // namespace
}  // namespace kvtier::engine

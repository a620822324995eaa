// The engine on kvtier's connector API: a prefix loaded from G2 gives the same logits and
// greedy continuation as recomputing it.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "engine_test_util.h"
#include "kvtier/connector.h"

namespace kvtier::engine {
namespace {

using testing::RelativeError;
using testing::Tokens;

constexpr uint32_t kTpb = 16;

std::unique_ptr<BlockManager> MakeManager(const KvLayout& layout, uint64_t g2_blocks) {
  ManagerOptions o = testing::EngineManagerOptions(layout, g2_blocks);
  EXPECT_TRUE(o.config.Set("g3.enabled", "false").ok());
  return testing::CreateManager(o);
}

struct Fixture {
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<BlockManager> manager;
  std::unique_ptr<Engine> with_kvtier;
  std::unique_ptr<Engine> recompute;

  explicit Fixture(const LlamaConfig& c) {
    model = std::move(LlamaModel::Random(c, 2024).value());
    manager = MakeManager(model->MakeKvLayout(kTpb), 64);
    with_kvtier = std::move(Engine::Create(model.get(), manager.get(), 32, kTpb).value());
    recompute = std::move(Engine::Create(model.get(), nullptr, 32, kTpb).value());
  }
};

void ExpectSameResult(const RequestOutcome& got, const RequestOutcome& want) {
  EXPECT_LT(RelativeError(got.prompt_logits, want.prompt_logits), 1e-4);
  EXPECT_EQ(got.generated, want.generated);
}

TEST(EngineConnectorTest, PrefixLoadedFromG2MatchesRecompute) {
  Fixture f(LlamaConfig{});
  const auto prompt = Tokens(5 * kTpb + 3, 1, 256);
  const RequestSpec first{"a", prompt, "", "", {}};
  auto a = f.with_kvtier->Run(first, 10, -1);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->loaded_tokens, 0u);
  EXPECT_EQ(a->computed_tokens, prompt.size());
  f.with_kvtier->ReleaseFinished(/*wait=*/true);

  auto b = f.with_kvtier->Run({"b", prompt, "", "", {}}, 10, -1);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->offered_tokens, 5 * kTpb);
  EXPECT_EQ(b->loaded_tokens, 5 * kTpb);
  EXPECT_EQ(b->computed_tokens, 3u);
  auto ref = f.recompute->Run({"r", prompt, "", "", {}}, 10, -1);
  ASSERT_TRUE(ref.ok());
  ExpectSameResult(*b, *ref);
  ExpectSameResult(*a, *ref);
  f.with_kvtier->ReleaseFinished(true);
  const ManagerStats s = f.manager->Stats();
  EXPECT_EQ(s.hit_blocks[kTierG2], 5u);
  EXPECT_EQ(s.pinned_blocks, 0u);
  EXPECT_EQ(f.with_kvtier->held_requests(), 0u);
  EXPECT_EQ(f.with_kvtier->cache().free_blocks(), 32u) << "every G1 block came back";
}

TEST(EngineConnectorTest, SharedPrefixWithADifferentSuffixAndGeneratedTokensAreReused) {
  LlamaConfig c;
  c.num_layers = 3;
  Fixture f(c);
  auto conv = Tokens(3 * kTpb + 5, 7, 256);
  auto a = f.with_kvtier->Run({"turn1", conv, "", "", {}}, 2 * kTpb, -1);
  ASSERT_TRUE(a.ok());
  f.with_kvtier->ReleaseFinished(true);
  // The next turn appends the answer and a new user message: prompt and generated blocks were
  // committed, so everything but the unfinished tail block loads.
  conv.insert(conv.end(), a->generated.begin(), a->generated.end() - 1);
  const auto more = Tokens(20, 8, 256);
  conv.insert(conv.end(), more.begin(), more.end());
  auto b = f.with_kvtier->Run({"turn2", conv, "", "", {}}, 8, -1);
  ASSERT_TRUE(b.ok());
  const uint32_t committed = (3 * kTpb + 5 + 2 * kTpb - 1) / kTpb * kTpb;
  EXPECT_EQ(b->loaded_tokens, committed);
  auto ref = f.recompute->Run({"ref", conv, "", "", {}}, 8, -1);
  ASSERT_TRUE(ref.ok());
  ExpectSameResult(*b, *ref);
  f.with_kvtier->ReleaseFinished(true);
  EXPECT_EQ(f.manager->Stats().pinned_blocks, 0u);
}

TEST(EngineConnectorTest, RejectsAMismatchedLayoutAndEmptyPrompts) {
  auto model = LlamaModel::Random(LlamaConfig{}, 1);
  ASSERT_TRUE(model.ok());
  auto manager = MakeManager((*model)->MakeKvLayout(32), 8);
  auto e = Engine::Create(model->get(), manager.get(), 8, kTpb);
  EXPECT_TRUE(e.status().Is(StatusCode::kInvalidArgument)) << e.status().ToString();
  EXPECT_TRUE(Engine::Create(nullptr, nullptr, 8, kTpb).status().Is(StatusCode::kInvalidArgument));
  auto ok = Engine::Create(model->get(), nullptr, 8, kTpb);
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE((*ok)->Run({"x", {}, "", "", {}}, 1, -1).status().Is(StatusCode::kInvalidArgument));
  // G1 too small for the prompt: ResourceExhausted, and nothing leaks.
  const auto big = Tokens(8 * kTpb + 1, 3, 256);
  EXPECT_TRUE(
      (*ok)->Run({"y", big, "", "", {}}, 1, -1).status().Is(StatusCode::kResourceExhausted));
  EXPECT_EQ((*ok)->cache().free_blocks(), 8u);
}

}  // namespace
}  // namespace kvtier::engine

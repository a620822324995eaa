// The real model: SmolLM2-135M-Instruct (Q4_1 GGUF), fetched by scripts/fetch-model.sh into
// ./models/. Skipped, loudly, when the file is absent.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "engine/chat_template.h"
#include "engine/engine.h"
#include "engine/gguf.h"
#include "engine/kv_cache.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "engine_test_util.h"
#include "kvtier/connector.h"

namespace kvtier::engine {
namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

const char* kModelPath = KVTIER_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf";

struct RealModel {
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<LlamaModel> model;
  ChatTemplate chat;
};

// Loaded once for the whole binary (dequantizing takes a moment).
RealModel* Load() {
  static RealModel* loaded = []() -> RealModel* {
    if (!std::filesystem::exists(kModelPath)) return nullptr;
    auto* r = new RealModel();
    auto f = GgufFile::Open(kModelPath);
    EXPECT_TRUE(f.ok()) << f.status().ToString();
    if (!f.ok()) return nullptr;
    r->file = std::move(*f);
    auto t = Tokenizer::FromGguf(*r->file);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    auto m = LlamaModel::FromGguf(*r->file);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    auto c = ChatTemplate::FromGguf(*r->file);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!t.ok() || !m.ok() || !c.ok()) return nullptr;
    r->tokenizer = std::move(*t);
    r->model = std::move(*m);
    r->chat = *c;
    return r;
  }();
  return loaded;
}

#define REQUIRE_MODEL(r)                                                                      \
  RealModel* r = Load();                                                                      \
  if (r == nullptr) {                                                                         \
    std::fprintf(stderr,                                                                      \
                 "\n*** SKIPPING: %s is absent. Run scripts/fetch-model.sh to test the real " \
                 "model. ***\n\n",                                                            \
                 kModelPath);                                                                 \
    GTEST_SKIP() << "real model absent: run scripts/fetch-model.sh";                          \
  }

TEST(RealModelTest, ConfigAndTokenizerMatchSmolLm2) {
  REQUIRE_MODEL(r);
  const LlamaConfig& c = r->model->config();
  EXPECT_EQ(c.num_layers, 30u);
  EXPECT_EQ(c.dim, 576u);
  EXPECT_EQ(c.num_heads, 9u);
  EXPECT_EQ(c.num_kv_heads, 3u);
  EXPECT_EQ(c.head_dim, 64u);
  EXPECT_EQ(c.vocab_size, 49152u);
  EXPECT_TRUE(c.tied_embeddings);
  const Tokenizer& tok = *r->tokenizer;
  EXPECT_EQ(tok.Encode("<|im_start|>", true), (std::vector<TokenId>{1}));
  EXPECT_EQ(tok.Encode("<|im_end|>", true), (std::vector<TokenId>{2}));
  for (const char* s : {"Hello world", "The year 2024 was warm.", "  spaces\n\nand lines ",
                        "naïve café", "x = y**2 + 3;"}) {
    const auto ids = tok.Encode(s, false);
    EXPECT_EQ(tok.Decode(ids), s);
  }
  EXPECT_EQ(tok.Encode("Hello world", false).size(), 2u);
  ASSERT_TRUE(r->chat.default_system().has_value());
  EXPECT_NE(r->chat.default_system()->find("SmolLM"), std::string::npos);
}

TEST(RealModelTest, AnswersTheCapitalOfFrance) {
  REQUIRE_MODEL(r);
  const std::string prompt =
      r->chat.Apply({{"user", "What is the capital of France?"}}, /*add_generation_prompt=*/true);
  const auto ids = r->tokenizer->Encode(prompt, /*parse_special=*/true);
  auto cache = PagedKvCache::Create(r->model->MakeKvLayout(16), 64);
  ASSERT_TRUE(cache.ok());
  SequenceState seq;
  ASSERT_TRUE(EnsureCapacity(**cache, seq, static_cast<uint32_t>(ids.size())).ok());
  auto logits = r->model->Forward(**cache, seq.block_table, ids, 0);
  ASSERT_TRUE(logits.ok()) << logits.status().ToString();
  seq.num_tokens = static_cast<uint32_t>(ids.size());
  auto out =
      GreedyDecode(*r->model, **cache, seq, *logits, kSanitized ? 8 : 24, r->tokenizer->eos_id());
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const std::string answer = r->tokenizer->Decode(*out, /*skip_special=*/true);
  std::printf("prompt tokens: %zu\nanswer: %s\n", ids.size(), answer.c_str());
  EXPECT_NE(answer.find("Paris"), std::string::npos) << answer;
  for (char ch : answer) {
    EXPECT_TRUE(ch == '\n' || (ch >= 0x20 && ch < 0x7f)) << "non-ASCII in: " << answer;
  }
}

TEST(RealModelTest, PrefixFromG2GivesTheRecomputeAnswer) {
  REQUIRE_MODEL(r);
  const uint32_t tpb = 16;
  ManagerOptions o;
  o.layout = r->model->MakeKvLayout(tpb);
  o.model_id = "SmolLM2-135M-Instruct.Q4_1";
  const uint64_t slot = 4096 + o.layout.BlockBytes();
  ASSERT_TRUE(o.config.Set("g2.capacity_bytes", std::to_string(32 * slot)).ok());
  ASSERT_TRUE(o.config.Set("g2.lock_memory", "false").ok());
  ASSERT_TRUE(o.config.Set("g2.prefault_threads", "1").ok());
  ASSERT_TRUE(o.config.Set("g3.enabled", "false").ok());
  auto manager = BlockManager::Create(o);
  ASSERT_TRUE(manager.ok()) << manager.status().ToString();
  auto with = Engine::Create(r->model.get(), manager->get(), 32, tpb);
  auto without = Engine::Create(r->model.get(), nullptr, 32, tpb);
  ASSERT_TRUE(with.ok() && without.ok());
  const auto ids =
      r->tokenizer->Encode(r->chat.Apply({{"user", "Name three primary colors."}}, true), true);
  const uint32_t max_new = kSanitized ? 4 : 16;
  const int64_t eos = r->tokenizer->eos_id();
  auto first = (*with)->Run({"first", ids, "", "", {}}, max_new, eos);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  (*with)->ReleaseFinished(true);
  auto again = (*with)->Run({"again", ids, "", "", {}}, max_new, eos);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  auto ref = (*without)->Run({"ref", ids, "", "", {}}, max_new, eos);
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(again->loaded_tokens, (ids.size() - 1) / tpb * tpb);
  EXPECT_GT(again->loaded_tokens, 0u);
  EXPECT_LT(testing::RelativeError(again->prompt_logits, ref->prompt_logits), 1e-4);
  EXPECT_EQ(again->generated, ref->generated);
  std::printf("reused %u of %zu prompt tokens; answer: %s\n", again->loaded_tokens, ids.size(),
              r->tokenizer->Decode(again->generated, true).c_str());
  (*with)->ReleaseFinished(true);
}

}  // namespace
}  // namespace kvtier::engine

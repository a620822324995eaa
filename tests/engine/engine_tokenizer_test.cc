#include <gtest/gtest.h>

#include <random>

#include "engine/chat_template.h"
#include "engine/pretokenizer.h"
#include "engine/tokenizer.h"
#include "engine_test_util.h"

namespace kvtier::engine {
namespace {

using testing::GgufWriter;
using testing::TempDir;
using Pieces = std::vector<std::string_view>;

Pieces Gpt2(std::string_view s) { return PreTokenize(s, PreTokenizerKind::kGpt2); }
Pieces Smol(std::string_view s) { return PreTokenize(s, PreTokenizerKind::kDigitsThenGpt2); }

TEST(PreTokenizerTest, Gpt2PatternOnHandSplitExamples) {
  EXPECT_EQ(Gpt2("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(Gpt2("I'm here, don't"), (Pieces{"I", "'m", " here", ",", " don", "'t"}));
  EXPECT_EQ(Gpt2("we're they've you'll he'd"),
            (Pieces{"we", "'re", " they", "'ve", " you", "'ll", " he", "'d"}));
  EXPECT_EQ(Gpt2("IT'S"), (Pieces{"IT", "'", "S"}));  // contractions are lowercase only
  EXPECT_EQ(Gpt2("hi 's"), (Pieces{"hi", " '", "s"}));
  EXPECT_EQ(Gpt2("  two spaces"), (Pieces{" ", " two", " spaces"}));
  EXPECT_EQ(Gpt2("end  "), (Pieces{"end", "  "}));
  EXPECT_EQ(Gpt2("a\n\nb"), (Pieces{"a", "\n", "\n", "b"}));
  EXPECT_EQ(Gpt2("a \n  b"), (Pieces{"a", " \n ", " b"}));
  EXPECT_EQ(Gpt2("x = 123;"), (Pieces{"x", " =", " 123", ";"}));
  EXPECT_EQ(Gpt2("Hello!!! ok?"), (Pieces{"Hello", "!!!", " ok", "?"}));
  EXPECT_EQ(Gpt2("abc123def"), (Pieces{"abc", "123", "def"}));
  EXPECT_EQ(Gpt2("café über"), (Pieces{"café", " über"}));
  EXPECT_EQ(Gpt2("日本語です。"), (Pieces{"日本語です", "。"}));
  EXPECT_EQ(Gpt2("Привет мир"), (Pieces{"Привет", " мир"}));
  EXPECT_EQ(Gpt2(""), Pieces{});
  EXPECT_EQ(Gpt2(" "), (Pieces{" "}));
}

TEST(PreTokenizerTest, DigitsAreIsolatedForSmolLm) {
  EXPECT_EQ(Smol("x = 123;"), (Pieces{"x", " =", " ", "1", "2", "3", ";"}));
  EXPECT_EQ(Smol("in 2024 we"), (Pieces{"in", " ", "2", "0", "2", "4", " we"}));
  EXPECT_EQ(Smol("a1b"), (Pieces{"a", "1", "b"}));
  EXPECT_EQ(Smol("٣"), (Pieces{"٣"}));  // Arabic-Indic digit three
}

TEST(PreTokenizerTest, PiecesAlwaysConcatenateToTheInput) {
  std::mt19937 rng(7);
  const std::string alphabet[] = {"a", "Z", " ",  "  ",   "\n",   "'",  "s",   "1",
                                  "!", "é", "日", "\xff", "\xc3", "\t", "'ll", "\xe2\x80\xa8"};
  for (int iter = 0; iter < 2000; ++iter) {
    std::string s;
    const int n = static_cast<int>(rng() % 20);
    for (int k = 0; k < n; ++k) s += alphabet[rng() % std::size(alphabet)];
    for (auto kind : {PreTokenizerKind::kGpt2, PreTokenizerKind::kDigitsThenGpt2}) {
      std::string joined;
      for (std::string_view p : PreTokenize(s, kind)) {
        ASSERT_FALSE(p.empty());
        joined += p;
      }
      ASSERT_EQ(joined, s);
    }
  }
}

TEST(PreTokenizerTest, Utf8DecodingRejectsInvalidSequences) {
  size_t len = 0;
  EXPECT_EQ(DecodeUtf8("é", 0, &len), 0xE9u);
  EXPECT_EQ(len, 2u);
  EXPECT_EQ(DecodeUtf8("\xc3", 0, &len), 0xFFFDu);  // truncated
  EXPECT_EQ(len, 1u);
  EXPECT_EQ(DecodeUtf8("\xc0\x80", 0, &len), 0xFFFDu);      // overlong
  EXPECT_EQ(DecodeUtf8("\xed\xa0\x80", 0, &len), 0xFFFDu);  // surrogate
  EXPECT_EQ(DecodeUtf8("\xf0\x9f\x98\x80", 0, &len), 0x1F600u);
  EXPECT_EQ(len, 4u);
  std::string s;
  AppendUtf8(0x1F600, &s);
  EXPECT_EQ(s, "\xf0\x9f\x98\x80");
  EXPECT_TRUE(ParsePreTokenizer("smollm").ok());
  EXPECT_TRUE(ParsePreTokenizer("llama-bpe").status().Is(StatusCode::kInvalidArgument));
}

// A tiny byte-level vocabulary: 3 control tokens, the 256 byte symbols, and merges that build
// "hello" and "Ġworld".
TokenizerSpec TinySpec() {
  TokenizerSpec spec;
  spec.tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  spec.token_types = {3, 3, 3};
  std::vector<uint32_t> cps;
  uint32_t next = 0x100;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool self = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    std::string sym;
    AppendUtf8(self ? b : next++, &sym);
    spec.tokens.push_back(sym);
    spec.token_types.push_back(1);
  }
  for (const char* t : {"he", "ll", "hell", "hello", "Ġw", "or", "Ġwor", "ld", "Ġworld"}) {
    spec.tokens.push_back(t);
    spec.token_types.push_back(1);
  }
  spec.merges = {"h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld"};
  spec.bos_id = 1;
  spec.eos_id = 2;
  return spec;
}

TEST(TokenizerTest, BpeMergesByRank) {
  auto t = Tokenizer::Create(TinySpec());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const Tokenizer& tok = **t;
  const TokenId hello = static_cast<TokenId>(tok.Find("hello"));
  const TokenId world = static_cast<TokenId>(tok.Find("Ġworld"));
  EXPECT_EQ(tok.Encode("hello world", false), (std::vector<TokenId>{hello, world}));
  // "hel": h e -> he; "he l" has no merge.
  EXPECT_EQ(tok.Encode("hel", false), (std::vector<TokenId>{static_cast<TokenId>(tok.Find("he")),
                                                            static_cast<TokenId>(tok.Find("l"))}));
  // "ello": "l l" (rank 1) wins over nothing else; then no merge for "e ll" or "ll o".
  EXPECT_EQ(tok.Encode("ello", false), (std::vector<TokenId>{static_cast<TokenId>(tok.Find("e")),
                                                             static_cast<TokenId>(tok.Find("ll")),
                                                             static_cast<TokenId>(tok.Find("o"))}));
  // A space is the byte symbol U+0120.
  EXPECT_EQ(tok.Encode(" ", false), (std::vector<TokenId>{static_cast<TokenId>(tok.Find("Ġ"))}));
}

TEST(TokenizerTest, SpecialTokensOnlyWhenAllowed) {
  auto t = Tokenizer::Create(TinySpec());
  ASSERT_TRUE(t.ok());
  const Tokenizer& tok = **t;
  const std::string text = "<|im_start|>hello<|im_end|><|endoftext|>";
  auto ids = tok.Encode(text, true);
  ASSERT_EQ(ids.size(), 4u);
  EXPECT_EQ(ids[0], 1u);
  EXPECT_EQ(ids[1], static_cast<TokenId>(tok.Find("hello")));
  EXPECT_EQ(ids[2], 2u);
  EXPECT_EQ(ids[3], 0u);
  auto plain = tok.Encode(text, false);
  EXPECT_GT(plain.size(), 10u);
  for (TokenId id : plain) EXPECT_GT(id, 2u);
  EXPECT_EQ(tok.Decode(ids), text);
  EXPECT_EQ(tok.Decode(ids, /*skip_special=*/true), "hello");
  EXPECT_EQ(tok.Decode(plain), text);
}

TEST(TokenizerTest, DecodeInvertsEncodeForArbitraryBytes) {
  auto t = Tokenizer::Create(TinySpec());
  ASSERT_TRUE(t.ok());
  std::mt19937 rng(3);
  for (int iter = 0; iter < 300; ++iter) {
    std::string s(rng() % 40, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 4 == 0 ? ' ' : rng());
    EXPECT_EQ((*t)->Decode((*t)->Encode(s, false)), s);
  }
  const TokenId out_of_range[] = {100000};
  EXPECT_EQ((*t)->Decode(out_of_range), "");
}

TEST(TokenizerTest, CreateRejectsBadSpecs) {
  TokenizerSpec empty;
  EXPECT_TRUE(Tokenizer::Create(empty).status().Is(StatusCode::kInvalidArgument));
  auto s = TinySpec();
  s.token_types.pop_back();
  EXPECT_TRUE(Tokenizer::Create(s).status().Is(StatusCode::kInvalidArgument));
  s = TinySpec();
  s.merges.push_back("nospace");
  EXPECT_TRUE(Tokenizer::Create(s).status().Is(StatusCode::kInvalidArgument));
  s = TinySpec();
  s.merges.push_back("a b c");
  EXPECT_TRUE(Tokenizer::Create(s).status().Is(StatusCode::kInvalidArgument));
  s = TinySpec();
  s.eos_id = 100000;
  auto r = Tokenizer::Create(s);
  EXPECT_TRUE(r.status().Is(StatusCode::kInvalidArgument));
  EXPECT_NE(r.status().message().find("eos"), std::string::npos);
}

GgufWriter TokenizerGguf(const TokenizerSpec& spec, const std::string& model,
                         const std::string& pre) {
  GgufWriter w;
  w.AddString("tokenizer.ggml.model", model);
  w.AddString("tokenizer.ggml.pre", pre);
  w.AddStringArray("tokenizer.ggml.tokens", spec.tokens);
  w.AddI32Array("tokenizer.ggml.token_type", spec.token_types);
  w.AddStringArray("tokenizer.ggml.merges", spec.merges);
  w.AddU32("tokenizer.ggml.bos_token_id", 1);
  w.AddU32("tokenizer.ggml.eos_token_id", 2);
  return w;
}

TEST(TokenizerTest, FromGgufReadsMetadataAndRejectsWhatItCannotRun) {
  TempDir dir;
  const std::string path = dir.File("tok.gguf");
  ASSERT_TRUE(TokenizerGguf(TinySpec(), "gpt2", "smollm").Write(path));
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok());
  auto t = Tokenizer::FromGguf(**f);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ((*t)->bos_id(), 1);
  EXPECT_EQ((*t)->eos_id(), 2);
  EXPECT_EQ((*t)->vocab_size(), 3u + 256u + 9u);
  EXPECT_EQ((*t)->Encode("a12", false).size(), 3u);  // digits isolated

  ASSERT_TRUE(TokenizerGguf(TinySpec(), "llama", "smollm").Write(path));
  f = GgufFile::Open(path);
  EXPECT_TRUE(Tokenizer::FromGguf(**f).status().Is(StatusCode::kInvalidArgument));

  ASSERT_TRUE(TokenizerGguf(TinySpec(), "gpt2", "qwen2").Write(path));
  f = GgufFile::Open(path);
  EXPECT_TRUE(Tokenizer::FromGguf(**f).status().Is(StatusCode::kInvalidArgument));

  GgufWriter no_merges;
  no_merges.AddString("tokenizer.ggml.model", "gpt2");
  no_merges.AddStringArray("tokenizer.ggml.tokens", {"a"});
  ASSERT_TRUE(no_merges.Write(path));
  f = GgufFile::Open(path);
  EXPECT_TRUE(Tokenizer::FromGguf(**f).status().Is(StatusCode::kNotFound));

  GgufWriter no_model;
  ASSERT_TRUE(no_model.Write(path));
  f = GgufFile::Open(path);
  EXPECT_TRUE(Tokenizer::FromGguf(**f).status().Is(StatusCode::kNotFound));
}

TEST(ChatTemplateTest, FormatsChatMlWithDefaultSystemMessage) {
  const std::string source =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
      "{{ '<|im_start|>system\nYou are a test bot<|im_end|>\n' }}{% endif %}"
      "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
      "{% endfor %}";
  auto t = ChatTemplate::FromSource(source);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE(t->default_system().has_value());
  EXPECT_EQ(*t->default_system(), "You are a test bot");
  EXPECT_EQ(t->Apply({{"user", "Hi"}}, true),
            "<|im_start|>system\nYou are a test bot<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t->Apply({{"system", "S"}, {"user", "Hi"}, {"assistant", "Yo"}}, false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nYo<|im_end|>\n");
  EXPECT_EQ(ChatTemplate().Apply({{"user", "x"}}, false), "<|im_start|>user\nx<|im_end|>\n");
}

TEST(ChatTemplateTest, RejectsNonChatMlAndMissingTemplates) {
  auto t = ChatTemplate::FromSource("[INST] {{ messages[0]['content'] }} [/INST]");
  EXPECT_TRUE(t.status().Is(StatusCode::kInvalidArgument));
  EXPECT_NE(t.status().message().find("ChatML"), std::string::npos);
  TempDir dir;
  GgufWriter w;
  ASSERT_TRUE(w.Write(dir.File("x.gguf")));
  auto f = GgufFile::Open(dir.File("x.gguf"));
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(ChatTemplate::FromGguf(**f).status().Is(StatusCode::kNotFound));
}

}  // namespace
}  // namespace kvtier::engine

#include "kvtier/block_key.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli_run.h"

#include "core/sha256.h"
#include "kvtier/layout.h"

namespace kvtier {
namespace {

std::vector<TokenId> Tokens(TokenId first, size_t n) {
  std::vector<TokenId> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

BlockHasher MakeHasher(HashAlgorithm algo, std::string salt = "", std::string adapter = "") {
  KeyNamespace ns{"kvtier-test-model", KvLayout{}.Fingerprint(), std::move(salt),
                  std::move(adapter)};
  return *BlockHasher::Create(ns, 16, algo);
}

// Known answers computed independently with Python (hashlib, and libxxhash through ctypes)
// from DESIGN.md's chaining rule and the serialization documented in block_key.h / .cc.
TEST(BlockKeyTest, Sha256KnownAnswers) {
  BlockHasher h = MakeHasher(HashAlgorithm::kSha256);
  EXPECT_EQ(h.root().ToHex(), "54ae4427b4665b88fecdefc556b7481d");
  auto keys = h.KeysFor(Tokens(1000, 48));
  ASSERT_EQ(keys.size(), 3u);
  EXPECT_EQ(keys[0].ToHex(), "18adcddbf5f8f1d0bc0503c4fddaa284");
  EXPECT_EQ(keys[1].ToHex(), "a240910ba412de951f58b839e260f924");
  EXPECT_EQ(keys[2].ToHex(), "b3e9c89e1407dfc56aa34c425a20dea8");
}

TEST(BlockKeyTest, Xxh3KnownAnswers) {
  BlockHasher h = MakeHasher(HashAlgorithm::kXxh3_128);
  EXPECT_EQ(h.root().ToHex(), "497dbbc726b09cf0989a5331a5f48801");
  auto keys = h.KeysFor(Tokens(1000, 48));
  ASSERT_EQ(keys.size(), 3u);
  EXPECT_EQ(keys[0].ToHex(), "75ef47ff7851b3ad969ebdb4da7fbecf");
  EXPECT_EQ(keys[1].ToHex(), "ad02547c9491b26bc535cd145cff87e1");
  EXPECT_EQ(keys[2].ToHex(), "0e1e78a17c52d324cd082b525e051633");
}

TEST(BlockKeyTest, SaltAndAdapterKnownAnswers) {
  BlockHasher h = MakeHasher(HashAlgorithm::kSha256, "tenant-a", "lora-7");
  EXPECT_EQ(h.root().ToHex(), "51800faa775f98cb7e5cd2cee11c72c2");
  EXPECT_EQ(h.KeysFor(Tokens(1000, 16))[0].ToHex(), "9ef8cd37c84a3c10764b159190ca0c9b");
}

TEST(BlockKeyTest, TokensAreLittleEndianUint32) {
  KeyNamespace ns{"m", 7, "", ""};
  BlockHasher h = *BlockHasher::Create(ns, 4);
  std::vector<TokenId> t = {0, 1, 4294967295u, 65536, 5, 6, 7, 8};
  auto keys = h.KeysFor(t);
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(h.root().ToHex(), "07c27bb5e4a954011c2d0277c1eea87f");
  EXPECT_EQ(keys[0].ToHex(), "e50544bf28b25d9b5bac0675badec5ff");
  EXPECT_EQ(keys[1].ToHex(), "b81402323c96339046323b235e5c7f52");
}

TEST(BlockKeyTest, BlockExtrasChangeOnlyTheirBlockAndWhatFollows) {
  BlockHasher h = MakeHasher(HashAlgorithm::kSha256);
  const auto tokens = Tokens(0, 48);
  const std::vector<BlockKey> plain = h.KeysFor(tokens);
  std::vector<BlockKey> none;
  h.AppendKeys(tokens, h.root(), &none, std::vector<std::string>{});
  EXPECT_EQ(none, plain) << "no extras: the plain keys";
  std::vector<BlockKey> empty_strings;
  h.AppendKeys(tokens, h.root(), &empty_strings, std::vector<std::string>{"", "", ""});
  EXPECT_EQ(empty_strings, plain) << "an empty extra is no extra";
  // An image (say) in block 1: block 0 keeps its key, blocks 1 and 2 get other keys.
  std::vector<BlockKey> image_a, image_b;
  h.AppendKeys(tokens, h.root(), &image_a, std::vector<std::string>{"", "image-a"});
  h.AppendKeys(tokens, h.root(), &image_b, std::vector<std::string>{"", "image-b"});
  ASSERT_EQ(image_a.size(), 3u);
  EXPECT_EQ(image_a[0], plain[0]);
  EXPECT_NE(image_a[1], plain[1]);
  EXPECT_NE(image_a[2], plain[2]) << "the key names the whole prefix";
  EXPECT_NE(image_a[1], image_b[1]);
  // The same as chaining by hand.
  const std::string extra = "image-a";
  EXPECT_EQ(image_a[1], h.Chain(plain[0], std::span<const TokenId>(tokens).subspan(16, 16),
                                std::span<const uint8_t>(
                                    reinterpret_cast<const uint8_t*>(extra.data()), extra.size())));
}

TEST(BlockKeyTest, OnlyFullBlocksAreKeyedAndKeysChainPrefixes) {
  BlockHasher h = MakeHasher(HashAlgorithm::kSha256);
  EXPECT_EQ(h.KeysFor(Tokens(0, 15)).size(), 0u);
  EXPECT_EQ(h.KeysFor(Tokens(0, 47)).size(), 2u);
  // Same first block, different second: first keys agree, second differ.
  auto a = Tokens(0, 32);
  auto b = a;
  b[20] = 999;
  auto ka = h.KeysFor(a), kb = h.KeysFor(b);
  EXPECT_EQ(ka[0], kb[0]);
  EXPECT_NE(ka[1], kb[1]);
  // Same second block after a different first: the keys differ (they name the whole prefix).
  auto c = a;
  c[0] = 12345;
  EXPECT_NE(h.KeysFor(c)[1], ka[1]);
  // Incremental hashing continues a chain exactly.
  std::vector<BlockKey> inc;
  h.AppendKeys(std::span<const TokenId>(a).subspan(0, 16), h.root(), &inc);
  h.AppendKeys(std::span<const TokenId>(a).subspan(16), inc.back(), &inc);
  EXPECT_EQ(inc, ka);
}

TEST(BlockKeyTest, ExtraBytesChangeTheKey) {
  BlockHasher h = MakeHasher(HashAlgorithm::kSha256);
  auto t = Tokens(0, 16);
  const uint8_t img1[] = {1, 2, 3}, img2[] = {1, 2, 4};
  EXPECT_NE(h.Chain(h.root(), t, img1), h.Chain(h.root(), t, img2));
  EXPECT_NE(h.Chain(h.root(), t, img1), h.Chain(h.root(), t));
}

TEST(BlockKeyTest, DifferentTenantSaltGivesDisjointKeys) {
  BlockHasher a = MakeHasher(HashAlgorithm::kSha256, "tenant-a");
  BlockHasher b = MakeHasher(HashAlgorithm::kSha256, "tenant-b");
  BlockHasher lora = MakeHasher(HashAlgorithm::kSha256, "tenant-a", "adapter-1");
  auto t = Tokens(0, 16 * 64);
  std::set<BlockKey> seen;
  for (const auto& k : a.KeysFor(t)) seen.insert(k);
  for (const auto& k : b.KeysFor(t)) EXPECT_EQ(seen.count(k), 0u);
  for (const auto& k : lora.KeysFor(t)) EXPECT_EQ(seen.count(k), 0u);
  EXPECT_EQ(seen.size(), 64u);
}

TEST(BlockKeyTest, NamespaceFieldsAreLengthDelimited) {
  KeyNamespace n1{"ab", 1, "c", ""}, n2{"a", 1, "bc", ""};
  EXPECT_NE(BlockHasher::Create(n1, 16)->root(), BlockHasher::Create(n2, 16)->root());
}

TEST(BlockKeyTest, HexRoundTripAndErrors) {
  BlockKey k{0x0123456789abcdefull, 0xfedcba9876543210ull};
  EXPECT_EQ(k.ToHex(), "0123456789abcdeffedcba9876543210");
  EXPECT_EQ(*BlockKey::FromHex(k.ToHex()), k);
  EXPECT_EQ(BlockKey::FromHex("abc").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(BlockKey::FromHex("0123456789abcdeffedcba987654321g").status().code(),
            StatusCode::kInvalidArgument);
}

TEST(BlockKeyTest, RejectsBadTokensPerBlock) {
  KeyNamespace ns{"m", 1, "", ""};
  EXPECT_FALSE(BlockHasher::Create(ns, 0).ok());
  const auto too_big = BlockHasher::Create(ns, KvLayout::kMaxTokensPerBlock + 1);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_big.status().message().find("tokens_per_block = 4097"), std::string::npos)
      << too_big.status().message();
  EXPECT_NE(too_big.status().message().find("1..4096"), std::string::npos)
      << too_big.status().message();
  EXPECT_TRUE(BlockHasher::Create(ns, 1024).ok());
  EXPECT_TRUE(BlockHasher::Create(ns, KvLayout::kMaxTokensPerBlock).ok());
}

// Any block size keys like a power of two does: each full block is one link of the chain,
// keyed by SHA-256 over exactly (parent, its tokens); a partial tail is not keyed; the block
// size is in the root, so the same tokens cut at another size are other keys.
TEST(BlockKeyTest, NonPowerOfTwoBlockSizesChainAndSkipThePartialTail) {
  KeyNamespace ns{"m", 7, "", ""};
  for (uint32_t tpb : {3u, 48u, 96u, 528u, 784u, 4096u}) {
    BlockHasher h = *BlockHasher::Create(ns, tpb);
    std::vector<TokenId> t(size_t{tpb} * 3 + tpb / 2 + 1);  // three full blocks and a tail
    for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<TokenId>(i * 2654435761u % 200000);
    const std::vector<BlockKey> keys = h.KeysFor(t);
    ASSERT_EQ(keys.size(), 3u) << tpb;
    // Recomputed from the documented message: parent (16 bytes, big-endian) || uint32 LE ids.
    BlockKey parent = h.root();
    for (size_t b = 0; b < 3; ++b) {
      std::vector<uint8_t> msg(16 + 4 * size_t{tpb});
      for (int i = 0; i < 8; ++i) {
        msg[i] = static_cast<uint8_t>(parent.hi >> (56 - 8 * i));
        msg[8 + i] = static_cast<uint8_t>(parent.lo >> (56 - 8 * i));
      }
      for (uint32_t i = 0; i < tpb; ++i) {
        const TokenId v = t[b * tpb + i];
        for (int k = 0; k < 4; ++k) msg[16 + 4 * i + k] = static_cast<uint8_t>(v >> (8 * k));
      }
      uint8_t digest[32];
      Sha256(msg.data(), msg.size(), digest);
      BlockKey want;
      for (int i = 0; i < 8; ++i) want.hi = (want.hi << 8) | digest[i];
      for (int i = 8; i < 16; ++i) want.lo = (want.lo << 8) | digest[i];
      EXPECT_EQ(keys[b], want) << "tpb " << tpb << " block " << b;
      parent = want;
    }
    // Keying the blocks in two calls (a prompt that grows) gives the same chain.
    std::vector<BlockKey> split;
    h.AppendKeys(std::span<const TokenId>(t).first(tpb), h.root(), &split);
    h.AppendKeys(std::span<const TokenId>(t).subspan(tpb), split.back(), &split);
    EXPECT_EQ(split, keys) << tpb;
    // A prompt one token short of three blocks has two keys, the same first two.
    const std::vector<BlockKey> shorter =
        h.KeysFor(std::span<const TokenId>(t).first(size_t{tpb} * 3 - 1));
    ASSERT_EQ(shorter.size(), 2u) << tpb;
    EXPECT_EQ(shorter[1], keys[1]) << tpb;
  }
  // The same 96 x 2 tokens cut as 2 blocks of 96 and as 1 block of 192 (or 3 of 64): no key
  // in common, even though the tokens are the same.
  std::vector<TokenId> t(192);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<TokenId>(i + 1);
  const auto k96 = BlockHasher::Create(ns, 96)->KeysFor(t);
  const auto k64 = BlockHasher::Create(ns, 64)->KeysFor(t);
  const auto k192 = BlockHasher::Create(ns, 192)->KeysFor(t);
  ASSERT_EQ(k96.size(), 2u);
  ASSERT_EQ(k64.size(), 3u);
  ASSERT_EQ(k192.size(), 1u);
  for (const BlockKey& k : k96) {
    EXPECT_EQ(std::count(k64.begin(), k64.end(), k), 0);
    EXPECT_NE(k, k192[0]);
  }
}

// Another process (the kvtier CLI, with its own address space and start-up) must compute the
// same keys: nothing may depend on a per-process seed or on pointer values.
TEST(BlockKeyTest, SecondProcessComputesIdenticalKeys) {
  std::string tokens;
  for (int i = 0; i < 64; ++i) tokens += (i ? "," : "") + std::to_string(i * 7919 % 50000);
  const std::string cmd = std::string(KVTIER_CLI_PATH) +
                          " keys --model kvtier-test-model --salt s1 --hash sha256 --tokens " +
                          tokens;
  const cli_run::CliRun run = cli_run::RunShell(cmd);
  const std::string& out = run.out;
  ASSERT_EQ(run.exit_code, 0) << out;

  KeyNamespace ns{"kvtier-test-model", KvLayout{}.Fingerprint(), "s1", ""};
  BlockHasher h = *BlockHasher::Create(ns, 16);
  std::vector<TokenId> t;
  for (int i = 0; i < 64; ++i) t.push_back(static_cast<TokenId>(i * 7919 % 50000));
  std::string expected = "root " + h.root().ToHex() + "\n";
  auto keys = h.KeysFor(t);
  for (size_t i = 0; i < keys.size(); ++i) {
    expected += std::to_string(i) + " " + keys[i].ToHex() + "\n";
  }
  EXPECT_EQ(out, expected);
}

}  // namespace
}  // namespace kvtier

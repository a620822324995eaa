// Identity (issue 40, "a shared cache that never mixes identities"): everything that makes two
// engines' KV differ keeps their blocks apart in every tier, and what does not, shares.
//
// The matrix varies exactly one field of an identity (model path, weights digest or rank in the
// model id, dtype, block size, kv_heads, head_dim, layers, planes, cache_salt, adapter, per-block
// extra keys; the G1 arrangement, which changes no stored byte) and checks, through the
// connector API of real managers on real files:
//  - G2: one manager, a request of one identity after the other's commit (for the fields a
//    request carries: a manager's model and layout are its own);
//  - G3: a manager of one identity, closed (its G2 flushed to G3), then a manager of the other
//    identity on the same directory;
//  - G4: a manager of one identity writing through to a shared-filesystem G4, then a manager of
//    the other identity, with no G3, on the same G4 directory.
// Apart means a Lookup finds 0 tokens; sharing means it finds the whole prompt (but its last
// token) and loads it byte-exact. Ids are as long as real deployments make them.
//
// Also: the hasher cache's bound (10,000 distinct 4 KiB salts), and a G3 block whose stored
// tokens are not the request's (a forged key collision) never served.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kvtier/connector.h"
#include "manager/block_manager_impl.h"
#include "manager/embedded_manager.h"
#include "manager/hasher_cache.h"
#include "manager_test_util.h"
#include "tier/block_format.h"

namespace kvtier {
namespace {

using namespace std::string_literals;
using testing::MiniEngine;
using testing::Prompt;
using testing::TempDirectory;
using testing::TierConfig;

// A model id as kvtier.vllm makes it: a 100-character model path, then the weights' digest,
// the device and the ranks.
std::string ModelId(char path_end = 'a', const std::string& weights = "3f9a0c17e2b45d68",
                    const std::string& ranks = "tp0of2|pp0of1") {
  std::string path =
      "/mnt/models/huggingface/hub/models--example-org--Example-13B-Instruct/snapshots/"
      "0e9e39f249a16976918f";
  path.resize(99, 'x');
  path += path_end;
  return path + "|w" + weights + "|cpu|" + ranks;
}

struct Identity {
  std::string model_id;
  KvLayout layout;
  std::string salt;
  std::string adapter;
  std::vector<std::string> extras;  // RequestSpec::block_extra
};

Identity BaseIdentity() {
  Identity id;
  id.model_id = ModelId();
  id.layout = testing::TestLayout();
  id.salt = "tenant-7f3e\x00kvtier-epoch-0"s;  // a reset epoch, as kvtier.vllm salts
  id.adapter = "sql-lora-3|/adapters/sql-lora-3";
  // An image in the first block, nothing in the next ones.
  id.extras = {"mm:5d41402abc4b2a76b9719d911017c592", "", ""};
  return id;
}

// The keys of `prompt` under `id`, computed here (not asked of the manager).
std::vector<BlockKey> KeysOf(const Identity& id, const std::vector<TokenId>& prompt) {
  auto hasher =
      BlockHasher::Create(KeyNamespace{id.model_id, id.layout.Fingerprint(), id.salt, id.adapter},
                          id.layout.tokens_per_block);
  EXPECT_TRUE(hasher.ok()) << hasher.status().ToString();
  std::vector<BlockKey> keys;
  if (hasher.ok()) hasher->AppendKeys(prompt, hasher->root(), &keys, id.extras);
  return keys;
}

RequestSpec SpecOf(const Identity& id, const std::string& request_id,
                   const std::vector<TokenId>& prompt) {
  RequestSpec spec;
  spec.request_id = request_id;
  spec.prompt = prompt;
  spec.cache_salt = id.salt;
  spec.adapter_id = id.adapter;
  spec.block_extra = id.extras;
  return spec;
}

// G2 of 32 blocks of `id`'s layout; G3 of 64 in `g3_dir` (none when empty); a filesystem G4 in
// `g4_dir` (none when empty), written through, with deadlines a loaded machine meets.
std::unique_ptr<BlockManager> OpenManager(const Identity& id, const std::string& g3_dir,
                                          const std::string& g4_dir = "") {
  ManagerOptions o;
  o.layout = id.layout;
  o.model_id = id.model_id;
  o.config = TierConfig(BlockHeaderBytes(id.layout) + id.layout.BlockBytes(), 32, g3_dir, 64);
  if (!g4_dir.empty()) {
    EXPECT_TRUE(o.config.Set("g4.backend", "fs").ok());
    EXPECT_TRUE(o.config.Set("g4.dir", g4_dir).ok());
    EXPECT_TRUE(o.config.Set("g4.lookup_deadline_ms", "5000").ok());
    EXPECT_TRUE(o.config.Set("g4.load_deadline_ms", "10000").ok());
  }
  auto m = BlockManager::Create(o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(m).value() : nullptr;
}

struct Variant {
  const char* name;
  std::function<void(Identity*)> change;
  bool shares;
};

std::ostream& operator<<(std::ostream& os, const Variant& v) { return os << v.name; }

class IdentityMatrix : public ::testing::TestWithParam<Variant> {
 protected:
  // One G4 directory for the suite (a fresh one costs 256 directories): each test's prompt is
  // its own, so no test finds another's objects.
  static void SetUpTestSuite() { g4_ = new TempDirectory; }
  static void TearDownTestSuite() {
    delete g4_;
    g4_ = nullptr;
  }
  void SetUp() override {
    a_ = BaseIdentity();
    b_ = a_;
    GetParam().change(&b_);
    // 4 blocks of 16 tokens, and the one always computed.
    prompt_ = Prompt(1000 + next_seed_++, 4 * 16 + 1);
  }
  // What a Lookup of `b_` must find after `a_` stored the prompt.
  uint32_t WantTokens() const {
    const uint32_t tpb = b_.layout.tokens_per_block;
    return GetParam().shares ? static_cast<uint32_t>((prompt_.size() - 1) / tpb * tpb) : 0;
  }
  void RunA(BlockManager* m) {
    MiniEngine e(m, 16, a_.model_id);
    const MiniEngine::Outcome out = e.RunSpec(SpecOf(a_, "a", prompt_), KeysOf(a_, prompt_));
    EXPECT_EQ(out.offered_tokens, 0u) << "the store was not empty";
    m->WaitForSaves();
  }
  // Runs `b_`'s request on `m`; checks what it found and loaded against WantTokens(), and that
  // every loaded byte is what b's own keys name.
  void CheckB(BlockManager* m, TierId tier) {
    const ManagerStats before = m->Stats();
    MiniEngine e(m, 16, b_.model_id);
    const MiniEngine::Outcome out = e.RunSpec(SpecOf(b_, "b", prompt_), KeysOf(b_, prompt_));
    EXPECT_EQ(out.offered_tokens, WantTokens()) << TierName(tier);
    EXPECT_EQ(out.loaded_tokens, WantTokens()) << TierName(tier);
    EXPECT_EQ(out.mismatched_blocks, 0u) << TierName(tier);
    EXPECT_FALSE(out.load_error);
    m->WaitForSaves();
    const ManagerStats after = m->Stats();
    EXPECT_EQ(after.hit_blocks[tier] - before.hit_blocks[tier],
              WantTokens() / b_.layout.tokens_per_block)
        << TierName(tier);
  }

  void ThroughG2();
  void ThroughG3AfterARestart();
  void ThroughASharedG4();

  static inline TempDirectory* g4_ = nullptr;
  static inline uint32_t next_seed_ = 0;
  Identity a_, b_;
  std::vector<TokenId> prompt_;
};

// Fields a manager serves many of (what a request carries): through G2 too.
class RequestIdentity : public IdentityMatrix {};
// Fields of the manager itself (model, layout): two managers never share a G2 in one process
// (kvtier serve keeps a pool per model and layout), so through G3 and G4 only.
class ManagerIdentity : public IdentityMatrix {};

void IdentityMatrix::ThroughG2() {
  auto m = OpenManager(a_, "");
  ASSERT_NE(m, nullptr);
  RunA(m.get());
  CheckB(m.get(), kTierG2);
}

void IdentityMatrix::ThroughG3AfterARestart() {
  TempDirectory dir;
  {
    auto m = OpenManager(a_, dir.path());
    ASSERT_NE(m, nullptr);
    RunA(m.get());
  }  // closed: G2 flushed to G3 (g3.flush_on_close)
  auto m = OpenManager(b_, dir.path());
  ASSERT_NE(m, nullptr);
  CheckB(m.get(), kTierG3);
}

void IdentityMatrix::ThroughASharedG4() {
  {
    auto m = OpenManager(a_, "", g4_->path());
    ASSERT_NE(m, nullptr);
    RunA(m.get());
    ASSERT_EQ(m->Stats().g4_saved_blocks, prompt_.size() / a_.layout.tokens_per_block);
  }
  auto m = OpenManager(b_, "", g4_->path());
  ASSERT_NE(m, nullptr);
  CheckB(m.get(), kTierG4);
}

TEST_P(RequestIdentity, ThroughG2) { ThroughG2(); }
TEST_P(RequestIdentity, ThroughG3AfterARestartOnTheSameDirectory) { ThroughG3AfterARestart(); }
TEST_P(RequestIdentity, ThroughASharedG4) { ThroughASharedG4(); }
TEST_P(ManagerIdentity, ThroughG3AfterARestartOnTheSameDirectory) { ThroughG3AfterARestart(); }
TEST_P(ManagerIdentity, ThroughASharedG4) { ThroughASharedG4(); }

KvLayout& L(Identity* id) { return id->layout; }

std::string VariantName(const ::testing::TestParamInfo<Variant>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(
    OneFieldAtATime, RequestIdentity,
    ::testing::Values(
        Variant{"Identical", [](Identity*) {}, true},
        Variant{"CacheSalt", [](Identity* id) { id->salt = "tenant-7f3f\x00kvtier-epoch-0"s; },
                false},
        Variant{"NoCacheSalt", [](Identity* id) { id->salt.clear(); }, false},
        Variant{"Adapter", [](Identity* id) { id->adapter = "sql-lora-4|/adapters/sql-lora-4"; },
                false},
        Variant{"NoAdapter", [](Identity* id) { id->adapter.clear(); }, false},
        Variant{"ExtraKey",
                [](Identity* id) { id->extras[0] = "mm:7d793037a0760186574b0282f2f435e7"; }, false},
        Variant{"NoExtraKeys", [](Identity* id) { id->extras.clear(); }, false}),
    VariantName);

INSTANTIATE_TEST_SUITE_P(
    OneFieldAtATime, ManagerIdentity,
    ::testing::Values(
        Variant{"Identical", [](Identity*) {}, true},
        // Not part of the identity: where the engine keeps its blocks changes no stored byte.
        Variant{"G1Arrangement",
                [](Identity* id) { L(id).g1_arrangement = G1Arrangement::kBlockContiguous; }, true},
        Variant{"ModelPath", [](Identity* id) { id->model_id = ModelId('b'); }, false},
        Variant{"WeightsDigest",
                [](Identity* id) { id->model_id = ModelId('a', "3f9a0c17e2b45d69"); }, false},
        Variant{
            "TensorParallelRank",
            [](Identity* id) { id->model_id = ModelId('a', "3f9a0c17e2b45d68", "tp1of2|pp0of1"); },
            false},
        Variant{"DType", [](Identity* id) { L(id).dtype = DType::kBf16; }, false},
        Variant{"BlockSize", [](Identity* id) { L(id).tokens_per_block = 32; }, false},
        Variant{"KvHeads", [](Identity* id) { L(id).num_kv_heads = 4; }, false},
        Variant{"HeadDim", [](Identity* id) { L(id).head_dim = 64; }, false},
        Variant{"NumLayers", [](Identity* id) { L(id).num_layers = 2; }, false},
        // The same bytes per block, in another shape.
        Variant{"HeadsTimesDimSameBytes",
                [](Identity* id) {
                  L(id).num_kv_heads = 4;
                  L(id).head_dim = 16;
                },
                false},
        Variant{"OnePlane", [](Identity* id) { L(id).num_planes = 1; }, false}),
    VariantName);

// The adapter alone, and the keys themselves: the same tokens and salt under two adapters are
// other blocks (a Lookup of one after the other's commit finds nothing, and every key of the
// commit is the adapter's own); under the same adapter they share.
TEST(Identity, TheAdapterAloneSeparatesKeys) {
  Identity a = BaseIdentity();
  a.extras.clear();
  Identity b = a;
  b.adapter = "sql-lora-4|/adapters/sql-lora-4";
  auto m = OpenManager(a, "");
  ASSERT_NE(m, nullptr);
  std::mutex mu;
  std::vector<BlockKey> stored;
  m->SubscribeEvents([&](std::span<const KvEvent> events) {
    std::lock_guard<std::mutex> lock(mu);
    for (const KvEvent& e : events) {
      if (e.kind == KvEvent::Kind::kStored) stored.push_back(e.key);
    }
  });
  auto take_stored = [&] {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<BlockKey> out;
    out.swap(stored);
    return out;
  };
  MiniEngine e(m.get(), 16, a.model_id);
  const std::vector<TokenId> prompt = Prompt(11, 4 * 16 + 1);
  const std::vector<BlockKey> keys_a = KeysOf(a, prompt), keys_b = KeysOf(b, prompt);
  for (size_t i = 0; i < keys_a.size(); ++i) EXPECT_NE(keys_a[i], keys_b[i]);

  EXPECT_EQ(e.RunSpec(SpecOf(a, "a", prompt), keys_a).offered_tokens, 0u);
  m->WaitForSaves();
  EXPECT_EQ(take_stored(), keys_a) << "the commit under adapter a stored other keys";
  const MiniEngine::Outcome other = e.RunSpec(SpecOf(b, "b", prompt), keys_b);
  EXPECT_EQ(other.offered_tokens, 0u) << "adapter b was offered adapter a's blocks";
  EXPECT_EQ(other.mismatched_blocks, 0u);
  m->WaitForSaves();
  EXPECT_EQ(take_stored(), keys_b) << "the commit under adapter b stored other keys";
  const MiniEngine::Outcome same = e.RunSpec(SpecOf(a, "a2", prompt), keys_a);
  EXPECT_EQ(same.offered_tokens, 4u * 16);
  EXPECT_EQ(same.loaded_tokens, 4u * 16);
  EXPECT_EQ(same.mismatched_blocks, 0u);
}

// Per-block extra keys (multimodal inputs, prompt embeddings): the same tokens with other extras
// share nothing from the first block whose extra differs, with equal extras everything.
TEST(Identity, PerBlockExtraKeysSeparateFromTheBlockThatDiffers) {
  Identity a = BaseIdentity();
  a.extras = {"", "", "mm:aaaa", ""};
  auto m = OpenManager(a, "");
  ASSERT_NE(m, nullptr);
  MiniEngine e(m.get(), 16, a.model_id);
  const std::vector<TokenId> prompt = Prompt(12, 4 * 16 + 1);
  EXPECT_EQ(e.RunSpec(SpecOf(a, "a", prompt), KeysOf(a, prompt)).offered_tokens, 0u);
  m->WaitForSaves();

  Identity first = a;  // another image in the first block: nothing in common
  first.extras[0] = "mm:bbbb";
  MiniEngine::Outcome out = e.RunSpec(SpecOf(first, "first", prompt), KeysOf(first, prompt));
  EXPECT_EQ(out.offered_tokens, 0u);
  Identity third = a;  // another image in the third block: the two blocks before it
  third.extras[2] = "mm:cccc";
  out = e.RunSpec(SpecOf(third, "third", prompt), KeysOf(third, prompt));
  EXPECT_EQ(out.offered_tokens, 2u * 16);
  EXPECT_EQ(out.loaded_tokens, 2u * 16);
  EXPECT_EQ(out.mismatched_blocks, 0u);
  Identity none = a;  // the image gone: the two blocks before it
  none.extras.clear();
  out = e.RunSpec(SpecOf(none, "none", prompt), KeysOf(none, prompt));
  EXPECT_EQ(out.offered_tokens, 2u * 16);
  Identity equal = a;  // equal extras: all of it
  out = e.RunSpec(SpecOf(equal, "equal", prompt), KeysOf(equal, prompt));
  EXPECT_EQ(out.offered_tokens, 4u * 16);
  EXPECT_EQ(out.loaded_tokens, 4u * 16);
  EXPECT_EQ(out.mismatched_blocks, 0u);
}

// ---------------------------------------------------------------------------------------------
// A hash collision in G3: a stored block whose key is the request's but whose tokens are not.

// Rewrites, in the slot files of G3 directory `dir` (TestLayout()), the header of the block
// `key` with `tokens` in place of its own; every other field (key, parent, namespace, slot,
// generation, payload checksum) as it was, and a valid header checksum: what a block of another
// prompt whose key collided with this one's would look like. Removes the clean-shutdown
// snapshot, so the next open reads the headers. Returns whether the block was found.
bool ForgeStoredTokens(const std::string& dir, const BlockKey& key,
                       const std::vector<TokenId>& tokens) {
  const KvLayout layout = testing::TestLayout();
  const uint64_t header_bytes = BlockHeaderBytes(layout);
  const uint64_t stride = (header_bytes + layout.BlockBytes() + 4095) / 4096 * 4096;
  bool found = false;
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    const std::string name = f.path().filename().string();
    if (name.rfind("g3-", 0) != 0 || f.path().extension() != ".kvt") continue;
    const int fd = ::open(f.path().c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) continue;
    const uint64_t size = std::filesystem::file_size(f.path());
    std::vector<uint8_t> header(header_bytes);
    // Slots start after the superblock and the probe page (docs/disk-tier.md).
    for (uint64_t off = 8192; off + stride <= size; off += stride) {
      if (::pread(fd, header.data(), header.size(), static_cast<off_t>(off)) !=
          static_cast<ssize_t>(header.size())) {
        break;
      }
      DecodedBlockHeader h;
      if (DecodeBlockHeader(header, &h) != BlockCheck::kOk || h.fields.key != key) continue;
      EXPECT_TRUE(
          EncodeBlockHeader(h.fields, tokens, h.payload_bytes, h.payload_checksum, header.data())
              .ok());
      EXPECT_EQ(::pwrite(fd, header.data(), header.size(), static_cast<off_t>(off)),
                static_cast<ssize_t>(header.size()));
      found = true;
    }
    ::close(fd);
  }
  std::filesystem::remove(dir + "/snapshot.kvt");
  return found;
}

// The index finds the key (G3's headers name it), but the read checks the stored tokens against
// the request's: the block is a miss, counted corrupt, and the prefix before it still loads.
TEST(Identity, AG3BlockWhoseStoredTokensAreNotTheRequestsIsNeverServed) {
  TempDirectory dir;
  const Identity id = BaseIdentity();
  const std::vector<TokenId> prompt = Prompt(13, 4 * 16 + 1);
  const std::vector<BlockKey> keys = KeysOf(id, prompt);
  {
    auto m = OpenManager(id, dir.path());
    ASSERT_NE(m, nullptr);
    MiniEngine e(m.get(), 16, id.model_id);
    e.RunSpec(SpecOf(id, "a", prompt), keys);
    m->WaitForSaves();
  }  // flushed to G3
  // Block 2 as another prompt's block that collided with it: one token differs.
  std::vector<TokenId> other(prompt.begin() + 2 * 16, prompt.begin() + 3 * 16);
  other[5] += 1;
  ASSERT_TRUE(ForgeStoredTokens(dir.path(), keys[2], other));

  auto m = OpenManager(id, dir.path());
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(m->Stats().g3_blocks, 4u) << "the restart did not recover the four blocks";
  MiniEngine e(m.get(), 16, id.model_id);
  const MiniEngine::Outcome out = e.RunSpec(SpecOf(id, "b", prompt), keys);
  EXPECT_EQ(out.offered_tokens, 4u * 16) << "G3's headers name all four keys";
  EXPECT_EQ(out.loaded_tokens, 2u * 16)
      << "a G3 block whose stored tokens differ from the request's was served";
  EXPECT_EQ(out.mismatched_blocks, 0u);
  EXPECT_GE(m->Stats().corrupt_blocks, 1u);
}

// ---------------------------------------------------------------------------------------------
// The hasher cache's bound (manager.max_namespaces).

TEST(HasherCacheTest, KeepsTheMostRecentlyUsedAndRemakesTheSameKeys) {
  HasherCache cache(ModelId(), testing::TestLayout().Fingerprint(), 16, HashAlgorithm::kSha256, 2);
  auto s1 = cache.Get("s1", "lora");
  auto s2 = cache.Get("s2", "lora");
  ASSERT_TRUE(s1.ok() && s2.ok());
  EXPECT_EQ(cache.Get("s1", "lora")->get(), s1->get());  // kept; now the most recent
  ASSERT_TRUE(cache.Get("s3", "lora").ok());             // drops s2, the least recent
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.evictions(), 1u);
  EXPECT_EQ(cache.Get("s1", "lora")->get(), s1->get());
  EXPECT_FALSE(cache.Names((*s2)->root().hi).has_value()) << "a dropped namespace's names";
  // s2 again: a new hasher, the same keys; the old one still works for whoever holds it.
  auto again = cache.Get("s2", "lora");
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->get(), s2->get());
  const std::vector<TokenId> tokens = Prompt(15, 3 * 16);
  EXPECT_EQ((*again)->KeysFor(tokens), (*s2)->KeysFor(tokens));
  auto names = cache.Names((*again)->root().hi);
  ASSERT_TRUE(names.has_value());
  EXPECT_EQ(names->first, "lora");
  EXPECT_EQ(names->second, "s2");
  // Salt and adapter are two fields, never one string: ("ab", "c") is not ("a", "bc").
  auto ab = cache.Get("ab", "c"), a = cache.Get("a", "bc");
  ASSERT_TRUE(ab.ok() && a.ok());
  EXPECT_NE((*ab)->root(), (*a)->root());
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.evictions(), 4u);
}

// Salt `i`: 4 KiB, as long as vLLM's channel lets an API client make it.
std::string LongSalt(uint32_t i) {
  std::string s = "tenant-" + std::to_string(i) + "-";
  s.resize(4096, static_cast<char>('a' + i % 26));
  return s;
}

// 10,000 distinct 4 KiB salts through Lookup and Commit leave at most manager.max_namespaces
// hashers; a salt whose hasher was dropped comes back to the same keys (its blocks still hit).
TEST(HasherCacheBound, TenThousandDistinctSaltsLeaveTheCacheAtItsBound) {
  constexpr uint32_t kBound = 256;
  Config config = testing::SmallConfig("", 32, 0);
  ASSERT_TRUE(config.Set("manager.max_namespaces", std::to_string(kBound)).ok());
  ManagerOptions o;
  o.layout = testing::TestLayout();
  o.model_id = ModelId();
  o.config = config;
  auto impl = BlockManagerImpl::Create(o);
  ASSERT_TRUE(impl.ok()) << impl.status().ToString();
  BlockManagerImpl* raw = impl->get();
  EmbeddedManager manager(std::move(impl).value());
  MiniEngine e(&manager, 16, o.model_id);

  Identity id = BaseIdentity();
  id.model_id = o.model_id;
  id.extras.clear();
  const std::vector<TokenId> prompt = Prompt(14, 2 * 16 + 1);
  id.salt = LongSalt(0);
  EXPECT_EQ(e.RunSpec(SpecOf(id, "first", prompt), KeysOf(id, prompt)).offered_tokens, 0u);

  size_t most = 0;
  for (uint32_t i = 1; i <= 10000; ++i) {
    id.salt = LongSalt(i);
    RequestSpec spec = SpecOf(id, "r" + std::to_string(i), prompt);
    spec.store_tiers = 0;  // nothing stored: salt 0's blocks stay in G2
    const MiniEngine::Outcome out = e.RunSpec(spec, KeysOf(id, prompt));
    if (out.offered_tokens != 0) {
      ADD_FAILURE() << "salt " << i << " was offered salt 0's blocks";
      break;
    }
    most = std::max(most, raw->CachedNamespaces());
  }
  EXPECT_LE(most, kBound) << "the hasher cache grew past manager.max_namespaces";
  EXPECT_EQ(raw->CachedNamespaces(), kBound);

  id.salt = LongSalt(0);  // its hasher was dropped long ago
  const MiniEngine::Outcome back = e.RunSpec(SpecOf(id, "back", prompt), KeysOf(id, prompt));
  EXPECT_EQ(back.offered_tokens, 2u * 16) << "salt 0 came back to other keys";
  EXPECT_EQ(back.loaded_tokens, 2u * 16);
  EXPECT_EQ(back.mismatched_blocks, 0u);
  EXPECT_EQ(manager.Stats().tracked_requests, 0u);
}

}  // namespace
}  // namespace kvtier

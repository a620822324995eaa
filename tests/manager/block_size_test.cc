// Any block size (issue 24): vLLM's block sizes are not all powers of two (528 or 784 for
// hybrid models, any multiple of 32 such as 96 on its CPU backend). Here blocks of 3, 96, 784
// and 2048 tokens go G1 -> G2 -> G3 -> G1 through the connector API, across a restart (the
// snapshot, then a header scan) and through G4 (fs), every loaded byte checked against what its
// key implies; 2048-token blocks have a 12 KiB at-rest header (block_format.h), the others 4 KiB.
// And the at-rest format stays readable across its version change: a G3 written in format
// version 1 (before any-size blocks) is served after the upgrade; one of a version this build
// does not know is dropped, and `kvtier inspect` says which version and what to do.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "cli_run.h"
#include "manager_test_util.h"
#include "tier/block_format.h"

namespace kvtier {
namespace {

using testing::MiniEngine;
using testing::Prompt;
using testing::TempDirectory;

KvLayout LayoutOf(uint32_t tpb) {
  // 2 layers x 2 planes x 8 x 4 B = 128 B per token
  return KvLayout{.num_layers = 2,
                  .num_kv_heads = 1,
                  .head_dim = 8,
                  .tokens_per_block = tpb,
                  .dtype = DType::kFp32};
}

// G2 of `g2_blocks` slots (their header area included), G3 of `g3_blocks` in `g3_dir` (none
// when empty), G4 on the filesystem in `g4_dir` (none when empty).
Config ConfigFor(const KvLayout& l, uint64_t g2_blocks, const std::string& g3_dir,
                 uint64_t g3_blocks, const std::string& g4_dir = "") {
  const uint64_t slot = BlockHeaderBytes(l) + (l.BlockBytes() + 4095) / 4096 * 4096;
  Config c = testing::TierConfig(slot, g2_blocks, g3_dir, g3_blocks);
  if (!g4_dir.empty()) {
    EXPECT_TRUE(c.Set("g4.backend", "fs").ok());
    EXPECT_TRUE(c.Set("g4.dir", g4_dir).ok());
    // What is checked here is the bytes, not the deadlines: ones a loaded machine meets.
    EXPECT_TRUE(c.Set("g4.lookup_deadline_ms", "5000").ok());
    EXPECT_TRUE(c.Set("g4.load_deadline_ms", "10000").ok());
  }
  return c;
}

std::unique_ptr<BlockManager> Make(const KvLayout& layout, const Config& config) {
  ManagerOptions o;
  o.layout = layout;
  o.model_id = "test-model";  // MiniEngine keys (and checks loaded bytes) in this namespace
  o.config = config;
  auto m = BlockManager::Create(o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(m).value() : nullptr;
}

// Collects a manager's events (they arrive on the threads that made the changes).
struct EventLog {
  std::mutex mu;
  std::vector<KvEvent> events;
  void Subscribe(BlockManager& m) {
    m.SubscribeEvents([this](std::span<const KvEvent> e) {
      std::lock_guard<std::mutex> lock(mu);
      events.insert(events.end(), e.begin(), e.end());
    });
  }
  // The store of each of `keys` in `tier` was published with its block's tokens, the block size
  // and its parent, as vLLM's BlockStored carries them.
  void ExpectStores(const std::vector<BlockKey>& keys, const std::vector<TokenId>& prompt,
                    uint32_t tpb, TierId tier) {
    std::lock_guard<std::mutex> lock(mu);
    for (size_t i = 0; i < keys.size(); ++i) {
      const KvEvent* found = nullptr;
      for (const KvEvent& e : events) {
        if (e.kind == KvEvent::Kind::kStored && e.tier == tier && e.key == keys[i]) found = &e;
      }
      ASSERT_NE(found, nullptr) << "no store of block " << i << " in tier " << int(tier);
      EXPECT_EQ(found->block_size, tpb);
      const std::vector<TokenId> want(prompt.begin() + i * tpb, prompt.begin() + (i + 1) * tpb);
      EXPECT_EQ(found->token_ids, want) << "block " << i;
      EXPECT_EQ(found->parent_is_root, i == 0) << "block " << i;
      if (i > 0) {
        EXPECT_EQ(found->parent, keys[i - 1]) << "block " << i;
      }
    }
  }
};

class AnyBlockSize : public ::testing::TestWithParam<uint32_t> {};

TEST_P(AnyBlockSize, RoundTripsG1G2G3G1AndThroughARestartByteExact) {
  const uint32_t tpb = GetParam();
  const KvLayout layout = LayoutOf(tpb);
  ASSERT_TRUE(layout.Validate().ok()) << layout.Validate().ToString();
  TempDirectory dir;
  const Config config = ConfigFor(layout, 12, dir.path(), 64);  // 4 staging + 8 cache in G2
  const std::vector<TokenId> prompt = Prompt(1, size_t{4} * tpb + 1);
  std::vector<BlockKey> keys;
  {
    EventLog log;  // outlives the manager, which may publish while it shuts down
    auto mgr = Make(layout, config);
    ASSERT_NE(mgr, nullptr);
    log.Subscribe(*mgr);
    MiniEngine engine(mgr.get(), 64);
    keys = engine.Keys(prompt);
    ASSERT_EQ(keys.size(), 4u);
    const auto first = engine.Run("p0", prompt);
    EXPECT_EQ(first.offered_tokens, 0u);
    mgr->WaitForSaves();
    log.ExpectStores(keys, prompt, tpb, kTierG2);
    // G1 -> G2, then G2 -> G3 as six more prompts push it out of G2's 8 cache slots.
    for (uint32_t i = 1; i <= 6; ++i) {
      engine.Run("f" + std::to_string(i), Prompt(1 + i, size_t{4} * tpb + 1));
    }
    mgr->WaitForSaves();
    ManagerStats s = mgr->Stats();
    EXPECT_EQ(s.saved_blocks, 7u * 4);
    EXPECT_GT(s.demoted_blocks, 0u);
    // G3 -> G1 (staged through G2): every block of the prefix, byte for byte.
    const auto back = engine.Run("p0-again", prompt);
    EXPECT_EQ(back.planned_tokens, 4u * tpb);
    EXPECT_EQ(back.loaded_tokens, 4u * tpb);
    EXPECT_EQ(back.mismatched_blocks, 0u);
    EXPECT_FALSE(back.load_error);
    s = mgr->Stats();
    EXPECT_GT(s.hit_blocks[kTierG3], 0u) << "the prefix came back from G3";
    EXPECT_EQ(s.pinned_blocks, 0u);
  }
  // A warm restart from the clean-shutdown snapshot: G2 is empty, G3 serves the prefix.
  {
    auto mgr = Make(layout, config);
    ASSERT_NE(mgr, nullptr);
    EXPECT_GE(mgr->Stats().g3_blocks, 4u);
    MiniEngine engine(mgr.get(), 64);
    const auto r = engine.Run("after-restart", prompt);
    EXPECT_EQ(r.loaded_tokens, 4u * tpb);
    EXPECT_EQ(r.mismatched_blocks, 0u);
    EXPECT_EQ(mgr->Stats().hit_blocks[kTierG3], 4u);
  }
  // Without the snapshot: the header scan reads every slot's header (of this block size) back,
  // tokens included, which the recovered blocks' G3 events carry.
  ASSERT_TRUE(std::filesystem::remove(dir.path() + "/snapshot.kvt"));
  {
    EventLog log;
    auto mgr = Make(layout, config);
    ASSERT_NE(mgr, nullptr);
    log.Subscribe(*mgr);
    log.ExpectStores(keys, prompt, tpb, kTierG3);
    MiniEngine engine(mgr.get(), 64);
    const auto r = engine.Run("after-scan", prompt);
    EXPECT_EQ(r.loaded_tokens, 4u * tpb);
    EXPECT_EQ(r.mismatched_blocks, 0u);
    EXPECT_EQ(mgr->Stats().hit_blocks[kTierG3], 4u);
  }
}

// G4 objects are [header | payload] too: another manager on the same G4 loads them byte-exact.
TEST_P(AnyBlockSize, AnotherManagerLoadsItFromG4ByteExact) {
  const uint32_t tpb = GetParam();
  const KvLayout layout = LayoutOf(tpb);
  TempDirectory dir;
  const Config config = ConfigFor(layout, 32, "", 0, dir.path() + "/g4");
  const std::vector<TokenId> prompt = Prompt(9, size_t{3} * tpb + 2);
  {
    auto a = Make(layout, config);
    ASSERT_NE(a, nullptr);
    MiniEngine engine(a.get(), 16);
    engine.Run("a", prompt);
    a->WaitForSaves();
    EXPECT_EQ(a->Stats().g4_saved_blocks, 3u);
  }
  auto b = Make(layout, config);
  ASSERT_NE(b, nullptr);
  MiniEngine engine(b.get(), 16);
  const auto r = engine.Run("b", prompt);
  EXPECT_EQ(r.loaded_tokens, 3u * tpb);
  EXPECT_EQ(r.mismatched_blocks, 0u);
  EXPECT_EQ(b->Stats().hit_blocks[kTierG4], 3u);
}

INSTANTIATE_TEST_SUITE_P(Sizes, AnyBlockSize, ::testing::Values(3u, 96u, 784u, 2048u),
                         [](const ::testing::TestParamInfo<uint32_t>& info) {
                           return "Tpb" + std::to_string(info.param);
                         });

// Rewrites the format version of every block header in the G3 slot files of `dir` (4 KiB
// headers) and reseals it: for version 1, exactly the bytes a version 1 kvtier wrote (a 4 KiB
// version 2 header differs from version 1 only there: BlockFormat.Version1BlocksAreStillRead).
// Returns how many headers were rewritten.
int StampG3Version(const std::string& dir, const KvLayout& layout, uint32_t version) {
  const uint64_t stride = kBlockHeaderBytes + (layout.BlockBytes() + 4095) / 4096 * 4096;
  int stamped = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    if (f.path().filename().string().rfind("g3-", 0) != 0) continue;
    const int fd = ::open(f.path().c_str(), O_RDWR | O_CLOEXEC);
    EXPECT_GE(fd, 0) << f.path();
    if (fd < 0) continue;
    const uint64_t size = std::filesystem::file_size(f.path());
    std::vector<uint8_t> h(kBlockHeaderBytes);
    for (uint64_t off = 8192; off + stride <= size; off += stride) {
      if (::pread(fd, h.data(), h.size(), static_cast<off_t>(off)) != ssize_t(h.size())) break;
      DecodedBlockHeader d;
      if (DecodeBlockHeader(h, &d) != BlockCheck::kOk) continue;
      std::memcpy(h.data() + offsetof(BlockHeader, format_version), &version, 4);
      const uint64_t sum = XXH3_64bits(h.data(), offsetof(BlockHeader, header_checksum));
      std::memcpy(h.data() + offsetof(BlockHeader, header_checksum), &sum, 8);
      EXPECT_EQ(::pwrite(fd, h.data(), h.size(), static_cast<off_t>(off)), ssize_t(h.size()));
      ++stamped;
    }
    ::close(fd);
  }
  return stamped;
}

// A G3 directory as the version 1 kvtier left it (slot files, superblocks and geometry are
// unchanged for blocks of up to 1320 tokens): prompt P stored, the snapshot removed, so the
// upgraded manager scans the version 1 headers and then loads (and verifies) version 1 blocks.
struct Version1Directory {
  TempDirectory dir;
  KvLayout layout = LayoutOf(16);
  std::vector<TokenId> prompt = Prompt(5, 4 * 16 + 1);
  int stamped = 0;

  Config config() const { return ConfigFor(layout, 12, dir.path(), 64); }

  void Make(uint32_t version) {
    {
      auto mgr = kvtier::Make(layout, config());
      ASSERT_NE(mgr, nullptr);
      MiniEngine engine(mgr.get(), 64);
      engine.Run("p", prompt);
      mgr->WaitForSaves();
    }  // the clean shutdown writes G2 to G3
    stamped = StampG3Version(dir.path(), layout, version);
    ASSERT_GE(stamped, 4);
    std::filesystem::remove(dir.path() + "/snapshot.kvt");
  }
};

TEST(G3FormatVersions, AVersion1DirectoryIsServedAfterTheUpgrade) {
  Version1Directory v1;
  v1.Make(1);
  const cli_run::CliRun inspect =
      cli_run::RunShell(std::string(KVTIER_CLI_PATH) + " inspect " + v1.dir.path() + " 2>&1");
  EXPECT_EQ(inspect.exit_code, 0) << inspect.out;
  EXPECT_NE(inspect.out.find("blocks found: " + std::to_string(v1.stamped) + " of v1"),
            std::string::npos)
      << inspect.out;
  auto mgr = Make(v1.layout, v1.config());
  ASSERT_NE(mgr, nullptr);
  EXPECT_EQ(mgr->Stats().g3_blocks, uint64_t(v1.stamped)) << "every version 1 block recovered";
  MiniEngine engine(mgr.get(), 64);
  const auto r = engine.Run("after-upgrade", v1.prompt);
  EXPECT_EQ(r.loaded_tokens, 4u * 16);
  EXPECT_EQ(r.mismatched_blocks, 0u);
  EXPECT_EQ(mgr->Stats().hit_blocks[kTierG3], 4u);
}

TEST(G3FormatVersions, BlocksOfANewerVersionAreDroppedAndInspectSaysWhy) {
  Version1Directory v3;
  v3.Make(3);
  const cli_run::CliRun inspect =
      cli_run::RunShell(std::string(KVTIER_CLI_PATH) + " inspect " + v3.dir.path() + " 2>&1");
  EXPECT_NE(inspect.out.find("block format version 3; this build reads versions 1..2 (written "
                             "by a newer kvtier"),
            std::string::npos)
      << inspect.out;
  auto mgr = Make(v3.layout, v3.config());
  ASSERT_NE(mgr, nullptr);
  EXPECT_EQ(mgr->Stats().g3_blocks, 0u) << "nothing of an unknown version is trusted";
  MiniEngine engine(mgr.get(), 64);
  const auto r = engine.Run("after-downgrade", v3.prompt);
  EXPECT_EQ(r.offered_tokens, 0u) << "recomputed, never served";
}

}  // namespace
}  // namespace kvtier

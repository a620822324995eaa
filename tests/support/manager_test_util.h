// A minimal engine for BlockManager tests: host-memory G1 in the layer-separate arrangement, a
// G1 block allocator, and a request runner that goes through the connector API exactly as an
// engine would. "Computing" a block fills it with a deterministic function of its key, so every
// byte a load delivers can be checked against what the key implies.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/connector.h"

namespace kvtier::testing {

inline KvLayout TestLayout() {
  // 4 x 2 x 16 x 2 x 32 x 2 B = 32 KiB per block
  return KvLayout{.num_layers = 4, .num_kv_heads = 2, .head_dim = 32, .tokens_per_block = 16};
}

inline uint64_t Mix(uint64_t x) {
  x ^= x >> 31;
  x *= 0x7fb5d329728ea185ull;
  x ^= x >> 27;
  x *= 0x81dadef4bc2dd44dull;
  return x ^ (x >> 33);
}

// The canonical bytes of the block named `key`.
inline void KeyContent(const BlockKey& key, uint8_t* out, uint64_t bytes) {
  uint64_t x = key.hi ^ Mix(key.lo);
  for (uint64_t off = 0; off < bytes; off += 8) {
    x = Mix(x + off);
    std::memcpy(out + off, &x, std::min<uint64_t>(8, bytes - off));
  }
}

class TempDirectory {
 public:
  TempDirectory() {
    char tmpl[] = "/tmp/kvtier-mgr-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDirectory() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// G2 of `g2_blocks` slots of `slot` bytes, G3 of `g3_blocks` of them in `g3_dir` (none when
// empty), no G4.
inline Config TierConfig(uint64_t slot, uint64_t g2_blocks, const std::string& g3_dir,
                         uint64_t g3_blocks) {
  Config c;
  EXPECT_TRUE(c.Set("g2.capacity_bytes", std::to_string(g2_blocks * slot)).ok());
  EXPECT_TRUE(c.Set("g2.lock_memory", "false").ok());
  EXPECT_TRUE(c.Set("g2.prefault_threads", "1").ok());
  if (g3_dir.empty()) {
    EXPECT_TRUE(c.Set("g3.enabled", "false").ok());
  } else {
    EXPECT_TRUE(c.Set("g3.dir", g3_dir).ok());
    EXPECT_TRUE(c.Set("g3.capacity_bytes", std::to_string(g3_blocks * slot + (1 << 20))).ok());
    EXPECT_TRUE(c.Set("g3.admit_min_seen", "1").ok());
  }
  return c;
}

inline Config SmallConfig(const std::string& g3_dir, uint64_t g2_blocks, uint64_t g3_blocks) {
  return TierConfig(4096 + TestLayout().BlockBytes(), g2_blocks, g3_dir, g3_blocks);
}

class MiniEngine {
 public:
  // `on_device`: G1 is registered as device memory (host memory all the same; for a manager
  // whose device backend is a host stand-in, tests/support/host_device_backend.h).
  MiniEngine(BlockManager* manager, uint32_t g1_blocks, std::string model = "test-model",
             bool on_device = false)
      : manager_(manager), layout_(manager->layout()), model_(std::move(model)) {
    mem_.assign(layout_.BlockBytes() * g1_blocks, 0);
    G1Memory g1;
    g1.layout = layout_;
    g1.num_blocks = g1_blocks;
    g1.on_device = on_device;
    if (layout_.g1_arrangement == G1Arrangement::kBlockContiguous) {
      g1.regions.push_back({mem_.data(), layout_.BlockBytes()});
    } else {
      const uint64_t chunk = layout_.ChunkBytes();
      for (uint32_t r = 0; r < layout_.num_layers * layout_.num_planes; ++r) {
        g1.regions.push_back({mem_.data() + r * chunk * g1_blocks, chunk});
      }
    }
    g1_ = g1;
    free_.resize(g1_blocks);
    std::iota(free_.begin(), free_.end(), 0u);
    EXPECT_TRUE(manager_->RegisterDeviceMemory(g1).ok());
  }

  struct Outcome {
    uint32_t offered_tokens = 0;     // Lookup
    uint32_t planned_tokens = 0;     // PrepareLoad
    uint32_t loaded_tokens = 0;      // LoadedTokens
    uint64_t mismatched_blocks = 0;  // loaded blocks whose bytes differ from their key's
    bool load_error = false;
  };

  // Runs one request: lookup, load, verify, compute the rest, commit, save, finish.
  // Thread-safe: threads run their own requests (distinct ids) at once.
  Outcome Run(const std::string& id, const std::vector<TokenId>& prompt,
              const std::string& salt = "", bool wait_saves = true) {
    RequestSpec spec;
    spec.request_id = id;
    spec.prompt = prompt;
    spec.cache_salt = salt;
    return RunSpec(spec, Keys(prompt, salt), wait_saves);
  }

  // Run with the whole of a request's identity in `spec` (salt, adapter, per-block extras,
  // tiers); `keys` are the keys the test expects for its prompt (computed by the test, not
  // asked of the manager): loaded bytes are checked against them, computed blocks made from
  // them.
  Outcome RunSpec(const RequestSpec& spec, const std::vector<BlockKey>& keys,
                  bool wait_saves = true) {
    Outcome out;
    const std::string& id = spec.request_id;
    const std::vector<TokenId> prompt(spec.prompt.begin(), spec.prompt.end());
    const uint32_t tpb = layout_.tokens_per_block;
    const uint32_t nblocks = static_cast<uint32_t>((prompt.size() + tpb - 1) / tpb);
    std::vector<uint32_t> blocks = Alloc(nblocks);
    if (blocks.size() < nblocks) {
      ADD_FAILURE() << "test G1 too small";
      return out;
    }
    auto lr = manager_->Lookup(spec, 0);
    EXPECT_TRUE(lr.ok()) << lr.status().ToString();
    out.offered_tokens = lr->num_tokens;
    auto planned = manager_->PrepareLoad(id, blocks, lr->num_tokens);
    EXPECT_TRUE(planned.ok()) << planned.status().ToString();
    out.planned_tokens = *planned;
    EXPECT_TRUE(manager_->StartLoad().ok());
    for (uint32_t l = 0; l < layout_.num_layers; ++l) {
      if (!manager_->WaitLayer(l).ok()) out.load_error = true;
    }
    out.loaded_tokens = manager_->LoadedTokens(id);
    EXPECT_LE(out.loaded_tokens, out.planned_tokens);
    std::vector<uint8_t> expect(layout_.BlockBytes()), got(layout_.BlockBytes());
    for (uint32_t i = 0; i < out.loaded_tokens / tpb; ++i) {
      KeyContent(keys[i], expect.data(), expect.size());
      Gather(blocks[i], got.data());
      if (expect != got) ++out.mismatched_blocks;
    }
    for (uint32_t i = out.loaded_tokens / tpb; i < keys.size(); ++i) Compute(blocks[i], keys[i]);
    EXPECT_TRUE(manager_->Commit(id, prompt, blocks).ok());
    EXPECT_TRUE(manager_->StartSave().ok());
    if (manager_->RequestFinished(id)) {
      bool already_done = false;
      {
        // Another thread's DrainFinished may have taken this id from Finished() already.
        std::lock_guard<std::mutex> lock(mu_);
        already_done = done_early_.erase(id) > 0;
        if (!already_done) held_.push_back({id, blocks});
      }
      if (already_done) Free(blocks);
      if (wait_saves) DrainFinished(true);
    } else {
      Free(blocks);
    }
    return out;
  }

  // Frees the G1 blocks of requests the manager kept, once it reports their saves done.
  void DrainFinished(bool wait) {
    if (wait) manager_->WaitForSaves();
    FinishedRequests f = manager_->Finished();
    std::vector<std::vector<uint32_t>> to_free;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const std::string& id : f.saves_done) {
        bool found = false;
        for (size_t i = 0; i < held_.size() && !found; ++i) {
          if (held_[i].first == id) {
            to_free.push_back(std::move(held_[i].second));
            held_.erase(held_.begin() + i);
            found = true;
          }
        }
        if (!found) done_early_.insert(id);
      }
    }
    for (const auto& blocks : to_free) Free(blocks);
  }

  std::vector<BlockKey> Keys(const std::vector<TokenId>& prompt, const std::string& salt = "") {
    KeyNamespace ns{model_, layout_.Fingerprint(), salt, ""};
    return BlockHasher::Create(ns, layout_.tokens_per_block)->KeysFor(prompt);
  }

  // G1 blocks for a test that drives the connector API itself (Run never hands them out until
  // FreeBlocks gives them back).
  std::vector<uint32_t> AllocBlocks(uint32_t n) { return Alloc(n); }
  void FreeBlocks(const std::vector<uint32_t>& blocks) { Free(blocks); }
  // Sets every byte of G1 block `block` to `byte` (what an engine's recompute writes, as far as
  // a test can tell).
  void FillBlock(uint32_t block, uint8_t byte) {
    for (uint32_t l = 0; l < layout_.num_layers; ++l) {
      for (uint32_t p = 0; p < layout_.num_planes; ++p) {
        std::memset(g1_.Chunk(block, l, p), byte, layout_.ChunkBytes());
      }
    }
  }
  // The bytes of G1 block `block`, in the contiguous block layout.
  std::vector<uint8_t> BlockBytes(uint32_t block) {
    std::vector<uint8_t> out(layout_.BlockBytes());
    Gather(block, out.data());
    return out;
  }

  size_t free_blocks() {
    std::lock_guard<std::mutex> lock(mu_);
    return free_.size();
  }
  size_t held_requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return held_.size();
  }

 private:
  std::vector<uint32_t> Alloc(uint32_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<uint32_t> out;
    while (out.size() < n && !free_.empty()) {
      out.push_back(free_.back());
      free_.pop_back();
    }
    return out;
  }
  void Free(const std::vector<uint32_t>& blocks) {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint32_t b : blocks) {
      // Poison freed blocks: a save that read them after the free would store garbage.
      for (uint32_t l = 0; l < layout_.num_layers; ++l) {
        for (uint32_t p = 0; p < layout_.num_planes; ++p)
          std::memset(g1_.Chunk(b, l, p), 0xee, layout_.ChunkBytes());
      }
      free_.push_back(b);
    }
  }
  void Compute(uint32_t block, const BlockKey& key) {
    std::vector<uint8_t> bytes(layout_.BlockBytes());
    KeyContent(key, bytes.data(), bytes.size());
    for (uint32_t l = 0; l < layout_.num_layers; ++l) {
      for (uint32_t p = 0; p < layout_.num_planes; ++p) {
        std::memcpy(g1_.Chunk(block, l, p), bytes.data() + layout_.ChunkOffset(l, p),
                    layout_.ChunkBytes());
      }
    }
  }
  void Gather(uint32_t block, uint8_t* out) {
    for (uint32_t l = 0; l < layout_.num_layers; ++l) {
      for (uint32_t p = 0; p < layout_.num_planes; ++p) {
        std::memcpy(out + layout_.ChunkOffset(l, p), g1_.Chunk(block, l, p), layout_.ChunkBytes());
      }
    }
  }

  BlockManager* manager_;
  KvLayout layout_;
  std::string model_;
  std::vector<uint8_t> mem_;
  G1Memory g1_;
  std::mutex mu_;
  std::vector<uint32_t> free_;
  std::vector<std::pair<std::string, std::vector<uint32_t>>> held_;
  std::set<std::string> done_early_;  // reported done before Run recorded them as held
};

inline std::vector<TokenId> Prompt(uint32_t seed, size_t n, size_t shared_prefix = 0,
                                   uint32_t prefix_seed = 999) {
  std::vector<TokenId> t(n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t s = i < shared_prefix ? prefix_seed : seed;
    t[i] = static_cast<TokenId>(Mix(s * 1000003ull + i) % 50000);
  }
  return t;
}

// Overwrites 8 bytes of the payload of each of the first `slots` slots of every G3 slot file
// in `dir` (SmallConfig's layout), so every block G3 holds there fails verification. Returns
// how many slots were hit.
inline int CorruptG3Payloads(const std::string& dir, uint64_t slots = 64) {
  const uint64_t stride = (4096 + TestLayout().BlockBytes() + 4095) / 4096 * 4096;
  int corrupted = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    if (f.path().extension() != ".kvt") continue;
    const int fd = ::open(f.path().c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) continue;
    for (uint64_t k = 0; k < slots; ++k) {
      const uint8_t junk[8] = {0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4};
      if (::pwrite(fd, junk, sizeof(junk), 8192 + k * stride + 4096 + 1000) == sizeof(junk)) {
        ++corrupted;
      }
    }
    ::close(fd);
  }
  return corrupted;
}

// Options for a manager of TestLayout() with `config`, for model `model_id`.
inline ManagerOptions TestManagerOptions(Config config, std::string model_id = "test-model") {
  ManagerOptions o;
  o.layout = TestLayout();
  o.model_id = std::move(model_id);
  o.config = std::move(config);
  return o;
}

// A BlockManager on TestLayout() for model "test-model" with `config`; a test failure and
// nullptr when it cannot be created.
inline std::unique_ptr<BlockManager> MakeTestManager(const Config& config) {
  ManagerOptions o = TestManagerOptions(config);
  auto m = BlockManager::Create(o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(m).value() : nullptr;
}

// Polls `done` every 5 ms for up to 30 s; false when it never held.
template <typename F>
bool WaitFor(F done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace kvtier::testing

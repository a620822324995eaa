// Helpers shared by the BlockManager-with-G4 tests (tests/manager/manager_g4_test.cc and
// tests/manager/manager_g4_faults_test.cc): G4 configs over a shared directory or Redis, what a
// test does to a G4 store behind the managers' backs, and the worker that fills G4 and the
// fresh worker that reads it.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "kvtier/connector.h"
#include "manager_test_util.h"
#include "redis_test_util.h"
#include "tier/block_format.h"
#include "tier/remote_store.h"

namespace kvtier::testing {

inline Config FsConfig(const std::string& dir, uint64_t g2_blocks = 64) {
  Config c = SmallConfig("", g2_blocks, 0);
  EXPECT_TRUE(c.Set("g4.backend", "fs").ok());
  EXPECT_TRUE(c.Set("g4.dir", dir).ok());
  return c;
}

inline Config RedisConfig(const std::string& endpoint, uint64_t g2_blocks = 64) {
  Config c = SmallConfig("", g2_blocks, 0);
  EXPECT_TRUE(c.Set("g4.backend", "redis").ok());
  EXPECT_TRUE(c.Set("g4.endpoints", endpoint).ok());
  EXPECT_TRUE(c.Set("g4.lookup_deadline_ms", "50").ok());
  EXPECT_TRUE(c.Set("g4.load_deadline_ms", "300").ok());
  EXPECT_TRUE(c.Set("g4.save_deadline_ms", "300").ok());
  return c;
}

// The same config with G4 lookup and load deadlines that a loaded machine meets, for tests
// where what is checked is not the deadline (a late answer is a miss by design).
inline Config PatientReads(Config c) {
  EXPECT_TRUE(c.Set("g4.lookup_deadline_ms", "5000").ok());
  EXPECT_TRUE(c.Set("g4.load_deadline_ms", "10000").ok());
  return c;
}

inline constexpr uint32_t kTpb = 16;
inline constexpr uint32_t kG1Blocks = 64;

// What a test does to a G4 store behind the managers' backs.
struct G4Backdoor {
  std::function<void(const std::string& name)> corrupt;  // the object no longer verifies
  std::function<bool(const std::string& name)> exists;
};

// Where the fs G4 in `dir` keeps the object `name`.
inline std::string FsObjectPath(const std::string& dir, const std::string& name) {
  return dir + "/" + name.substr(22, 2) + "/" + name;
}

inline G4Backdoor FsBackdoor(const std::string& dir) {
  auto path = [dir](const std::string& name) { return FsObjectPath(dir, name); };
  G4Backdoor b;
  b.corrupt = [path](const std::string& name) {
    std::fstream f(path(name), std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good()) << path(name);
    f.seekg(kBlockHeaderBytes + 1234);
    const char c = static_cast<char>(f.get());
    f.seekp(kBlockHeaderBytes + 1234);
    f.put(static_cast<char>(c ^ 0x01));
  };
  b.exists = [path](const std::string& name) { return std::filesystem::exists(path(name)); };
  return b;
}

inline G4Backdoor RedisBackdoor(uint16_t port) {
  G4Backdoor b;
  b.corrupt = [port](const std::string& name) {
    // A byte of the header's token area.
    auto r = RedisCommand(port, {"SETRANGE", name, "200", std::string("\x7f", 1)});
    ASSERT_TRUE(r.ok && !r.IsError()) << r.text;
  };
  b.exists = [port](const std::string& name) {
    auto r = RedisCommand(port, {"EXISTS", name});
    EXPECT_TRUE(r.ok && !r.IsError()) << r.text;
    return r.text == "1";
  };
  return b;
}

// The namespace id of "test-model" on TestLayout() without salt or adapter.
inline uint64_t TestNamespace() {
  KeyNamespace kn{"test-model", TestLayout().Fingerprint(), "", ""};
  return BlockHasher::Create(kn, kTpb)->root().hi;
}

// Worker A runs `prompt` (with `salt`) as request "a" on a manager over `config` and waits for
// its saves, so that G4 holds the prompt's blocks; their keys, and A's stats then in `*stats`
// when it is not null. A is gone when this returns.
inline std::vector<BlockKey> SavedByWorkerA(const Config& config,
                                            const std::vector<TokenId>& prompt,
                                            const std::string& salt = "",
                                            ManagerStats* stats = nullptr) {
  auto a = MakeTestManager(config);
  EXPECT_NE(a, nullptr);
  if (a == nullptr) return {};
  MiniEngine ea(a.get(), kG1Blocks);
  ea.Run("a", prompt, salt);
  a->WaitForSaves();
  if (stats != nullptr) *stats = a->Stats();
  return ea.Keys(prompt, salt);
}

// A fresh worker (a manager of its own G2 over `config`) runs `prompt` as request `id`; every
// save of it ends. Its outcome in `*out`, and the worker's stats then in `*stats` when it is not
// null. The worker must be created (wrap in ASSERT_NO_FATAL_FAILURE); it is gone when this
// returns.
inline void RunOnFreshWorker(const Config& config, const std::string& id,
                             const std::vector<TokenId>& prompt, MiniEngine::Outcome* out,
                             ManagerStats* stats = nullptr) {
  auto b = MakeTestManager(config);
  ASSERT_NE(b, nullptr);
  MiniEngine eb(b.get(), kG1Blocks);
  *out = eb.Run(id, prompt);
  b->WaitForSaves();
  if (stats != nullptr) *stats = b->Stats();
}

// RunOnFreshWorker, and its outcome: `tokens` loaded (`why` on failure), none of them wrong.
// Wrap in ASSERT_NO_FATAL_FAILURE.
inline void FreshWorkerLoads(const Config& config, const std::string& id,
                             const std::vector<TokenId>& prompt, uint32_t tokens,
                             ManagerStats* stats = nullptr, const std::string& why = "") {
  MiniEngine::Outcome out;
  ASSERT_NO_FATAL_FAILURE(RunOnFreshWorker(config, id, prompt, &out, stats));
  EXPECT_EQ(out.loaded_tokens, tokens) << why;
  EXPECT_EQ(out.mismatched_blocks, 0u);
}

// An fs G4 in a fresh directory (`g4`, patient reads: `config`) that worker A filled with a
// prompt (Save), and the object name and path of one of its blocks.
struct FsG4Object {
  TempDirectory dir;
  std::string g4 = dir.path() + "/g4";
  Config config = PatientReads(FsConfig(g4));
  std::string name;
  std::string path;

  // Worker A saves `prompt`; `name` and `path` are then block `index`'s, which must exist
  // (wrap in ASSERT_NO_FATAL_FAILURE).
  void Save(const std::vector<TokenId>& prompt, size_t index) {
    const std::vector<BlockKey> keys = SavedByWorkerA(config, prompt);
    ASSERT_GT(keys.size(), index);
    name = RemoteObjectName(TestNamespace(), keys[index]);
    path = FsObjectPath(g4, name);
  }
};

}  // namespace kvtier::testing

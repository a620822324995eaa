// Helpers of the kvtier serve tests (service_test.cc, service_pools_test.cc): a real
// `kvtier serve` process, attached engines with a host G1, and blocks whose bytes are a
// function of their prompt and position.
#pragma once

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "kvtier/connector.h"
#include "proto/protocol.h"
#include "proto/unix_socket.h"

namespace kvtier::service_test {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

inline KvLayout TestLayout() {
  return KvLayout{.num_layers = 4,
                  .num_planes = 2,
                  .num_kv_heads = 2,
                  .head_dim = 16,
                  .tokens_per_block = 16,
                  .dtype = DType::kFp16,
                  .g1_arrangement = G1Arrangement::kBlockContiguous};
}

// An engine: an attached manager and a host G1 of `blocks` blocks.
struct Engine {
  std::vector<uint8_t> g1_bytes;
  G1Memory g1;
  std::unique_ptr<BlockManager> manager;
};

// G1 of `blocks` blocks of `layout`, block-contiguous in `bytes` (sized here).
inline G1Memory ContiguousG1(const KvLayout& layout, uint32_t blocks, std::vector<uint8_t>& bytes) {
  bytes.assign(uint64_t{blocks} * layout.BlockBytes(), 0);
  G1Memory g1;
  g1.layout = layout;
  g1.num_blocks = blocks;
  g1.regions = {G1Region{bytes.data(), layout.BlockBytes()}};
  return g1;
}

// `model`: the model id (each model and layout is a pool of its own in the daemon). `config`:
// more settings for the engine (after the defaults below).
inline Result<Engine> TryMakeEngine(
    const std::string& socket, const std::string& name, const std::string& model = "service-test",
    uint32_t blocks = 64, const std::vector<std::pair<std::string, std::string>>& config = {}) {
  Engine e;
  const KvLayout layout = TestLayout();
  e.g1 = ContiguousG1(layout, blocks, e.g1_bytes);
  ManagerOptions o;
  o.layout = layout;
  o.model_id = model;
  EXPECT_TRUE(o.config.Set("service.socket", socket).ok());
  EXPECT_TRUE(o.config.Set("service.instance", name).ok());
  EXPECT_TRUE(o.config.Set("service.reattach_ms", "100").ok());
  EXPECT_TRUE(o.config.Set("service.call_timeout_ms", "2000").ok());
  for (const auto& [k, v] : config) EXPECT_TRUE(o.config.Set(k, v).ok()) << k;
  KVTIER_ASSIGN_OR_RETURN(e.manager, BlockManager::Create(o));
  EXPECT_TRUE(e.manager->attached());
  KVTIER_RETURN_IF_ERROR(e.manager->RegisterDeviceMemory(e.g1));
  return e;
}

inline Engine MakeEngine(const std::string& socket, const std::string& name, uint32_t blocks = 64,
                         const std::string& model = "service-test") {
  Result<Engine> e = TryMakeEngine(socket, name, model, blocks);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(*e) : Engine{};
}

inline std::vector<TokenId> Prompt(uint32_t seed, uint32_t tokens) {
  std::vector<TokenId> p(tokens);
  for (uint32_t i = 0; i < tokens; ++i) p[i] = seed * 100003u + i * 7u + 1u;
  return p;
}

// The bytes block `index` of prompt `seed` holds: a function of both, so a block loaded from
// another prompt or another position is caught.
inline void FillBlock(uint8_t* dst, uint64_t bytes, uint32_t seed, uint32_t index) {
  uint64_t x = (uint64_t{seed} << 32) ^ (index * 0x9e3779b97f4a7c15ull) ^ 0x1234567ull;
  for (uint64_t i = 0; i < bytes; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    dst[i] = static_cast<uint8_t>(x);
  }
}

inline bool BlockIs(const uint8_t* src, uint64_t bytes, uint32_t seed, uint32_t index) {
  std::vector<uint8_t> want(bytes);
  FillBlock(want.data(), bytes, seed, index);
  return std::memcmp(src, want.data(), bytes) == 0;
}

// The first half of computing prompt `seed` (`blocks` full blocks + 1 token, into `*prompt`)
// as request `id` of `manager`: its Lookup, and its PrepareLoad into G1 blocks
// [first, first + blocks] (`*ids`).
inline void LookUpAndPrepare(BlockManager& manager, const KvLayout& l, const std::string& id,
                             uint32_t seed, uint32_t blocks, uint32_t first,
                             std::vector<TokenId>* prompt, std::vector<uint32_t>* ids) {
  *prompt = Prompt(seed, blocks * l.tokens_per_block + 1);
  RequestSpec spec;
  spec.request_id = id;
  spec.prompt = *prompt;
  ASSERT_TRUE(manager.Lookup(spec, 0).ok());
  for (uint32_t b = 0; b < blocks + 1; ++b) ids->push_back(first + b);
  ASSERT_TRUE(manager.PrepareLoad(id, *ids, 0).ok());
}

// Computes (fills) and saves prompt `seed` (`blocks` full blocks + 1 token) in G1 blocks
// [first, first + blocks); waits until its saves are done.
inline void ComputeAndSave(Engine& e, const std::string& id, uint32_t seed, uint32_t blocks,
                           uint32_t first = 0) {
  const KvLayout& l = e.g1.layout;
  std::vector<TokenId> prompt;
  std::vector<uint32_t> ids;
  ASSERT_NO_FATAL_FAILURE(LookUpAndPrepare(*e.manager, l, id, seed, blocks, first, &prompt, &ids));
  for (uint32_t b = 0; b < blocks; ++b) {
    FillBlock(e.g1_bytes.data() + uint64_t{first + b} * l.BlockBytes(), l.BlockBytes(), seed, b);
  }
  ASSERT_TRUE(e.manager->Commit(id, prompt, ids).ok());
  ASSERT_TRUE(e.manager->StartSave().ok());
  if (e.manager->RequestFinished(id)) {
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    bool done = false;
    while (!done && Clock::now() < deadline) {
      for (const std::string& s : e.manager->Finished().saves_done) done = done || s == id;
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_TRUE(done) << "the saves of " << id << " did not end within 10 s";
  }
}

// An engine attached to the daemon on `socket` as `name` (MakeEngine) that has computed and saved
// prompt `seed` as request `id` (ComputeAndSave, whose failures are the caller's test's).
inline Engine EngineThatSaved(const std::string& socket, const std::string& name,
                              const std::string& id, uint32_t seed, uint32_t blocks,
                              uint32_t first = 0) {
  Engine e = MakeEngine(socket, name);
  ComputeAndSave(e, id, seed, blocks, first);
  return e;
}

// Looks prompt `seed` up and loads what is found into G1 blocks from `first`; returns the
// tokens loaded intact, and checks every loaded block's bytes.
inline uint32_t LookupAndLoad(Engine& e, const std::string& id, uint32_t seed, uint32_t blocks,
                              uint32_t first, bool* bytes_ok) {
  const KvLayout& l = e.g1.layout;
  const std::vector<TokenId> prompt = Prompt(seed, blocks * l.tokens_per_block + 1);
  RequestSpec spec;
  spec.request_id = id;
  spec.prompt = prompt;
  auto found = e.manager->Lookup(spec, 0);
  EXPECT_TRUE(found.ok()) << found.status().ToString();
  if (!found.ok()) return 0;
  std::vector<uint32_t> ids;
  for (uint32_t b = 0; b < blocks + 1; ++b) ids.push_back(first + b);
  std::fill(e.g1_bytes.begin() + uint64_t{first} * l.BlockBytes(),
            e.g1_bytes.begin() + uint64_t{first + blocks} * l.BlockBytes(), 0);
  auto planned = e.manager->PrepareLoad(id, ids, found->num_tokens);
  EXPECT_TRUE(planned.ok());
  EXPECT_TRUE(e.manager->StartLoad().ok());
  for (uint32_t layer = 0; layer < l.num_layers; ++layer) (void)e.manager->WaitLayer(layer);
  const uint32_t loaded = e.manager->LoadedTokens(id);
  *bytes_ok = true;
  for (uint32_t b = 0; b < loaded / l.tokens_per_block; ++b) {
    if (!BlockIs(e.g1_bytes.data() + uint64_t{first + b} * l.BlockBytes(), l.BlockBytes(), seed,
                 b)) {
      *bytes_ok = false;
    }
  }
  (void)e.manager->RequestFinished(id);
  (void)e.manager->Finished();
  return loaded;
}

// Commits prompt `seed` (32 blocks) in four save batches of 8 blocks, as four engine steps
// would, and starts them: with KVTIER_TEST_ATTACHED_COPY_STALL_MS set, the first batch ends
// (its blocks counted) while the others are still lent to this engine. The "stall" child of
// the service tests, which then waits to be killed.
inline void CommitStalledSaves(Engine& e, uint32_t seed) {
  const KvLayout& l = e.g1.layout;
  const std::vector<TokenId> prompt = Prompt(seed, 32 * l.tokens_per_block + 1);
  RequestSpec spec;
  spec.request_id = "k-req";
  spec.prompt = prompt;
  (void)e.manager->Lookup(spec, 0);
  std::vector<uint32_t> ids;
  for (uint32_t b = 0; b < 33; ++b) ids.push_back(b);
  (void)e.manager->PrepareLoad("k-req", ids, 0);
  for (uint32_t b = 0; b < 32; ++b) {
    FillBlock(e.g1_bytes.data() + uint64_t{b} * l.BlockBytes(), l.BlockBytes(), seed, b);
  }
  for (uint32_t round = 1; round <= 4; ++round) {
    (void)e.manager->Commit(
        "k-req", std::span<const TokenId>(prompt.data(), round * 8 * l.tokens_per_block), ids);
    (void)e.manager->StartSave();
  }
}

// A Hello of this test's model and layout sent by hand on `fd`, and the daemon's reply frame.
inline Result<proto::Frame> RawHello(int fd, proto::Role role, const std::string& instance,
                                     const std::string& model = "service-test") {
  proto::Hello hello;
  hello.role = role;
  hello.instance_name = instance;
  hello.model_id = model;
  hello.layout = TestLayout();
  proto::WireWriter w;
  proto::EncodeHello(&w, hello);
  KVTIER_RETURN_IF_ERROR(
      proto::SendFrame(fd, static_cast<uint16_t>(proto::MsgType::kHello), 1, w.data()));
  return proto::RecvFrame(fd, Clock::now() + std::chrono::seconds(5));
}

// Waits for child `pid`: its exit code, or 128 + the signal that ended it.
inline int WaitExit(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// A real `kvtier serve` process.
class Daemon {
 public:
  explicit Daemon(std::string socket) : socket_(std::move(socket)) {}
  ~Daemon() { Kill(SIGKILL); }
  // `g3_dir`: G3 there (flushed from G2 at a clean shutdown); empty: G2 only. `g4_dir`: a
  // filesystem G4 there, fed by G3's demotions (no write-through).
  // `env`: more KVTIER_* settings for the daemon.
  void Start(uint32_t lease_ms = 1000, const std::string& g3_dir = "",
             const std::string& g4_dir = "",
             const std::vector<std::pair<std::string, std::string>>& env = {}) {
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setenv("KVTIER_G2_CAPACITY_BYTES", "8MiB", 1);
      ::setenv("KVTIER_G3_ENABLED", g3_dir.empty() ? "false" : "true", 1);
      if (!g3_dir.empty()) {
        ::setenv("KVTIER_G3_DIR", g3_dir.c_str(), 1);
        ::setenv("KVTIER_G3_CAPACITY_BYTES", "16MiB", 1);
        ::setenv("KVTIER_G3_ADMIT_MIN_SEEN", "1", 1);
      }
      if (!g4_dir.empty()) {
        ::setenv("KVTIER_G4_BACKEND", "fs", 1);
        ::setenv("KVTIER_G4_DIR", g4_dir.c_str(), 1);
        ::setenv("KVTIER_G4_WRITE_THROUGH", "false", 1);
      }
      ::setenv("KVTIER_G2_LOCK_MEMORY", "false", 1);
      ::setenv("KVTIER_SERVICE_LEASE_MS", std::to_string(lease_ms).c_str(), 1);
      for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      ::execl(KVTIER_CLI_PATH, KVTIER_CLI_PATH, "serve", "--socket", socket_.c_str(),
              static_cast<char*>(nullptr));
      _exit(127);
    }
    ASSERT_GT(pid_, 0);
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (Clock::now() < deadline) {
      if (proto::ConnectUnix(socket_).ok()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    FAIL() << "kvtier serve did not listen on " << socket_ << " within 20 s";
  }
  pid_t pid() const { return pid_; }
  // Returns the exit status (for SIGTERM: 0 when it shut down cleanly).
  int Kill(int sig) {
    if (pid_ <= 0) return -1;
    ::kill(pid_, sig);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return status;
  }

 private:
  std::string socket_;
  pid_t pid_ = -1;
};

// The directories TempDir made in this process, removed when it exits (each test is its own
// process under ctest): a suite that left them behind filled /tmp run after run (66 MiB per
// identity test). A forked child that exits does not remove its parent's.
struct MadeTempDirs {
  pid_t owner = ::getpid();
  std::vector<std::string> dirs;
  static MadeTempDirs& Get() {
    static MadeTempDirs* made = [] {
      auto* m = new MadeTempDirs;
      std::atexit([] {
        MadeTempDirs& d = Get();
        if (::getpid() != d.owner) return;
        std::error_code ec;
        for (const std::string& dir : d.dirs) fs::remove_all(dir, ec);
      });
      return m;
    }();
    return *made;
  }
};

// A fresh 0700 directory /tmp/kvtier-service-test-TAG-PID, removed when the process exits.
inline std::string TempDir(const std::string& tag) {
  std::string dir = "/tmp/kvtier-service-test-" + tag + "-" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  ::chmod(dir.c_str(), 0700);
  MadeTempDirs& made = MadeTempDirs::Get();
  if (std::find(made.dirs.begin(), made.dirs.end(), dir) == made.dirs.end()) {
    made.dirs.push_back(dir);
  }
  return dir;
}

// A `kvtier serve` on a socket in a fresh directory TempDir(`tag`), not started yet (the test
// starts it: daemon.Start(...)). Members in the order a test used to declare them, so the
// daemon is killed before the paths go.
struct ServedDir {
  explicit ServedDir(const std::string& tag)
      : dir(TempDir(tag)), socket(dir + "/sock/kvtier.sock"), daemon(socket) {}
  const std::string dir;
  const std::string socket;
  Daemon daemon;
};

// Runs this binary again (as `argv0`) with only the test `test` (a gtest filter) and `env`
// set in the child; returns its pid.
inline pid_t SpawnSelf(const char* argv0, const std::string& test,
                       const std::vector<std::pair<std::string, std::string>>& env) {
  const std::string filter = "--gtest_filter=" + test;
  const pid_t pid = ::fork();
  if (pid == 0) {
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    ::execl("/proc/self/exe", argv0, filter.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

}  // namespace kvtier::service_test

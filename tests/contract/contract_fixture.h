// The BlockManager contract suite's fixture: every test runs once per implementation that
// BlockManager::Create can return, built only through the public API (include/kvtier/):
//   embedded  the default: the manager runs in this process;
//   attached  service.socket set: the manager is a real `kvtier serve` process that the test
//             starts (and kills at its end), and this process copies between its G1 and its
//             mapping of the daemon's G2.
// A test asks for a manager with the tier settings it needs (G2 and G3 sizes, transfer and
// manager keys); embedded they are the manager's Config, attached they are the daemon's
// environment (KVTIER_*), so both implementations run the same cache. The contract is
// connector.h's comments; a test asserts only what they promise, so both modes must pass it.
#pragma once

#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "kvtier/connector.h"
#include "manager_test_util.h"

namespace kvtier::contract {

enum class Mode { kEmbedded, kAttached };

inline std::string ModeName(const ::testing::TestParamInfo<Mode>& info) {
  return info.param == Mode::kEmbedded ? "embedded" : "attached";
}

// Settings of the cache (not of the engine): key, value, as `kvtier config` names them.
using Settings = std::vector<std::pair<std::string, std::string>>;

// G2 of `g2_slots` slots of testing::TestLayout() blocks and, with `g3_dir`, G3 of `g3_slots`
// of them there (admitting every block it is offered), as testing::SmallConfig has them.
inline Settings Tiers(uint64_t g2_slots, const std::string& g3_dir = "", uint64_t g3_slots = 0) {
  const uint64_t slot = 4096 + testing::TestLayout().BlockBytes();
  Settings s = {{"g2.capacity_bytes", std::to_string(g2_slots * slot)},
                {"g2.lock_memory", "false"},
                {"g2.prefault_threads", "1"}};
  if (g3_dir.empty()) {
    s.push_back({"g3.enabled", "false"});
  } else {
    s.push_back({"g3.enabled", "true"});
    s.push_back({"g3.dir", g3_dir});
    s.push_back({"g3.capacity_bytes", std::to_string(g3_slots * slot + (1 << 20))});
    s.push_back({"g3.admit_min_seen", "1"});
  }
  return s;
}

// `g3.dir` -> KVTIER_G3_DIR, as the configuration reads its environment.
inline std::string EnvName(const std::string& key) {
  std::string env = "KVTIER_";
  for (char c : key) env += c == '.' ? '_' : static_cast<char>(std::toupper(c));
  return env;
}

// True once something accepts connections on the Unix socket at `path`.
inline bool Listening(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const bool ok = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

// A real `kvtier serve` (the binary the tests were built with), killed when this goes.
class ServeProcess {
 public:
  ServeProcess() = default;
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;
  ~ServeProcess() { Stop(SIGKILL); }

  // Starts it on `socket` with `settings` in its environment; a test failure when it does not
  // listen within 20 s.
  void Start(const std::string& socket, const Settings& settings) {
    pid_ = ::fork();
    if (pid_ == 0) {
      for (const auto& [key, value] : settings) ::setenv(EnvName(key).c_str(), value.c_str(), 1);
      ::execl(KVTIER_CLI_PATH, KVTIER_CLI_PATH, "serve", "--socket", socket.c_str(),
              static_cast<char*>(nullptr));
      _exit(127);
    }
    ASSERT_GT(pid_, 0) << "fork: " << std::strerror(errno);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      if (Listening(socket)) return;
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        FAIL() << "kvtier serve exited before it listened (status " << status << ")";
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    FAIL() << "kvtier serve did not listen on " << socket << " within 20 s";
  }
  bool running() const { return pid_ > 0; }
  void Stop(int sig) {
    if (pid_ <= 0) return;
    ::kill(pid_, sig);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

class BlockManagerContract : public ::testing::TestWithParam<Mode> {
 protected:
  BlockManagerContract() {
    char tmpl[] = "/tmp/kvtier-contract-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    ::chmod(dir_.c_str(), 0700);  // kvtier serve refuses a socket directory open to others
  }
  ~BlockManagerContract() override {
    daemon_.Stop(SIGKILL);
    std::filesystem::remove_all(dir_);
  }

  bool attached() const { return GetParam() == Mode::kAttached; }
  // A directory of this test's own, removed at its end (for G3).
  std::string Dir(const std::string& name) const { return dir_ + "/" + name; }

  // The options Make builds a manager from: model "test-model" (testing::MiniEngine's keys),
  // testing::TestLayout(). Embedded: `settings` are its config. Attached: the daemon is
  // started with `settings` by the first call of the test (later managers of the test attach
  // to that daemon, whose settings stay the first ones), and the engine names `instance`.
  ManagerOptions Options(const Settings& settings, const std::string& instance = "engine") {
    ManagerOptions o;
    o.layout = testing::TestLayout();
    o.model_id = "test-model";
    if (!attached()) {
      for (const auto& [k, v] : settings) EXPECT_TRUE(o.config.Set(k, v).ok()) << k << "=" << v;
      return o;
    }
    const std::string socket = dir_ + "/sock/kvtier.sock";
    if (!daemon_.running()) daemon_.Start(socket, settings);
    EXPECT_TRUE(o.config.Set("service.socket", socket).ok());
    EXPECT_TRUE(o.config.Set("service.instance", instance).ok());
    EXPECT_TRUE(o.config.Set("service.reattach_ms", "100").ok());
    // Generous: a call is a miss past it, and this machine may be busy with other tests.
    EXPECT_TRUE(o.config.Set("service.call_timeout_ms", "10000").ok());
    return o;
  }

  // A manager through BlockManager::Create; a test failure and nullptr when it cannot be made.
  std::unique_ptr<BlockManager> Make(const Settings& settings,
                                     const std::string& instance = "engine") {
    Result<std::unique_ptr<BlockManager>> m = BlockManager::Create(Options(settings, instance));
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    if (!m.ok()) return nullptr;
    EXPECT_EQ((*m)->attached(), attached());
    return std::move(m).value();
  }

 private:
  std::string dir_;
  ServeProcess daemon_;
};

// The request `id` for `prompt`, with nothing else set.
inline RequestSpec Spec(const std::string& id, const std::vector<TokenId>& prompt) {
  RequestSpec spec;
  spec.request_id = id;
  spec.prompt = prompt;
  return spec;
}

// Calls Finished() until `id` is in its saves_done (true) or `wait` passed (false). Other ids
// listed meanwhile are ignored.
inline bool WaitSavesDone(BlockManager& m, const std::string& id,
                          std::chrono::milliseconds wait = std::chrono::seconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (std::chrono::steady_clock::now() < deadline) {
    for (const std::string& s : m.Finished().saves_done) {
      if (s == id) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

// Waits for every layer of the synchronous loads started so far; the first failure, or Ok.
inline Status WaitAllLayers(BlockManager& m) {
  Status first = Status::Ok();
  for (uint32_t l = 0; l < m.layout().num_layers; ++l) {
    Status s = m.WaitLayer(l);
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

}  // namespace kvtier::contract

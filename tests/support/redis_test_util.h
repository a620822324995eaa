// Real redis-server processes for tests: a standalone server (RedisServer) and a 3-node Redis
// Cluster (RedisCluster), each on free 127.0.0.1 ports with its own temporary directory, no
// persistence, and always reaped (destructor; and PR_SET_PDEATHSIG, so even a crashed test
// leaves no server behind). Every wait is bounded. No hiredis here: a tiny RESP client
// (RedisCommand) talks to the servers, so the helpers do not depend on the code under test.
//
// Usage:
//   KVTIER_REQUIRE_REDIS();                      // skips the test when redis-server is absent
//   RedisServer server;                          // or RedisServer server(options)
//   ASSERT_TRUE(server.Start()) << server.error();
//   server.endpoint()                            // "127.0.0.1:PORT"
//   server.Kill(); server.Restart(); server.Pause(); server.Resume();
//
// REQUIRES: a server is started and stopped from the same thread (PR_SET_PDEATHSIG fires
// when the thread that forked it exits).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace kvtier::testing {

// The absolute path of `program` found on $PATH, or "" when absent.
inline std::string FindOnPath(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (dir.empty()) continue;
    const std::string candidate = dir + "/" + program;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  for (const char* d : {"/usr/bin", "/usr/local/bin", "/usr/sbin"}) {
    const std::string candidate = std::string(d) + "/" + program;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

inline bool RedisAvailable() {
  return !FindOnPath("redis-server").empty() && !FindOnPath("redis-cli").empty();
}

#define KVTIER_REQUIRE_REDIS()                                                           \
  do {                                                                                   \
    if (!::kvtier::testing::RedisAvailable()) {                                          \
      GTEST_SKIP() << "redis-server/redis-cli not on PATH: run scripts/install-deps.sh " \
                      "(packages redis-server redis-tools) to run this test";            \
    }                                                                                    \
  } while (0)

// One reply of a RedisCommand, flattened to text: a simple string or bulk string as is, an
// integer as its digits, an error with its leading '-' kept ("-ERR ..."), nil as "(nil)", an
// array as its elements joined by '\n'.
struct RedisReply {
  bool ok = false;   // a reply arrived (false: connect/send/receive failed or timed out)
  std::string text;  // the reply as above, or why there is none
  bool IsError() const { return ok && !text.empty() && text[0] == '-'; }
};

namespace internal {

// Reads from `fd` until `buf` holds at least `need` bytes or the deadline passes.
inline bool ReadAtLeast(int fd, std::string* buf, size_t need,
                        std::chrono::steady_clock::time_point deadline) {
  char chunk[65536];
  while (buf->size() < need) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int r = poll(&p, 1, static_cast<int>(left.count()));
    if (r <= 0) {
      if (r < 0 && errno == EINTR) continue;
      return false;
    }
    const ssize_t n = recv(fd, chunk, sizeof(chunk), 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return false;
    }
    buf->append(chunk, static_cast<size_t>(n));
  }
  return true;
}

// Parses one RESP value starting at *pos, reading more as needed. False on failure.
inline bool ParseReply(int fd, std::string* buf, size_t* pos,
                       std::chrono::steady_clock::time_point deadline, std::string* out,
                       int depth = 0) {
  if (depth > 8) return false;
  size_t eol;
  while ((eol = buf->find("\r\n", *pos)) == std::string::npos) {
    if (!ReadAtLeast(fd, buf, buf->size() + 1, deadline)) return false;
  }
  const char type = (*buf)[*pos];
  const std::string line = buf->substr(*pos + 1, eol - *pos - 1);
  *pos = eol + 2;
  switch (type) {
    case '+':
    case ':':
      *out = line;
      return true;
    case '-':
      *out = "-" + line;
      return true;
    case '$': {
      const long long n = std::atoll(line.c_str());
      if (n < 0) {
        *out = "(nil)";
        return true;
      }
      if (!ReadAtLeast(fd, buf, *pos + static_cast<size_t>(n) + 2, deadline)) return false;
      *out = buf->substr(*pos, static_cast<size_t>(n));
      *pos += static_cast<size_t>(n) + 2;
      return true;
    }
    case '*': {
      const long long n = std::atoll(line.c_str());
      out->clear();
      for (long long i = 0; i < n; ++i) {
        std::string element;
        if (!ParseReply(fd, buf, pos, deadline, &element, depth + 1)) return false;
        if (i > 0) *out += "\n";
        *out += element;
      }
      if (n < 0) *out = "(nil)";
      return true;
    }
    default:
      return false;
  }
}

}  // namespace internal

// Sends one command to 127.0.0.1:`port` on a fresh connection (AUTH first when `password` is
// set) and returns its reply, within `timeout`.
inline RedisReply RedisCommand(
    uint16_t port, const std::vector<std::string>& args, const std::string& password = "",
    std::chrono::milliseconds timeout = std::chrono::milliseconds(2000)) {
  RedisReply reply;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    reply.text = std::string("socket: ") + std::strerror(errno);
    return reply;
  }
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno != EINPROGRESS) {
      reply.text = std::string("connect: ") + std::strerror(errno);
      return reply;
    }
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, static_cast<int>(timeout.count())) != 1) {
      reply.text = "connect: timed out";
      return reply;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      reply.text = std::string("connect: ") + std::strerror(err);
      return reply;
    }
  }
  auto encode = [](const std::vector<std::string>& a) {
    std::string s = "*" + std::to_string(a.size()) + "\r\n";
    for (const std::string& x : a) s += "$" + std::to_string(x.size()) + "\r\n" + x + "\r\n";
    return s;
  };
  std::string out;
  if (!password.empty()) out += encode({"AUTH", password});
  out += encode(args);
  size_t sent = 0;
  while (sent < out.size()) {
    pollfd p{fd, POLLOUT, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) != 1) {
      reply.text = "send: timed out";
      return reply;
    }
    const ssize_t n = send(fd, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN && errno != EINTR) {
      reply.text = std::string("send: ") + std::strerror(errno);
      return reply;
    }
    if (n > 0) sent += static_cast<size_t>(n);
  }
  std::string buf;
  size_t pos = 0;
  std::string text;
  if (!password.empty()) {
    if (!internal::ParseReply(fd, &buf, &pos, deadline, &text)) {
      reply.text = "no reply to AUTH";
      return reply;
    }
    if (!text.empty() && text[0] == '-') {
      reply.ok = true;
      reply.text = text;
      return reply;
    }
  }
  if (!internal::ParseReply(fd, &buf, &pos, deadline, &text)) {
    reply.text = "no reply (timed out or connection closed)";
    return reply;
  }
  reply.ok = true;
  reply.text = text;
  return reply;
}

// Runs argv (argv[0] a path) with stdout+stderr captured; kills it after `timeout`. Returns
// the exit code (-1 when killed or not started) and the output.
inline int RunProgram(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
                      std::string* output) {
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) return -1;
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(pipefd[0]);
    close(pipefd[1]);
    return -1;
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(pipefd[1], 1);
    dup2(pipefd[1], 2);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  close(pipefd[1]);
  fcntl(pipefd[0], F_SETFL, O_NONBLOCK);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool killed = false;
  char chunk[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      kill(pid, SIGKILL);
      killed = true;
      break;
    }
    pollfd p{pipefd[0], POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t n = read(pipefd[0], chunk, sizeof(chunk));
    if (n > 0) {
      if (output != nullptr) output->append(chunk, static_cast<size_t>(n));
    } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
      break;
    }
  }
  close(pipefd[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (killed || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

// True when 127.0.0.1:`port` can be bound now (SO_REUSEADDR, as redis binds).
inline bool PortFree(uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

// A port in 20000..29999 (below the ephemeral range, so outgoing connections do not take it)
// that is free now, and whose +10000 (the cluster bus port) is free too when `with_bus`.
inline uint16_t PickFreePort(bool with_bus) {
  static std::mt19937 rng(
      static_cast<uint32_t>(getpid()) ^
      static_cast<uint32_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  for (int attempt = 0; attempt < 200; ++attempt) {
    const uint16_t port = static_cast<uint16_t>(20000 + rng() % 10000);
    if (PortFree(port) && (!with_bus || PortFree(static_cast<uint16_t>(port + 10000)))) {
      return port;
    }
  }
  return 0;
}

struct RedisServerOptions {
  std::string password;                 // requirepass when not empty
  std::string maxmemory;                // e.g. "4mb"; with maxmemory-policy noeviction
  bool cluster = false;                 // --cluster-enabled yes (bus port = port + 10000)
  std::vector<std::string> extra_args;  // more "--name value" words
};

class RedisServer {
 public:
  explicit RedisServer(RedisServerOptions options = {}) : options_(std::move(options)) {
    std::string tmpl = std::filesystem::temp_directory_path().string() + "/kvtier-redis-XXXXXX";
    if (mkdtemp(tmpl.data()) != nullptr) dir_ = tmpl;
  }
  ~RedisServer() {
    Kill();
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  // Starts the server on a fresh free port (retrying on a bind race) and waits until it
  // answers PING. False with error() set when it cannot.
  bool Start() {
    for (int attempt = 0; attempt < 5; ++attempt) {
      port_ = PickFreePort(options_.cluster);
      if (port_ == 0) {
        error_ = "no free loopback port found";
        return false;
      }
      if (Launch()) return true;
    }
    return false;
  }

  // Starts it again on the same port (after Stop or Kill); the data is gone (no persistence).
  bool Restart() {
    Kill();
    for (int attempt = 0; attempt < 50; ++attempt) {  // the port may linger for a moment
      if (Launch()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  // SIGTERM, then waits for it to exit (SIGKILL after 5 s).
  void Stop() { Signal(SIGTERM, std::chrono::milliseconds(5000)); }
  // SIGKILL: the server dies at once, connections are reset.
  void Kill() { Signal(SIGKILL, std::chrono::milliseconds(5000)); }
  // SIGSTOP: the server keeps its sockets but answers nothing (a hung or very slow server).
  void Pause() {
    if (pid_ > 0) kill(pid_, SIGSTOP);
  }
  void Resume() {
    if (pid_ > 0) kill(pid_, SIGCONT);
  }

  bool running() const { return pid_ > 0; }
  uint16_t port() const { return port_; }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }
  const std::string& dir() const { return dir_; }
  const std::string& error() const { return error_; }
  const RedisServerOptions& options() const { return options_; }

  // A command to this server (authenticated when it has a password).
  RedisReply Command(const std::vector<std::string>& args,
                     std::chrono::milliseconds timeout = std::chrono::milliseconds(2000)) const {
    return RedisCommand(port_, args, options_.password, timeout);
  }
  // DBSIZE, or -1 when the server does not answer.
  long long DbSize() const {
    RedisReply r = Command({"DBSIZE"});
    return r.ok && !r.IsError() ? std::atoll(r.text.c_str()) : -1;
  }
  // The server's log (for failure messages).
  std::string Log() const {
    std::ifstream in(dir_ + "/redis.log");
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

 private:
  bool Launch() {
    const std::string server = FindOnPath("redis-server");
    if (server.empty()) {
      error_ = "redis-server not found on PATH";
      return false;
    }
    std::vector<std::string> args = {server,
                                     "--port",
                                     std::to_string(port_),
                                     "--bind",
                                     "127.0.0.1",
                                     "--save",
                                     "",
                                     "--appendonly",
                                     "no",
                                     "--daemonize",
                                     "no",
                                     "--protected-mode",
                                     "no",
                                     "--dir",
                                     dir_,
                                     "--logfile",
                                     dir_ + "/redis.log"};
    if (!options_.password.empty()) {
      args.insert(args.end(), {"--requirepass", options_.password});
    }
    if (!options_.maxmemory.empty()) {
      args.insert(args.end(),
                  {"--maxmemory", options_.maxmemory, "--maxmemory-policy", "noeviction"});
    }
    if (options_.cluster) {
      // A fresh node each launch: the cluster config of a previous run is not reused.
      std::error_code ec;
      std::filesystem::remove(dir_ + "/nodes.conf", ec);
      args.insert(args.end(),
                  {"--cluster-enabled", "yes", "--cluster-config-file", dir_ + "/nodes.conf",
                   "--cluster-node-timeout", "1000", "--cluster-require-full-coverage", "no"});
    }
    args.insert(args.end(), options_.extra_args.begin(), options_.extra_args.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t pid = fork();
    if (pid < 0) {
      error_ = std::string("fork: ") + std::strerror(errno);
      return false;
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int devnull = open("/dev/null", O_RDWR);
      if (devnull >= 0) {
        dup2(devnull, 0);
        dup2(devnull, 1);
      }
      execv(argv[0], argv.data());
      _exit(127);
    }
    pid_ = pid;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        error_ = "redis-server on port " + std::to_string(port_) + " exited: " + Log();
        return false;
      }
      RedisReply r =
          RedisCommand(port_, {"PING"}, options_.password, std::chrono::milliseconds(200));
      if (r.ok && r.text == "PONG") return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    error_ = "redis-server on port " + std::to_string(port_) + " did not answer PING in 10 s";
    Signal(SIGKILL, std::chrono::milliseconds(5000));
    return false;
  }

  void Signal(int sig, std::chrono::milliseconds grace) {
    if (pid_ <= 0) return;
    kill(pid_, SIGCONT);  // a paused server cannot act on SIGTERM
    kill(pid_, sig);
    const auto deadline = std::chrono::steady_clock::now() + grace;
    int status = 0;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() >= deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    pid_ = -1;
  }

  RedisServerOptions options_;
  std::string dir_;
  std::string error_;
  uint16_t port_ = 0;
  pid_t pid_ = -1;
};

// A Redis Cluster of `nodes` masters (no replicas), slots spread evenly by redis-cli.
class RedisCluster {
 public:
  explicit RedisCluster(int nodes = 3, std::string password = "") : password_(password) {
    for (int i = 0; i < nodes; ++i) {
      RedisServerOptions o;
      o.cluster = true;
      o.password = password;
      if (!password.empty()) o.extra_args = {"--masterauth", password};
      nodes_.push_back(std::make_unique<RedisServer>(o));
    }
  }

  // Starts every node, creates the cluster and waits (at most 30 s) for cluster_state:ok on
  // every node. False with error() set when it cannot.
  bool Start() {
    std::vector<std::string> cli = {FindOnPath("redis-cli"), "--cluster", "create"};
    for (auto& n : nodes_) {
      if (!n->Start()) {
        error_ = n->error();
        return false;
      }
      cli.push_back(n->endpoint());
    }
    cli.insert(cli.end(), {"--cluster-replicas", "0", "--cluster-yes"});
    if (!password_.empty()) cli.insert(cli.end(), {"-a", password_, "--no-auth-warning"});
    std::string out;
    const int rc = RunProgram(cli, std::chrono::seconds(30), &out);
    if (rc != 0) {
      error_ = "redis-cli --cluster create failed (exit " + std::to_string(rc) + "): " + out;
      return false;
    }
    return WaitClusterOk(std::chrono::seconds(30));
  }

  // Waits until every running node reports cluster_state:ok.
  bool WaitClusterOk(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      bool all = true;
      for (auto& n : nodes_) {
        if (!n->running()) continue;
        RedisReply r = n->Command({"CLUSTER", "INFO"});
        if (!r.ok || r.text.find("cluster_state:ok") == std::string::npos) all = false;
      }
      if (all) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    error_ = "cluster_state did not become ok in time";
    return false;
  }

  int size() const { return static_cast<int>(nodes_.size()); }
  RedisServer& node(int i) { return *nodes_[static_cast<size_t>(i)]; }
  void Kill(int i) { nodes_[static_cast<size_t>(i)]->Kill(); }
  // "127.0.0.1:P1,127.0.0.1:P2,..." of every node.
  std::vector<std::string> endpoints() const {
    std::vector<std::string> out;
    for (const auto& n : nodes_) out.push_back(n->endpoint());
    return out;
  }
  // The node (index) that serves `slot` according to the first running node's CLUSTER NODES,
  // or -1. Lines read "<id> <ip:port@bus> <flags> <master> <ping> <pong> <epoch> <link>
  // <slot or range>...".
  int NodeOfSlot(int slot) {
    for (auto& n : nodes_) {
      if (!n->running()) continue;
      RedisReply r = n->Command({"CLUSTER", "NODES"});
      if (!r.ok || r.IsError()) continue;
      std::stringstream lines(r.text);
      std::string line;
      while (std::getline(lines, line)) {
        std::stringstream words(line);
        std::vector<std::string> w;
        std::string word;
        while (words >> word) w.push_back(word);
        if (w.size() < 9) continue;
        const size_t colon = w[1].find(':');
        if (colon == std::string::npos) continue;
        const int port = std::atoi(w[1].c_str() + colon + 1);
        for (size_t i = 8; i < w.size(); ++i) {
          if (w[i][0] == '[') continue;  // a slot being migrated
          const size_t dash = w[i].find('-');
          const int lo = std::atoi(w[i].c_str());
          const int hi = dash == std::string::npos ? lo : std::atoi(w[i].c_str() + dash + 1);
          if (slot < lo || slot > hi) continue;
          for (int k = 0; k < size(); ++k) {
            if (nodes_[static_cast<size_t>(k)]->port() == port) return k;
          }
        }
      }
      return -1;
    }
    return -1;
  }
  // The slot of `key` as the server computes it (CLUSTER KEYSLOT), or -1.
  int KeySlot(const std::string& key) {
    for (auto& n : nodes_) {
      if (!n->running()) continue;
      RedisReply r = n->Command({"CLUSTER", "KEYSLOT", key});
      if (r.ok && !r.IsError()) return std::atoi(r.text.c_str());
    }
    return -1;
  }
  const std::string& error() const { return error_; }

 private:
  std::string password_;
  std::vector<std::unique_ptr<RedisServer>> nodes_;
  std::string error_;
};

}  // namespace kvtier::testing

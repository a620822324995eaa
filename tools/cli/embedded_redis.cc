#include "cli/embedded_redis.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>
#include <vector>

namespace kvtier::cli {

namespace {

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// True when 127.0.0.1:port accepts a connection (redis-server listens once it is ready).
bool Accepts(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

}  // namespace

Status EmbeddedRedis::Start() {
  Status last = Status::Unavailable("redis-server did not start");
  for (int attempt = 0; attempt < 4; ++attempt) {
    const int port = FreePort();
    if (port <= 0) return Status::Unavailable("no free loopback port");
    last = Launch(port);
    if (last.ok()) return last;
  }
  return last;
}

void EmbeddedRedis::Stop() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  int status = 0;
  for (int i = 0; i < 500 && waitpid(pid_, &status, WNOHANG) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (waitpid(pid_, &status, WNOHANG) == 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
  }
  pid_ = -1;
}

Status EmbeddedRedis::Launch(int port) {
  port_ = port;
  std::vector<std::string> args = {"redis-server",
                                   "--port",
                                   std::to_string(port),
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
                                   "--loglevel",
                                   "warning"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return Status::FromErrno(errno, "fork redis-server");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int devnull = open("/dev/null", O_RDWR);
    if (devnull >= 0) {
      dup2(devnull, 0);
      dup2(devnull, 1);
      dup2(devnull, 2);
    }
    execvp(argv[0], argv.data());
    _exit(127);
  }
  pid_ = pid;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < give_up) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return Status::Unavailable(
          WIFEXITED(status) && WEXITSTATUS(status) == 127
              ? "redis-server is not on PATH: install redis-server (scripts/install-deps.sh) "
                "or give --redis HOST:PORT"
              : "redis-server exited at start (port " + std::to_string(port) + " taken?)");
    }
    if (Accepts(port)) return Status::Ok();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  Stop();
  return Status::Unavailable("redis-server on port " + std::to_string(port) +
                             " did not answer in 5 s");
}

}  // namespace kvtier::cli

// EmbeddedRedis: a redis-server the `kvtier` command starts for itself on a free loopback port
// (no persistence), for `bench remote` and `demo --workers` when no --redis is given.
#pragma once

#include <sys/types.h>

#include <string>

#include "kvtier/status.h"

namespace kvtier::cli {

class EmbeddedRedis {
 public:
  EmbeddedRedis() = default;
  EmbeddedRedis(const EmbeddedRedis&) = delete;
  EmbeddedRedis& operator=(const EmbeddedRedis&) = delete;
  // Stops the server (SIGTERM, SIGKILL after 5 s) and reaps it.
  ~EmbeddedRedis() { Stop(); }

  // Starts redis-server on a free 127.0.0.1 port (up to 4 ports tried) and waits up to 5 s
  // per try for it to accept connections. Unavailable saying what to do when redis-server is
  // not on PATH, exits at start or does not answer. The child dies with this process.
  Status Start();
  // Idempotent.
  void Stop();
  // "127.0.0.1:PORT". REQUIRES: Start() returned Ok.
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  Status Launch(int port);

  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace kvtier::cli

// `kvtier replay --g4 SPEC`: what G4 the replay uses, and the things the command set up for it
// (a temporary directory, a redis-server it started), owned for as long as the replay runs.
#pragma once

#include <memory>
#include <string>

#include "cli/embedded_redis.h"
#include "kvtier/status.h"

namespace kvtier::cli {

class ReplayG4Setup {
 public:
  // SPEC is one of:
  //   fs               a temporary directory under /tmp, removed afterwards (kept with `keep`)
  //   fs:DIR           the directory DIR (created if missing; never removed)
  //   redis            a running server at 127.0.0.1:6379
  //   redis:HOST:PORT  a running server at HOST:PORT
  //   embedded-redis   a redis-server started now on a free loopback port, stopped afterwards
  // InvalidArgument (listing the forms) for anything else or a bad port; IOError when the
  // temporary directory cannot be made; Unavailable (saying what to install) when
  // embedded-redis cannot start redis-server.
  static Result<std::unique_ptr<ReplayG4Setup>> Open(const std::string& spec, bool keep);

  ReplayG4Setup(const ReplayG4Setup&) = delete;
  ReplayG4Setup& operator=(const ReplayG4Setup&) = delete;
  // Stops an embedded server and removes a temporary directory (unless `keep`).
  ~ReplayG4Setup();

  // "fs" or "redis": the manager's g4.backend.
  const std::string& backend() const { return backend_; }
  // fs: the directory; "" for redis.
  const std::string& dir() const { return dir_; }
  // redis: "HOST:PORT"; "" for fs.
  const std::string& endpoint() const { return endpoint_; }
  // The SPEC's form: "fs", "fs:DIR", "redis", "embedded-redis".
  const std::string& kind() const { return kind_; }
  // One line: where G4 is and what bounds it (free space of the filesystem, the server's
  // maxmemory, or this host's memory for an embedded server).
  std::string Describe() const;

 private:
  ReplayG4Setup() = default;

  std::string backend_, dir_, endpoint_, kind_;
  bool remove_dir_ = false;
  EmbeddedRedis redis_;
};

}  // namespace kvtier::cli

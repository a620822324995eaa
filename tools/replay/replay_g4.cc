#include "replay/replay_g4.h"

#include <stdlib.h>

#include <filesystem>

#include "cli/temp_dirs.h"

namespace kvtier::cli {

namespace {

const char kForms[] = "use fs, fs:DIR, redis, redis:HOST:PORT or embedded-redis";

// "HOST:PORT" with a non-empty host and a port in 1..65535, or InvalidArgument.
Status CheckEndpoint(const std::string& spec, const std::string& endpoint) {
  const size_t colon = endpoint.rfind(':');
  const std::string host = colon == std::string::npos ? "" : endpoint.substr(0, colon);
  const std::string port = colon == std::string::npos ? "" : endpoint.substr(colon + 1);
  bool digits = !port.empty() && port.size() <= 5;
  for (char c : port) digits = digits && c >= '0' && c <= '9';
  if (host.empty() || !digits || std::stoul(port) == 0 || std::stoul(port) > 65535) {
    return Status::InvalidArgument("--g4 " + spec + ": expected redis:HOST:PORT with a port in " +
                                   "1..65535, e.g. redis:127.0.0.1:6379");
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<ReplayG4Setup>> ReplayG4Setup::Open(const std::string& spec, bool keep) {
  std::unique_ptr<ReplayG4Setup> g(new ReplayG4Setup());
  if (spec == "fs") {
    auto made = MakeTempDir("/tmp/kvtier-replay-g4-", keep);
    if (!made.ok()) {
      return Status::IOError("--g4 fs: " + made.status().message() + "; or give --g4 fs:DIR");
    }
    g->backend_ = "fs";
    g->kind_ = "fs";
    g->dir_ = *made;
    g->remove_dir_ = !keep;
  } else if (spec.rfind("fs:", 0) == 0) {
    if (spec.size() == 3) {
      return Status::InvalidArgument("--g4 fs: needs a directory after the colon (fs:DIR)");
    }
    g->backend_ = "fs";
    g->kind_ = "fs:DIR";
    g->dir_ = spec.substr(3);
  } else if (spec == "redis" || spec.rfind("redis:", 0) == 0) {
    g->backend_ = "redis";
    g->kind_ = "redis";
    g->endpoint_ = spec == "redis" ? "127.0.0.1:6379" : spec.substr(6);
    KVTIER_RETURN_IF_ERROR(CheckEndpoint(spec, g->endpoint_));
  } else if (spec == "embedded-redis") {
    KVTIER_RETURN_IF_ERROR(g->redis_.Start());
    g->backend_ = "redis";
    g->kind_ = "embedded-redis";
    g->endpoint_ = g->redis_.endpoint();
  } else {
    return Status::InvalidArgument("--g4 '" + spec + "': " + kForms);
  }
  return g;
}

ReplayG4Setup::~ReplayG4Setup() {
  redis_.Stop();
  if (remove_dir_) RemoveTempDir(dir_);
}

std::string ReplayG4Setup::Describe() const {
  if (backend_ == "fs") {
    std::error_code ec;
    const std::filesystem::space_info sp = std::filesystem::space(dir_, ec);
    const std::string free_text =
        ec ? "unknown free space" : std::to_string(sp.available / 1000000000) + " GB free";
    return "fs " + dir_ + (remove_dir_ ? " (temporary)" : "") +
           ": bounded only by the filesystem's space (" + free_text + ")";
  }
  if (kind_ == "embedded-redis") {
    return "redis " + endpoint_ +
           " (embedded, no persistence, no maxmemory: bounded by this host's memory)";
  }
  return "redis " + endpoint_ +
         ": bounded by the server's maxmemory (a full server refuses or evicts: counted as G4 "
         "save failures or misses)";
}

}  // namespace kvtier::cli

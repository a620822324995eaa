// kvtier serve: the per-host daemon that engines attach to (src/daemon, docs/service.md).
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "cli/cli_args.h"
#include "cli/commands.h"
#include "daemon/server.h"
#include "kvtier/config.h"

namespace kvtier::cli {
namespace {

volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

const char kServeUsage[] =
    "usage: kvtier serve [--socket PATH] [--config FILE] [--for-seconds N] [--json]\n"
    "  One kvtier per host: owns G2 (shared memory), G3, G4, the index, events and metrics, and\n"
    "  serves every engine process that attaches (service.socket = PATH in the engine's\n"
    "  settings). Settings: the same keys as the in-process manager (kvtier config lists them),\n"
    "  from --config FILE (else $KVTIER_CONFIG) and KVTIER_* variables; --socket overrides\n"
    "  service.socket. Runs until SIGINT/SIGTERM (or N seconds), then closes every connection\n"
    "  (engines carry on with misses) and the tiers (G3 writes its restart snapshot).\n"
    "  Prints its counters at exit (--json: one object).\n";

}  // namespace

int RunServe(const CliArgs& args) {
  if (args.Has("help")) {
    std::fputs(kServeUsage, stdout);
    return 0;
  }
  Status known = args.CheckKnown({"socket", "config", "for-seconds", "json", "help"});
  if (!known.ok()) return UsageError(known);
  Config config;
  std::string file = args.GetString("config", "");
  if (file.empty()) {
    if (const char* env = std::getenv("KVTIER_CONFIG"); env != nullptr) file = env;
  }
  if (!file.empty()) {
    Status loaded = config.LoadFile(file);
    if (!loaded.ok()) return UsageError(loaded);
  }
  Status env = config.LoadProcessEnvironment();
  if (!env.ok()) return UsageError(env);
  Result<uint64_t> seconds = args.GetUint("for-seconds", 0);
  if (!seconds.ok()) return UsageError(seconds.status());
  daemon::ServeOptions options;
  options.config = config;
  options.socket_path = args.GetString("socket", "");
  Result<std::unique_ptr<daemon::Server>> server = daemon::Server::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "kvtier serve: %s\n", server.status().ToString().c_str());
    return server.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGPIPE, SIG_IGN);
  std::fprintf(stderr, "kvtier serve: ready on %s\n", (*server)->socket_path().c_str());
  const auto start = std::chrono::steady_clock::now();
  while (g_stop == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (*seconds > 0 &&
        std::chrono::steady_clock::now() - start >= std::chrono::seconds(*seconds)) {
      break;
    }
  }
  (*server)->Stop();
  daemon::ServerStats s = (*server)->Stats();
  server->reset();
  if (args.Has("json")) {
    std::printf(
        "{\"connections\": %llu, \"refused\": %llu, \"bad_frames\": %llu, \"instances_ended\": "
        "%llu, \"pools\": %llu, \"lease_expired\": %llu, \"copy_batches\": %llu}\n",
        (unsigned long long)s.connections, (unsigned long long)s.refused,
        (unsigned long long)s.bad_frames, (unsigned long long)s.instances_ended,
        (unsigned long long)s.pools, (unsigned long long)s.lease_expired,
        (unsigned long long)s.copy_batches);
  } else {
    std::printf(
        "kvtier serve: %llu connections, %llu refused, %llu bad frames, %llu instances "
        "ended, %llu pools, %llu leases expired, %llu copy batches\n",
        (unsigned long long)s.connections, (unsigned long long)s.refused,
        (unsigned long long)s.bad_frames, (unsigned long long)s.instances_ended,
        (unsigned long long)s.pools, (unsigned long long)s.lease_expired,
        (unsigned long long)s.copy_batches);
  }
  return 0;
}

}  // namespace kvtier::cli

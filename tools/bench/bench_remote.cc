// kvtier bench remote: G4 (Redis) throughput against redis-benchmark, in the same run.
//
// C client threads, each with its own RedisStore (one connection), put batches of B values of
// N bytes (2 MiB by default) for S seconds, then get them back for S seconds. Then
// redis-benchmark runs SET and GET with the same value size, the same client count and the
// same number of requests, once without pipelining (-P 1) and once with B requests in flight
// per connection (-P B, as a batch of B is); the better of the two is the reference. Rounds
// alternate the two sides, so both see the same state of a shared machine; the best round of
// each side is reported. Without --redis the bench starts its own redis-server on a free
// loopback port and stops it afterwards.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <latch>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_timer.h"
#include "bench/redis_benchmark.h"
#include "cli/commands.h"
#include "cli/embedded_redis.h"
#include "cli/json_writer.h"
#include "cli/progress.h"
#include "tier/redis_wire.h"
#include "tier/remote_store.h"

namespace kvtier::cli {
namespace {

void PrintUsage() {
  std::printf(
      "usage: kvtier bench remote [--redis HOST:PORT] [--cluster] [--value-bytes N]\n"
      "                           [--clients C] [--batch B] [--seconds S] [--rounds R]\n"
      "                           [--user U] [--password P] [--no-redis-benchmark] [--json]\n"
      "  C threads, each with its own store, put batches of B values of N bytes for S seconds,\n"
      "  then get them back for S seconds (every value checked once), and redis-benchmark\n"
      "  runs SET and GET at the same value size, client count and request count (-P 1 and\n"
      "  -P B, the better one counts). R rounds alternate both sides; the best of each is\n"
      "  reported, with the ratios put_ratio and get_ratio.\n"
      "  --redis HOST:PORT: an existing server (with --cluster: a seed node of a cluster);\n"
      "    without it a redis-server is started on a free loopback port and stopped after\n"
      "  --value-bytes N (2MiB)  --clients C (4)  --batch B (4)  --seconds S (1)  --rounds R "
      "(3)\n");
}

struct Phase {
  double gbps = 0;
  uint64_t ops = 0;
  uint64_t failures = 0;
  std::string first_error;
};

struct Client {
  std::unique_ptr<RemoteStore> store;
  std::vector<std::string> names;
  std::vector<uint8_t> value;               // what every put of this client stores
  std::vector<std::vector<uint8_t>> dests;  // one per name
};

// Runs `op(client)` (one call of `batch` items; returns items ok, and adds failures) in every
// client thread until `seconds` pass; GB/s over the wall time of the slowest thread.
template <typename Op>
Phase RunPhase(std::vector<Client>& clients, double seconds, uint64_t value_bytes, Op op) {
  std::latch start(static_cast<std::ptrdiff_t>(clients.size()) + 1);
  std::atomic<uint64_t> ops{0}, failures{0};
  std::string first_error;
  std::atomic<bool> have_error{false};
  std::vector<std::thread> threads;
  for (Client& c : clients) {
    threads.emplace_back([&, cp = &c] {
      start.arrive_and_wait();
      const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
      do {
        std::string error;
        uint64_t failed = 0;
        ops += op(*cp, &failed, &error);
        if (failed > 0) {
          failures += failed;
          if (!have_error.exchange(true)) first_error = error;
        }
      } while (std::chrono::steady_clock::now() < end);
    });
  }
  start.arrive_and_wait();
  Stopwatch sw;
  for (auto& t : threads) t.join();
  Phase p;
  p.ops = ops.load();
  p.failures = failures.load();
  p.first_error = first_error;
  p.gbps = static_cast<double>(p.ops * value_bytes) / sw.Seconds() / 1e9;
  return p;
}

}  // namespace

int RunBenchRemote(const CliArgs& args) {
  if (args.Has("help")) {
    PrintUsage();
    return 0;
  }
  if (Status s =
          args.CheckKnown({"json", "help", "redis", "cluster", "value-bytes", "clients", "batch",
                           "seconds", "rounds", "user", "password", "no-redis-benchmark"});
      !s.ok()) {
    return UsageError(s);
  }
  auto value_bytes = args.GetUint("value-bytes", 2ull << 20);
  auto clients_n = args.GetUint("clients", 4);
  auto batch = args.GetUint("batch", 4);
  auto rounds = args.GetUint("rounds", 3);
  auto seconds = args.GetDouble("seconds", 1.0);
  for (const auto* r : {&value_bytes, &clients_n, &batch, &rounds}) {
    if (!r->ok()) return UsageError(r->status());
  }
  if (!seconds.ok()) return UsageError(seconds.status());
  if (*value_bytes < 1 || *value_bytes > (512ull << 20)) {
    return UsageError(Status::InvalidArgument("--value-bytes must be in 1..512MiB (Redis' limit)"));
  }
  if (*clients_n < 1 || *clients_n > 256) {
    return UsageError(Status::InvalidArgument("--clients must be in 1..256"));
  }
  if (*batch < 1 || *batch > 1024) {
    return UsageError(Status::InvalidArgument("--batch must be in 1..1024"));
  }
  if (*rounds < 1 || *rounds > 100) {
    return UsageError(Status::InvalidArgument("--rounds must be in 1..100"));
  }
  if (!(*seconds > 0 && *seconds <= 3600)) {
    return UsageError(Status::InvalidArgument("--seconds must be in (0, 3600]"));
  }
  if (*clients_n * *batch * *value_bytes > (8ull << 30)) {
    return UsageError(Status::InvalidArgument(
        "--clients x --batch x --value-bytes must stay under 8 GiB (the server holds them all)"));
  }
  const bool cluster = args.Has("cluster");
  const bool json = args.Has("json");
  const std::string given = args.GetString("redis", "");
  if (cluster && given.empty()) {
    return UsageError(Status::InvalidArgument(
        "--cluster needs --redis HOST:PORT of a seed node (the bench starts only standalone "
        "servers itself)"));
  }
  EmbeddedRedis embedded;
  std::string endpoint = given;
  if (given.empty()) {
    if (Status s = embedded.Start(); !s.ok()) return Failure(s);
    endpoint = embedded.endpoint();
  }
  auto parsed = ParseRedisEndpoint(endpoint);
  if (!parsed.ok()) return UsageError(parsed.status());

  const uint64_t n_bytes = *value_bytes;
  const uint32_t b = static_cast<uint32_t>(*batch);
  std::vector<Client> clients(*clients_n);
  std::mt19937_64 rng(42);
  for (size_t c = 0; c < clients.size(); ++c) {
    RedisStoreOptions o;
    o.endpoints = {endpoint};
    o.cluster = cluster;
    o.username = args.GetString("user", "");
    o.password = args.GetString("password", "");
    o.connections_per_node = 1;
    o.max_pipeline = b;
    o.connect_timeout = std::chrono::milliseconds(1000);
    auto store = OpenRedisStore(o);
    if (!store.ok()) return Failure(store.status());
    clients[c].store = std::move(store).value();
    for (uint32_t k = 0; k < b; ++k) {
      clients[c].names.push_back("kvt-bench:" + std::to_string(getpid()) + ":" + std::to_string(c) +
                                 ":" + std::to_string(k));
    }
    clients[c].value.resize(n_bytes);
    for (auto& byte : clients[c].value) byte = static_cast<uint8_t>(rng());
    clients[c].dests.assign(b, std::vector<uint8_t>(n_bytes));
  }
  const auto call_deadline = [] { return RemoteClock::now() + std::chrono::seconds(30); };
  auto put_op = [&](Client& c, uint64_t* failed, std::string* error) -> uint64_t {
    std::vector<RemotePut> puts;
    for (const std::string& name : c.names) puts.push_back({name, c.value});
    std::vector<Status> r(puts.size());
    c.store->Put(puts, call_deadline(), r);
    uint64_t ok = 0;
    for (const Status& s : r) {
      if (s.ok()) {
        ++ok;
      } else if ((*failed)++ == 0) {
        *error = s.ToString();
      }
    }
    return ok;
  };
  auto get_op = [&](Client& c, uint64_t* failed, std::string* error) -> uint64_t {
    std::vector<RemoteGet> gets;
    for (size_t k = 0; k < c.names.size(); ++k) gets.push_back({c.names[k], c.dests[k], 0});
    std::vector<Status> r(gets.size());
    c.store->Get(gets, call_deadline(), r);
    uint64_t ok = 0;
    for (size_t k = 0; k < r.size(); ++k) {
      if (r[k].ok() && gets[k].bytes_read == n_bytes) {
        ++ok;
      } else if ((*failed)++ == 0) {
        *error = r[k].ok() ? "short object" : r[k].ToString();
      }
    }
    return ok;
  };

  // Unmeasured: every key written once, and every value read back and checked byte for byte.
  uint64_t failures = 0;
  std::string first_error;
  for (Client& c : clients) {
    uint64_t failed = 0;
    std::string error;
    put_op(c, &failed, &error);
    get_op(c, &failed, &error);
    for (const auto& d : c.dests) {
      if (failed == 0 && std::memcmp(d.data(), c.value.data(), n_bytes) != 0) {
        failed = 1;
        error = "a value read back differs from what was stored";
      }
    }
    if (failed > 0 && failures++ == 0) first_error = error;
  }

  const bool want_rb = !args.Has("no-redis-benchmark");
  const bool have_rb = want_rb && RedisBenchmarkInstalled();
  std::string rb_base = "redis-benchmark -h " + parsed->host + " -p " +
                        std::to_string(parsed->port) + " -c " + std::to_string(*clients_n) +
                        " -d " + std::to_string(n_bytes);
  if (!args.GetString("password", "").empty()) {
    rb_base += " -a '" + args.GetString("password", "") + "' --no-auth-warning";
    if (!args.GetString("user", "").empty())
      rb_base += " --user '" + args.GetString("user", "") + "'";
  }
  if (cluster) rb_base += " --cluster";

  Phase best_put, best_get;
  double best_rb_set = 0, best_rb_get = 0;
  std::string rb_error, rb_set_cmd, rb_get_cmd;
  Progress progress("bench remote", *rounds, "rounds");
  for (uint64_t round = 0; round < *rounds && failures == 0; ++round) {
    Phase put = RunPhase(clients, *seconds, n_bytes, put_op);
    Phase get = RunPhase(clients, *seconds, n_bytes, get_op);
    for (const Phase* p : {&put, &get}) {
      if (p->failures > 0 && failures == 0) first_error = p->first_error;
      failures += p->failures;
    }
    if (put.gbps > best_put.gbps) best_put = put;
    if (get.gbps > best_get.gbps) best_get = get;
    if (!have_rb || !rb_error.empty()) continue;
    const uint64_t min_requests = 4 * *clients_n;
    for (uint32_t pipeline : {1u, b}) {
      std::string cmd;
      const double set_rps = RedisBenchmark(rb_base, "set", pipeline,
                                            std::max(put.ops, min_requests), &cmd, &rb_error);
      if (set_rps > 0 && set_rps * n_bytes / 1e9 > best_rb_set) {
        best_rb_set = set_rps * n_bytes / 1e9;
        rb_set_cmd = cmd;
      }
      const double get_rps = RedisBenchmark(rb_base, "get", pipeline,
                                            std::max(get.ops, min_requests), &cmd, &rb_error);
      if (get_rps > 0 && get_rps * n_bytes / 1e9 > best_rb_get) {
        best_rb_get = get_rps * n_bytes / 1e9;
        rb_get_cmd = cmd;
      }
      if (b == 1 || !rb_error.empty()) break;
    }
    progress.Update(round + 1);
  }
  progress.Finish();
  // The bench's own keys go (redis-benchmark leaves its one key, key:__rand_int__, as always).
  for (Client& c : clients) (void)c.store->Remove(c.names, call_deadline());
  RemoteStoreStats stats;
  for (Client& c : clients) {
    const RemoteStoreStats s = c.store->Stats();
    stats.timeouts += s.timeouts;
    stats.reconnects += s.reconnects;
    stats.redirects += s.redirects;
  }
  embedded.Stop();
  if (failures > 0) {
    std::fprintf(stderr, "kvtier bench remote: %llu item(s) failed, first: %s\n",
                 static_cast<unsigned long long>(failures), first_error.c_str());
    return 1;
  }
  const bool rb_ran = best_rb_set > 0 && best_rb_get > 0;
  const std::string rb_state = !want_rb   ? "skipped"
                               : !have_rb ? "not installed"
                               : rb_ran   ? "ran"
                                          : "failed";
  const double put_ratio = rb_ran ? best_put.gbps / best_rb_set : 0;
  const double get_ratio = rb_ran ? best_get.gbps / best_rb_get : 0;
  if (json) {
    JsonObject o;
    o.Add("put_gbps", best_put.gbps);
    o.Add("get_gbps", best_get.gbps);
    o.Add("value_bytes", n_bytes);
    o.Add("clients", *clients_n);
    o.Add("batch", *batch);
    o.Add("seconds", *seconds);
    o.Add("rounds", *rounds);
    o.Add("server", given.empty() ? "embedded" : "given");
    o.Add("cluster", cluster);
    o.Add("put_ops", best_put.ops);
    o.Add("get_ops", best_get.ops);
    o.Add("redirects", stats.redirects);
    o.Add("redis_benchmark", rb_state);
    if (rb_ran) {
      o.Add("redis_benchmark_set_gbps", best_rb_set);
      o.Add("redis_benchmark_get_gbps", best_rb_get);
      o.Add("put_ratio", put_ratio);
      o.Add("get_ratio", get_ratio);
    }
    std::printf("%s\n", o.Str().c_str());
    return 0;
  }
  std::printf(
      "G4 bench: %s%s, %llu clients, batches of %u x %llu bytes, %.1f s per phase, "
      "best of %llu\n",
      given.empty() ? "embedded redis-server " : "", endpoint.c_str(),
      static_cast<unsigned long long>(*clients_n), b, static_cast<unsigned long long>(n_bytes),
      *seconds, static_cast<unsigned long long>(*rounds));
  std::printf("  put (pipelined SET)   %7.3f GB/s", best_put.gbps);
  if (rb_ran) std::printf("   redis-benchmark SET %7.3f GB/s   ratio %.2f", best_rb_set, put_ratio);
  std::printf("\n  get (pipelined GET)   %7.3f GB/s", best_get.gbps);
  if (rb_ran) std::printf("   redis-benchmark GET %7.3f GB/s   ratio %.2f", best_rb_get, get_ratio);
  std::printf("\n");
  if (rb_ran) {
    std::printf("  best redis-benchmark runs: %s\n                             %s\n",
                rb_set_cmd.c_str(), rb_get_cmd.c_str());
  } else {
    std::printf("  redis-benchmark %s%s%s\n", rb_state.c_str(), rb_error.empty() ? "" : ": ",
                rb_error.c_str());
  }
  return 0;
}

}  // namespace kvtier::cli

// kvtier replay: replays a request trace through the real BlockManager and tiers (G2 arena,
// optional G3 slot files, optional G4: a shared directory or Redis) via the connector API, checks
// every loaded byte, and estimates TTFT with a cost model of the real model on real hardware.
// --compare-belady adds Belady's oracle and an unbounded cache (simulated, same capacity); --sweep
// plots hit ratio against capacity for every policy (simulated: see docs/replay.md).
#include <stdlib.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "cli/credit_lru_flags.h"
#include "cli/json_writer.h"
#include "cli/metrics_settings.h"
#include "cli/progress.h"
#include "cli/temp_dirs.h"
#include "index/eviction_policy.h"
#include "kvtier/config.h"
#include "policies/lab_policies.h"
#include "replay/multi_worker_command.h"
#include "replay/replay_g4.h"
#include "replay/replay_runner.h"
#include "sim/belady_policy.h"
#include "sim/policy_sim.h"
#include "tier/block_format.h"

namespace kvtier::cli {

namespace {

constexpr PolicyKind kOnlinePolicies[] = {
    PolicyKind::kCreditLru,    PolicyKind::kAdaptive, PolicyKind::kLru,
    PolicyKind::kArc,          PolicyKind::kWTinyLfu, PolicyKind::kLineageLru,
    PolicyKind::kLeafFirstLru, PolicyKind::kS3Fifo,   PolicyKind::kHitDensity};

void PrintReplayHelp(const std::string& default_policy) {
  std::printf(
      "usage: kvtier replay --trace FILE [flags] [--json]\n"
      "  Replays a trace through the real BlockManager (G2 host arena, optional G3 SSD files)\n"
      "  through the connector API, one request at a time: Lookup, PrepareLoad, StartLoad,\n"
      "  WaitLayer, byte-exact check of every loaded block, Commit, StartSave, RequestFinished.\n"
      "  Blocks are scaled down to --payload-bytes; TTFT is estimated for the real model.\n"
      "\n"
      "  --trace FILE               Mooncake JSONL ({\"hash_ids\": [...]}) or kvtier JSONL\n"
      "                             ({\"tokens\": [...]}); see docs/replay.md\n"
      "  --format auto|mooncake|kvtier   default auto (a first line with hash_ids = mooncake)\n"
      "  --tokens-per-block N       1..4096, default 512 (Mooncake's block)\n"
      "  --policy NAME              adaptive, credit-lru, lru, arc, w-tinylfu, hit-density\n"
      "                             (default %s, the manager's default), or one of the\n"
      "                             lab's: lineage-lru, leaf-first-lru, s3fifo (the replay\n"
      "                             runs them in the real manager; a deployment's config\n"
      "                             refuses them: docs/policies.md)\n"
      "  --capacity-fraction F      G2 slots = ceil(F x distinct blocks of the trace); default "
      "0.05\n"
      "  --g3-fraction F            add a G3 of ceil(F x distinct blocks) slots (default 0: none)\n"
      "  --g3-dir DIR               G3 slot files (default a temp dir under /tmp, removed after)\n"
      "  --g3-admit-min-seen N      sightings before a G2 victim goes to G3 (default 2, the\n"
      "                             config's g3.admit_min_seen)\n"
      "  --g3-admit-max-writes-per-hit W\n"
      "                             with N > 1, blocks below N sightings still go to G3 while\n"
      "                             a sample of them yields a G3 hit per W writes (default 8,\n"
      "                             the config's g3.admit_max_writes_per_hit; 0: never)\n"
      "%s"
      "                             (G2 and G3, and the simulated figures; echoed in --json)\n"
      "  --g4 SPEC                  add G4 (networked, shared; no capacity fraction): fs (a temp\n"
      "                             dir under /tmp, removed after), fs:DIR, redis:HOST:PORT (a\n"
      "                             running server), embedded-redis (a redis-server started on a\n"
      "                             free loopback port, stopped after); see docs/replay.md\n"
      "  --g4-write-through on|off  default: the manager's (g4.write_through = %s)\n"
      "  --g4-warm                  replay the trace a second time with empty G2/G3 (a fresh\n"
      "                             worker) against the same G4; reported separately\n"
      "  --g4-lookup-deadline-ms N, --g4-load-deadline-ms N   default: the manager's (%llu,\n"
      "                             %llu); a late G4 answer is a miss\n"
      "  --payload-bytes B          bytes of a scaled block (default 4096; multiple of 4 x tpb)\n"
      "  --requests N               replay only the first N requests\n"
      "  --verify-every N           check every N-th loaded block (default 1 = all; 0 = none)\n"
      "  --copy-threads N           transfer memcpy workers (default 2)\n"
      "  --pace-ms N                sleep N ms after each request (to watch it: kvtier top)\n"
      "  --hold-s S                 keep the manager (and KVTIER_METRICS_PORT's /metrics) up S\n"
      "                             seconds after the last request, before the report\n"
      "  cost model (real model; defaults: Llama-3-8B-class on an H200, see docs/replay.md):\n"
      "  --prefill-tokens-per-s R   default 20000\n"
      "  --kv-bytes-per-token B     default 131072 (32 layers x K,V x 8 heads x 128 x 2 B)\n"
      "  --g2-gbps G, --g3-gbps G   load bandwidth into the GPU: default 50 (PCIe Gen5 x16),\n"
      "                             6 (NVMe)\n"
      "  --g4-gbps G                G4 load bandwidth: default 1.25 (10 GbE line rate)\n"
      "  --g4-offer always|when-faster   default always: the manager offers every G4 block;\n"
      "                             when-faster: only where loading one beats recomputing it by\n"
      "                             the cost model (sets g4.load_gbps, g4.recompute_tokens_per_s)\n"
      "  --compare-belady           also simulate Belady's oracle and an unbounded cache with the\n"
      "                             same capacity (G2 + G3 slots), same prefix semantics\n"
      "  --sweep                    instead of a replay: hit ratio vs capacity fraction for every\n"
      "                             policy and Belady, SIMULATED (lab/sim/policy_sim), plotted\n"
      "  --sweep-fractions LIST     default 0.02,0.05,0.1,0.15,0.2,0.3\n"
      "  --sweep-out FILE.png       default replay-sweep.png (needs gnuplot)\n"
      "  multi-worker (docs/router.md): G2/G3 fractions are per worker, G4 is shared\n"
      "  --workers N                N workers (1..64; default 2 with --router)\n"
      "  --router R                 round-robin, least-loaded, gpu-prefix, gpu-aware, kvtier\n"
      "                             (default) or all (every router, a table)\n"
      "  --g1-fraction F            each worker's G1 prefix cache = F x its G2 slots (default\n"
      "                             0.2)\n",
      default_policy.c_str(), CreditLruFlagsHelp(29).c_str(),
      Config().GetBool("g4.write_through") ? "on" : "off",
      static_cast<unsigned long long>(Config().GetUint("g4.lookup_deadline_ms")),
      static_cast<unsigned long long>(Config().GetUint("g4.load_deadline_ms")));
}

Result<double> PositiveDouble(const CliArgs& a, const char* flag, double fallback, double max) {
  auto v = a.GetDouble(flag, fallback);
  if (!v.ok()) return v.status();
  if (!std::isfinite(*v) || *v <= 0 || *v > max) {
    return Status::InvalidArgument(std::string("--") + flag + " = " + a.GetString(flag, "") +
                                   ": must be a number in (0, " + std::to_string(max) + "]");
  }
  return *v;
}

Result<std::vector<double>> ParseFractions(const std::string& text) {
  std::vector<double> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0' || !std::isfinite(v) || v <= 0 || v > 1e6) {
      return Status::InvalidArgument("--sweep-fractions: '" + item +
                                     "' is not a number in (0, 1e6]; give e.g. 0.02,0.05,0.1");
    }
    out.push_back(v);
  }
  if (out.empty() || out.size() > 64) {
    return Status::InvalidArgument("--sweep-fractions: give 1 to 64 comma-separated fractions");
  }
  return out;
}

Result<SimResult> Simulate(const Trace& t, PolicyKind kind, uint64_t capacity,
                           const PolicyOptions& options) {
  std::unique_ptr<EvictionPolicy> policy;
  if (kind == PolicyKind::kBelady) {
    policy = MakeBeladyPolicy(TraceReferences(t));
  } else {
    KVTIER_ASSIGN_OR_RETURN(policy, MakeLabEvictionPolicy(kind, capacity, options));
  }
  return SimulatePolicy(t, *policy, std::max<uint64_t>(capacity, 1));
}

double Ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

bool HaveGnuplot() { return std::system("command -v gnuplot >/dev/null 2>&1") == 0; }

struct SweepRow {
  double fraction;
  uint64_t capacity;
  std::vector<double> hit;  // one per kOnlinePolicies, then belady, then unbounded
};

Status WriteSweepPlot(const std::vector<SweepRow>& rows, const std::string& png,
                      const std::string& title) {
  const std::string dat = png + ".dat", script = png + ".gp";
  FILE* f = std::fopen(dat.c_str(), "w");
  if (f == nullptr) return Status::IOError("cannot write " + dat);
  for (const SweepRow& r : rows) {
    std::fprintf(f, "%g", r.fraction);
    for (double h : r.hit) std::fprintf(f, " %.5f", h);
    std::fprintf(f, "\n");
  }
  std::fclose(f);
  f = std::fopen(script.c_str(), "w");
  if (f == nullptr) return Status::IOError("cannot write " + script);
  std::fprintf(f,
               "set terminal png size 1000,600 noenhanced\nset output '%s'\n"
               "set title '%s'\nset xlabel 'capacity (fraction of distinct blocks)'\n"
               "set ylabel 'prefix hit ratio (blocks)'\nset grid\nset key bottom right\n"
               "set style data linespoints\nplot ",
               png.c_str(), title.c_str());
  int col = 2;
  for (PolicyKind k : kOnlinePolicies) {
    std::fprintf(f, "'%s' using 1:%d title '%s' lw 2, ", dat.c_str(), col++, PolicyKindName(k));
  }
  std::fprintf(f, "'%s' using 1:%d title 'belady (offline)' lw 2 dt 2 lc rgb 'black', ",
               dat.c_str(), col++);
  std::fprintf(f, "'%s' using 1:%d title 'unbounded' lw 1 dt 3\n", dat.c_str(), col);
  std::fclose(f);
  const std::string cmd = "gnuplot '" + script + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  std::error_code ec;
  std::filesystem::remove(dat, ec);
  std::filesystem::remove(script, ec);
  if (rc != 0) return Status::Internal("gnuplot failed on " + script);
  return Status::Ok();
}

int RunSweep(const CliArgs& args, const ReplayTrace& trace, const PolicyOptions& options) {
  auto fractions = ParseFractions(args.GetString("sweep-fractions", "0.02,0.05,0.1,0.15,0.2,0.3"));
  if (!fractions.ok()) return UsageError(fractions.status());
  const std::string png = args.GetString("sweep-out", "replay-sweep.png");
  // Checked before the simulations, not after them: a directory or a FIFO there, or a quote
  // that would end the gnuplot script's string (and the shell's), would fail only the plot.
  if (Status s = CheckOutputFile("sweep-out", png); !s.ok()) return UsageError(s);
  if (png.find_first_of("'\n") != std::string::npos) {
    return UsageError(Status::InvalidArgument("--sweep-out " + png +
                                              ": a file name with a quote or a newline cannot "
                                              "be handed to gnuplot; give another name"));
  }
  const Trace& t = trace.blocks();
  const double unbounded = SimulateUnbounded(t).hit_ratio();
  std::vector<SweepRow> rows;
  for (double fraction : *fractions) {
    SweepRow row{fraction, CapacityForFraction(t, fraction), {}};
    for (PolicyKind k : kOnlinePolicies) {
      auto r = Simulate(t, k, row.capacity, options);
      if (!r.ok()) return Failure(r.status());
      row.hit.push_back(r->hit_ratio());
    }
    auto b = Simulate(t, PolicyKind::kBelady, row.capacity, options);
    if (!b.ok()) return Failure(b.status());
    row.hit.push_back(b->hit_ratio());
    row.hit.push_back(unbounded);
    rows.push_back(std::move(row));
  }
  std::string plot;
  if (!HaveGnuplot()) {
    std::fprintf(stderr,
                 "kvtier: warning: gnuplot not found, no plot written (install gnuplot-nox, "
                 "scripts/install-deps.sh does)\n");
  } else if (Status s = WriteSweepPlot(
                 rows, png,
                 "kvtier replay --sweep: " +
                     std::filesystem::path(args.GetString("trace", "")).filename().string() +
                     " (simulated, one tier)");
             !s.ok()) {
    std::fprintf(stderr, "kvtier: warning: %s\n", s.ToString().c_str());
  } else {
    plot = std::filesystem::absolute(png).string();
  }
  const char* kMode = "simulated (lab/sim/policy_sim: one tier, same prefix semantics)";
  if (args.Has("json")) {
    std::string arr = "[";
    for (size_t i = 0; i < rows.size(); ++i) {
      JsonObject o;
      o.Add("capacity_fraction", rows[i].fraction).Add("capacity_blocks", rows[i].capacity);
      size_t c = 0;
      for (PolicyKind k : kOnlinePolicies) o.Add(PolicyKindName(k), rows[i].hit[c++]);
      o.Add("belady", rows[i].hit[c]);
      o.Add("unbounded", rows[i].hit[c + 1]);
      arr += (i ? ", " : "") + o.Str();
    }
    arr += "]";
    JsonObject out;
    out.Add("trace", args.GetString("trace", ""))
        .Add("mode", kMode)
        .Add("distinct_blocks", t.distinct_blocks)
        .Add("plot", plot)
        .Raw("credit_lru", CreditLruJson(options.credit_lru))
        .Raw("sweep", arr);
    std::printf("%s\n", out.Str().c_str());
    return 0;
  }
  std::printf("sweep: hit ratio vs capacity, %s\n", kMode);
  std::printf("%-9s %9s", "fraction", "blocks");
  for (PolicyKind k : kOnlinePolicies) std::printf(" %11s", PolicyKindName(k));
  std::printf(" %11s %11s\n", "belady", "unbounded");
  for (const SweepRow& r : rows) {
    std::printf("%-9g %9llu", r.fraction, static_cast<unsigned long long>(r.capacity));
    for (double h : r.hit) std::printf(" %11.4f", h);
    std::printf("\n");
  }
  if (!plot.empty()) std::printf("plot: %s\n", plot.c_str());
  return 0;
}

// What the output reports of one replay pass.
struct PassFigures {
  double hit_ratio = 0;
  std::array<double, kNumTiers> tier_ratio{};      // hit blocks from the tier / prompt blocks
  double p50 = 0, p90 = 0, p99 = 0, mean = 0;      // TTFT with kvtier (ms)
  double rp50 = 0, rp90 = 0, rp99 = 0, rmean = 0;  // TTFT recomputing everything (ms)
};

PassFigures Figures(const ReplayResult& r) {
  PassFigures f;
  const double blocks = static_cast<double>(r.prompt_blocks);
  f.hit_ratio = blocks > 0 ? static_cast<double>(r.hits()) / blocks : 0;
  for (TierId t = 0; t < kNumTiers; ++t) {
    f.tier_ratio[t] = blocks > 0 ? static_cast<double>(r.hit_blocks[t]) / blocks : 0.0;
  }
  const double ms = 1e3;
  f.p50 = Percentile(r.ttft_kvtier_s, 50) * ms;
  f.p90 = Percentile(r.ttft_kvtier_s, 90) * ms;
  f.p99 = Percentile(r.ttft_kvtier_s, 99) * ms;
  f.rp50 = Percentile(r.ttft_recompute_s, 50) * ms;
  f.rp90 = Percentile(r.ttft_recompute_s, 90) * ms;
  f.rp99 = Percentile(r.ttft_recompute_s, 99) * ms;
  for (double v : r.ttft_kvtier_s) f.mean += v;
  for (double v : r.ttft_recompute_s) f.rmean += v;
  if (r.requests > 0) {
    f.mean = f.mean / r.requests * ms;
    f.rmean = f.rmean / r.requests * ms;
  }
  return f;
}

// The G4 counters of a pass (docs/g4.md): every G4 failure is a miss or a dropped save.
// G2 slots in none of the places a slot may be at rest (free, staging pool, holding a block):
// a leak (the run has ended and every save and demotion with it).
uint64_t G2SlotsUnaccounted(const ManagerStats& s) {
  const uint64_t accounted = s.g2_free_slots + s.g2_blocks + s.g2_staging_slots;
  return s.g2_slots > accounted ? s.g2_slots - accounted : 0;
}

void AddG3Counters(const ManagerStats& s, JsonObject* o) {
  o->Add("corrupt_blocks", s.corrupt_blocks)
      .Add("g3_quarantines", s.g3_quarantines)
      .Add("g3_quarantined_at_end", s.g3_quarantined)
      .Add("demotion_failures", s.demotion_failures);
}

void AddG4Counters(const ManagerStats& s, JsonObject* o) {
  o->Add("g4_saved_blocks", s.g4_saved_blocks)
      .Add("g4_lookup_blocks", s.g4_lookup_blocks)
      .Add("g4_skipped_lookups", s.g4_skipped_lookups)
      .Add("g4_lookup_failures", s.g4_lookup_failures)
      .Add("g4_lookup_timeouts", s.g4_lookup_timeouts)
      .Add("g4_save_failures", s.g4_save_failures)
      .Add("g4_dropped_saves", s.g4_dropped_saves)
      .Add("g4_load_failures", s.g4_load_failures)
      .Add("g4_corrupt_blocks", s.g4_corrupt_blocks)
      .Add("g4_timeouts", s.g4_timeouts)
      .Add("g4_abandoned_loads", s.g4_abandoned_loads)
      .Add("g4_late_returns", s.g4_late_returns)
      .Add("g4_breaker_open_at_end", s.g4_breaker_open);
}

void PrintG4Counters(const ManagerStats& s) {
  std::printf(
      "G4: %llu blocks written, %llu found by lookups; errors: lookups %llu (timed out %llu), "
      "saves %llu (+%llu dropped), loads %llu (corrupt %llu), timeouts %llu (%llu loads ended "
      "while the store's call was stuck)%s%s\n",
      static_cast<unsigned long long>(s.g4_saved_blocks),
      static_cast<unsigned long long>(s.g4_lookup_blocks),
      static_cast<unsigned long long>(s.g4_lookup_failures),
      static_cast<unsigned long long>(s.g4_lookup_timeouts),
      static_cast<unsigned long long>(s.g4_save_failures),
      static_cast<unsigned long long>(s.g4_dropped_saves),
      static_cast<unsigned long long>(s.g4_load_failures),
      static_cast<unsigned long long>(s.g4_corrupt_blocks),
      static_cast<unsigned long long>(s.g4_timeouts),
      static_cast<unsigned long long>(s.g4_abandoned_loads),
      s.g4_breaker_open ? "; breaker OPEN at the end" : "",
      s.g4_skipped_lookups > 0
          ? ("; " + std::to_string(s.g4_skipped_lookups) +
             " lookups did not ask G4 (loading estimated slower than recompute)")
                .c_str()
          : "");
}

}  // namespace

int RunReplayCommand(const CliArgs& args) {
  const std::string default_policy = Config().GetString("g2.policy");
  if (args.Has("help")) {
    PrintReplayHelp(default_policy);
    return 0;
  }
  if (Status s = args.CheckKnown({"help",
                                  "json",
                                  "trace",
                                  "format",
                                  "tokens-per-block",
                                  "policy",
                                  "capacity-fraction",
                                  "g3-fraction",
                                  "g3-dir",
                                  "g3-admit-min-seen",
                                  "g3-admit-max-writes-per-hit",
                                  "g4",
                                  "g4-write-through",
                                  "g4-warm",
                                  "g4-gbps",
                                  "g4-offer",
                                  "g4-lookup-deadline-ms",
                                  "g4-load-deadline-ms",
                                  "payload-bytes",
                                  "requests",
                                  "verify-every",
                                  "copy-threads",
                                  "prefill-tokens-per-s",
                                  "kv-bytes-per-token",
                                  "g2-gbps",
                                  "g3-gbps",
                                  "compare-belady",
                                  "sweep",
                                  "sweep-fractions",
                                  "sweep-out",
                                  "keep",
                                  "credit-lru",
                                  "pace-ms",
                                  "hold-s",
                                  "workers",
                                  "router",
                                  "g1-fraction"});
      !s.ok()) {
    return UsageError(s);
  }
  auto credit_lru = ParseCreditLruFlags(args);
  if (!credit_lru.ok()) return UsageError(credit_lru.status());
  PolicyOptions policy_options;
  policy_options.credit_lru = credit_lru->config;
  if (!args.Has("trace")) return UsageError(Status::InvalidArgument("--trace FILE is required"));
  for (const char* flag : {"sweep-fractions", "sweep-out"}) {
    if (args.Has(flag) && !args.Has("sweep")) {
      return UsageError(Status::InvalidArgument("--" + std::string(flag) +
                                                " goes with --sweep (a simulated sweep); "
                                                "without --sweep it would be ignored"));
    }
  }
  auto tpb = args.GetUint("tokens-per-block", 512);
  if (!tpb.ok()) return UsageError(tpb.status());
  if (*tpb == 0 || *tpb > KvLayout::kMaxTokensPerBlock) {
    return UsageError(Status::InvalidArgument("--tokens-per-block " + std::to_string(*tpb) +
                                              ": must be in 1.." +
                                              std::to_string(KvLayout::kMaxTokensPerBlock)));
  }
  const std::string path = args.GetString("trace", "");
  auto trace =
      ReplayTrace::Load(path, args.GetString("format", "auto"), static_cast<uint32_t>(*tpb));
  if (!trace.ok()) {
    // A path that does not exist or is no regular file is the user's to fix, as a bad line is.
    const bool usage =
        trace.status().Is(StatusCode::kInvalidArgument) || trace.status().Is(StatusCode::kNotFound);
    return usage ? UsageError(trace.status()) : Failure(trace.status());
  }
  if (trace->requests() == 0) {
    return UsageError(Status::InvalidArgument(
        "trace " + path + " holds no requests (it is empty or blank); nothing to replay"));
  }
  if (trace->blocks().lineage_conflicts > 0) {
    std::fprintf(stderr,
                 "kvtier: warning: %llu ids appear under two parents; the trace is not "
                 "prefix-chained and the simulated figures will not match the replay\n",
                 static_cast<unsigned long long>(trace->blocks().lineage_conflicts));
  }
  const bool multi_worker = args.Has("workers") || args.Has("router") || args.Has("g1-fraction");
  if (multi_worker && args.Has("sweep")) {
    return UsageError(
        Status::InvalidArgument("--sweep is simulated, single-worker; drop "
                                "--workers/--router/--g1-fraction"));
  }
  if (args.Has("sweep")) return RunSweep(args, *trace, policy_options);

  ReplayOptions o;
  o.policy = args.GetString("policy", default_policy);
  auto kind = ParsePolicyKind(o.policy);
  if (!kind.ok()) return UsageError(kind.status());
  if (*kind == PolicyKind::kBelady) {
    return UsageError(Status::InvalidArgument(
        "--policy belady: Belady is offline (it needs the future); use --compare-belady"));
  }
  for (const auto& [key, value] : credit_lru->given) {
    o.settings.emplace_back("g2.credit_lru." + key, value);
    o.settings.emplace_back("g3.credit_lru." + key, value);
  }
  if (!credit_lru->given.empty() && *kind != PolicyKind::kCreditLru &&
      *kind != PolicyKind::kAdaptive) {
    std::fprintf(stderr,
                 "kvtier: warning: --credit-lru has no effect with --policy %s; use --policy "
                 "credit-lru\n",
                 o.policy.c_str());
  }
  auto fraction = PositiveDouble(args, "capacity-fraction", 0.05, 1e6);
  if (!fraction.ok()) return UsageError(fraction.status());
  double g3_fraction = 0;
  if (args.Has("g3-fraction")) {
    auto g3f = PositiveDouble(args, "g3-fraction", 0, 1e6);
    if (!g3f.ok()) return UsageError(g3f.status());
    g3_fraction = *g3f;
  }
  auto min_seen = args.GetUint("g3-admit-min-seen", 2);
  auto payload = args.GetUint("payload-bytes", 4096);
  auto requests = args.GetUint("requests", 0);
  auto verify = args.GetUint("verify-every", 1);
  auto threads = args.GetUint("copy-threads", 2);
  auto kvbytes = args.GetUint("kv-bytes-per-token", o.cost.kv_bytes_per_token);
  for (auto* r : {&min_seen, &payload, &requests, &verify, &threads, &kvbytes}) {
    if (!r->ok()) return UsageError(r->status());
  }
  if (*min_seen < 1 || *min_seen > 15 || *threads < 1 || *threads > 64 || *kvbytes < 1 ||
      *kvbytes > (1ull << 30)) {
    return UsageError(Status::InvalidArgument(
        "--g3-admit-min-seen 1..15, --copy-threads 1..64, --kv-bytes-per-token 1..2^30"));
  }
  auto prefill = PositiveDouble(args, "prefill-tokens-per-s", o.cost.prefill_tokens_per_s, 1e12);
  auto g2_gbps = PositiveDouble(args, "g2-gbps", o.cost.load_bytes_per_s[kTierG2] / 1e9, 1e6);
  auto g3_gbps = PositiveDouble(args, "g3-gbps", o.cost.load_bytes_per_s[kTierG3] / 1e9, 1e6);
  auto g4_gbps = PositiveDouble(args, "g4-gbps", o.cost.load_bytes_per_s[kTierG4] / 1e9, 1e6);
  for (auto* r : {&prefill, &g2_gbps, &g3_gbps, &g4_gbps}) {
    if (!r->ok()) return UsageError(r->status());
  }
  o.cost.prefill_tokens_per_s = *prefill;
  o.cost.kv_bytes_per_token = *kvbytes;
  o.cost.load_bytes_per_s[kTierG2] = *g2_gbps * 1e9;
  o.cost.load_bytes_per_s[kTierG3] = *g3_gbps * 1e9;
  o.cost.load_bytes_per_s[kTierG4] = *g4_gbps * 1e9;
  o.g3_admit_min_seen = static_cast<uint32_t>(*min_seen);
  if (args.Has("g3-admit-max-writes-per-hit")) {
    auto w = args.GetDouble("g3-admit-max-writes-per-hit", 0);
    if (!w.ok()) return UsageError(w.status());
    if (!std::isfinite(*w) || *w < 0 || *w > 1e6) {
      return UsageError(Status::InvalidArgument(
          "--g3-admit-max-writes-per-hit = " + args.GetString("g3-admit-max-writes-per-hit", "") +
          ": must be a number in [0, 1e6] (0: never admit below --g3-admit-min-seen)"));
    }
    o.settings.emplace_back("g3.admit_max_writes_per_hit",
                            args.GetString("g3-admit-max-writes-per-hit", ""));
  }
  o.payload_bytes = *payload;
  o.max_requests = *requests;
  o.verify_every = static_cast<uint32_t>(std::min<uint64_t>(*verify, UINT32_MAX));
  o.copy_threads = static_cast<uint32_t>(*threads);
  const Trace& t = trace->blocks();
  o.g2_blocks = CapacityForFraction(t, *fraction);
  o.g3_blocks = g3_fraction > 0 ? CapacityForFraction(t, g3_fraction) : 0;
  auto replay_layout = ReplayLayout(o.payload_bytes, static_cast<uint32_t>(*tpb));
  if (!replay_layout.ok()) return UsageError(replay_layout.status());

  // G4: shared storage, so no capacity fraction; what bounds it is said in the output.
  std::unique_ptr<ReplayG4Setup> g4;
  bool g4_write_through = Config().GetBool("g4.write_through");
  const bool warm = args.Has("g4-warm");
  std::string g4_offer = "always";
  if (args.Has("g4")) {
    if (args.Has("g4-write-through")) {
      const std::string wt = args.GetString("g4-write-through", "");
      if (wt != "on" && wt != "off") {
        return UsageError(
            Status::InvalidArgument("--g4-write-through '" + wt + "': use on or off"));
      }
      g4_write_through = wt == "on";
      o.g4_write_through = g4_write_through;
    }
    auto lookup_ms = args.GetUint("g4-lookup-deadline-ms", 0);
    auto load_ms = args.GetUint("g4-load-deadline-ms", 0);
    for (auto* v : {&lookup_ms, &load_ms}) {
      if (!v->ok()) return UsageError(v->status());
    }
    if ((args.Has("g4-lookup-deadline-ms") && (*lookup_ms < 1 || *lookup_ms > 60000)) ||
        (args.Has("g4-load-deadline-ms") && (*load_ms < 1 || *load_ms > 600000))) {
      return UsageError(Status::InvalidArgument(
          "--g4-lookup-deadline-ms 1..60000, --g4-load-deadline-ms 1..600000"));
    }
    o.g4_lookup_deadline_ms = static_cast<uint32_t>(*lookup_ms);
    o.g4_load_deadline_ms = static_cast<uint32_t>(*load_ms);
    const std::string offer = args.GetString("g4-offer", "always");
    if (offer != "always" && offer != "when-faster") {
      return UsageError(
          Status::InvalidArgument("--g4-offer '" + offer + "': use always or when-faster"));
    }
    g4_offer = offer;
    if (offer == "when-faster") {
      // The manager compares ITS block bytes / g4.load_gbps with tokens per block /
      // g4.recompute_tokens_per_s. Its blocks are scaled down, so the bandwidth is scaled by the
      // same factor: the comparison is then the cost model's, for the real model's blocks.
      const double real_block_bytes = static_cast<double>(o.cost.kv_bytes_per_token) * *tpb;
      const double scaled_gbps =
          *g4_gbps * static_cast<double>(replay_layout->BlockBytes()) / real_block_bytes;
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%.17g", scaled_gbps);
      o.settings.emplace_back("g4.load_gbps", buf);
      std::snprintf(buf, sizeof(buf), "%.17g", o.cost.prefill_tokens_per_s);
      o.settings.emplace_back("g4.recompute_tokens_per_s", buf);
    }
    auto opened = ReplayG4Setup::Open(args.GetString("g4", ""), args.Has("keep"));
    if (!opened.ok()) {
      return opened.status().code() == StatusCode::kInvalidArgument ? UsageError(opened.status())
                                                                    : Failure(opened.status());
    }
    g4 = std::move(opened).value();
    o.g4_backend = g4->backend();
    o.g4_dir = g4->dir();
    o.g4_endpoints = g4->endpoint();
  } else {
    for (const char* flag : {"g4-warm", "g4-write-through", "g4-lookup-deadline-ms",
                             "g4-load-deadline-ms", "g4-gbps", "g4-offer"}) {
      if (args.Has(flag)) {
        return UsageError(Status::InvalidArgument(std::string("--") + flag + " needs --g4 SPEC"));
      }
    }
  }

  if (multi_worker) return RunMultiWorkerCommand(args, *trace, path, o);  // docs/router.md

  // The first pass; with --g4-warm a second one: a fresh manager (empty G2, G3 in a fresh
  // directory: G3 survives restarts) on the same G4, as a second worker would be.
  std::vector<std::string> temp_dirs;
  // Metrics (docs/metrics.md): KVTIER_METRICS_PORT serves /metrics during the replay; --pace-ms
  // slows it down and --hold-s keeps the endpoint up after the last request, for scrapers.
  auto metrics = MetricsSettings();
  if (!metrics.ok()) return UsageError(metrics.status());
  for (auto& kv : *metrics) o.settings.push_back(kv);
  auto pace_ms = args.GetUint("pace-ms", 0);
  auto hold_s = args.GetDouble("hold-s", 0);
  if (!pace_ms.ok()) return UsageError(pace_ms.status());
  if (!hold_s.ok()) return UsageError(hold_s.status());
  if (*pace_ms > 60000 || *hold_s < 0 || *hold_s > 3600) {
    return UsageError(Status::InvalidArgument("--pace-ms 0..60000, --hold-s 0..3600"));
  }
  auto run_pass = [&](int pass) -> Result<ReplayResult> {
    if (o.g3_blocks > 0) {
      if (args.Has("g3-dir")) {
        o.g3_dir = args.GetString("g3-dir", "");
        std::error_code ec;
        if (pass == 1 && std::filesystem::is_directory(o.g3_dir, ec) &&
            !std::filesystem::is_empty(o.g3_dir, ec)) {
          // G3 recovers the old blocks and counts them as hits of this trace: right for a warm
          // restart (the chaos test's kill -9 and rerun), misleading for a cold measurement.
          std::fprintf(stderr,
                       "kvtier: warning: --g3-dir %s is not empty: G3 recovers its blocks and "
                       "they count as hits of this trace (ratio_to_unbounded may exceed 1); "
                       "name an empty dir for a cold run\n",
                       o.g3_dir.c_str());
        }
        if (pass > 1) {
          o.g3_dir += "/warm-pass";
          std::error_code ec;
          std::filesystem::create_directories(o.g3_dir, ec);
          if (ec) return Status::IOError("cannot create " + o.g3_dir + ": " + ec.message());
        }
      } else {
        auto made = MakeTempDir("/tmp/kvtier-replay-", args.Has("keep"));
        if (!made.ok()) return made.status();
        temp_dirs.push_back(o.g3_dir = *made);
      }
    }
    const size_t total = o.max_requests == 0 ? trace->requests()
                                             : std::min<size_t>(o.max_requests, trace->requests());
    Progress progress(pass == 1 ? "replay" : "replay (warm pass)", total, "requests");
    ReplayOptions po = o;
    po.after_request = [&, inner = o.after_request](size_t r) {
      if (inner) inner(r);
      progress.Update(r + 1);
      if (*pace_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(*pace_ms));
      if (r + 1 == total && *hold_s > 0) {
        progress.Finish();
        std::this_thread::sleep_for(std::chrono::duration<double>(*hold_s));
      }
    };
    return RunReplay(*trace, po);
  };
  auto result = run_pass(1);
  Result<ReplayResult> warm_result = Status::Unavailable("no second pass");
  if (result.ok() && warm) warm_result = run_pass(2);
  if (!args.Has("keep")) {
    for (const std::string& d : temp_dirs) RemoveTempDir(d);
  }
  if (result.ok() && warm && !warm_result.ok()) result = warm_result.status();
  if (!result.ok()) {
    return result.status().code() == StatusCode::kInvalidArgument ? UsageError(result.status())
                                                                  : Failure(result.status());
  }
  const ReplayResult& r = *result;
  const uint64_t mismatches = r.mismatched_blocks + (warm ? warm_result->mismatched_blocks : 0);

  // The same replay simulated (one tier of the same total slots), and the yardsticks.
  const uint64_t total_slots = r.g2_slots + r.g3_slots;
  Trace replayed = t;
  if (r.requests < t.requests()) {
    replayed.request_ends.resize(r.requests);
    replayed.ids.resize(r.requests == 0 ? 0 : replayed.request_ends.back());
  }
  auto sim = Simulate(replayed, *kind, total_slots, policy_options);
  if (!sim.ok()) return Failure(sim.status());
  double belady = -1;
  const double unbounded = SimulateUnbounded(replayed).hit_ratio();
  if (args.Has("compare-belady")) {
    auto b = Simulate(replayed, PolicyKind::kBelady, total_slots, policy_options);
    if (!b.ok()) return Failure(b.status());
    belady = b->hit_ratio();
  }

  const PassFigures f = Figures(r);
  const double hit_ratio = f.hit_ratio;
  auto tier_ratio = [&](TierId tier) { return f.tier_ratio[tier]; };
  const double p50 = f.p50, p90 = f.p90, p99 = f.p99, mean = f.mean;
  const double rp50 = f.rp50, rp90 = f.rp90, rp99 = f.rp99, rmean = f.rmean;
  const uint64_t real_block = uint64_t{trace->tokens_per_block()} * o.cost.kv_bytes_per_token;
  const char* kPaths[8] = {"g1_to_g2", "g2_to_g1", "g2_to_g3", "g3_to_g2",
                           "g3_to_g1", "g2_to_g4", "g4_to_g2", "g4_to_g1"};
  const int num_paths = g4 ? 8 : 5;
  const ManagerStats& s = r.stats;
  // A stored G4 object: the at-rest header (4 KiB up to 1320 tokens) and the payload
  // (docs/g4.md).
  const uint64_t g4_object_bytes = BlockHeaderBytesFor(trace->tokens_per_block()) + o.payload_bytes;

  if (args.Has("json")) {
    JsonObject bytes;
    for (int i = 0; i < num_paths; ++i) bytes.Add(kPaths[i], s.bytes_by_path[i]);
    JsonObject real;
    real.Add("g2_to_g1", r.hit_blocks[kTierG2] * real_block)
        .Add("g3_to_g1", r.hit_blocks[kTierG3] * real_block)
        .Add("g1_to_g2", s.saved_blocks * real_block)
        .Add("g2_to_g3", s.demoted_blocks * real_block);
    if (g4) {
      real.Add("g4_to_g1", r.hit_blocks[kTierG4] * real_block)
          .Add("g2_to_g4", s.g4_saved_blocks * real_block);
    }
    JsonObject out;
    out.Add("trace", path)
        .Add("format", trace->format() == ReplayTrace::Format::kMooncake ? "mooncake" : "kvtier")
        .Add("requests", r.requests)
        .Add("prompt_blocks", r.prompt_blocks)
        .Add("distinct_blocks", t.distinct_blocks)
        .Add("policy", o.policy)
        .Raw("credit_lru", CreditLruJson(policy_options.credit_lru))
        .Add("capacity_fraction", *fraction)
        .Add("g3_fraction", g3_fraction)
        .Add("g2_slots", r.g2_slots)
        .Add("g3_slots", r.g3_slots)
        .Add("payload_bytes", o.payload_bytes)
        .Add("hit_ratio", hit_ratio)
        .Add("hit_ratio_g2", tier_ratio(kTierG2))
        .Add("hit_ratio_g3", tier_ratio(kTierG3))
        .Add("hit_ratio_g4", tier_ratio(kTierG4))
        .Add("hit_blocks_g2", r.hit_blocks[kTierG2])
        .Add("hit_blocks_g3", r.hit_blocks[kTierG3])
        .Add("hit_blocks_g4", r.hit_blocks[kTierG4])
        .Add("hit_blocks", r.hits())
        .Add("sim_hit_ratio", sim->hit_ratio());
    if (belady >= 0) {
      out.Add("belady_hit_ratio", belady).Add("ratio_to_belady", Ratio(hit_ratio, belady));
    }
    // SSD endurance (issue 17): G3 bytes written (real block size) per G3 byte hit; a write that
    // is never read is wasted flash. null when G3 was written but never hit.
    out.Add("unbounded_hit_ratio", unbounded)
        .Add("ratio_to_unbounded", Ratio(hit_ratio, unbounded))
        .Add("g3_blocks_written", s.demoted_blocks)
        .Add("g3_first_sighting_writes", s.demotions_first_sighting)
        .Add("g3_admitting_first_sightings_at_end", s.g3_admitting_first_sightings)
        .Add("g3_bytes_written", s.demoted_blocks * real_block)
        .Add("g3_hit_bytes", r.hit_blocks[kTierG3] * real_block);
    if (r.hit_blocks[kTierG3] > 0 || s.demoted_blocks == 0) {
      out.Add("g3_write_per_hit", Ratio(double(s.demoted_blocks), double(r.hit_blocks[kTierG3])));
    } else {
      out.Raw("g3_write_per_hit", "null");
    }
    out.Add("prompt_tokens", r.prompt_tokens)
        .Add("prefill_tokens_saved", r.prefill_tokens_saved)
        .Add("ttft_p50_ms", p50)
        .Add("ttft_p90_ms", p90)
        .Add("ttft_p99_ms", p99)
        .Add("ttft_mean_ms", mean)
        .Add("recompute_ttft_p50_ms", rp50)
        .Add("recompute_ttft_p90_ms", rp90)
        .Add("recompute_ttft_p99_ms", rp99)
        .Add("recompute_ttft_mean_ms", rmean)
        .Raw("bytes_moved", bytes.Str())
        .Raw("real_bytes_moved", real.Str())
        .Add("wall_seconds", r.wall_seconds)
        .Add("dropped_saves", s.dropped_saves)
        .Add("saved_blocks", s.saved_blocks)
        .Add("demoted_blocks", s.demoted_blocks)
        .Add("evicted_blocks_g2", s.evicted_blocks_g2)
        .Add("evicted_blocks_g3", s.evicted_blocks_g3)
        .Add("load_failures", s.load_failures)
        .Add("short_loads", r.short_loads)
        .Add("verified_blocks", r.verified_blocks)
        .Add("mismatched_blocks", r.mismatched_blocks)
        .Add("pinned_blocks_at_end", s.pinned_blocks)
        .Add("g2_slots_unaccounted_at_end", G2SlotsUnaccounted(s));
    // Why a run lost hits: G3 blocks refused by verification, and the tier's quarantines.
    AddG3Counters(s, &out);
    out.Add("prefill_tokens_per_s", o.cost.prefill_tokens_per_s)
        .Add("kv_bytes_per_token", o.cost.kv_bytes_per_token)
        .Add("g2_load_gbps", o.cost.load_bytes_per_s[kTierG2] / 1e9)
        .Add("g3_load_gbps", o.cost.load_bytes_per_s[kTierG3] / 1e9)
        .Add("g4_load_gbps", o.cost.load_bytes_per_s[kTierG4] / 1e9)
        .Add("g4", g4 ? g4->Describe() : std::string("none"))
        .Add("g4_backend", g4 ? g4->kind() : std::string("none"))
        .Add("g2_staging_slots", r.g2_staging_slots);
    if (g4) {
      out.Add("g4_write_through", g4_write_through)
          .Add("g4_offer", g4_offer)
          .Add("g4_object_bytes", g4_object_bytes)
          .Add("g4_lookup_deadline_ms", o.g4_lookup_deadline_ms > 0
                                            ? uint64_t{o.g4_lookup_deadline_ms}
                                            : Config().GetUint("g4.lookup_deadline_ms"))
          .Add("g4_load_deadline_ms", o.g4_load_deadline_ms > 0
                                          ? uint64_t{o.g4_load_deadline_ms}
                                          : Config().GetUint("g4.load_deadline_ms"));
      AddG4Counters(s, &out);
    }
    if (warm) {
      const ReplayResult& w = *warm_result;
      const PassFigures wf = Figures(w);
      JsonObject wo;
      JsonObject wbytes;
      for (int i = 0; i < num_paths; ++i) wbytes.Add(kPaths[i], w.stats.bytes_by_path[i]);
      wo.Add("requests", w.requests)
          .Add("hit_ratio", wf.hit_ratio)
          .Add("hit_ratio_g2", wf.tier_ratio[kTierG2])
          .Add("hit_ratio_g3", wf.tier_ratio[kTierG3])
          .Add("hit_ratio_g4", wf.tier_ratio[kTierG4])
          .Add("hit_blocks_g2", w.hit_blocks[kTierG2])
          .Add("hit_blocks_g3", w.hit_blocks[kTierG3])
          .Add("hit_blocks_g4", w.hit_blocks[kTierG4])
          .Add("hit_blocks", w.hits())
          .Add("prefill_tokens_saved", w.prefill_tokens_saved)
          .Add("ttft_p50_ms", wf.p50)
          .Add("ttft_p90_ms", wf.p90)
          .Add("ttft_p99_ms", wf.p99)
          .Add("ttft_mean_ms", wf.mean)
          .Raw("bytes_moved", wbytes.Str())
          .Add("wall_seconds", w.wall_seconds)
          .Add("load_failures", w.stats.load_failures)
          .Add("short_loads", w.short_loads)
          .Add("verified_blocks", w.verified_blocks)
          .Add("mismatched_blocks", w.mismatched_blocks)
          .Add("pinned_blocks_at_end", w.stats.pinned_blocks)
          .Add("g2_slots_unaccounted_at_end", G2SlotsUnaccounted(w.stats));
      AddG3Counters(w.stats, &wo);
      AddG4Counters(w.stats, &wo);
      out.Raw("warm_pass", wo.Str());
    }
    std::printf("%s\n", out.Str().c_str());
    return mismatches == 0 ? 0 : 1;
  }

  std::printf("trace %s: %llu requests replayed, %llu prompt blocks, %llu distinct\n", path.c_str(),
              static_cast<unsigned long long>(r.requests),
              static_cast<unsigned long long>(r.prompt_blocks),
              static_cast<unsigned long long>(t.distinct_blocks));
  std::printf("policy %s; G2 %llu slots (%.4g x distinct)", o.policy.c_str(),
              static_cast<unsigned long long>(r.g2_slots), *fraction);
  if (r.g3_slots > 0) {
    std::printf(", G3 %llu slots (%.4g x distinct)", static_cast<unsigned long long>(r.g3_slots),
                g3_fraction);
  }
  std::printf("; %llu-byte blocks\n", static_cast<unsigned long long>(o.payload_bytes));
  if (g4) {
    std::printf("G4 %s; write-through %s; %llu staging slots added to G2; %llu-byte objects\n",
                g4->Describe().c_str(), g4_write_through ? "on" : "off (fed by demotion)",
                static_cast<unsigned long long>(r.g2_staging_slots),
                static_cast<unsigned long long>(g4_object_bytes));
  }
  std::printf("\n");
  if (!credit_lru->given.empty()) {
    std::printf("credit-lru settings: %s\n\n", CreditLruJson(policy_options.credit_lru).c_str());
  }
  std::printf(
      "hit ratio      %.4f  (G2 %.4f, G3 %.4f, G4 %.4f)   simulated, same policy/slots: %.4f%s\n",
      hit_ratio, tier_ratio(kTierG2), tier_ratio(kTierG3), tier_ratio(kTierG4), sim->hit_ratio(),
      g4 ? " (G2+G3 only)" : "");
  std::printf("hit blocks     %llu = G2 %llu + G3 %llu + G4 %llu of %llu prompt blocks\n",
              static_cast<unsigned long long>(r.hits()),
              static_cast<unsigned long long>(r.hit_blocks[kTierG2]),
              static_cast<unsigned long long>(r.hit_blocks[kTierG3]),
              static_cast<unsigned long long>(r.hit_blocks[kTierG4]),
              static_cast<unsigned long long>(r.prompt_blocks));
  if (belady >= 0) {
    std::printf("belady         %.4f  (replay = %.3f x belady)   unbounded %.4f\n", belady,
                Ratio(hit_ratio, belady), unbounded);
  }
  if (belady < 0)
    std::printf("unbounded      %.4f  (replay = %.3f x unbounded)\n", unbounded,
                Ratio(hit_ratio, unbounded));
  if (r.g3_slots > 0) {
    std::printf("g3 endurance   %llu blocks written for %llu G3 hits: %.3f written per hit\n",
                static_cast<unsigned long long>(s.demoted_blocks),
                static_cast<unsigned long long>(r.hit_blocks[kTierG3]),
                Ratio(double(s.demoted_blocks), double(r.hit_blocks[kTierG3])));
  }
  std::printf("prefill saved  %llu of %llu prompt tokens (%.1f%%)\n",
              static_cast<unsigned long long>(r.prefill_tokens_saved),
              static_cast<unsigned long long>(r.prompt_tokens),
              100.0 * Ratio(static_cast<double>(r.prefill_tokens_saved),
                            static_cast<double>(r.prompt_tokens)));
  std::printf("TTFT (ms)      %10s %9s %9s %9s\n", "p50", "p90", "p99", "mean");
  std::printf("  kvtier       %10.1f %9.1f %9.1f %9.1f\n", p50, p90, p99, mean);
  std::printf("  recompute    %10.1f %9.1f %9.1f %9.1f\n", rp50, rp90, rp99, rmean);
  std::printf("bytes moved (scaled blocks):");
  for (int i = 0; i < num_paths; ++i) {
    std::printf(" %s %.1f MB%s", kPaths[i], s.bytes_by_path[i] / 1e6,
                i < num_paths - 1 ? "," : "\n");
  }
  std::printf("bytes moved (real model):    g2_to_g1 %.1f GB, g3_to_g1 %.1f GB",
              r.hit_blocks[kTierG2] * real_block / 1e9, r.hit_blocks[kTierG3] * real_block / 1e9);
  if (g4) {
    std::printf(", g4_to_g1 %.1f GB, g2_to_g4 %.1f GB", r.hit_blocks[kTierG4] * real_block / 1e9,
                s.g4_saved_blocks * real_block / 1e9);
  }
  std::printf("\n");
  std::printf("saves %llu, dropped %llu, demoted %llu, load failures %llu, short loads %llu\n",
              static_cast<unsigned long long>(s.saved_blocks),
              static_cast<unsigned long long>(s.dropped_saves),
              static_cast<unsigned long long>(s.demoted_blocks),
              static_cast<unsigned long long>(s.load_failures),
              static_cast<unsigned long long>(r.short_loads));
  std::printf("verified %llu loaded blocks byte for byte: %llu mismatches\n",
              static_cast<unsigned long long>(r.verified_blocks),
              static_cast<unsigned long long>(r.mismatched_blocks));
  if (r.g3_slots > 0) {
    std::printf("G3: %llu corrupt blocks refused, %llu quarantines%s, %llu demotion failures\n",
                static_cast<unsigned long long>(s.corrupt_blocks),
                static_cast<unsigned long long>(s.g3_quarantines),
                s.g3_quarantined ? " (quarantined at the end)" : "",
                static_cast<unsigned long long>(s.demotion_failures));
  }
  if (g4) PrintG4Counters(s);
  std::printf("wall time %.2f s\n", r.wall_seconds);
  if (warm) {
    const ReplayResult& w = *warm_result;
    const PassFigures wf = Figures(w);
    std::printf("\nwarm pass (a fresh worker: empty G2/G3, the same G4):\n");
    std::printf("hit ratio      %.4f  (G2 %.4f, G3 %.4f, G4 %.4f)\n", wf.hit_ratio,
                wf.tier_ratio[kTierG2], wf.tier_ratio[kTierG3], wf.tier_ratio[kTierG4]);
    std::printf("TTFT (ms)      %10.1f %9.1f %9.1f %9.1f  (p50 p90 p99 mean)\n", wf.p50, wf.p90,
                wf.p99, wf.mean);
    std::printf("verified %llu loaded blocks byte for byte: %llu mismatches; short loads %llu\n",
                static_cast<unsigned long long>(w.verified_blocks),
                static_cast<unsigned long long>(w.mismatched_blocks),
                static_cast<unsigned long long>(w.short_loads));
    PrintG4Counters(w.stats);
    std::printf("wall time %.2f s\n", w.wall_seconds);
  }
  return mismatches == 0 ? 0 : 1;
}

}  // namespace kvtier::cli

// kvtier sim: replays a block trace through one cache tier under each eviction policy and
// compares the hit ratios with Belady's offline optimum and with an unbounded cache. A study
// tool for eviction policies; `kvtier replay` (real tiers, TTFT) is the end-to-end one.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/credit_lru_flags.h"
#include "cli/json_writer.h"
#include "index/eviction_policy.h"
#include "policies/lab_policies.h"
#include "sim/belady_policy.h"
#include "sim/policy_sim.h"

namespace kvtier::cli {

namespace {

// The online policies `--policy all` runs, the default first; the lab's among them
// (lineage-lru, leaf-first-lru, s3fifo: lab/policies, docs/policies.md).
// The default of g2.policy / g3.policy (src/core/config.cc).
constexpr PolicyKind kDefaultPolicy = PolicyKind::kAdaptive;
constexpr PolicyKind kOnlinePolicies[] = {
    kDefaultPolicy,         PolicyKind::kCreditLru,  PolicyKind::kLru,          PolicyKind::kArc,
    PolicyKind::kWTinyLfu,  PolicyKind::kLineageLru, PolicyKind::kLeafFirstLru, PolicyKind::kS3Fifo,
    PolicyKind::kHitDensity};
// The baselines the default must stay within 2% of (issue 17).
constexpr PolicyKind kBaselines[] = {PolicyKind::kLru, PolicyKind::kArc, PolicyKind::kWTinyLfu};

void PrintSimHelp() {
  std::printf(
      "usage: kvtier sim --trace FILE [--capacity-fraction F] [--policy NAME|all]\n"
      "                  [--credit-lru KEY=VALUE]... [--adaptive KEY=VALUE]...\n"
      "                  [--hit-density KEY=VALUE]... [--json]\n"
      "  Replays a Mooncake-format block trace (JSONL: {\"hash_ids\": [...], ...} per line,\n"
      "  prefix-chained ids) through ONE cache tier and reports the hit ratio of each policy,\n"
      "  of Belady's offline optimum and of an unbounded cache.\n"
      "\n"
      "  --trace FILE              the trace (required)\n"
      "  --capacity-fraction F     tier capacity = ceil(F x distinct blocks of the trace);\n"
      "                            default 0.05\n"
      "  --policy NAME|all         the product's: adaptive, credit-lru, lru, arc, w-tinylfu,\n"
      "                            hit-density; the lab's (a deployment's config refuses\n"
      "                            them): lineage-lru, leaf-first-lru, s3fifo; or all\n"
      "                            (default %s)\n"
      "%s"
      "  --adaptive KEY=VALUE      a setting of adaptive: half_life (score half-life in\n"
      "                            references per capacity block, default 16) or hysteresis\n"
      "                            (relative lead to take over, default 0.02) or\n"
      "                            with_hit_density (1: hit-density is a candidate too,\n"
      "                            default 0); repeatable\n"
      "  --hit-density KEY=VALUE   a setting of hit-density: ghost_factor, decay, refresh,\n"
      "                            max_age, samples, features (src/index/eviction_policy.h,\n"
      "                            HitDensityConfig); repeatable\n"
      "  --json                    one JSON object: hit_ratio (of --policy; of %s for all),\n"
      "                            belady_hit_ratio, unbounded_hit_ratio, ratio_to_belady,\n"
      "                            policies {name: {hit_ratio, ratio_to_belady, ...}},\n"
      "                            credit_lru {the settings credit-lru ran with}; with all:\n"
      "                            best_baseline (of lru, arc, w-tinylfu), its hit_ratio,\n"
      "                            default_vs_best_baseline, default_gain_over_lru, and per\n"
      "                            policy vs_best_baseline and gain_over_lru\n"
      "\n"
      "  Semantics: requests are served one at a time in trace order. A request's prefix hits\n"
      "  are its blocks from the first up to its first block that is not cached; only they\n"
      "  count as hits. Every block after the first miss is recomputed and stored (evicting\n"
      "  the policy's victim when the tier is full); one that happens to be cached already is\n"
      "  used but is not a hit. A block's parent is the previous block of its request.\n"
      "  Nothing is pinned. hit_ratio = prefix-hit blocks / all blocks.\n",
      PolicyKindName(kDefaultPolicy), CreditLruFlagsHelp(28).c_str(),
      PolicyKindName(kDefaultPolicy));
}

struct PolicyRun {
  std::string name;
  SimResult result;
  double seconds = 0;
};

Result<PolicyRun> RunOne(const Trace& trace, PolicyKind kind, uint64_t capacity,
                         const PolicyOptions& options, const std::vector<BlockKey>* references) {
  std::unique_ptr<EvictionPolicy> policy;
  if (kind == PolicyKind::kBelady) {
    policy = MakeBeladyPolicy(*references);
  } else {
    auto made = MakeLabEvictionPolicy(kind, capacity, options);
    if (!made.ok()) return made.status();
    policy = std::move(*made);
  }
  const auto start = std::chrono::steady_clock::now();
  auto result = SimulatePolicy(trace, *policy, capacity);
  if (!result.ok()) {
    return Status::Internal(std::string(PolicyKindName(kind)) + ": " + result.status().message());
  }
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  return PolicyRun{PolicyKindName(kind), *result, took.count()};
}

double Ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

// The whole of `text` as a finite number; InvalidArgument otherwise.
Result<double> ParseFiniteDouble(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v)) {
    return Status::InvalidArgument("not a finite number: '" + text + "'");
  }
  return v;
}

}  // namespace

int RunSim(const CliArgs& args) {
  if (args.Has("help")) {
    PrintSimHelp();
    return 0;
  }
  if (Status s = args.CheckKnown({"help", "json", "trace", "capacity-fraction", "policy",
                                  "credit-lru", "adaptive", "hit-density"});
      !s.ok()) {
    return UsageError(s);
  }
  auto credit_lru = ParseCreditLruFlags(args);
  if (!credit_lru.ok()) return UsageError(credit_lru.status());
  PolicyOptions options;
  options.credit_lru = credit_lru->config;
  for (const std::string& kv : args.GetAll("adaptive")) {
    const size_t eq = kv.find('=');
    auto value = eq == std::string::npos ? Result<double>(Status::InvalidArgument(""))
                                         : ParseFiniteDouble(kv.substr(eq + 1));
    if (!value.ok()) {
      return UsageError(Status::InvalidArgument("--adaptive '" + kv +
                                                "': expected KEY=NUMBER, KEY one of half_life, "
                                                "hysteresis, with_hit_density"));
    }
    if (Status s = options.adaptive.Set(kv.substr(0, eq), *value); !s.ok()) {
      return UsageError(Status::InvalidArgument("--adaptive: " + s.message()));
    }
  }
  for (const std::string& kv : args.GetAll("hit-density")) {
    const size_t eq = kv.find('=');
    auto value = eq == std::string::npos ? Result<double>(Status::InvalidArgument(""))
                                         : ParseFiniteDouble(kv.substr(eq + 1));
    if (!value.ok()) {
      return UsageError(Status::InvalidArgument("--hit-density '" + kv + "': expected KEY=NUMBER"));
    }
    if (Status s = options.hit_density.Set(kv.substr(0, eq), *value); !s.ok()) {
      return UsageError(Status::InvalidArgument("--hit-density: " + s.message()));
    }
  }
  if (!args.Has("trace")) return UsageError(Status::InvalidArgument("--trace FILE is required"));
  auto fraction = args.GetDouble("capacity-fraction", 0.05);
  if (!fraction.ok()) return UsageError(fraction.status());
  if (!std::isfinite(*fraction) || *fraction <= 0 || *fraction > 1e6) {
    return UsageError(
        Status::InvalidArgument("--capacity-fraction = " + args.GetString("capacity-fraction", "") +
                                ": must be a number in (0, 1e6]"));
  }
  const std::string policy_name = args.GetString("policy", PolicyKindName(kDefaultPolicy));
  std::vector<PolicyKind> kinds;
  if (policy_name == "all") {
    kinds.assign(std::begin(kOnlinePolicies), std::end(kOnlinePolicies));
  } else {
    auto kind = ParsePolicyKind(policy_name);
    if (!kind.ok()) return UsageError(kind.status());
    if (*kind == PolicyKind::kBelady) {
      return UsageError(Status::InvalidArgument(
          "--policy belady: Belady is always run as the yardstick; name an online policy"));
    }
    kinds.push_back(*kind);
  }
  if (!credit_lru->given.empty() &&
      std::find(kinds.begin(), kinds.end(), PolicyKind::kCreditLru) == kinds.end() &&
      std::find(kinds.begin(), kinds.end(), PolicyKind::kAdaptive) == kinds.end()) {
    std::fprintf(stderr,
                 "kvtier: warning: --credit-lru has no effect with --policy %s; use --policy "
                 "credit-lru, adaptive or all\n",
                 policy_name.c_str());
  }

  auto trace = LoadMooncakeTrace(args.GetString("trace", ""));
  if (!trace.ok()) {
    // A path that does not exist or is no regular file is the user's to fix, as a bad line is.
    const bool usage =
        trace.status().Is(StatusCode::kInvalidArgument) || trace.status().Is(StatusCode::kNotFound);
    return usage ? UsageError(trace.status()) : Failure(trace.status());
  }
  if (trace->requests() == 0) {
    return UsageError(Status::InvalidArgument("trace " + args.GetString("trace", "") +
                                              " holds no requests (it is empty or blank)"));
  }
  const uint64_t capacity = CapacityForFraction(*trace, *fraction);
  const std::vector<BlockKey> references = TraceReferences(*trace);

  std::vector<PolicyRun> runs;
  for (PolicyKind kind : kinds) {
    auto run = RunOne(*trace, kind, capacity, options, nullptr);
    if (!run.ok()) return Failure(run.status());
    runs.push_back(*run);
  }
  auto belady = RunOne(*trace, PolicyKind::kBelady, capacity, options, &references);
  if (!belady.ok()) return Failure(belady.status());
  const SimResult unbounded = SimulateUnbounded(*trace);
  const double belady_ratio = belady->result.hit_ratio();
  const PolicyRun& headline = runs.front();

  // The best of the baselines and LRU, when they ran (--policy all).
  const PolicyRun* best = nullptr;
  const PolicyRun* lru = nullptr;
  for (const PolicyRun& run : runs) {
    for (PolicyKind b : kBaselines) {
      if (run.name != PolicyKindName(b)) continue;
      if (best == nullptr || run.result.hit_ratio() > best->result.hit_ratio()) best = &run;
      if (b == PolicyKind::kLru) lru = &run;
    }
  }
  const bool compare = policy_name == "all" && best != nullptr && lru != nullptr;

  if (args.Has("json")) {
    JsonObject per_policy;
    for (const PolicyRun& run : runs) {
      JsonObject o;
      o.Add("hit_ratio", run.result.hit_ratio())
          .Add("ratio_to_belady", Ratio(run.result.hit_ratio(), belady_ratio))
          .Add("hit_blocks", run.result.hit_blocks)
          .Add("inserts", run.result.inserts)
          .Add("evictions", run.result.evictions)
          .Add("seconds", run.seconds);
      if (compare) {
        o.Add("vs_best_baseline", Ratio(run.result.hit_ratio(), best->result.hit_ratio()))
            .Add("gain_over_lru", Ratio(run.result.hit_ratio(), lru->result.hit_ratio()));
      }
      per_policy.Raw(run.name, o.Str());
    }
    JsonObject out;
    out.Add("trace", args.GetString("trace", ""))
        .Add("requests", static_cast<uint64_t>(trace->requests()))
        .Add("blocks", static_cast<uint64_t>(trace->ids.size()))
        .Add("distinct_blocks", trace->distinct_blocks)
        .Add("lineage_conflicts", trace->lineage_conflicts)
        .Add("capacity_fraction", *fraction)
        .Add("capacity_blocks", capacity)
        .Add("policy", headline.name)
        .Add("hit_ratio", headline.result.hit_ratio())
        .Add("belady_hit_ratio", belady_ratio)
        .Add("unbounded_hit_ratio", unbounded.hit_ratio())
        .Add("ratio_to_belady", Ratio(headline.result.hit_ratio(), belady_ratio))
        .Raw("policies", per_policy.Str())
        .Raw("credit_lru", CreditLruJson(options.credit_lru));
    if (compare) {
      out.Add("default_policy", PolicyKindName(kDefaultPolicy))
          .Add("best_baseline", best->name)
          .Add("best_baseline_hit_ratio", best->result.hit_ratio())
          .Add("default_vs_best_baseline",
               Ratio(headline.result.hit_ratio(), best->result.hit_ratio()))
          .Add("default_gain_over_lru",
               Ratio(headline.result.hit_ratio(), lru->result.hit_ratio()));
    }
    std::printf("%s\n", out.Str().c_str());
    return 0;
  }

  std::printf("trace %s: %zu requests, %zu blocks, %llu distinct\n",
              args.GetString("trace", "").c_str(), trace->requests(), trace->ids.size(),
              static_cast<unsigned long long>(trace->distinct_blocks));
  if (trace->lineage_conflicts > 0) {
    std::printf("warning: %llu ids appear under two parents; the trace is not prefix-chained\n",
                static_cast<unsigned long long>(trace->lineage_conflicts));
  }
  std::printf("capacity %llu blocks (%.4g x distinct), one tier\n",
              static_cast<unsigned long long>(capacity), *fraction);
  if (!credit_lru->given.empty()) {
    std::printf("credit-lru settings: %s\n", CreditLruJson(options.credit_lru).c_str());
  }
  std::printf("\n");
  std::printf("%-12s %10s %10s %11s %11s %8s\n", "policy", "hit_ratio", "vs_belady", "hit_blocks",
              "evictions", "seconds");
  for (const PolicyRun& run : runs) {
    std::printf("%-12s %10.4f %10.3f %11llu %11llu %8.2f\n", run.name.c_str(),
                run.result.hit_ratio(), Ratio(run.result.hit_ratio(), belady_ratio),
                static_cast<unsigned long long>(run.result.hit_blocks),
                static_cast<unsigned long long>(run.result.evictions), run.seconds);
  }
  std::printf("%-12s %10.4f %10.3f %11llu %11llu %8.2f\n", "belady", belady_ratio, 1.0,
              static_cast<unsigned long long>(belady->result.hit_blocks),
              static_cast<unsigned long long>(belady->result.evictions), belady->seconds);
  std::printf("%-12s %10.4f %10.3f %11llu %11s %8s\n", "unbounded", unbounded.hit_ratio(),
              Ratio(unbounded.hit_ratio(), belady_ratio),
              static_cast<unsigned long long>(unbounded.hit_blocks), "0", "-");
  return 0;
}

}  // namespace kvtier::cli

// `kvtier replay --workers N --router R`: flags, runs and output of the multi-worker replay
// (tools/replay/multi_worker.h; docs/router.md). replay_command.cc parses the single-worker
// flags, sets up G4, and hands over here.
#include <stdlib.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/json_writer.h"
#include "cli/temp_dirs.h"
#include "replay/multi_worker.h"
#include "replay/multi_worker_command.h"

namespace kvtier::cli {

namespace {

struct RunFigures {
  MultiWorkerResult r;
  double mean_ms = 0, p50_ms = 0, p90_ms = 0, p99_ms = 0, wait_mean_ms = 0;
};

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / v.size();
}

std::string JsonArray(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out + "]";
}

std::string RunJson(const RunFigures& f, const MultiWorkerOptions& mo) {
  const MultiWorkerResult& r = f.r;
  JsonObject j;
  const double blocks = static_cast<double>(std::max<uint64_t>(r.prompt_blocks, 1));
  j.Add("router", RouterKindName(r.router))
      .Add("workers", static_cast<uint64_t>(r.workers.size()))
      .Add("requests", r.requests)
      .Add("prompt_blocks", r.prompt_blocks)
      .Add("hit_ratio", r.hits() / blocks)
      .Add("hit_ratio_g1", r.hit_blocks[kTierG1] / blocks)
      .Add("hit_ratio_g2", r.hit_blocks[kTierG2] / blocks)
      .Add("hit_ratio_g3", r.hit_blocks[kTierG3] / blocks)
      .Add("hit_ratio_g4", r.hit_blocks[kTierG4] / blocks)
      .Add("ttft_mean_ms", f.mean_ms)
      .Add("ttft_p50_ms", f.p50_ms)
      .Add("ttft_p90_ms", f.p90_ms)
      .Add("ttft_p99_ms", f.p99_ms)
      .Add("queue_wait_mean_ms", f.wait_mean_ms)
      .Add("load_imbalance", r.load_imbalance())
      .Add("prompt_tokens", r.prompt_tokens)
      .Add("prefill_tokens_saved", r.prefill_tokens_saved);
  std::vector<std::string> reqs, work;
  for (const WorkerFigures& w : r.workers) {
    reqs.push_back(std::to_string(w.requests));
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.6g", w.work_s);
    work.push_back(buf);
  }
  j.Raw("worker_requests", JsonArray(reqs))
      .Raw("worker_work_s", JsonArray(work))
      .Add("g1_blocks_per_worker", mo.g1_blocks)
      .Add("g2_slots_per_worker", mo.replay.g2_blocks)
      .Add("g3_slots_per_worker", mo.replay.g3_blocks)
      .Add("g4", mo.replay.g4_backend.empty() ? std::string("none") : mo.replay.g4_backend)
      .Add("router_events", r.router_events)
      .Add("verified_blocks", r.verified_blocks)
      .Add("mismatched_blocks", r.mismatched_blocks)
      .Add("short_loads", r.short_loads)
      .Add("wall_seconds", r.wall_seconds);
  return j.Str();
}

}  // namespace

int RunMultiWorkerCommand(const CliArgs& args, const ReplayTrace& trace,
                          const std::string& trace_path, const ReplayOptions& replay) {
  for (const char* flag : {"g4-warm", "compare-belady"}) {
    if (args.Has(flag)) {
      return UsageError(Status::InvalidArgument(std::string("--") + flag +
                                                " is a single-worker figure; drop it or "
                                                "--workers"));
    }
  }
  auto workers = args.GetUint("workers", 2);
  if (!workers.ok()) return UsageError(workers.status());
  if (*workers < 1 || *workers > 64) {
    return UsageError(
        Status::InvalidArgument("--workers " + std::to_string(*workers) + ": use 1..64"));
  }
  const std::string router_name = args.GetString("router", "kvtier");
  std::vector<RouterKind> routers;
  if (router_name == "all") {
    routers.assign(std::begin(kAllRouters), std::end(kAllRouters));
  } else {
    auto k = ParseRouterKind(router_name);
    if (!k.ok()) return UsageError(k.status());
    routers.push_back(*k);
  }
  auto g1f = args.GetDouble("g1-fraction", 0.2);
  if (!g1f.ok()) return UsageError(g1f.status());
  if (!std::isfinite(*g1f) || *g1f <= 0 || *g1f > 1e6) {
    return UsageError(Status::InvalidArgument(
        "--g1-fraction " + args.GetString("g1-fraction", "") +
        ": must be a number in (0, 1e6] (each worker's G1 blocks = F x its G2 slots)"));
  }
  auto arrivals = ReadArrivalSeconds(trace_path, trace);
  if (!arrivals.ok()) {
    return arrivals.status().code() == StatusCode::kInvalidArgument ? UsageError(arrivals.status())
                                                                    : Failure(arrivals.status());
  }

  MultiWorkerOptions mo;
  mo.workers = static_cast<uint32_t>(*workers);
  mo.replay = replay;
  mo.g1_blocks = std::max<uint64_t>(
      1, static_cast<uint64_t>(std::ceil(*g1f * static_cast<double>(replay.g2_blocks))));
  mo.arrival_s = std::move(arrivals).value();

  std::vector<RunFigures> runs;
  std::vector<std::string> temp_dirs;
  Status failed = Status::Ok();
  for (RouterKind k : routers) {
    mo.router = k;
    // A run per router: fresh managers, keys of their own namespace (a shared G4 keeps one
    // run's blocks from another's).
    mo.model_id = std::string("kvtier-replay/") + RouterKindName(k);
    if (replay.g3_blocks > 0) {
      if (args.Has("g3-dir")) {
        mo.replay.g3_dir = args.GetString("g3-dir", "") + "/" + RouterKindName(k);
      } else {
        auto made = MakeTempDir("/tmp/kvtier-replay-", args.Has("keep"));
        if (!made.ok()) {
          failed = made.status();
          break;
        }
        temp_dirs.push_back(mo.replay.g3_dir = *made);
      }
    }
    auto r = RunMultiWorkerReplay(trace, mo);
    if (!r.ok()) {
      failed = r.status();
      break;
    }
    RunFigures f;
    f.r = std::move(r).value();
    f.mean_ms = Mean(f.r.ttft_s) * 1e3;
    f.p50_ms = Percentile(f.r.ttft_s, 50) * 1e3;
    f.p90_ms = Percentile(f.r.ttft_s, 90) * 1e3;
    f.p99_ms = Percentile(f.r.ttft_s, 99) * 1e3;
    f.wait_mean_ms = Mean(f.r.wait_s) * 1e3;
    runs.push_back(std::move(f));
    if (!args.Has("json")) {
      std::fprintf(stderr, "kvtier: router %s done in %.1f s\n", RouterKindName(k),
                   runs.back().r.wall_seconds);
    }
  }
  if (!args.Has("keep")) {
    for (const std::string& d : temp_dirs) RemoveTempDir(d);
  }
  if (!failed.ok()) {
    return failed.code() == StatusCode::kInvalidArgument ? UsageError(failed) : Failure(failed);
  }

  uint64_t mismatches = 0, verified = 0;
  for (const RunFigures& f : runs) {
    mismatches += f.r.mismatched_blocks;
    verified += f.r.verified_blocks;
  }
  if (args.Has("json")) {
    if (runs.size() == 1) {
      std::printf("%s\n", RunJson(runs[0], mo).c_str());
    } else {
      JsonObject all;
      std::vector<std::string> items;
      for (const RunFigures& f : runs) items.push_back(RunJson(f, mo));
      all.Add("workers", static_cast<uint64_t>(mo.workers)).Raw("runs", JsonArray(items));
      // The bars, as ratios of the kvtier router's figures to the others'.
      const RunFigures* kv = nullptr;
      for (const RunFigures& f : runs) {
        if (f.r.router == RouterKind::kKvtier) kv = &f;
      }
      for (const RunFigures& f : runs) {
        if (kv == nullptr || &f == kv || f.mean_ms <= 0) continue;
        std::string key = std::string("kvtier_ttft_mean_vs_") + RouterKindName(f.r.router);
        for (char& c : key) c = c == '-' ? '_' : c;
        all.Add(key, kv->mean_ms / f.mean_ms);
      }
      std::printf("%s\n", all.Str().c_str());
    }
  } else {
    std::printf(
        "kvtier replay: %u workers, G1 %llu + G2 %llu%s slots each%s; %llu requests on the "
        "trace's timestamps\n",
        mo.workers, static_cast<unsigned long long>(mo.g1_blocks),
        static_cast<unsigned long long>(replay.g2_blocks),
        replay.g3_blocks > 0 ? (" + G3 " + std::to_string(replay.g3_blocks)).c_str() : "",
        replay.g4_backend.empty() ? "" : (", G4 " + replay.g4_backend + " shared").c_str(),
        static_cast<unsigned long long>(runs.empty() ? 0 : runs[0].r.requests));
    std::printf("%-13s %9s %7s %7s %7s %7s %10s %10s %10s %10s %9s\n", "router", "hit", "G1", "G2",
                "G3", "G4", "mean ms", "p50 ms", "p90 ms", "wait ms", "imbalance");
    for (const RunFigures& f : runs) {
      const double b = static_cast<double>(std::max<uint64_t>(f.r.prompt_blocks, 1));
      std::printf("%-13s %9.4f %7.4f %7.4f %7.4f %7.4f %10.1f %10.1f %10.1f %10.1f %9.3f\n",
                  RouterKindName(f.r.router), f.r.hits() / b, f.r.hit_blocks[kTierG1] / b,
                  f.r.hit_blocks[kTierG2] / b, f.r.hit_blocks[kTierG3] / b,
                  f.r.hit_blocks[kTierG4] / b, f.mean_ms, f.p50_ms, f.p90_ms, f.wait_mean_ms,
                  f.r.load_imbalance());
    }
    std::printf("verified %llu loaded blocks, %llu mismatched\n",
                static_cast<unsigned long long>(verified),
                static_cast<unsigned long long>(mismatches));
  }
  // Out before the caller's clean-up (removing a G4 directory of every run's blocks takes a while).
  std::fflush(stdout);
  if (mismatches > 0) {
    std::fprintf(stderr, "kvtier: %llu loaded blocks differ from what was saved\n",
                 static_cast<unsigned long long>(mismatches));
    return 1;
  }
  return 0;
}

}  // namespace kvtier::cli

// The multi-worker replay (tools/replay/multi_worker.h): exact routing on hand-made traces
// through real BlockManagers (real G2 arenas, a real shared G4 directory), the simulated queues,
// and the CLI (JSON keys, bad flags).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "replay/multi_worker.h"
#include "replay_test_util.h"

namespace kvtier::cli {
namespace {

using namespace replay_testing;  // NOLINT: test helpers

constexpr uint32_t kTpb = 16;

ReplayTrace Mooncake(const std::string& text) {
  std::istringstream in(text);
  auto t = ParseMooncakeTrace(in);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return ReplayTrace::FromMooncake(t.ok() ? *t : Trace{}, kTpb);
}

// Two conversations, A and B, opened at t = 0; B's follow-up at 100 s, A's at 200 s. Round-robin
// sends each follow-up to the other worker.
const char* kTwoChats =
    "{\"timestamp\": 0, \"hash_ids\": [1, 2, 3]}\n"
    "{\"timestamp\": 0, \"hash_ids\": [10, 11, 12]}\n"
    "{\"timestamp\": 100000, \"hash_ids\": [10, 11, 12, 13]}\n"
    "{\"timestamp\": 200000, \"hash_ids\": [1, 2, 3, 4]}\n";

MultiWorkerOptions Options(const ReplayTrace& trace, RouterKind router) {
  MultiWorkerOptions o;
  o.workers = 2;
  o.router = router;
  o.replay.policy = "lru";
  o.replay.g2_blocks = 64;
  o.replay.payload_bytes = kTpb * 4 * 4;
  o.g1_blocks = 1;  // G1 keeps only a request's first block: the rest must come from G2
  std::vector<double> arrivals;
  for (size_t r = 0; r < trace.requests(); ++r) arrivals.push_back(0);
  o.arrival_s = arrivals;
  return o;
}

std::vector<double> Arrivals(const std::string& text, const ReplayTrace& trace) {
  TempDir dir;
  const std::string path = dir.path() + "/trace.jsonl";
  {
    std::ofstream f(path);
    f << text;
  }
  auto a = ReadArrivalSeconds(path, trace);
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  return a.ok() ? *a : std::vector<double>();
}

MultiWorkerResult RunReplayOf(const ReplayTrace& trace, const MultiWorkerOptions& o) {
  auto r = RunMultiWorkerReplay(trace, o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return MultiWorkerResult();
  EXPECT_EQ(r->mismatched_blocks, 0u);
  EXPECT_EQ(r->short_loads, 0u);
  // Every load of the manager (G2, G3, G4) was checked byte for byte.
  EXPECT_EQ(r->verified_blocks,
            r->hit_blocks[kTierG2] + r->hit_blocks[kTierG3] + r->hit_blocks[kTierG4]);
  return std::move(r).value();
}

TEST(MultiWorkerTest, ReadsArrivalTimesInSeconds) {
  const ReplayTrace t = Mooncake(kTwoChats);
  EXPECT_EQ(Arrivals(kTwoChats, t), (std::vector<double>{0, 0, 100, 200}));
  // A trace that changed under the parser: the line count disagrees.
  auto bad = ReadArrivalSeconds("/nonexistent/trace.jsonl", t);
  EXPECT_EQ(bad.status().code(), StatusCode::kNotFound);
  TempDir dir;
  {
    std::ofstream f(dir.path() + "/short.jsonl");
    f << "{\"timestamp\": 5, \"hash_ids\": [1]}\n";
  }
  auto short_trace = ReadArrivalSeconds(dir.path() + "/short.jsonl", t);
  EXPECT_EQ(short_trace.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(short_trace.status().message().find("1 request lines but 4"), std::string::npos);
  // The kvtier token format: an optional timestamp (absent: the previous one), a request id
  // that mentions "timestamp" is not read as one, blank lines are skipped.
  const std::string tokens =
      "{\"request_id\": \"a \\\"timestamp\\\": 9\", \"tokens\": [1, 2]}\n"
      "\n"
      "{\"timestamp\": 1500, \"tokens\": [1, 2, 3]}\n"
      "{\"tokens\": [4]}\n";
  {
    std::ofstream f(dir.path() + "/tokens.jsonl");
    f << tokens;
  }
  auto tt = ReplayTrace::Load(dir.path() + "/tokens.jsonl", "auto", kTpb);
  ASSERT_TRUE(tt.ok()) << tt.status().ToString();
  auto a = ReadArrivalSeconds(dir.path() + "/tokens.jsonl", *tt);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(*a, (std::vector<double>{0, 1.5, 1.5}));
}

TEST(MultiWorkerTest, RoundRobinAlternatesAndMissesTheFollowUps) {
  const ReplayTrace t = Mooncake(kTwoChats);
  MultiWorkerOptions o = Options(t, RouterKind::kRoundRobin);
  o.arrival_s = Arrivals(kTwoChats, t);
  const MultiWorkerResult r = RunReplayOf(t, o);
  EXPECT_EQ(r.routed, (std::vector<uint32_t>{0, 1, 0, 1}));
  EXPECT_EQ(r.hits(), 0u);
  EXPECT_EQ(r.workers[0].requests, 2u);
  EXPECT_EQ(r.workers[1].requests, 2u);
}

TEST(MultiWorkerTest, KvtierSendsFollowUpsToTheirPrefixFromG1AndG2) {
  const ReplayTrace t = Mooncake(kTwoChats);
  MultiWorkerOptions o = Options(t, RouterKind::kKvtier);
  o.arrival_s = Arrivals(kTwoChats, t);
  const MultiWorkerResult r = RunReplayOf(t, o);
  // r0 -> 0 (all equal, lower id); r1 -> 1 (worker 0 is busy with r0); each follow-up to the
  // worker that holds its chat: its first block from G1, the other two from G2.
  EXPECT_EQ(r.routed, (std::vector<uint32_t>{0, 1, 1, 0}));
  EXPECT_EQ(r.hit_blocks[kTierG1], 2u);
  EXPECT_EQ(r.hit_blocks[kTierG2], 4u);
  EXPECT_EQ(r.prompt_blocks, 14u);
  EXPECT_GT(r.router_events, 0u);
  // Service: a first turn computes 3 x 16 + 1 tokens; a follow-up loads 2 blocks from G2 and
  // computes 16 + 1. r1 waited for nothing (worker 1 was idle).
  const CostModel c;
  const double first = c.ComputeSeconds(49);
  const double follow = c.LoadSeconds({0, 2, 0, 0}, kTpb) + c.ComputeSeconds(17);
  EXPECT_DOUBLE_EQ(r.ttft_s[0], first);
  EXPECT_DOUBLE_EQ(r.ttft_s[1], first);
  EXPECT_DOUBLE_EQ(r.ttft_s[2], follow);
  EXPECT_DOUBLE_EQ(r.workers[0].work_s, first + follow);
  EXPECT_DOUBLE_EQ(r.load_imbalance(), 1.0);
}

TEST(MultiWorkerTest, ClearedG1LosesGpuPrefixRoutingButNotKvtier) {
  const ReplayTrace t = Mooncake(kTwoChats);
  for (RouterKind k : {RouterKind::kGpuPrefix, RouterKind::kKvtier}) {
    MultiWorkerOptions o = Options(t, k);
    o.arrival_s = Arrivals(kTwoChats, t);
    const MultiWorkerResult kept = RunReplayOf(t, o);
    EXPECT_EQ(kept.routed, (std::vector<uint32_t>{0, 1, 1, 0})) << RouterKindName(k);
    // Worker 1 restarts its engine before B's follow-up (request 2): its G1 is empty. The
    // anchors' rule sees no prefix anywhere and takes the least loaded (equal: worker 0); there
    // B's first block pushes A's out of worker 0's one-block G1, so A's follow-up sees no prefix
    // either and goes to the worker with less work (1): no hit at all. kvtier still sees B in
    // worker 1's G2, and A in worker 0's.
    o.clear_g1_at = {{2, 1}};
    const MultiWorkerResult cleared = RunReplayOf(t, o);
    if (k == RouterKind::kGpuPrefix) {
      EXPECT_EQ(cleared.routed, (std::vector<uint32_t>{0, 1, 0, 1}));
      EXPECT_EQ(cleared.hits(), 0u);
    } else {
      EXPECT_EQ(cleared.routed, (std::vector<uint32_t>{0, 1, 1, 0}));
      EXPECT_EQ(cleared.hit_blocks[kTierG1], 1u);
      EXPECT_EQ(cleared.hit_blocks[kTierG2], 2u + 3u);  // B's 3 blocks now all from G2
    }
  }
}

TEST(MultiWorkerTest, LeastLoadedTakesTheShortestQueue) {
  const char* text =
      "{\"timestamp\": 0, \"hash_ids\": [1, 2, 3, 4, 5, 6, 7, 8]}\n"
      "{\"timestamp\": 0, \"hash_ids\": [20]}\n"
      "{\"timestamp\": 0, \"hash_ids\": [30]}\n";
  const ReplayTrace t = Mooncake(text);
  MultiWorkerOptions o = Options(t, RouterKind::kLeastLoaded);
  const MultiWorkerResult r = RunReplayOf(t, o);
  EXPECT_EQ(r.routed, (std::vector<uint32_t>{0, 1, 1}));
  // r2 waited for r1 on worker 1: its TTFT is its wait plus its own service.
  const CostModel c;
  EXPECT_DOUBLE_EQ(r.wait_s[2], c.ComputeSeconds(17));
  EXPECT_DOUBLE_EQ(r.ttft_s[2], 2 * c.ComputeSeconds(17));
  // Busiest worker 0 (129 tokens) over the mean ((129 + 34) / 2).
  EXPECT_NEAR(r.load_imbalance(), 129.0 / ((129.0 + 34.0) / 2), 1e-9);
}

TEST(MultiWorkerTest, SharedG4ServesAFollowUpOnTheOtherWorker) {
  const ReplayTrace t = Mooncake(kTwoChats);
  TempDir g4;
  MultiWorkerOptions o = Options(t, RouterKind::kRoundRobin);
  o.arrival_s = Arrivals(kTwoChats, t);
  o.replay.g4_backend = "fs";
  o.replay.g4_dir = g4.path();
  o.replay.g4_write_through = true;
  o.replay.g4_lookup_deadline_ms = 5000;
  o.replay.g4_load_deadline_ms = 20000;
  const MultiWorkerResult r = RunReplayOf(t, o);
  EXPECT_EQ(r.routed, (std::vector<uint32_t>{0, 1, 0, 1}));
  // Each follow-up finds its chat's 3 blocks in G4, written through by the other worker.
  EXPECT_EQ(r.hit_blocks[kTierG4], 6u);
  EXPECT_EQ(r.hit_blocks[kTierG2], 0u);
}

TEST(MultiWorkerTest, KvtierFindsAPrefixThatWasDemotedToG3) {
  // Worker 0's G2 (4 slots) cannot hold A's 6 blocks: the oldest go to its G3 (real slot files
  // under g3_dir/worker-0). Its G1 is emptied before A's follow-up: kvtier still sends it there
  // (G3 + G2 beat recomputing), and the prefix loads from both tiers.
  const char* text =
      "{\"timestamp\": 0, \"hash_ids\": [1, 2, 3, 4, 5, 6]}\n"
      "{\"timestamp\": 0, \"hash_ids\": [10, 11, 12]}\n"
      "{\"timestamp\": 100000, \"hash_ids\": [1, 2, 3, 4, 5, 6, 7]}\n";
  const ReplayTrace t = Mooncake(text);
  TempDir g3;
  MultiWorkerOptions o = Options(t, RouterKind::kKvtier);
  o.arrival_s = {0, 0, 100};
  o.replay.g2_blocks = 4;
  o.replay.g3_blocks = 32;
  o.replay.g3_dir = g3.path();
  o.clear_g1_at = {{2, 0}};
  const MultiWorkerResult r = RunReplayOf(t, o);
  EXPECT_EQ(r.routed, (std::vector<uint32_t>{0, 1, 0}));
  EXPECT_EQ(r.hit_blocks[kTierG1], 0u);
  // What the two small tiers kept of A's 6 blocks (G2's free-slot reserve and the staging of G3
  // loads through G2 take some: docs/replay.md), some of it from G3.
  EXPECT_GE(r.hit_blocks[kTierG2] + r.hit_blocks[kTierG3], 3u);
  EXPECT_GE(r.hit_blocks[kTierG3], 1u);
  EXPECT_TRUE(std::filesystem::is_directory(g3.path() + "/worker-0"));
  EXPECT_TRUE(std::filesystem::is_directory(g3.path() + "/worker-1"));
  // Round-robin sends the follow-up to worker 0 as well (request 2): the same hits, so the
  // difference above is the router's choice, not the tiers'.
  o.router = RouterKind::kRoundRobin;
  TempDir g3b;
  o.replay.g3_dir = g3b.path();
  const MultiWorkerResult rr = RunReplayOf(t, o);
  EXPECT_EQ(rr.routed, (std::vector<uint32_t>{0, 1, 0}));
  EXPECT_EQ(rr.hits(), r.hits());
}

TEST(MultiWorkerTest, BadOptionsAreRefused) {
  const ReplayTrace t = Mooncake(kTwoChats);
  struct Case {
    const char* what;
    void (*change)(MultiWorkerOptions&);
    const char* says;
  };
  const Case cases[] = {
      {"no workers", [](MultiWorkerOptions& o) { o.workers = 0; }, "workers = 0"},
      {"65 workers", [](MultiWorkerOptions& o) { o.workers = 65; }, "1..64"},
      {"g1 0", [](MultiWorkerOptions& o) { o.g1_blocks = 0; }, "g1_blocks"},
      {"arrivals", [](MultiWorkerOptions& o) { o.arrival_s.pop_back(); }, "3 times for 4"},
      {"negative", [](MultiWorkerOptions& o) { o.arrival_s[1] = -1; }, ">= 0"},
      {"nan", [](MultiWorkerOptions& o) { o.arrival_s[1] = NAN; }, "finite"},
      {"clear",
       [](MultiWorkerOptions& o) {
         o.clear_g1_at = {{0, 2}};
       },
       "worker 2 of 2"},
      {"g2", [](MultiWorkerOptions& o) { o.replay.g2_blocks = 0; }, "G2"},
      {"g3 dir", [](MultiWorkerOptions& o) { o.replay.g3_blocks = 8; }, "directory"},
  };
  for (const Case& c : cases) {
    MultiWorkerOptions o = Options(t, RouterKind::kKvtier);
    c.change(o);
    auto r = RunMultiWorkerReplay(t, o);
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(r.status().message().find(c.says), std::string::npos)
        << c.what << ": " << r.status().ToString();
  }
  EXPECT_EQ(ParseRouterKind("dynamo").status().code(), StatusCode::kInvalidArgument);
  for (RouterKind k : kAllRouters) EXPECT_EQ(*ParseRouterKind(RouterKindName(k)), k);
}

// ---- the CLI ----

TEST(MultiWorkerCliTest, AllRoutersPrintConsistentJson) {
  const std::string trace = kData + "replay_mooncake_small.jsonl";
  CliRun r = Kvtier("replay --trace " + trace + " --workers 3 --router all --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  size_t at = 0;
  for (RouterKind k : kAllRouters) {
    at = r.out.find(std::string("\"router\": \"") + RouterKindName(k) + "\"", at);
    ASSERT_NE(at, std::string::npos) << RouterKindName(k) << " missing in " << r.out;
    const double hit = JsonNumber(r.out, "hit_ratio", at);
    double tiers = 0;
    for (const char* key : {"hit_ratio_g1", "hit_ratio_g2", "hit_ratio_g3", "hit_ratio_g4"}) {
      tiers += JsonNumber(r.out, key, at);
    }
    EXPECT_NEAR(hit, tiers, 1e-4) << RouterKindName(k);
    const double mean = JsonNumber(r.out, "ttft_mean_ms", at);
    const double p50 = JsonNumber(r.out, "ttft_p50_ms", at);
    const double p90 = JsonNumber(r.out, "ttft_p90_ms", at);
    EXPECT_GT(mean, 0);
    EXPECT_LE(p50, p90);
    const double imbalance = JsonNumber(r.out, "load_imbalance", at);
    EXPECT_GE(imbalance, 1.0);
    EXPECT_LE(imbalance, 3.0);
    EXPECT_EQ(JsonNumber(r.out, "workers", at), 3);
    EXPECT_EQ(JsonNumber(r.out, "requests", at), 240);
    EXPECT_EQ(JsonNumber(r.out, "mismatched_blocks", at), 0);
  }
  EXPECT_FALSE(std::isnan(JsonNumber(r.out, "kvtier_ttft_mean_vs_round_robin")));
  EXPECT_FALSE(std::isnan(JsonNumber(r.out, "kvtier_ttft_mean_vs_gpu_prefix")));
  // One router: one object, and the table without --json.
  CliRun one = Kvtier("replay --trace " + trace + " --workers 2 --router kvtier --json");
  ASSERT_EQ(one.exit_code, 0) << one.out;
  EXPECT_EQ(one.out.find("\"runs\""), std::string::npos);
  EXPECT_EQ(JsonNumber(one.out, "workers"), 2);
  CliRun table = Kvtier("replay --trace " + trace + " --workers 2 --router round-robin");
  ASSERT_EQ(table.exit_code, 0) << table.out;
  EXPECT_NE(table.out.find("round-robin"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("imbalance"), std::string::npos) << table.out;
}

TEST(MultiWorkerCliTest, BadFlagsExitTwoSayingWhy) {
  const std::string trace = "replay --trace " + kData + "replay_mooncake_small.jsonl ";
  const std::pair<std::string, std::string> cases[] = {
      {"--workers 0", "--workers 0: use 1..64"},
      {"--workers 65", "use 1..64"},
      {"--workers x", "workers"},
      {"--workers 2 --router dynamo", "--router 'dynamo'"},
      {"--workers 2 --g1-fraction 0", "--g1-fraction"},
      {"--workers 2 --g1-fraction -1", "--g1-fraction"},
      {"--workers 2 --compare-belady", "single-worker"},
      {"--workers 2 --sweep", "--sweep is simulated"},
      {"--router kvtier --sweep", "--sweep is simulated"},
  };
  for (const auto& [flags, says] : cases) {
    CliRun r = KvtierAll(trace + flags);
    EXPECT_EQ(r.exit_code, 2) << flags << ": " << r.out;
    EXPECT_NE(r.out.find(says), std::string::npos) << flags << ": " << r.out;
  }
}

}  // namespace
}  // namespace kvtier::cli

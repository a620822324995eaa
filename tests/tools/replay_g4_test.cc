// kvtier replay with G4 (issue 7): the replay core on a real shared directory and on a real
// redis-server (started by the test on a free loopback port), and the CLI's --g4 flags end to
// end. Failure paths: the server killed under a planned load, an unreachable port, a missing
// redis-server binary, bad specs; and the byte check catching wrong bytes loaded from G4.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "redis_test_util.h"
#include "replay/replay_runner.h"
#include "replay_test_util.h"
#include "sim/replay_trace.h"

namespace kvtier::cli {
namespace {

using kvtier::testing::PickFreePort;
using kvtier::testing::RedisServer;

using namespace replay_testing;  // NOLINT: test helpers
// A stored G4 object: the 4 KiB at-rest header and the 4 KiB payload (the replay's default).
constexpr uint64_t kObjectBytes = 4096 + 4096;

// G4 on `backend` at `where` (a directory or host:port), with deadlines long enough that a
// slow (sanitized, shared) machine does not turn G4 answers into misses: the tests compare hit
// counts exactly.
void UseG4(ReplayOptions* o, const std::string& backend, const std::string& where) {
  o->g4_backend = backend;
  (backend == "fs" ? o->g4_dir : o->g4_endpoints) = where;
  o->g4_lookup_deadline_ms = 5000;
  o->g4_load_deadline_ms = 20000;
}

// Objects in an fs store (names under its 256 two-hex-digit directories; no temporaries left).
uint64_t CountObjects(const std::string& dir) {
  uint64_t n = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    EXPECT_NE(e.path().filename().string()[0], '.') << "temporary left: " << e.path();
    ++n;
  }
  return n;
}

// The invariants of any replay: the per-tier hits add up, every loaded block was verified and
// matched, no pin leaked.
void ExpectConsistent(const ReplayResult& r) {
  EXPECT_EQ(r.hits(), r.hit_blocks[kTierG2] + r.hit_blocks[kTierG3] + r.hit_blocks[kTierG4]);
  EXPECT_EQ(r.hit_blocks[kTierG1], 0u);
  EXPECT_LE(r.hits(), r.prompt_blocks);
  EXPECT_EQ(r.hit_blocks, r.stats.hit_blocks);
  EXPECT_EQ(r.verified_blocks, r.hits()) << "verify_every = 1 checks every loaded block";
  EXPECT_EQ(r.mismatched_blocks, 0u);
  EXPECT_EQ(r.stats.pinned_blocks, 0u);
}

// ---- the replay core, G4 = a shared directory ----

// G2 too small for the trace's reuse: with every block written through to G4, the prefix match
// is the longest run held by G2 or G4, which is exactly the unbounded cache's; the G4 blocks
// arrive byte for byte, and the bytes moved agree with the blocks counted.
TEST(ReplayG4Test, FsServesWhatG2IsTooSmallToKeep) {
  const ReplayTrace t = Load("replay_mooncake_small.jsonl", 512);
  ReplayOptions o;
  o.g2_blocks = 40;
  auto g2_only = RunReplay(t, o);
  ASSERT_TRUE(g2_only.ok()) << g2_only.status().ToString();

  TempDir g4;
  UseG4(&o, "fs", g4.path());
  auto r = RunReplay(t, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ExpectConsistent(*r);
  EXPECT_GT(r->hit_blocks[kTierG4], 0u);
  EXPECT_GT(r->hits(), g2_only->hits());
  EXPECT_EQ(r->g2_slots, 40u) << "the staging pool comes on top of G2's slots";
  EXPECT_EQ(r->g2_staging_slots, 25u) << "the longest prompt (24 blocks) + 1";
  EXPECT_EQ(r->hits(), SimulateUnbounded(t.blocks()).hit_blocks);
  EXPECT_EQ(r->short_loads, 0u);
  const ManagerStats& s = r->stats;
  EXPECT_TRUE(s.g4_enabled);
  EXPECT_EQ(s.g4_saved_blocks, s.saved_blocks) << "write-through: every save goes to G4";
  EXPECT_EQ(s.g4_save_failures + s.g4_dropped_saves + s.g4_load_failures, 0u);
  EXPECT_EQ(s.g4_lookup_failures, 0u);
  EXPECT_EQ(s.bytes_by_path[5], s.g4_saved_blocks * kObjectBytes) << "G2 -> G4";
  EXPECT_EQ(s.bytes_by_path[6], r->hit_blocks[kTierG4] * kObjectBytes) << "G4 -> G2 (staged)";
  const uint64_t objects = CountObjects(g4.path());
  EXPECT_GT(objects, 0u);
  EXPECT_LE(objects, s.g4_saved_blocks);
  EXPECT_EQ(objects, t.blocks().distinct_blocks) << "every distinct block was committed once";
}

// With write-through off G4 is fed by G2's victims: what G2 evicts is in G4 and loads from there.
TEST(ReplayG4Test, WithoutWriteThroughG2VictimsFeedG4) {
  const ReplayTrace t = Load("replay_mooncake_small.jsonl", 512);
  TempDir g4;
  ReplayOptions o;
  o.g2_blocks = 40;
  UseG4(&o, "fs", g4.path());
  o.g4_write_through = false;
  auto r = RunReplay(t, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ExpectConsistent(*r);
  EXPECT_GT(r->hit_blocks[kTierG4], 0u);
  EXPECT_GT(r->stats.evicted_blocks_g2, 0u);
  // Only victims go to G4, each time it leaves G2 (a block loaded back from G4 into a free G2
  // slot may be evicted and written again: the object is replaced, not duplicated).
  EXPECT_EQ(r->stats.g4_saved_blocks, r->stats.evicted_blocks_g2);
  const uint64_t objects = CountObjects(g4.path());
  EXPECT_GT(objects, 0u);
  EXPECT_LE(objects, r->stats.g4_saved_blocks);
  EXPECT_LT(objects, t.blocks().distinct_blocks) << "what G2 still holds was never written";
}

// G2, G3 and G4 together: each tier serves some blocks, and the totals still add up.
TEST(ReplayG4Test, WorksWithG3) {
  const ReplayTrace t = Load("replay_mooncake_small.jsonl", 512);
  TempDir g3, g4;
  ReplayOptions o;
  o.g2_blocks = 40;
  o.g3_blocks = 100;
  o.g3_dir = g3.path();
  UseG4(&o, "fs", g4.path());
  auto r = RunReplay(t, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ExpectConsistent(*r);
  EXPECT_GT(r->hit_blocks[kTierG2], 0u);
  EXPECT_GT(r->hit_blocks[kTierG3], 0u);
  EXPECT_GT(r->hit_blocks[kTierG4], 0u);
  EXPECT_EQ(r->stats.g4_save_failures + r->stats.g4_load_failures, 0u);
}

// The byte check covers G4 loads: when the engine's KV changes under the same keys, blocks
// loaded from G4 that were written before the change count as mismatches (G4's own checks pass:
// the tokens and checksums are those of what was written). A first worker writes every block
// (write-through, all of it awaited); a second one whose KV differs loads its first request's
// prefix from G4, all of it written by the first: each loaded block is a mismatch, and nothing
// else is. (One worker reseeded halfway made the count depend on which G4 objects the second
// half had rewritten by then: under TSan on a loaded machine it once found none.)
TEST(ReplayG4Test, ChangedContentLoadedFromG4IsCountedAsMismatch) {
  const ReplayTrace t = Load("replay_mooncake_small.jsonl", 512);
  TempDir g4;
  ReplayOptions o;
  o.g2_blocks = 40;
  UseG4(&o, "fs", g4.path());
  o.g4_write_through = true;
  auto first = RunReplay(t, o);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ(CountObjects(g4.path()), t.blocks().distinct_blocks) << "every block is in G4";
  EXPECT_EQ(first->mismatched_blocks, 0u);

  o.max_requests = 1;  // a fresh G2: its hits come from G4 only
  o.content_seed = 7;
  auto second = RunReplay(t, o);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->hit_blocks[kTierG2], 0u);
  EXPECT_GT(second->hit_blocks[kTierG4], 0u);
  EXPECT_EQ(second->verified_blocks, second->hit_blocks[kTierG4]);
  EXPECT_EQ(second->mismatched_blocks, second->hit_blocks[kTierG4])
      << "every block loaded from G4 was written under other content";

  // The same second worker with the first one's content: the same loads, no mismatch.
  o.content_seed = 0;
  auto same = RunReplay(t, o);
  ASSERT_TRUE(same.ok()) << same.status().ToString();
  EXPECT_EQ(same->hit_blocks[kTierG4], second->hit_blocks[kTierG4]);
  EXPECT_EQ(same->mismatched_blocks, 0u);
}

// A second worker (fresh manager, empty G2) sharing the first one's G4 loads its prefixes from
// G4 from the first request on.
TEST(ReplayG4Test, AFreshWorkerLoadsWhatTheFirstWroteToG4) {
  const ReplayTrace t = Load("replay_mooncake_small.jsonl", 512);
  TempDir g4;
  ReplayOptions o;
  o.g2_blocks = 40;
  UseG4(&o, "fs", g4.path());
  auto first = RunReplay(t, o);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto second = RunReplay(t, o);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  ExpectConsistent(*second);
  EXPECT_GT(second->hits(), first->hits());
  EXPECT_GT(second->hit_blocks[kTierG4], first->hit_blocks[kTierG4]);
  // Every prompt of the second pass loads all its blocks (the tail token is computed).
  EXPECT_EQ(second->hits(), second->prompt_blocks);
}

TEST(ReplayG4Test, BadG4OptionsAreRefused) {
  const ReplayTrace t = Load("replay_tokens_small.jsonl", 16);
  ReplayOptions o;
  o.payload_bytes = 256;
  o.g4_backend = "fs";
  EXPECT_NE(RunReplay(t, o).status().message().find("shared directory"), std::string::npos);
  o.g4_backend = "redis";
  EXPECT_NE(RunReplay(t, o).status().message().find("host:port"), std::string::npos);
  o.g4_backend = "nfs";
  EXPECT_NE(RunReplay(t, o).status().message().find("use fs or redis"), std::string::npos);
  o.g4_backend = "redis";
  o.g4_endpoints = "127.0.0.1:notaport";
  auto bad = RunReplay(t, o);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status().ToString();
  // A store that cannot open at all is an error of the replay, not a replay without G4.
  UseG4(&o, "fs", "/proc/kvtier-replay-no-such-dir");
  auto unopened = RunReplay(t, o);
  EXPECT_EQ(unopened.status().code(), StatusCode::kUnavailable) << unopened.status().ToString();
  EXPECT_NE(unopened.status().message().find("/proc/kvtier-replay-no-such-dir"), std::string::npos);
}

// ---- the replay core, G4 = a real redis-server ----

TEST(ReplayG4RedisTest, RedisServesWhatG2IsTooSmallToKeep) {
  KVTIER_REQUIRE_REDIS();
  RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  const ReplayTrace t = Load("replay_mooncake_small.jsonl", 512);
  ReplayOptions o;
  o.g2_blocks = 40;
  UseG4(&o, "redis", server.endpoint());
  auto r = RunReplay(t, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ExpectConsistent(*r);
  EXPECT_GT(r->hit_blocks[kTierG4], 0u);
  EXPECT_EQ(r->hits(), SimulateUnbounded(t.blocks()).hit_blocks);
  EXPECT_EQ(r->stats.g4_save_failures + r->stats.g4_load_failures, 0u);
  EXPECT_EQ(static_cast<uint64_t>(server.DbSize()), t.blocks().distinct_blocks) << server.Log();
}

// The server dies right after a Lookup that found blocks in G4: that load fails and is
// recomputed, every later G4 call fails fast and is counted, the replay ends in bounded time
// with no wrong byte served and no pin left.
TEST(ReplayG4RedisTest, ServerKilledMidReplayFallsBackToRecompute) {
  KVTIER_REQUIRE_REDIS();
  RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  const ReplayTrace t = Load("replay_mooncake_small.jsonl", 512);
  ReplayOptions o;
  o.g2_blocks = 40;
  UseG4(&o, "redis", server.endpoint());
  size_t killed_at = 0;
  uint32_t planned_from_g4 = 0;
  o.after_lookup = [&](size_t request, uint32_t g4_blocks) {
    if (killed_at == 0 && request >= t.requests() / 3 && g4_blocks > 0) {
      server.Kill();
      killed_at = request;
      planned_from_g4 = g4_blocks;
    }
  };
  const auto start = std::chrono::steady_clock::now();
  auto r = RunReplay(t, o);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_GT(killed_at, 0u) << "no Lookup found G4 blocks after a third of the trace";
  ASSERT_GT(planned_from_g4, 0u);
  EXPECT_LT(seconds, 60.0) << "a dead G4 must not stall the replay";
  EXPECT_EQ(r->requests, t.requests());
  ExpectConsistent(*r);
  const ManagerStats& s = r->stats;
  EXPECT_GT(r->hit_blocks[kTierG4], 0u) << "G4 served before the kill";
  EXPECT_GE(s.g4_load_failures, 1u) << "the load planned before the kill failed";
  EXPECT_GE(r->short_loads, 1u) << "that request loaded less than Lookup offered";
  EXPECT_GE(s.load_failures, 1u);
  EXPECT_GT(s.g4_lookup_failures, 0u) << "later Lookups asked a dead server: counted misses";
  EXPECT_GT(s.g4_save_failures + s.g4_dropped_saves, 0u) << "later write-throughs failed";
}

// A G4 that never answers (nothing listens on the port): the replay runs on G2 alone with the
// same hits as without G4, the failures counted, in bounded time.
TEST(ReplayG4RedisTest, UnreachableServerIsAMissNotAnError) {
  const ReplayTrace t = Load("replay_mooncake_small.jsonl", 512);
  ReplayOptions o;
  o.policy = "lru";  // inserts in any order give the same hits (credit-lru's may differ by one)
  o.g2_blocks = 40;
  auto g2_only = RunReplay(t, o);
  ASSERT_TRUE(g2_only.ok()) << g2_only.status().ToString();
  const uint16_t port = PickFreePort(false);
  ASSERT_NE(port, 0);
  UseG4(&o, "redis", "127.0.0.1:" + std::to_string(port));
  const auto start = std::chrono::steady_clock::now();
  auto r = RunReplay(t, o);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_LT(seconds, 60.0);
  ExpectConsistent(*r);
  EXPECT_EQ(r->hit_blocks[kTierG4], 0u);
  EXPECT_EQ(r->stats.g4_saved_blocks, 0u);
  EXPECT_GT(r->stats.g4_lookup_failures + r->stats.g4_save_failures, 0u);
  // The staging pool comes on top of G2's slots, so G2 alone serves what it served before.
  EXPECT_EQ(r->hit_blocks[kTierG2], g2_only->hit_blocks[kTierG2]);
}

// ---- the CLI ----

// Every use adds --g4 SPEC; the deadlines as in UseG4.
const std::string kSmall = "replay --trace " + kData +
                           "replay_mooncake_small.jsonl --capacity-fraction 0.05 --json "
                           "--g4-lookup-deadline-ms 5000 --g4-load-deadline-ms 20000 ";

// Per-tier ratios add up to the total; G4 served blocks, all verified.
void ExpectG4Json(const std::string& out, size_t from = 0) {
  const double g2 = JsonNumber(out, "hit_ratio_g2", from),
               g3 = JsonNumber(out, "hit_ratio_g3", from),
               g4 = JsonNumber(out, "hit_ratio_g4", from);
  EXPECT_GT(g4, 0.0) << out;
  EXPECT_NEAR(JsonNumber(out, "hit_ratio", from), g2 + g3 + g4, 1e-5) << out;
  EXPECT_EQ(JsonNumber(out, "hit_blocks", from), JsonNumber(out, "hit_blocks_g2", from) +
                                                     JsonNumber(out, "hit_blocks_g3", from) +
                                                     JsonNumber(out, "hit_blocks_g4", from));
  EXPECT_EQ(JsonNumber(out, "verified_blocks", from), JsonNumber(out, "hit_blocks", from));
  EXPECT_EQ(JsonNumber(out, "mismatched_blocks", from), 0.0);
  EXPECT_EQ(JsonNumber(out, "g4_load_failures", from), 0.0);
  EXPECT_EQ(JsonNumber(out, "g4_save_failures", from), 0.0);
}

TEST(ReplayG4CliTest, FsJsonReportsG4AndRemovesItsTempDir) {
  CliRun r = Kvtier(kSmall + "--g4 fs --compare-belady --g4-gbps 2.5");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  ExpectG4Json(r.out);
  EXPECT_EQ(JsonString(r.out, "g4_backend"), "fs");
  EXPECT_EQ(r.out.find("\"g4_write_through\": true"), r.out.find("\"g4_write_through\"")) << r.out;
  EXPECT_EQ(JsonNumber(r.out, "g4_load_gbps"), 2.5);
  EXPECT_EQ(JsonNumber(r.out, "g4_lookup_deadline_ms"), 5000.0);
  EXPECT_EQ(JsonNumber(r.out, "g4_load_deadline_ms"), 20000.0);
  EXPECT_NEAR(JsonNumber(r.out, "hit_ratio"), JsonNumber(r.out, "unbounded_hit_ratio"), 1e-9);
  for (const char* path : {"\"g2_to_g4\"", "\"g4_to_g2\"", "\"g4_to_g1\"", "\"g4_lookup_failures\"",
                           "\"g4_timeouts\"", "\"g4_dropped_saves\"", "\"g4_corrupt_blocks\""}) {
    EXPECT_NE(r.out.find(path), std::string::npos) << path;
  }
  EXPECT_GT(JsonNumber(r.out, "g2_to_g4"), 0.0);
  EXPECT_GT(JsonNumber(r.out, "g4_to_g2"), 0.0);
  // "g4": "fs /tmp/kvtier-replay-g4-XXXXXX (temporary): ..." -- gone after the run.
  const std::string where = JsonString(r.out, "g4");
  ASSERT_EQ(where.rfind("fs /tmp/kvtier-replay-g4-", 0), 0u) << where;
  const std::string dir = where.substr(3, where.find(' ', 3) - 3);
  EXPECT_FALSE(std::filesystem::exists(dir)) << dir;
}

// A G4 load costs its bytes at --g4-gbps: slower G4, higher TTFT, same hits.
TEST(ReplayG4CliTest, G4BandwidthEntersTheTtft) {
  CliRun fast = Kvtier(kSmall + "--g4 fs --g4-gbps 1000");
  CliRun slow = Kvtier(kSmall + "--g4 fs --g4-gbps 0.5");
  ASSERT_EQ(fast.exit_code, 0) << fast.out;
  ASSERT_EQ(slow.exit_code, 0) << slow.out;
  EXPECT_EQ(JsonNumber(fast.out, "hit_blocks_g4"), JsonNumber(slow.out, "hit_blocks_g4"));
  EXPECT_GT(JsonNumber(slow.out, "ttft_mean_ms"), JsonNumber(fast.out, "ttft_mean_ms") + 1.0);
  EXPECT_LT(JsonNumber(fast.out, "ttft_mean_ms"), JsonNumber(fast.out, "recompute_ttft_mean_ms"));
}

// --g4-offer when-faster: the manager is told the cost model's G4 bandwidth and prefill rate
// (g4.load_gbps scaled to the replay's small blocks, g4.recompute_tokens_per_s) and asks G4
// only where a block loads faster than it recomputes. At 0.5 GB/s a real 64 MiB block loads in
// 134 ms and recomputes in 25.6 ms: no G4 hits, every lookup past G2 counted as skipped, and
// TTFT no worse than recompute. At 1000 GB/s: the same G4 hits as --g4-offer always.
TEST(ReplayG4CliTest, OfferWhenFasterSkipsASlowG4AndKeepsAFastOne) {
  CliRun always = Kvtier(kSmall + "--g4 fs --g4-gbps 0.5");
  CliRun slow = Kvtier(kSmall + "--g4 fs --g4-gbps 0.5 --g4-offer when-faster");
  CliRun fast = Kvtier(kSmall + "--g4 fs --g4-gbps 1000 --g4-offer when-faster");
  for (const CliRun* r : {&always, &slow, &fast}) ASSERT_EQ(r->exit_code, 0) << r->out;
  EXPECT_EQ(JsonString(slow.out, "g4_offer"), "when-faster");
  EXPECT_EQ(JsonString(always.out, "g4_offer"), "always");
  EXPECT_GT(JsonNumber(always.out, "hit_blocks_g4"), 0.0);
  EXPECT_EQ(JsonNumber(slow.out, "hit_blocks_g4"), 0.0) << slow.out;
  EXPECT_GT(JsonNumber(slow.out, "g4_skipped_lookups"), 0.0);
  EXPECT_LE(JsonNumber(slow.out, "ttft_mean_ms"), JsonNumber(slow.out, "recompute_ttft_mean_ms"));
  EXPECT_LT(JsonNumber(slow.out, "ttft_mean_ms"), JsonNumber(always.out, "ttft_mean_ms"));
  EXPECT_EQ(JsonNumber(fast.out, "hit_blocks_g4"), JsonNumber(always.out, "hit_blocks_g4"));
  EXPECT_EQ(JsonNumber(fast.out, "g4_skipped_lookups"), 0.0);
  CliRun bad = KvtierAll(kSmall + "--g4 fs --g4-offer sometimes");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.out.find("always or when-faster"), std::string::npos) << bad.out;
  CliRun alone =
      KvtierAll("replay --trace " + kData + "replay_mooncake_small.jsonl --g4-offer when-faster");
  EXPECT_EQ(alone.exit_code, 2);
  EXPECT_NE(alone.out.find("--g4-offer needs --g4 SPEC"), std::string::npos) << alone.out;
}

TEST(ReplayG4CliTest, EmbeddedRedisWithAWarmSecondWorker) {
  KVTIER_REQUIRE_REDIS();
  CliRun r = Kvtier(kSmall + "--g4 embedded-redis --g4-warm --g3-fraction 0.2");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  ExpectG4Json(r.out);
  EXPECT_EQ(JsonString(r.out, "g4_backend"), "embedded-redis");
  const size_t warm = r.out.find("\"warm_pass\": {");
  ASSERT_NE(warm, std::string::npos) << r.out;
  ExpectG4Json(r.out, warm);
  EXPECT_GT(JsonNumber(r.out, "hit_ratio", warm), JsonNumber(r.out, "hit_ratio"));
  EXPECT_GT(JsonNumber(r.out, "hit_ratio_g4", warm), JsonNumber(r.out, "hit_ratio_g4"));
}

TEST(ReplayG4CliTest, TextOutputShowsG4) {
  CliRun r = Kvtier("replay --trace " + kData +
                    "replay_mooncake_small.jsonl --capacity-fraction 0.05 --g4 fs "
                    "--g4-write-through off --g4-warm");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("write-through off (fed by demotion)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(", G4 0."), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("g2_to_g4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("G4: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("warm pass (a fresh worker"), std::string::npos) << r.out;
}

// A server that is not there: the replay finishes (exit 0) on its local tiers, the G4 failures
// counted, in bounded time.
TEST(ReplayG4CliTest, UnreachableRedisIsCountedNotFatal) {
  const uint16_t port = PickFreePort(false);
  ASSERT_NE(port, 0);
  const auto start = std::chrono::steady_clock::now();
  CliRun r = Kvtier(kSmall + "--g4 redis:127.0.0.1:" + std::to_string(port));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_LT(seconds, 60.0);
  EXPECT_EQ(JsonNumber(r.out, "hit_ratio_g4"), 0.0);
  EXPECT_GT(JsonNumber(r.out, "g4_lookup_failures") + JsonNumber(r.out, "g4_save_failures"), 0.0);
  EXPECT_EQ(JsonNumber(r.out, "mismatched_blocks"), 0.0);
}

TEST(ReplayG4CliTest, EmbeddedRedisWithoutRedisServerSaysWhatToInstall) {
  CliRun r = RunShell("/usr/bin/env PATH=/nonexistent " + std::string(KVTIER_CLI_PATH) + " " +
                      kSmall + "--g4 embedded-redis 2>&1");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("redis-server"), std::string::npos) << r.out;
}

TEST(ReplayG4CliTest, AStoreThatCannotOpenFailsTheCommand) {
  CliRun r = KvtierAll(kSmall + "--g4 fs:/proc/kvtier-replay-no-such-dir");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("could not be opened"), std::string::npos) << r.out;
}

TEST(ReplayG4CliTest, UsageErrorsSayWhatToFix) {
  const std::string base = "replay --trace " + kData + "replay_mooncake_small.jsonl ";
  const std::pair<std::string, std::string> cases[] = {
      {"--g4 nfs", "use fs, fs:DIR, redis, redis:HOST:PORT or embedded-redis"},
      {"--g4 fs:", "needs a directory"},
      {"--g4 redis:localhost", "redis:HOST:PORT with a port in 1..65535"},
      {"--g4 redis:localhost:99999", "redis:HOST:PORT with a port in 1..65535"},
      {"--g4 redis::6379", "redis:HOST:PORT"},
      {"--g4 fs --g4-write-through maybe", "--g4-write-through 'maybe': use on or off"},
      {"--g4-warm", "--g4-warm needs --g4 SPEC"},
      {"--g4-write-through on", "--g4-write-through needs --g4 SPEC"},
      {"--g4 fs --g4-gbps 0", "--g4-gbps"},
      {"--g4-gbps 2", "--g4-gbps needs --g4 SPEC"},
      {"--g4 fs --g4-lookup-deadline-ms 0", "--g4-lookup-deadline-ms 1..60000"},
      {"--g4 fs --g4-load-deadline-ms x", "--g4-load-deadline-ms"},
  };
  for (const auto& [flags, want] : cases) {
    CliRun r = KvtierAll(base + flags);
    EXPECT_EQ(r.exit_code, 2) << flags << ": " << r.out;
    EXPECT_NE(r.out.find(want), std::string::npos) << flags << ": " << r.out;
  }
}

}  // namespace
}  // namespace kvtier::cli

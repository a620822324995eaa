// kvtier replay: the trace formats (and every parser error), the token mapping of Mooncake ids,
// the cost model's arithmetic, the replay core on real tiers (G2 arena, G3 files in a temp dir),
// and the CLI end to end on the small traces under tests/data/.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "policies/lab_policies.h"
#include "replay/replay_cost.h"
#include "replay/replay_runner.h"
#include "replay_test_util.h"
#include "sim/replay_trace.h"

namespace kvtier::cli {
namespace {

using namespace replay_testing;  // NOLINT: test helpers

Result<ReplayTrace> ParseTokens(const std::string& text, uint32_t tpb = 4) {
  std::istringstream in(text);
  return ReplayTrace::ParseTokens(in, tpb);
}

ReplayTrace Mooncake(const std::string& text) {
  std::istringstream in(text);
  auto t = ParseMooncakeTrace(in);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return ReplayTrace::FromMooncake(t.ok() ? *t : Trace{}, 512);
}

// ---- the kvtier token format ----

TEST(ReplayTraceTest, TokenFormatParsesAndNumbersSharedBlocks) {
  auto t = ParseTokens(
      "{\"request_id\": \"a\", \"tokens\": [1,2,3,4, 5,6,7,8, 9]}\n"
      "\n"
      "{\"tokens\": [1,2,3,4, 5,6,7,8, 10,11,12,13], \"timestamp\": 3.5, \"other\": {\"x\": [1]}}\n"
      "{\"tokens\": [5,6,7,8, 1,2,3,4]}\n");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_EQ(t->requests(), 3u);
  EXPECT_EQ(t->format(), ReplayTrace::Format::kTokens);
  EXPECT_EQ(t->RequestId(0), "a");
  EXPECT_EQ(t->RequestId(1), "r1");
  EXPECT_EQ(t->prompt_blocks(0), 2u);
  EXPECT_EQ(t->prompt_blocks(1), 3u);
  const Trace& b = t->blocks();
  // Requests 0 and 1 share their first two blocks; request 2 has the same token blocks in
  // another order, so other prefixes: other ids.
  EXPECT_EQ(b.ids[0], b.ids[2]);
  EXPECT_EQ(b.ids[1], b.ids[3]);
  EXPECT_NE(b.ids[4], b.ids[0]);
  EXPECT_NE(b.ids[5], b.ids[1]);
  EXPECT_NE(b.ids[6], b.ids[0]);
  EXPECT_EQ(b.distinct_blocks, 5u);
  std::vector<TokenId> p;
  t->Prompt(0, &p);
  EXPECT_EQ(p, (std::vector<TokenId>{1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(t->cost_tokens(1), 12u);
}

// Each bad record is refused with its line, its column and what is wrong.
TEST(ReplayTraceTest, TokenFormatErrorsNameTheLineAndTheProblem) {
  const std::map<std::string, std::string> cases = {
      {"[1, 2]", "expected '{'"},
      {"{\"request_id\": \"x\"}", "missing \"tokens\""},
      {"{\"tokens\": []}", "\"tokens\" is empty"},
      {"{\"tokens\": [1, -2]}", "tokens[1] must be a non-negative integer"},
      {"{\"tokens\": [1, 2.5]}", "tokens[1] must be a non-negative integer"},
      {"{\"tokens\": [4294967296]}", "tokens[0] is too large (at most 4294967295)"},
      {"{\"tokens\": [1], \"tokens\": [2]}", "duplicate key \"tokens\""},
      {"{\"tokens\": [1], \"request_id\": \"\"}", "\"request_id\" is empty"},
      {"{\"tokens\": [1], \"request_id\": 7}", "expected a string"},
      {"{\"tokens\": [1], \"timestamp\": -1}", "timestamp must be a finite non-negative number"},
      {"{\"tokens\": [1]} trailing", "unexpected text after the object"},
      {"{\"tokens\": [1, 2", "expected ']'"},
      {"{\"tokens\": \"abc\"}", "expected '['"},
  };
  for (const auto& [line, what] : cases) {
    auto t = ParseTokens("{\"tokens\": [1, 2, 3]}\n\n" + line + "\n");
    ASSERT_FALSE(t.ok()) << line;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << line;
    EXPECT_NE(t.status().message().find("trace line 3, column"), std::string::npos)
        << line << " -> " << t.status().message();
    EXPECT_NE(t.status().message().find(what), std::string::npos)
        << line << " -> " << t.status().message();
  }
}

TEST(ReplayTraceTest, LoadDetectsTheFormatAndReportsMissingFiles) {
  auto m = ReplayTrace::Load(kData + "replay_mooncake_small.jsonl", "auto", 512);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->format(), ReplayTrace::Format::kMooncake);
  auto k = ReplayTrace::Load(kData + "replay_tokens_small.jsonl", "auto", 16);
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  EXPECT_EQ(k->format(), ReplayTrace::Format::kTokens);
  EXPECT_EQ(k->requests(), 60u);
  EXPECT_EQ(k->RequestId(1), "req-1");
  // A token trace read as Mooncake has no hash_ids: the error says so.
  auto wrong = ReplayTrace::Load(kData + "replay_tokens_small.jsonl", "mooncake", 16);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("missing \"hash_ids\""), std::string::npos)
      << wrong.status().message();
  EXPECT_EQ(ReplayTrace::Load("/nonexistent/t.jsonl", "auto", 16).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(ReplayTrace::Load(kData + "replay_tokens_small.jsonl", "csv", 16).status().code(),
            StatusCode::kInvalidArgument);
}

// ---- Mooncake ids -> tokens ----

// Two requests sharing hash ids [a, b] share exactly those blocks' keys: the same tokens at the
// same positions, chained from the same root. A request that holds b behind another first block
// gets another key for it (prefix semantics), and ids map to distinct tokens.
TEST(ReplayTraceTest, MooncakeRequestsSharingIdsShareExactlyThoseKeys) {
  ReplayTrace t = Mooncake(
      "{\"hash_ids\": [11, 12, 13]}\n{\"hash_ids\": [11, 12, 14, 15]}\n{\"hash_ids\": [16, 12]}\n");
  auto hasher = BlockHasher::Create(KeyNamespace{"m", 1, "", ""}, 512);
  ASSERT_TRUE(hasher.ok());
  std::vector<std::vector<BlockKey>> keys;
  std::vector<TokenId> p;
  for (size_t r = 0; r < 3; ++r) {
    t.Prompt(r, &p);
    EXPECT_EQ(p.size(), t.prompt_blocks(r) * 512 + 1) << "blocks plus the tail token";
    keys.push_back(hasher->KeysFor(p));
    EXPECT_EQ(keys.back().size(), t.prompt_blocks(r));
  }
  EXPECT_EQ(keys[0][0], keys[1][0]);
  EXPECT_EQ(keys[0][1], keys[1][1]);
  EXPECT_NE(keys[0][2], keys[1][2]);
  EXPECT_NE(keys[2][1], keys[0][1]) << "id 12 behind id 16 is another prefix";
  EXPECT_NE(MooncakeToken(11, 0), MooncakeToken(12, 0));
  EXPECT_EQ(MooncakeToken(11, 5), MooncakeToken(11, 5));
  // The tail token differs per request, so equal id lists still end in a computed token.
  t.Prompt(0, &p);
  const TokenId tail0 = p.back();
  t.Prompt(1, &p);
  EXPECT_NE(tail0, p.back());
}

TEST(ReplayTraceTest, MooncakeCostTokensUseAConsistentInputLength) {
  ReplayTrace t = Mooncake(
      "{\"input_length\": 700, \"hash_ids\": [1, 2]}\n"   // consistent: 512 < 700 <= 1024
      "{\"input_length\": 5000, \"hash_ids\": [1, 2]}\n"  // inconsistent: blocks decide
      "{\"hash_ids\": [1, 2, 3]}\n");                     // absent
  EXPECT_EQ(t.cost_tokens(0), 700u);
  EXPECT_EQ(t.cost_tokens(1), 1025u);
  EXPECT_EQ(t.cost_tokens(2), 1537u);
}

// ---- the cost model ----

TEST(ReplayCostTest, ArithmeticAndValidation) {
  CostModel c;
  c.prefill_tokens_per_s = 10000;
  c.kv_bytes_per_token = 1000;
  c.load_bytes_per_s = {0, 1e9, 1e8, 1e7};
  // 3 blocks of 512 tokens from G2: 3 x 512 x 1000 B / 1e9 B/s; 2 from G3 at 1e8 B/s.
  const double want = 3 * 512 * 1000 / 1e9 + 2 * 512 * 1000 / 1e8;
  EXPECT_DOUBLE_EQ(c.LoadSeconds({0, 3, 2, 0}, 512), want);
  EXPECT_DOUBLE_EQ(c.LoadSeconds({7, 0, 0, 0}, 512), 0.0) << "G1 blocks cost no load";
  EXPECT_DOUBLE_EQ(c.ComputeSeconds(2500), 0.25);
  EXPECT_TRUE(c.Validate().ok());
  // The defaults: Llama-3-8B (128 KiB/token), 50 GB/s PCIe Gen5, 6 GB/s NVMe, 20k tokens/s.
  CostModel d;
  EXPECT_EQ(d.kv_bytes_per_token, 32u * 2 * 8 * 128 * 2);
  EXPECT_NEAR(d.LoadSeconds({0, 1, 0, 0}, 512), 512.0 * 131072 / 50e9, 1e-12);
  EXPECT_NEAR(d.ComputeSeconds(20000), 1.0, 1e-12);

  c.prefill_tokens_per_s = 0;
  EXPECT_NE(c.Validate().message().find("prefill"), std::string::npos);
  c.prefill_tokens_per_s = 1;
  c.load_bytes_per_s[kTierG3] = std::nan("");
  EXPECT_NE(c.Validate().message().find("G3"), std::string::npos) << c.Validate().message();
}

TEST(ReplayCostTest, PercentileIsNearestRank) {
  EXPECT_EQ(Percentile({}, 50), 0.0);
  EXPECT_EQ(Percentile({5}, 99), 5.0);
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);
  EXPECT_EQ(Percentile(v, 50), 50.0);
  EXPECT_EQ(Percentile(v, 90), 90.0);
  EXPECT_EQ(Percentile(v, 99), 99.0);
  EXPECT_EQ(Percentile(v, 100), 100.0);
  EXPECT_EQ(Percentile(v, 0), 1.0);
}

TEST(ReplayLayoutTest, PayloadBytesPickTheLayout) {
  auto l = ReplayLayout(4096, 512);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->BlockBytes(), 4096u);
  EXPECT_EQ(l->head_dim, 2u);
  auto bad = ReplayLayout(1000, 512);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("multiple of 2048"), std::string::npos)
      << bad.status().message();
  EXPECT_FALSE(ReplayLayout(0, 16).ok());
}

// ---- the replay core on real tiers ----

// lineage-lru is a lab policy (docs/policies.md): the replay, a lab command, runs it in the real
// manager (ReplayConfig enables the lab's policies in this process).
TEST(ReplayRunnerTest, G2ReplayLoadsExactBytesAndMatchesTheSimulator) {
  const ReplayTrace t = Load("replay_mooncake_small.jsonl", 512);
  ReplayOptions o;
  o.policy = "lineage-lru";
  o.g2_blocks = 100;
  auto r = RunReplay(t, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->requests, t.requests());
  EXPECT_GT(r->hits(), 0u);
  EXPECT_EQ(r->hits(), r->hit_blocks[kTierG2]);
  EXPECT_EQ(r->verified_blocks, r->hits());
  EXPECT_EQ(r->mismatched_blocks, 0u);
  EXPECT_EQ(r->stats.pinned_blocks, 0u);
  EXPECT_EQ(r->stats.dropped_saves, 0u);
  EXPECT_EQ(r->prefill_tokens_saved, r->hits() * 512) << "no request here hits its last block";
  // The simulator with the same slots agrees with lineage-lru (exactly on the Mooncake trace;
  // a request's saves complete on two copy threads, so the order of their inserts may differ:
  // a small tolerance). Without G3 the manager keeps no free-slot reserve.
  auto policy = MakeLabEvictionPolicy(PolicyKind::kLineageLru, r->g2_slots);
  ASSERT_TRUE(policy.ok());
  auto sim = SimulatePolicy(t.blocks(), **policy, r->g2_slots);
  ASSERT_TRUE(sim.ok());
  EXPECT_NEAR(static_cast<double>(sim->hit_blocks), static_cast<double>(r->hits()),
              0.01 * static_cast<double>(r->prompt_blocks));
  // TTFT with kvtier never exceeds recompute-only at these bandwidths.
  for (size_t i = 0; i < r->ttft_kvtier_s.size(); ++i)
    EXPECT_LE(r->ttft_kvtier_s[i], r->ttft_recompute_s[i] + 1e-12);
}

TEST(ReplayRunnerTest, G3ServesWhatG2Evicted) {
  const ReplayTrace t = Load("replay_mooncake_small.jsonl", 512);
  TempDir dir;
  ReplayOptions o;
  o.g2_blocks = 40;
  o.g3_blocks = 800;
  o.g3_dir = dir.path();
  auto r = RunReplay(t, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GT(r->hit_blocks[kTierG3], 0u);
  EXPECT_GT(r->stats.demoted_blocks, 0u);
  EXPECT_EQ(r->mismatched_blocks, 0u);
  EXPECT_EQ(r->stats.load_failures, 0u);
  EXPECT_EQ(r->stats.pinned_blocks, 0u);
}

// Damage G3's slot files halfway: the manager refuses the corrupt blocks (load failures, not
// mismatches), the replay recomputes them and carries on.
TEST(ReplayRunnerTest, CorruptG3BlocksAreRecomputedNeverServed) {
  const ReplayTrace t = Load("replay_mooncake_small.jsonl", 512);
  TempDir dir;
  ReplayOptions o;
  o.g2_blocks = 40;
  o.g3_blocks = 800;
  o.g3_dir = dir.path();
  int corrupted = 0;
  o.after_request = [&](size_t r) {
    if (r != t.requests() / 2) return;
    for (const auto& f : std::filesystem::directory_iterator(dir.path())) {
      if (f.path().extension() != ".kvt") continue;
      const int fd = open(f.path().c_str(), O_WRONLY);
      ASSERT_GE(fd, 0);
      for (uint64_t k = 0; k < 800; ++k) {
        const uint8_t junk[8] = {0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4};
        if (pwrite(fd, junk, sizeof(junk), 8192 + k * 8192 + 4096 + 100) == sizeof(junk))
          ++corrupted;
      }
      close(fd);
    }
  };
  auto r = RunReplay(t, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_GT(corrupted, 0);
  EXPECT_GT(r->stats.corrupt_blocks, 0u);
  EXPECT_GT(r->stats.load_failures, 0u);
  EXPECT_EQ(r->mismatched_blocks, 0u) << "no corrupt byte reached G1";
  EXPECT_EQ(r->stats.pinned_blocks, 0u);
}

// The byte check can fail: when the engine's KV changes under the same keys, loads of blocks
// saved before the change are counted as mismatches.
TEST(ReplayRunnerTest, ChangedContentIsCountedAsMismatch) {
  const ReplayTrace t = Load("replay_tokens_small.jsonl", 16);
  ReplayOptions o;
  o.payload_bytes = 16 * 4 * 4;
  o.g2_blocks = 1000;
  o.reseed_at_request = 30;
  auto r = RunReplay(t, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GT(r->hits(), 0u);
  EXPECT_GT(r->mismatched_blocks, 0u);
  EXPECT_LT(r->mismatched_blocks, r->verified_blocks) << "blocks saved after the change match";
}

// Small payloads: the arena aligns slots to 4 KiB, and the replay sizes G2 so that it still
// gets the slots it asked for (a one-slot G2 with 64-byte blocks once failed to start).
TEST(ReplayRunnerTest, SmallPayloadsGetTheSlotsAskedFor) {
  std::istringstream in("{\"tokens\": [5]}\n{\"tokens\": [1,2,3,4]}\n{\"tokens\": [1,2,3,4,5]}\n");
  auto t = ReplayTrace::ParseTokens(in, 4);
  ASSERT_TRUE(t.ok());
  ReplayOptions o;
  o.payload_bytes = 16;
  for (uint64_t slots : {1, 3}) {
    o.g2_blocks = slots;
    auto r = RunReplay(*t, o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->g2_slots, slots);
    EXPECT_EQ(r->hits(), 1u) << "the third prompt loads the second's block";
    EXPECT_EQ(r->mismatched_blocks, 0u);
  }
}

TEST(ReplayRunnerTest, BadOptionsAreRefused) {
  const ReplayTrace t = Load("replay_tokens_small.jsonl", 16);
  ReplayOptions o;
  o.payload_bytes = 100;
  EXPECT_NE(RunReplay(t, o).status().message().find("--payload-bytes"), std::string::npos);
  o.payload_bytes = 256;
  o.g3_blocks = 10;
  EXPECT_NE(RunReplay(t, o).status().message().find("directory"), std::string::npos);
  o.g3_blocks = 0;
  o.policy = "fifo";
  EXPECT_FALSE(RunReplay(t, o).ok());
  o.policy = "lru";
  o.cost.prefill_tokens_per_s = -1;
  EXPECT_NE(RunReplay(t, o).status().message().find("prefill"), std::string::npos);
}

// ---- the CLI ----

TEST(ReplayCliTest, JsonHasTheKeysAndSaneFigures) {
  for (const std::string policy : {"lru", "credit-lru"}) {
    CliRun r = Kvtier("replay --trace " + kData +
                      "replay_mooncake_small.jsonl --capacity-fraction 0.1 --compare-belady "
                      "--json --policy " +
                      policy);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    for (const char* key :
         {"hit_ratio", "belady_hit_ratio", "unbounded_hit_ratio", "prefill_tokens_saved",
          "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "recompute_ttft_p50_ms",
          "recompute_ttft_p99_ms", "hit_ratio_g2", "hit_ratio_g3", "sim_hit_ratio", "wall_seconds",
          "dropped_saves", "mismatched_blocks", "verified_blocks"}) {
      EXPECT_NE(r.out.find(std::string("\"") + key + "\""), std::string::npos) << key;
    }
    const double hit = JsonNumber(r.out, "hit_ratio");
    const double belady = JsonNumber(r.out, "belady_hit_ratio");
    const double unbounded = JsonNumber(r.out, "unbounded_hit_ratio");
    EXPECT_GT(hit, 0.0);
    EXPECT_LE(hit, belady + 1e-9) << policy;
    EXPECT_LE(belady, unbounded + 1e-9);
    EXPECT_LE(unbounded, 1.0);
    EXPECT_EQ(JsonNumber(r.out, "mismatched_blocks"), 0.0);
    EXPECT_GT(JsonNumber(r.out, "verified_blocks"), 0.0);
    EXPECT_GT(JsonNumber(r.out, "prefill_tokens_saved"), 0.0);
    EXPECT_LE(JsonNumber(r.out, "ttft_p50_ms"), JsonNumber(r.out, "recompute_ttft_p50_ms"));
    EXPECT_LE(JsonNumber(r.out, "ttft_p50_ms"), JsonNumber(r.out, "ttft_p99_ms"));
    EXPECT_NEAR(hit, JsonNumber(r.out, "sim_hit_ratio"), 0.05);
  }
}

// kvtier replay is a lab command: it runs the lab's policies (docs/policies.md) in the real
// manager, G2 and G3, which a deployment's config refuses.
TEST(ReplayCliTest, RunsTheLabsPoliciesInTheRealManager) {
  for (const std::string policy : {"s3fifo", "leaf-first-lru"}) {
    CliRun r = Kvtier("replay --trace " + kData +
                      "replay_mooncake_small.jsonl --capacity-fraction 0.1 --g3-fraction 0.5 "
                      "--json --policy " +
                      policy);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("\"policy\": \"" + policy + "\""), std::string::npos) << r.out;
    EXPECT_GT(JsonNumber(r.out, "hit_ratio"), 0.0) << r.out;
    EXPECT_EQ(JsonNumber(r.out, "mismatched_blocks"), 0.0);
    EXPECT_GT(JsonNumber(r.out, "verified_blocks"), 0.0);
  }
}

TEST(ReplayCliTest, TokenTraceWithG3) {
  CliRun r = Kvtier("replay --trace " + kData +
                    "replay_tokens_small.jsonl --tokens-per-block 16 --payload-bytes 256 "
                    "--capacity-fraction 0.05 --g3-fraction 1 --compare-belady --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("\"format\": \"kvtier\""), std::string::npos) << r.out;
  EXPECT_GT(JsonNumber(r.out, "hit_ratio_g3"), 0.0) << r.out;
  EXPECT_EQ(JsonNumber(r.out, "mismatched_blocks"), 0.0);
}

// Block sizes that are not powers of two replay through the real manager and tiers too: every
// loaded block byte-exact, hits from G2 and G3.
TEST(ReplayCliTest, NonPowerOfTwoBlockSizes) {
  CliRun r = Kvtier("replay --trace " + kData +
                    "replay_tokens_small.jsonl --tokens-per-block 24 --payload-bytes 192 "
                    "--capacity-fraction 0.05 --g3-fraction 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_GT(JsonNumber(r.out, "hit_ratio"), 0.0) << r.out;
  EXPECT_GT(JsonNumber(r.out, "hit_ratio_g3"), 0.0) << r.out;
  EXPECT_EQ(JsonNumber(r.out, "mismatched_blocks"), 0.0);
  r = Kvtier("replay --trace " + kData +
             "replay_mooncake_small.jsonl --tokens-per-block 528 --payload-bytes 2112 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_GT(JsonNumber(r.out, "hit_ratio"), 0.0) << r.out;
  EXPECT_EQ(JsonNumber(r.out, "mismatched_blocks"), 0.0);
}

TEST(ReplayCliTest, UsageErrorsSayWhatToFix) {
  CliRun r = KvtierAll("replay");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("--trace FILE is required"), std::string::npos) << r.out;
  r = KvtierAll("replay --trace " + kData + "replay_mooncake_small.jsonl --policy belady");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("--compare-belady"), std::string::npos) << r.out;
  r = KvtierAll("replay --trace " + kData + "replay_mooncake_small.jsonl --payload-bytes 1000");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("multiple of 2048"), std::string::npos) << r.out;
  r = KvtierAll("replay --trace " + kData + "replay_mooncake_small.jsonl --capacity-fraction -1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("--capacity-fraction"), std::string::npos) << r.out;
  r = KvtierAll("replay --trace " + kData + "replay_mooncake_small.jsonl --tokens-per-block 4097");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("--tokens-per-block 4097: must be in 1..4096"), std::string::npos) << r.out;
  r = KvtierAll("replay --trace /nonexistent.jsonl");
  EXPECT_EQ(r.exit_code, 2) << "a missing trace is a usage error";
  EXPECT_NE(r.out.find("does not exist"), std::string::npos) << r.out;
  // A malformed trace: the line and what is wrong.
  char path[] = "/tmp/kvtier-replay-bad-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  const std::string bad = "{\"tokens\": [1, 2]}\n{\"tokens\": [1, x]}\n";
  ASSERT_EQ(write(fd, bad.data(), bad.size()), static_cast<ssize_t>(bad.size()));
  close(fd);
  r = KvtierAll(std::string("replay --trace ") + path + " --tokens-per-block 1 --payload-bytes 4");
  std::filesystem::remove(path);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("trace line 2, column 16: tokens[1] must be a non-negative integer"),
            std::string::npos)
      << r.out;
}

// --credit-lru reaches the real manager's G2 policy through g2.credit_lru.*. The trace is the
// one of policy_sim_test's CreditLruFlagsReachThePolicyAndAreEchoed (8 G2 slots): by default
// the turn's last block is evicted and the next turn hits 6 of its blocks (7 hits of 18); with
// stale_tail = 0 it hits all 7 (8 of 18), replayed as simulated.
TEST(ReplayCliTest, CreditLruFlagsReachTheManagerAndAreEchoed) {
  TempDir dir;
  const std::string trace = dir.path() + "/tail.jsonl";
  {
    std::ofstream out(trace);
    for (const char* ids : {"100", "100", "1, 2, 3, 4, 5, 6, 7", "200", "1, 2, 3, 4, 5, 6, 7, 8"}) {
      out << "{\"hash_ids\": [" << ids << "]}\n";
    }
  }
  const std::string base =
      "replay --trace " + trace + " --capacity-fraction 0.8 --policy credit-lru --json";
  CliRun r = Kvtier(base);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(JsonNumber(r.out, "g2_slots"), 8.0) << r.out;
  EXPECT_NEAR(JsonNumber(r.out, "hit_ratio"), 7.0 / 18, 1e-6) << r.out;
  EXPECT_NE(r.out.find("\"credit_lru\": {\"used_twice\": 0.75, \"used_thrice\": 1.5, "
                       "\"long_follow_up\": -0.5, \"stale_tail\": -1, \"ghost_factor\": 4}"),
            std::string::npos)
      << r.out;
  r = Kvtier(base + " --credit-lru stale_tail=0");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NEAR(JsonNumber(r.out, "hit_ratio"), 8.0 / 18, 1e-6) << r.out;
  EXPECT_NEAR(JsonNumber(r.out, "sim_hit_ratio"), 8.0 / 18, 1e-6) << "the simulation too";
  EXPECT_NE(r.out.find("\"stale_tail\": 0,"), std::string::npos) << r.out;
  // With G3, both tiers take the settings (the manager accepts g3.credit_lru.* as well).
  r = KvtierAll(base + " --g3-fraction 1 --credit-lru stale_tail=0 --credit-lru used_twice=1");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("\"used_twice\": 1,"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("WARN"), std::string::npos) << r.out;
  EXPECT_EQ(JsonNumber(r.out, "mismatched_blocks"), 0.0);
  // The sweep echoes them too.
  r = Kvtier("replay --trace " + trace + " --sweep --sweep-fractions 0.8 --json --sweep-out " +
             dir.path() + "/sweep.png --credit-lru stale_tail=0");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("\"stale_tail\": 0,"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"credit-lru\": 0.444444"), std::string::npos) << r.out;
  // Another policy: they do nothing, and both the command and the manager say so.
  r = KvtierAll(base + " --policy lru --credit-lru stale_tail=0");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("warning: --credit-lru has no effect with --policy lru"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("g2.credit_lru.stale_tail = 0 (from set) has no effect"), std::string::npos)
      << r.out;
  // Bad ones are usage errors naming them, before any work.
  for (const char* bad : {"stale_tail=inf", "stale=0", "ghost_factor=100", "used_twice"}) {
    r = KvtierAll(base + " --credit-lru " + bad);
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.out;
    EXPECT_NE(r.out.find(std::string("--credit-lru '") + bad + "'"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("hit_ratio"), std::string::npos) << bad << ": nothing ran";
  }
}

// ReplayOptions::settings go through the config's checks: a bad one fails the replay, naming it.
TEST(ReplayTest, BadSettingsFailTheReplayNamingThem) {
  const ReplayTrace t = Load("replay_tokens_small.jsonl", 16);
  ReplayOptions o;
  o.payload_bytes = 256;
  o.g2_blocks = 8;
  o.settings = {{"g2.credit_lru.stale_tail", "0"}, {"g3.credit_lru.ghost_factor", "nan"}};
  auto r = RunReplay(t, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("g3.credit_lru.ghost_factor = 'nan'"), std::string::npos)
      << r.status().message();
  o.settings = {{"g2.credit_lru.stale_tail", "0"}};
  EXPECT_TRUE(RunReplay(t, o).ok());
}

TEST(ReplayCliTest, SweepWritesAPlot) {
  TempDir dir;
  const std::string png = dir.path() + "/sweep.png";
  CliRun r = Kvtier("replay --trace " + kData +
                    "replay_mooncake_small.jsonl --sweep --sweep-fractions 0.05,0.2 --json "
                    "--sweep-out " +
                    png);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("\"sweep\": [{"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"belady\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("simulated"), std::string::npos) << r.out;
  if (std::system("command -v gnuplot >/dev/null 2>&1") == 0) {
    EXPECT_GT(std::filesystem::file_size(png), 1000u);
  } else {
    GTEST_SKIP() << "gnuplot not installed: plot not checked";
  }
}

}  // namespace
}  // namespace kvtier::cli

// The trace simulator behind `kvtier sim`: its semantics on hand-computed traces, the trace
// parser's errors, and the command itself.
#include "sim/policy_sim.h"

#include <sys/wait.h>
#include <unistd.h>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "cli_run.h"

#include "index/eviction_policy.h"
#include "policies/lab_policies.h"
#include "sim/belady_policy.h"

namespace kvtier {
namespace {

Trace MustParse(const std::string& text) {
  std::istringstream in(text);
  auto trace = ParseMooncakeTrace(in);
  EXPECT_TRUE(trace.ok()) << trace.status().ToString();
  return trace.ok() ? *trace : Trace{};
}

// The error message of parsing `text`; empty when it parses.
std::string ParseError(const std::string& text) {
  std::istringstream in(text);
  auto trace = ParseMooncakeTrace(in);
  if (trace.ok()) return "";
  EXPECT_EQ(trace.status().code(), StatusCode::kInvalidArgument);
  return trace.status().message();
}

std::string Line(const std::string& ids) {
  return "{\"timestamp\": 0, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": [" + ids +
         "]}\n";
}

SimResult Simulate(const Trace& trace, PolicyKind kind, uint64_t capacity) {
  std::unique_ptr<EvictionPolicy> policy;
  if (kind == PolicyKind::kBelady) {
    policy = MakeBeladyPolicy(TraceReferences(trace));
  } else {
    policy = std::move(MakeLabEvictionPolicy(kind, capacity)).value();  // the lab's too
  }
  auto result = SimulatePolicy(trace, *policy, capacity);
  EXPECT_TRUE(result.ok()) << result.status().ToString();
  return result.ok() ? *result : SimResult{};
}

// Five requests over blocks 1..5 (prefix-chained: 1 is always first, 2 always follows 1).
//   r0 [1 2 3]  r1 [1 2 4]  r2 [1 5]  r3 [1 2 4]  r4 [1 2 4]
const char* const kSmallTrace = "[1, 2, 3]|[1, 2, 4]|[1, 5]|[1, 2, 4]|[1, 2, 4]";

Trace SmallTrace() {
  std::string text;
  std::string rest = kSmallTrace;
  size_t bar;
  while ((bar = rest.find('|')) != std::string::npos) {
    text += "{\"hash_ids\": " + rest.substr(0, bar) + "}\n";
    rest = rest.substr(bar + 1);
  }
  text += "{\"hash_ids\": " + rest + "}\n";
  return MustParse(text);
}

TEST(PolicySimTest, ParsesTheTraceShape) {
  Trace t = SmallTrace();
  EXPECT_EQ(t.requests(), 5u);
  EXPECT_EQ(t.ids.size(), 14u);
  EXPECT_EQ(t.distinct_blocks, 5u);
  EXPECT_EQ(t.lineage_conflicts, 0u);
  EXPECT_EQ(t.begin(2), 6u);
  EXPECT_EQ(t.end(2), 8u);
}

// LRU with 3 slots, by hand (order = least recently used first):
//   r0: misses 1 2 3, stored                  -> {1 2 3}       order 1 2 3     hits 0
//   r1: hits 1 2; 4 evicts 3                  -> {1 2 4}       order 1 2 4     hits 2
//   r2: hit 1; 5 evicts 2                     -> {1 4 5}       order 4 1 5     hits 1
//   r3: hit 1; 2 evicts 4; 4 evicts 5         -> {1 2 4}       order 1 2 4     hits 1
//   r4: hits 1 2 4                                                            hits 3
TEST(PolicySimTest, LruHitsMatchAHandReplay) {
  SimResult r = Simulate(SmallTrace(), PolicyKind::kLru, 3);
  EXPECT_EQ(r.blocks, 14u);
  EXPECT_EQ(r.hit_blocks, 7u);
  EXPECT_EQ(r.inserts, 7u);
  EXPECT_EQ(r.evictions, 4u);
  EXPECT_EQ(r.late_accesses, 0u);
  EXPECT_DOUBLE_EQ(r.hit_ratio(), 7.0 / 14.0);
}

// Belady with 3 slots: r1 evicts 3 (never used again); r2 evicts 4 (used later than 1 and 2);
// r3 hits 1 2 and 4 evicts 5 (never used again); r4 hits all three: 0 + 2 + 1 + 2 + 3 = 8.
TEST(PolicySimTest, BeladyHitsMatchAHandReplay) {
  SimResult r = Simulate(SmallTrace(), PolicyKind::kBelady, 3);
  EXPECT_EQ(r.hit_blocks, 8u);
  EXPECT_EQ(r.evictions, 3u);
}

// Unbounded: r1 hits 2, r2 hits 1, r3 and r4 hit 3 each.
TEST(PolicySimTest, UnboundedHitsEveryRepeatedPrefix) {
  SimResult r = SimulateUnbounded(SmallTrace());
  EXPECT_EQ(r.hit_blocks, 9u);
  EXPECT_EQ(r.inserts, 5u);
  EXPECT_EQ(r.evictions, 0u);
}

// A block cached behind a miss is used but is not a hit: r1 misses 1, then finds 2 cached.
TEST(PolicySimTest, ACachedBlockAfterAMissIsNotAHit) {
  Trace t = MustParse(Line("2") + Line("1, 2"));
  EXPECT_EQ(t.lineage_conflicts, 1u);  // 2 hangs off the root, then off 1
  SimResult r = Simulate(t, PolicyKind::kLru, 2);
  EXPECT_EQ(r.hit_blocks, 0u);
  EXPECT_EQ(r.late_accesses, 1u);
  EXPECT_EQ(r.inserts, 2u);
  SimResult u = SimulateUnbounded(t);
  EXPECT_EQ(u.hit_blocks, 0u);
  EXPECT_EQ(u.late_accesses, 1u);
}

// Records every event, in order, and ranks like LRU.
class RecordingPolicy final : public EvictionPolicy {
 public:
  PolicyKind kind() const override { return PolicyKind::kLru; }
  void OnInsert(const BlockKey& key, const BlockKey& parent) override {
    events.push_back("insert " + Name(key) + " under " + Name(parent));
    lru_->OnInsert(key, parent);
  }
  void OnAccess(const BlockKey& key) override {
    events.push_back("access " + Name(key));
    lru_->OnAccess(key);
  }
  void OnRemove(const BlockKey& key) override {
    events.push_back("remove " + Name(key));
    lru_->OnRemove(key);
  }
  std::optional<BlockKey> Victim(const EvictablePredicate& evictable) override {
    return lru_->Victim(evictable);
  }
  size_t size() const override { return lru_->size(); }
  bool Contains(const BlockKey& key) const override { return lru_->Contains(key); }

  std::vector<std::string> events;

 private:
  static std::string Name(const BlockKey& key) {
    if (key == TraceRootKey()) return "root";
    return std::to_string(key.hi - 1);  // TraceBlockKey(id).hi == id + 1
  }
  std::unique_ptr<EvictionPolicy> lru_ = std::move(MakeEvictionPolicy(PolicyKind::kLru, 0)).value();
};

// One event per reference, in trace order; a block's parent is the previous block of its
// request; the victim is removed before the insert that needed the room.
TEST(PolicySimTest, EventsFollowTheTraceWithPrefixParents) {
  Trace t = MustParse(Line("1, 2") + Line("1, 3") + Line("2"));
  RecordingPolicy policy;
  auto r = SimulatePolicy(t, policy, 2);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(policy.events, (std::vector<std::string>{
                               "insert 1 under root", "insert 2 under 1",   // r0
                               "access 1", "remove 2", "insert 3 under 1",  // r1
                               "remove 1", "insert 2 under root",           // r2
                           }));
  EXPECT_EQ(r->hit_blocks, 1u);
}

TEST(PolicySimTest, BeladySeesEachReferenceOnce) {
  Trace t = SmallTrace();
  const std::vector<BlockKey> refs = TraceReferences(t);
  BeladyPolicy belady(refs);
  ASSERT_TRUE(SimulatePolicy(t, belady, 3).ok());
  EXPECT_EQ(belady.cursor(), refs.size());
}

TEST(PolicySimTest, CapacityIsTheCeilingOfTheFraction) {
  Trace t = SmallTrace();  // 5 distinct blocks
  EXPECT_EQ(CapacityForFraction(t, 0.5), 3u);
  EXPECT_EQ(CapacityForFraction(t, 0.2), 1u);
  EXPECT_EQ(CapacityForFraction(t, 0.01), 1u);
  EXPECT_EQ(CapacityForFraction(t, 2.0), 10u);
}

TEST(PolicySimTest, RefusesBadArguments) {
  Trace t = SmallTrace();
  auto policy = std::move(MakeEvictionPolicy(PolicyKind::kLru, 3)).value();
  EXPECT_EQ(SimulatePolicy(t, *policy, 0).status().code(), StatusCode::kInvalidArgument);
  policy->OnInsert(TraceBlockKey(9), TraceRootKey());
  EXPECT_EQ(SimulatePolicy(t, *policy, 3).status().code(), StatusCode::kInvalidArgument);
}

// A policy that never names a victim: the simulator reports it instead of looping or crashing.
class NoVictimPolicy final : public EvictionPolicy {
 public:
  PolicyKind kind() const override { return PolicyKind::kLru; }
  void OnInsert(const BlockKey& key, const BlockKey&) override { ++size_; }
  void OnAccess(const BlockKey&) override {}
  void OnRemove(const BlockKey&) override { --size_; }
  std::optional<BlockKey> Victim(const EvictablePredicate&) override { return std::nullopt; }
  size_t size() const override { return size_; }
  bool Contains(const BlockKey&) const override { return false; }

 private:
  size_t size_ = 0;
};

TEST(PolicySimTest, ABrokenPolicyIsAnInternalError) {
  NoVictimPolicy policy;
  auto r = SimulatePolicy(SmallTrace(), policy, 2);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

TEST(PolicySimTest, KeysAreDistinctAndNeverTheRoot) {
  EXPECT_NE(TraceBlockKey(0), TraceBlockKey(1));
  EXPECT_NE(TraceBlockKey(0), TraceRootKey());
  EXPECT_NE(TraceBlockKey(18446744073709551614ull), TraceRootKey());
  EXPECT_EQ(TraceBlockKey(42), TraceBlockKey(42));
}

// On random prefix-chained traces: no online policy has more blocks cached when referenced (hits
// plus blocks found behind a miss) than Belady, which is what Belady optimizes; nobody beats
// the unbounded cache's prefix hits; a tier as large as the trace equals the unbounded cache.
// (Belady's *prefix* hits are not an upper bound: it may evict a request's first block to make
// room for the rest of that request, which a later request then finds behind a miss. At
// capacity 2 S3-FIFO beats it by a block now and then; on the Mooncake trace Belady reaches the
// unbounded cache from 5% on, so there the bound is exact.)
TEST(PolicySimTest, BeladyBoundsEveryPolicyOnRandomTraces) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 20; ++round) {
    // Conversations: each request extends a prefix of an earlier one (or starts one under the
    // shared system prompt, block 0) by a few new blocks.
    std::vector<std::vector<uint64_t>> requests;
    uint64_t next_id = 1;
    for (int r = 0; r < 60; ++r) {
      std::vector<uint64_t> ids;
      if (!requests.empty() && rng() % 3 != 0) {
        const auto& base = requests[rng() % requests.size()];
        ids.assign(base.begin(), base.begin() + 1 + rng() % base.size());
      } else {
        ids.push_back(0);
      }
      for (uint64_t extra = 1 + rng() % 4; extra > 0; --extra) ids.push_back(next_id++);
      requests.push_back(ids);
    }
    std::string text;
    for (const auto& ids : requests) {
      std::string list;
      for (uint64_t id : ids) list += (list.empty() ? "" : ", ") + std::to_string(id);
      text += Line(list);
    }
    Trace t = MustParse(text);
    ASSERT_EQ(t.lineage_conflicts, 0u);
    const uint64_t unbounded = SimulateUnbounded(t).hit_blocks;
    for (uint64_t capacity : {2ull, 5ull, 20ull}) {
      const SimResult belady = Simulate(t, PolicyKind::kBelady, capacity);
      EXPECT_LE(belady.hit_blocks, unbounded);
      for (PolicyKind kind : {PolicyKind::kLru, PolicyKind::kLineageLru, PolicyKind::kS3Fifo,
                              PolicyKind::kCreditLru, PolicyKind::kHitDensity}) {
        const SimResult r = Simulate(t, kind, capacity);
        EXPECT_LE(r.hit_blocks + r.late_accesses, belady.hit_blocks + belady.late_accesses)
            << PolicyKindName(kind) << " capacity " << capacity << " round " << round;
        EXPECT_LE(r.hit_blocks, unbounded);
        EXPECT_EQ(r.hit_blocks + r.late_accesses + r.inserts, r.blocks);
      }
    }
    for (PolicyKind kind :
         {PolicyKind::kLru, PolicyKind::kCreditLru, PolicyKind::kBelady, PolicyKind::kHitDensity}) {
      EXPECT_EQ(Simulate(t, kind, t.distinct_blocks).hit_blocks, unbounded);
    }
  }
}

TEST(PolicySimTest, ParserAcceptsWhatTheTraceMayHold) {
  Trace t = MustParse(
      "\n"
      "  {\"hash_ids\": [], \"note\": {\"a\": [1, {\"b\": null}], \"c\": \"x\\\"y\"}}\n"
      "{\"timestamp\": 1.5e3, \"hash_ids\": [18446744073709551614], \"flag\": true}\r\n"
      "   \n");
  EXPECT_EQ(t.requests(), 2u);
  EXPECT_EQ(t.ids.size(), 1u);
  EXPECT_EQ(t.ids[0], 18446744073709551614ull);
}

TEST(PolicySimTest, ParserErrorsNameTheLine) {
  struct Case {
    std::string text;
    std::string want;  // a part of the message
  };
  const std::string ok = Line("1, 2");
  const Case cases[] = {
      {ok + "not json\n", "trace line 2"},
      {ok + "\n" + "{\"timestamp\": 3}\n", "trace line 3"},
      {"{\"timestamp\": 3}\n", "missing \"hash_ids\""},
      {"{\"hash_ids\": [1, -2]}\n", "hash_ids[1] must be a non-negative integer"},
      {"{\"hash_ids\": [1.5]}\n", "hash_ids[0] must be a non-negative integer"},
      {"{\"hash_ids\": [1e3]}\n", "must be a non-negative integer"},
      {"{\"hash_ids\": [\"7\"]}\n", "must be a non-negative integer"},
      {"{\"hash_ids\": [18446744073709551615]}\n", "hash_ids[0] is too large"},
      {"{\"hash_ids\": [99999999999999999999999]}\n", "too large"},
      {"{\"hash_ids\": [1, 2\n", "expected ']'"},
      {"{\"hash_ids\": [1, 2]\n", "expected '}'"},
      {"{\"hash_ids\": [1,]}\n", "must be a non-negative integer"},
      {"{\"hash_ids\": [1]} x\n", "unexpected text after the object"},
      {"{\"hash_ids\": [1], \"hash_ids\": [2]}\n", "duplicate key"},
      {"{\"hash_ids\": 5}\n", "expected '['"},
      {"{\"timestamp\": -1, \"hash_ids\": [1]}\n", "timestamp must be a finite non-negative"},
      {"{\"input_length\": \"big\", \"hash_ids\": [1]}\n", "input_length must be a finite"},
      {"{\"output_length\": 1e999, \"hash_ids\": [1]}\n", "output_length must be a finite"},
      {"{\"x\": tru, \"hash_ids\": [1]}\n", "expected a value"},
      {"{\"x\": \"open, \"hash_ids\": [1]}\n", "expected '}', found 'h'"},
      {"{\"x\": \"never closed}\n", "unterminated string"},
      {"{hash_ids: [1]}\n", "expected a string"},
      {"[1, 2]\n", "expected '{'"},
      {std::string("{\"x\": ") + std::string(200, '[') + std::string(200, ']') +
           ", \"hash_ids\": [1]}\n",
       "nested too deeply"},
  };
  for (const Case& c : cases) {
    const std::string message = ParseError(c.text);
    EXPECT_NE(message.find(c.want), std::string::npos)
        << "input: " << c.text << "message: " << message;
    EXPECT_EQ(message.rfind("trace line ", 0), 0u) << message;
  }
}

TEST(PolicySimTest, LoadReportsAMissingFile) {
  auto t = LoadMooncakeTrace("/nonexistent/trace.jsonl");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
}

// --- the `kvtier sim` command ---------------------------------------------------------------

using cli_run::CliRun;

CliRun Kvtier(const std::string& args) {
  const std::string cmd = std::string(KVTIER_CLI_PATH) + " " + args + " 2>&1";
  return cli_run::RunShell(cmd);
}

class SimCommandTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("kvtier_sim_test_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    const std::filesystem::path path = dir_ / name;
    std::ofstream(path) << text;
    return path.string();
  }
  std::filesystem::path dir_;
};

TEST_F(SimCommandTest, JsonHasTheKeysAndTheHandComputedRatios) {
  std::string text;
  for (const char* ids : {"1, 2, 3", "1, 2, 4", "1, 5", "1, 2, 4", "1, 2, 4"}) text += Line(ids);
  const std::string trace = Write("small.jsonl", text);
  // 5 distinct blocks x 0.6 = 3 slots: LRU keeps 7 of 14 blocks, Belady 8, unbounded 9.
  CliRun r = Kvtier("sim --trace " + trace + " --capacity-fraction 0.6 --policy lru --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (const char* key :
       {"\"hit_ratio\": 0.5,", "\"belady_hit_ratio\": 0.571429",
        "\"unbounded_hit_ratio\": 0.642857", "\"ratio_to_belady\": 0.875", "\"capacity_blocks\": 3",
        "\"policy\": \"lru\"", "\"policies\": {\"lru\": {\"hit_ratio\": 0.5"}) {
    EXPECT_NE(r.out.find(key), std::string::npos) << key << " missing in " << r.out;
  }
  r = Kvtier("sim --trace " + trace + " --capacity-fraction 0.6 --policy all --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (const char* name :
       {"\"credit-lru\": {", "\"lru\": {", "\"lineage-lru\": {", "\"s3fifo\": {"}) {
    EXPECT_NE(r.out.find(name), std::string::npos) << name << " missing in " << r.out;
  }
  r = Kvtier("sim --trace " + trace + " --policy all");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("belady"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("unbounded"), std::string::npos) << r.out;
}

TEST_F(SimCommandTest, BadInputIsAUsageErrorThatSaysWhere) {
  const std::string bad = Write("bad.jsonl", Line("1") + Line("2") + "{\"hash_ids\": [3,, 4]}\n");
  CliRun r = Kvtier("sim --trace " + bad);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("trace line 3"), std::string::npos) << r.out;

  const std::string good = Write("good.jsonl", Line("1"));
  for (const char* args : {"--capacity-fraction 0", "--capacity-fraction -1",
                           "--capacity-fraction nan", "--capacity-fraction lots", "--policy fifo",
                           "--policy belady", "--capacity-fractoin 0.1"}) {
    r = Kvtier("sim --trace " + good + " " + args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.out;
  }
  r = Kvtier("sim");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("--trace"), std::string::npos) << r.out;
  r = Kvtier("sim --trace " + (dir_ / "missing.jsonl").string());
  EXPECT_EQ(r.exit_code, 2) << "a missing trace is a usage error: " << r.out;
  EXPECT_NE(r.out.find("does not exist"), std::string::npos) << r.out;
}

// --credit-lru KEY=VALUE reaches the policy. The trace (10 distinct blocks, 8 slots): x (id 100)
// is stored and hit; a turn stores 1..7 (7 is its last block, a stale tail); an unrelated block
// needs a slot; the next turn repeats 1..7 and adds 8. By default the stale tail 7 goes and the
// next turn hits 6 blocks (7 hits of 18 blocks); with stale_tail = 0, x goes and it hits all 7
// (8 of 18).
TEST_F(SimCommandTest, CreditLruFlagsReachThePolicyAndAreEchoed) {
  std::string text;
  for (const char* ids : {"100", "100", "1, 2, 3, 4, 5, 6, 7", "200", "1, 2, 3, 4, 5, 6, 7, 8"}) {
    text += Line(ids);
  }
  const std::string trace = Write("tail.jsonl", text);
  const std::string base =
      "sim --trace " + trace + " --capacity-fraction 0.8 --policy credit-lru --json";
  CliRun r = Kvtier(base);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (const char* key :
       {"\"capacity_blocks\": 8", "\"policy\": \"credit-lru\"", "\"hit_ratio\": 0.388889",
        "\"credit_lru\": {\"used_twice\": 0.75, \"used_thrice\": 1.5, \"long_follow_up\": -0.5, "
        "\"stale_tail\": -1, \"ghost_factor\": 4}"}) {
    EXPECT_NE(r.out.find(key), std::string::npos) << key << " missing in " << r.out;
  }
  for (const std::string& flags :
       {std::string("--credit-lru stale_tail=0"), std::string("--credit-lru=stale_tail=0"),
        std::string("--credit-lru stale_tail=-1 --credit-lru stale_tail=+0.0")}) {
    r = Kvtier(base + " " + flags);
    ASSERT_EQ(r.exit_code, 0) << flags << ": " << r.out;
    EXPECT_NE(r.out.find("\"hit_ratio\": 0.444444"), std::string::npos) << flags << ": " << r.out;
    EXPECT_NE(r.out.find("\"stale_tail\": 0,"), std::string::npos) << flags << ": " << r.out;
  }
  r = Kvtier(base + " --credit-lru used_twice=0.123456789 --credit-lru ghost_factor=0.5");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("\"used_twice\": 0.123456789,"), std::string::npos)
      << "echoed exactly: " << r.out;
  EXPECT_NE(r.out.find("\"ghost_factor\": 0.5}"), std::string::npos) << r.out;
  // Text output names the settings; another policy warns that they do nothing.
  r = Kvtier("sim --trace " + trace + " --credit-lru stale_tail=0");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("credit-lru settings: {"), std::string::npos) << r.out;
  r = Kvtier("sim --trace " + trace + " --policy lru --credit-lru stale_tail=0");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("warning: --credit-lru has no effect with --policy lru"), std::string::npos)
      << r.out;
}

TEST_F(SimCommandTest, BadCreditLruFlagsAreUsageErrorsNamingThem) {
  const std::string trace = Write("one.jsonl", Line("1"));
  const std::pair<const char*, const char*> cases[] = {
      {"--credit-lru stale_tail", "--credit-lru 'stale_tail': expected KEY=VALUE"},
      {"--credit-lru stale=0",
       "--credit-lru 'stale=0': unknown key 'stale'; keys: used_twice, "
       "used_thrice, long_follow_up, stale_tail, ghost_factor"},
      {"--credit-lru =0", "unknown key ''"},
      {"--credit-lru stale_tail=abc", "--credit-lru 'stale_tail=abc': 'abc' is not a number"},
      {"--credit-lru stale_tail=", "'' is not a number"},
      {"--credit-lru used_twice=1,5", "'1,5' is not a number"},
      {"--credit-lru stale_tail=nan",
       "--credit-lru 'stale_tail=nan': credit_lru.stale_tail = nan: must be a finite number in "
       "[-64, 64]"},
      {"--credit-lru used_thrice=inf", "credit_lru.used_thrice = inf: must be a finite number"},
      {"--credit-lru long_follow_up=-64.5",
       "credit_lru.long_follow_up = -64.5: must be a finite "
       "number in [-64, 64]"},
      {"--credit-lru ghost_factor=-1",
       "credit_lru.ghost_factor = -1: must be a finite number in "
       "[0, 64]"},
      {"--credit-lru stale_tail=0 --credit-lru ghost_factor=65", "ghost_factor = 65"},
      {"--credit-lru", "flag --credit-lru needs a value"},
  };
  for (const auto& [flags, message] : cases) {
    CliRun r = Kvtier("sim --trace " + trace + " " + flags + " --json");
    EXPECT_EQ(r.exit_code, 2) << flags << ": " << r.out;
    EXPECT_NE(r.out.find(message), std::string::npos) << flags << ": " << r.out;
    EXPECT_EQ(r.out.find("hit_ratio"), std::string::npos) << flags << ": nothing ran";
  }
}

// The study's headline (docs/policy-study.md) on the real Mooncake conversation trace, when the
// checkout has it beside the repository.
TEST(PolicySimMooncakeTest, CreditLruClosesMuchOfTheGapToBelady) {
  const std::string path =
      std::string(KVTIER_SOURCE_DIR) + "/../shared/data/mooncake/conversation_trace.jsonl";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is not here";
  auto trace = LoadMooncakeTrace(path);
  ASSERT_TRUE(trace.ok()) << trace.status().ToString();
  EXPECT_EQ(trace->requests(), 12031u);
  EXPECT_EQ(trace->distinct_blocks, 182790u);
  EXPECT_NEAR(SimulateUnbounded(*trace).hit_ratio(), 0.366, 0.001);
  const std::vector<BlockKey> refs = TraceReferences(*trace);
  for (const auto& [fraction, lru_at_most, credit_at_least] :
       {std::tuple{0.05, 0.54, 0.60}, std::tuple{0.10, 0.77, 0.80}}) {
    const uint64_t capacity = CapacityForFraction(*trace, fraction);
    auto belady = MakeBeladyPolicy(refs);
    const double best = SimulatePolicy(*trace, *belady, capacity)->hit_ratio();
    const double lru = Simulate(*trace, PolicyKind::kLru, capacity).hit_ratio();
    const double credit = Simulate(*trace, PolicyKind::kCreditLru, capacity).hit_ratio();
    EXPECT_LE(lru / best, lru_at_most) << fraction;
    EXPECT_GE(credit / best, credit_at_least) << fraction;
  }
}

}  // namespace
}  // namespace kvtier

// kvtier gen-trace (determinism, every preset, bad flags), kvtier sim --policy all's comparison
// of the default with lru/arc/w-tinylfu, and kvtier replay's G3 endurance figures (issue 17).
// Runs the real CLI on real files.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "cli_run.h"
#include "replay_test_util.h"

namespace kvtier {
namespace {

using namespace cli::replay_testing;

CliRun Cli(const std::string& args) { return Kvtier(args); }
CliRun CliAll(const std::string& args) { return KvtierAll(args); }

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> Presets() {
  std::vector<std::string> names;
  std::istringstream in(Cli("gen-trace --list").out);
  std::string line;
  while (std::getline(in, line)) names.push_back(line.substr(0, line.find(' ')));
  return names;
}

TEST(GenTraceTest, SameSeedSameBytesOtherSeedOtherBytes) {
  TempDir dir;
  const std::string a = dir.path() + "/a.jsonl", b = dir.path() + "/b.jsonl",
                    c = dir.path() + "/c.jsonl";
  const std::string gen = "gen-trace --preset mixed-bursty --requests 400 ";
  ASSERT_EQ(Cli(gen + "--seed 7 --out " + a).exit_code, 0);
  ASSERT_EQ(Cli(gen + "--seed 7 --out " + b).exit_code, 0);
  ASSERT_EQ(Cli(gen + "--seed 8 --out " + c).exit_code, 0);
  const std::string ta = Slurp(a);
  ASSERT_GT(ta.size(), 1000u);
  EXPECT_EQ(ta, Slurp(b)) << "same preset and seed: same bytes";
  EXPECT_NE(ta, Slurp(c)) << "another seed: another trace";
  EXPECT_EQ(Cli(gen + "--seed 7 --out -").out, ta) << "stdout gets the same bytes";
  // --param changes it; the default seed is 1.
  ASSERT_EQ(Cli(gen + "--out " + b).exit_code, 0);
  EXPECT_EQ(Slurp(b), Cli(gen + "--seed 1 --out -").out);
  ASSERT_EQ(Cli(gen + "--seed 7 --param oneoff_share=0.5 --out " + b).exit_code, 0);
  EXPECT_NE(Slurp(b), ta);
}

// Every preset writes the asked number of Mooncake lines (the format's four fields, ids that
// start at 0 in order of appearance) that kvtier sim accepts, prefix-chained (no lineage
// conflict), and describes its parameters.
TEST(GenTraceTest, EveryPresetIsAValidPrefixChainedTrace) {
  TempDir dir;
  const std::vector<std::string> presets = Presets();
  ASSERT_GE(presets.size(), 6u);
  for (const std::string& p : presets) {
    const std::string path = dir.path() + "/" + p + ".jsonl";
    CliRun r = CliAll("gen-trace --preset " + p + " --requests 300 --seed 3 --out " + path);
    ASSERT_EQ(r.exit_code, 0) << p << ": " << r.out;
    const std::string text = Slurp(path);
    EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 300) << p;
    EXPECT_EQ(text.rfind("{\"timestamp\": ", 0), 0u) << p;
    for (const char* field : {"\"input_length\": ", "\"output_length\": ", "\"hash_ids\": [0"}) {
      EXPECT_NE(text.find(field), std::string::npos) << p << " lacks " << field;
    }
    r = Cli("sim --trace " + path + " --policy lru --json");
    ASSERT_EQ(r.exit_code, 0) << p << ": " << r.out;
    EXPECT_EQ(JsonNumber(r.out, "requests"), 300.0) << p;
    EXPECT_EQ(JsonNumber(r.out, "lineage_conflicts"), 0.0) << p;
    EXPECT_GT(JsonNumber(r.out, "unbounded_hit_ratio"), 0.0) << p << ": some reuse";
    r = Cli("gen-trace --preset " + p + " --describe");
    ASSERT_EQ(r.exit_code, 0) << p;
    for (const char* key : {"requests ", "sessions_per_s ", "turns_mean ", "oneoff_share "}) {
      EXPECT_NE(r.out.find(key), std::string::npos) << p << " --describe lacks " << key;
    }
  }
}

TEST(GenTraceTest, BadFlagsAreUsageErrorsSayingWhatToFix) {
  TempDir dir;
  const std::string out = " --out " + dir.path() + "/t.jsonl";
  const std::pair<std::string, std::string> cases[] = {
      {"gen-trace" + out, "--preset P is required"},
      {"gen-trace --preset chat" + out, "unknown preset 'chat'; the presets: sysprompt-few"},
      {"gen-trace --preset agent-loop", "--out FILE is required"},
      {"gen-trace --preset agent-loop --seed -3" + out, "--seed"},
      {"gen-trace --preset agent-loop --requests 0" + out, "requests = 0: must be in [1, "},
      {"gen-trace --preset agent-loop --requests lots" + out, "--requests"},
      {"gen-trace --preset agent-loop --param turns_mean" + out,
       "--param 'turns_mean': expected KEY=VALUE"},
      {"gen-trace --preset agent-loop --param turn_mean=3" + out,
       "no workload parameter 'turn_mean'; the parameters: requests,"},
      {"gen-trace --preset agent-loop --param turns_mean=nan" + out,
       "turns_mean = nan: must be in [1, 1000]"},
      {"gen-trace --preset agent-loop --param sys_prompts=-1" + out,
       "sys_prompts = '-1': must be a non-negative integer"},
      {"gen-trace --preset agent-loop --param turns_mean=100" + out,
       "turns_mean = 100 is above turns_max = 60"},
      {"gen-trace --preset agent-loop --param docs_min=3 --param docs_max=2" + out,
       "docs_min = 3 is above docs_max = 2"},
      {"gen-trace --preset agent-loop --sead 3" + out, "sead"},
      {"gen-trace extra --preset agent-loop" + out, "no positional argument"},
  };
  for (const auto& [args, message] : cases) {
    CliRun r = CliAll(args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.out;
    EXPECT_NE(r.out.find(message), std::string::npos) << args << ": " << r.out;
  }
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/t.jsonl")) << "nothing written";
}

// An --out in a directory that does not exist is refused before any work (a usage error, exit
// 2), naming the directory and what to do.
TEST(GenTraceTest, UnwritableOutputIsAFailureNamingIt) {
  TempDir dir;
  const std::string path = dir.path() + "/no/such/dir/t.jsonl";
  CliRun r = CliAll("gen-trace --preset agent-loop --requests 10 --out " + path);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find(dir.path() + "/no/such/dir is not an existing directory"), std::string::npos)
      << r.out;
  EXPECT_FALSE(std::filesystem::exists(path));
}

// --policy all runs every online policy and says how the default compares with lru, arc and
// w-tinylfu, and by how much it beats lru.
TEST(SimPolicyAllTest, JsonComparesTheDefaultWithTheBaselines) {
  TempDir dir;
  const std::string path = dir.path() + "/t.jsonl";
  ASSERT_EQ(Cli("gen-trace --preset chat-multiturn --requests 600 --out " + path).exit_code, 0);
  CliRun r = Cli("sim --trace " + path + " --capacity-fraction 0.05 --policy all --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (const char* name : {"adaptive", "lru", "arc", "w-tinylfu", "credit-lru", "lineage-lru",
                           "leaf-first-lru", "s3fifo", "hit-density"}) {
    EXPECT_NE(r.out.find("\"" + std::string(name) + "\": {\"hit_ratio\": "), std::string::npos)
        << name << " missing in " << r.out;
  }
  EXPECT_EQ(JsonString(r.out, "policy"), "adaptive");
  EXPECT_EQ(JsonString(r.out, "default_policy"), "adaptive");
  const std::string best = JsonString(r.out, "best_baseline");
  EXPECT_TRUE(best == "lru" || best == "arc" || best == "w-tinylfu") << best;
  const double hit = JsonNumber(r.out, "hit_ratio");
  const double best_hit = JsonNumber(r.out, "best_baseline_hit_ratio");
  EXPECT_NEAR(JsonNumber(r.out, "default_vs_best_baseline"), hit / best_hit, 1e-5);
  const size_t lru_at = r.out.find("\"lru\": {");
  ASSERT_NE(lru_at, std::string::npos);
  const double lru = JsonNumber(r.out, "hit_ratio", lru_at);
  EXPECT_NEAR(JsonNumber(r.out, "default_gain_over_lru"), hit / lru, 1e-5);
  // Every policy's row carries the same two ratios.
  const size_t credit_at = r.out.find("\"credit-lru\": {");
  ASSERT_NE(credit_at, std::string::npos);
  const double credit = JsonNumber(r.out, "hit_ratio", credit_at);
  EXPECT_NEAR(JsonNumber(r.out, "vs_best_baseline", credit_at), credit / best_hit, 1e-5);
  EXPECT_NEAR(JsonNumber(r.out, "gain_over_lru", credit_at), credit / lru, 1e-5);
  EXPECT_NEAR(JsonNumber(r.out, "gain_over_lru", lru_at), 1.0, 1e-9);
  // One policy: no comparison.
  r = Cli("sim --trace " + path + " --policy arc --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out.find("default_vs_best_baseline"), std::string::npos) << r.out;
  // --adaptive settings are checked.
  r = CliAll("sim --trace " + path + " --adaptive half_life=0");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("adaptive.half_life = 0: must be a number in (0, 1024]"), std::string::npos)
      << r.out;
  r = CliAll("sim --trace " + path + " --adaptive speed=2");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("adaptive has no setting 'speed'"), std::string::npos) << r.out;
  r = Cli("sim --trace " + path + " --adaptive half_life=1 --adaptive hysteresis=0 --json");
  EXPECT_EQ(r.exit_code, 0) << r.out;
}

// The replay reports G3 writes and their worth: blocks written, real bytes, and written per hit.
TEST(ReplayEnduranceTest, ReportsG3BytesWrittenPerHit) {
  TempDir dir;
  const std::string path = dir.path() + "/t.jsonl";
  ASSERT_EQ(Cli("gen-trace --preset chat-multiturn --requests 400 --out " + path).exit_code, 0);
  CliRun r =
      Cli("replay --trace " + path + " --capacity-fraction 0.05 --g3-fraction 0.25 --g3-dir " +
          dir.path() + "/g3 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const double written = JsonNumber(r.out, "g3_blocks_written");
  const double hits = JsonNumber(r.out, "hit_blocks_g3");
  EXPECT_GT(written, 0) << r.out;
  EXPECT_GT(hits, 0) << r.out;
  EXPECT_NEAR(JsonNumber(r.out, "g3_write_per_hit"), written / hits, 1e-4 * written / hits);
  EXPECT_EQ(JsonNumber(r.out, "g3_bytes_written"),
            written * JsonNumber(r.out, "kv_bytes_per_token") * 512);
  EXPECT_GT(JsonNumber(r.out, "unbounded_hit_ratio"), 0);
  EXPECT_LE(JsonNumber(r.out, "hit_ratio"), JsonNumber(r.out, "unbounded_hit_ratio") + 1e-9);
  // Without G3 nothing is written.
  r = Cli("replay --trace " + path + " --capacity-fraction 0.05 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(JsonNumber(r.out, "g3_bytes_written"), 0.0);
  EXPECT_EQ(JsonNumber(r.out, "g3_write_per_hit"), 0.0);
}

}  // namespace
}  // namespace kvtier

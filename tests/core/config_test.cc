#include "kvtier/config.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "cli_run.h"
#include "index/policy_names.h"

namespace kvtier {
namespace {

class ConfigFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvtier-config-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::string Write(const std::string& text) {
    const std::string path = dir_ + "/kvtier.toml";
    std::ofstream(path) << text;
    return path;
  }
  std::string dir_;
};

TEST(ConfigTest, DefaultsAreValidAndTyped) {
  Config c;
  EXPECT_EQ(c.GetBytes("g2.capacity_bytes"), 2ull << 30);
  EXPECT_EQ(c.GetUint("g3.queue_depth"), 32u);
  EXPECT_TRUE(c.GetBool("g2.hugepages"));
  EXPECT_EQ(c.GetString("g3.dir"), "./kvtier-data");
  EXPECT_EQ(c.GetString("hash.algorithm"), "sha256");
  for (const ConfigEntry& e : c.Entries())
    EXPECT_EQ(e.source, ConfigSource::kDefault) << e.spec->name;
}

TEST(ConfigTest, SetValidatesAndNamesFieldValueAndRange) {
  Config c;
  EXPECT_TRUE(c.Set("g2.capacity_bytes", "512MiB").ok());
  EXPECT_EQ(c.GetBytes("g2.capacity_bytes"), 512ull << 20);
  Status s = c.Set("g3.queue_depth", "0", ConfigSource::kEnvironment, "KVTIER_G3_QUEUE_DEPTH");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("g3.queue_depth = '0'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("KVTIER_G3_QUEUE_DEPTH"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("from 1 to 4096"), std::string::npos) << s.message();
  EXPECT_EQ(c.GetUint("g3.queue_depth"), 32u) << "a refused value changes nothing";
  EXPECT_FALSE(c.Set("g2.policy", "random").ok());
  EXPECT_NE(c.Set("g2.policy", "random").message().find("hit-density"), std::string::npos)
      << "the refusal lists the product's policies";
  EXPECT_FALSE(c.Set("g2.hugepages", "maybe").ok());
  EXPECT_FALSE(c.Set("g2.capacity_bytes", "12 parsecs").ok());
  EXPECT_FALSE(c.Set("index.shards", "12").ok()) << "not a power of two";
  EXPECT_FALSE(c.Set("g3.queue_depth", "1.5").ok());
  Status unknown = c.Set("g2.capacity", "1G");
  EXPECT_NE(unknown.message().find("unknown setting 'g2.capacity'"), std::string::npos);
}

TEST(ConfigTest, EnvironmentOverridesAndUnknownVariablesAreRefused) {
  Config c;
  ASSERT_TRUE(
      c.LoadEnvironment({"PATH=/bin", "KVTIER_G2_CAPACITY_BYTES=1GiB", "KVTIER_LOG_LEVEL=debug",
                         "KVTIER_TEST_STRESS_SECONDS=30", "KVTIER_G3_ENABLED=false"})
          .ok());
  EXPECT_EQ(c.GetBytes("g2.capacity_bytes"), 1ull << 30);
  EXPECT_FALSE(c.GetBool("g3.enabled"));
  for (const ConfigEntry& e : c.Entries()) {
    if (e.spec->name == "g2.capacity_bytes") {
      EXPECT_EQ(e.source, ConfigSource::kEnvironment);
      EXPECT_EQ(e.origin, "KVTIER_G2_CAPACITY_BYTES");
    }
  }
  Status typo = c.LoadEnvironment({"KVTIER_G2_CAPACITY=1GiB"});
  EXPECT_EQ(typo.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(typo.message().find("KVTIER_G2_CAPACITY names no kvtier setting"), std::string::npos);
}

// The variables kvtier itself documents outside the settings (progress lines, the vLLM
// environment's cache and base Python) are not refused: a user who exported one had every
// vLLM with kvtier fail at start-up. A name kvtier does not read still is.
TEST(ConfigTest, VariablesKvtierReadsElsewhereAreNotRefused) {
  Config c;
  EXPECT_TRUE(c.LoadEnvironment({"KVTIER_PROGRESS=0", "KVTIER_CACHE=/big/kvtier-cache",
                                 "KVTIER_BASE_PYTHON=python3.12",
                                 "KVTIER_CONFIG=", "KVTIER_LOG_LEVEL=warn"})
                  .ok());
  Status leaked = c.LoadEnvironment({"KVTIER_BENCH_PROGRAM=bench_pd.py"});
  EXPECT_EQ(leaked.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(leaked.message().find("KVTIER_BENCH_PROGRAM names no kvtier setting"),
            std::string::npos);
  Status near = c.LoadEnvironment({"KVTIER_PROGRES=0"});
  EXPECT_EQ(near.code(), StatusCode::kInvalidArgument) << "a typo of one is still refused";
}

TEST_F(ConfigFileTest, FileThenEnvironmentPrecedence) {
  const std::string path = Write(
      "[g2]\ncapacity_bytes = \"3GiB\"\nhugepages = false\n\n[g3]\nqueue_depth = 64\n"
      "dir = \"/var/lib/kvtier\"\n");
  Config c;
  ASSERT_TRUE(c.LoadFile(path).ok()) << c.LoadFile(path).ToString();
  EXPECT_EQ(c.GetBytes("g2.capacity_bytes"), 3ull << 30);
  EXPECT_FALSE(c.GetBool("g2.hugepages"));
  EXPECT_EQ(c.GetUint("g3.queue_depth"), 64u);
  EXPECT_EQ(c.GetString("g3.dir"), "/var/lib/kvtier");
  ASSERT_TRUE(c.LoadEnvironment({"KVTIER_G3_QUEUE_DEPTH=128"}).ok());
  EXPECT_EQ(c.GetUint("g3.queue_depth"), 128u) << "the environment wins over the file";
  for (const ConfigEntry& e : c.Entries()) {
    if (e.spec->name == "g2.hugepages") {
      EXPECT_EQ(e.source, ConfigSource::kFile);
      EXPECT_EQ(e.origin, path + ":3");
    }
  }
}

// IsSet tells a value someone chose from the built-in default: every explicit source counts,
// even when it repeats the default's value; a refused value leaves the field as it was.
TEST_F(ConfigFileTest, IsSetIsTrueForEveryExplicitSourceAndFalseForDefaults) {
  Config c;
  for (const ConfigFieldSpec& spec : Config::Schema()) {
    EXPECT_FALSE(c.IsSet(spec.name)) << spec.name << " is at its default";
  }
  ASSERT_TRUE(c.LoadFile(Write("[g3]\ndir = \"/data/kvtier\"\n")).ok());
  EXPECT_TRUE(c.IsSet("g3.dir"));
  EXPECT_FALSE(c.IsSet("g3.capacity_bytes")) << "only what the file holds";
  ASSERT_TRUE(c.LoadEnvironment({"KVTIER_G3_CAPACITY_BYTES=1GiB"}).ok());
  EXPECT_TRUE(c.IsSet("g3.capacity_bytes"));
  EXPECT_FALSE(c.IsSet("g3.files"));
  ASSERT_TRUE(c.Set("g3.files", std::to_string(Config().GetUint("g3.files"))).ok());
  EXPECT_TRUE(c.IsSet("g3.files")) << "set to the default's value, still set";
  Config d;
  EXPECT_FALSE(d.Set("g3.queue_depth", "not a number").ok());
  EXPECT_FALSE(d.IsSet("g3.queue_depth")) << "a refused value sets nothing";
  ASSERT_TRUE(d.Set("g3.queue_depth", "8", ConfigSource::kDefault).ok());
  EXPECT_FALSE(d.IsSet("g3.queue_depth")) << "Set with kDefault restores a default";
}

TEST_F(ConfigFileTest, BadFilesGetClearErrors) {
  Config c;
  Status missing = c.LoadFile(dir_ + "/nope.toml");
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);

  Status syntax = c.LoadFile(Write("[g2\ncapacity_bytes = 1\n"));
  EXPECT_EQ(syntax.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(syntax.message().find("kvtier.toml:1:"), std::string::npos) << syntax.message();

  Status unknown = c.LoadFile(Write("[g2]\ncapacity = \"1GiB\"\n"));
  EXPECT_NE(unknown.message().find("unknown setting 'g2.capacity'"), std::string::npos)
      << unknown.message();

  Status bad = c.LoadFile(Write("[g3]\nqueue_depth = 100000\n"));
  EXPECT_NE(bad.message().find("g3.queue_depth = '100000' (from"), std::string::npos)
      << bad.message();
  EXPECT_NE(bad.message().find("kvtier.toml:2"), std::string::npos) << bad.message();

  Status negative = c.LoadFile(Write("[g3]\nqueue_depth = -4\n"));
  EXPECT_NE(negative.message().find("negative"), std::string::npos) << negative.message();

  Status not_table = c.LoadFile(Write("capacity_bytes = 4\n"));
  EXPECT_NE(not_table.message().find("must be a table"), std::string::npos) << not_table.message();

  Status wrong_type = c.LoadFile(Write("[g3]\nqueue_depth = [1, 2]\n"));
  EXPECT_EQ(wrong_type.code(), StatusCode::kInvalidArgument);
}

// g2.credit_lru.* and g3.credit_lru.*: real numbers, finite, in range; a refusal names the
// key, the value, where it came from and the accepted range, and changes nothing.
TEST(ConfigTest, CreditLruKeysAcceptGoodValuesAndRefuseBadOnesByName) {
  struct Key {
    const char* field;
    const char* default_text;
    double min, max;
  };
  const Key keys[] = {{"used_twice", "0.75", -64, 64},
                      {"used_thrice", "1.5", -64, 64},
                      {"long_follow_up", "-0.5", -64, 64},
                      {"stale_tail", "-1", -64, 64},
                      {"ghost_factor", "4", 0, 64}};
  for (const char* tier : {"g2", "g3"}) {
    for (const Key& k : keys) {
      const std::string name = std::string(tier) + ".credit_lru." + k.field;
      Config c;
      EXPECT_EQ(c.GetDouble(name), std::strtod(k.default_text, nullptr)) << name;
      // Good values: the bounds, a fraction, exponent notation, a leading '+'.
      for (const auto& [text, value] : std::vector<std::pair<std::string, double>>{
               {"0", 0.0},
               {"0.25", 0.25},
               {"2.5e-1", 0.25},
               {"+3", 3.0},
               {std::to_string(static_cast<int>(k.max)), k.max},
               {std::to_string(static_cast<int>(k.min)), k.min}}) {
        Status s = c.Set(name, text);
        EXPECT_TRUE(s.ok()) << name << " = " << text << ": " << s.ToString();
        EXPECT_EQ(c.GetDouble(name), value) << name << " = " << text;
      }
      ASSERT_TRUE(c.Set(name, "0.5").ok());
      // Out of range, not finite, not a number.
      const std::string below = std::to_string(k.min - 0.5), above = std::to_string(k.max + 1);
      for (const std::string& bad :
           {below, above, std::string("1e400"), std::string("nan"), std::string("NaN"),
            std::string("inf"), std::string("-inf"), std::string("abc"), std::string("true"),
            std::string(""), std::string("1,5"), std::string("0x10"), std::string("1.5x")}) {
        Status s = c.Set(name, bad, ConfigSource::kEnvironment, "SOMEWHERE");
        EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << name << " = '" << bad << "'";
        EXPECT_NE(s.message().find(name + " = '" + bad + "'"), std::string::npos) << s.message();
        EXPECT_NE(s.message().find("SOMEWHERE"), std::string::npos) << s.message();
        const std::string range =
            std::string("a finite number from ") + (k.min == 0 ? "0" : "-64") + " to 64";
        EXPECT_NE(s.message().find(range), std::string::npos) << s.message();
        EXPECT_EQ(c.GetDouble(name), 0.5) << "a refused value changes nothing: " << bad;
      }
    }
  }
  Config c;
  Status nan = c.Set("g2.credit_lru.stale_tail", "nan");
  EXPECT_NE(nan.message().find("not a finite number"), std::string::npos) << nan.message();
  Status range = c.Set("g2.credit_lru.ghost_factor", "-1");
  EXPECT_NE(range.message().find("out of range"), std::string::npos) << range.message();
  Status word = c.Set("g3.credit_lru.used_twice", "lots");
  EXPECT_NE(word.message().find("not a number"), std::string::npos) << word.message();
  Status typo = c.Set("g2.credit_lru.stale_tails", "0");
  EXPECT_NE(typo.message().find("unknown setting 'g2.credit_lru.stale_tails'"), std::string::npos)
      << typo.message();
  ASSERT_TRUE(c.Set("g2.credit_lru.stale_tail", "-0").ok());
  for (const ConfigEntry& e : c.Entries()) {
    if (e.spec->name == "g2.credit_lru.stale_tail") {
      EXPECT_EQ(e.value, "0") << "-0 prints as 0";
    }
  }
}

TEST(ConfigTest, CreditLruKeysFollowTheEnvironment) {
  Config c;
  ASSERT_TRUE(c.LoadEnvironment({"KVTIER_G2_CREDIT_LRU_STALE_TAIL=0",
                                 "KVTIER_G3_CREDIT_LRU_GHOST_FACTOR=0.5",
                                 "KVTIER_G3_CREDIT_LRU_USED_THRICE=-2.25"})
                  .ok());
  EXPECT_EQ(c.GetDouble("g2.credit_lru.stale_tail"), 0.0);
  EXPECT_EQ(c.GetDouble("g3.credit_lru.stale_tail"), -1.0) << "g3 keeps its default";
  EXPECT_EQ(c.GetDouble("g3.credit_lru.ghost_factor"), 0.5);
  EXPECT_EQ(c.GetDouble("g3.credit_lru.used_thrice"), -2.25);
  for (const ConfigEntry& e : c.Entries()) {
    if (e.spec->name == "g2.credit_lru.stale_tail") {
      EXPECT_EQ(e.source, ConfigSource::kEnvironment);
      EXPECT_EQ(e.origin, "KVTIER_G2_CREDIT_LRU_STALE_TAIL");
      EXPECT_EQ(e.value, "0");
    }
  }
  Status bad = c.LoadEnvironment({"KVTIER_G2_CREDIT_LRU_USED_TWICE=inf"});
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("g2.credit_lru.used_twice = 'inf' (from "
                               "KVTIER_G2_CREDIT_LRU_USED_TWICE) is not a finite number"),
            std::string::npos)
      << bad.message();
  EXPECT_EQ(c.GetDouble("g2.credit_lru.used_twice"), 0.75);
  Status typo = c.LoadEnvironment({"KVTIER_G2_CREDIT_LRU_STALE=0"});
  EXPECT_NE(typo.message().find("KVTIER_G2_CREDIT_LRU_STALE names no kvtier setting"),
            std::string::npos)
      << typo.message();
}

// In a file, credit_lru is a sub-table of [g2]/[g3]: dotted keys or [g2.credit_lru]; TOML
// floats, negative integers (only for real-number fields) and integers are accepted.
TEST_F(ConfigFileTest, CreditLruKeysLoadFromSubTables) {
  const std::string path = Write(
      "[g2]\npolicy = \"credit-lru\"\ncredit_lru.stale_tail = 0\ncredit_lru.used_twice = 1.25\n"
      "\n[g3.credit_lru]\nlong_follow_up = -2\nghost_factor = 0.5\n");
  Config c;
  Status s = c.LoadFile(path);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(c.GetDouble("g2.credit_lru.stale_tail"), 0.0);
  EXPECT_EQ(c.GetDouble("g2.credit_lru.used_twice"), 1.25);
  EXPECT_EQ(c.GetDouble("g3.credit_lru.long_follow_up"), -2.0);
  EXPECT_EQ(c.GetDouble("g3.credit_lru.ghost_factor"), 0.5);
  for (const ConfigEntry& e : c.Entries()) {
    if (e.spec->name == "g3.credit_lru.ghost_factor") {
      EXPECT_EQ(e.source, ConfigSource::kFile);
      EXPECT_EQ(e.origin, path + ":8");
    }
  }
  ASSERT_TRUE(c.LoadEnvironment({"KVTIER_G2_CREDIT_LRU_STALE_TAIL=-0.5"}).ok());
  EXPECT_EQ(c.GetDouble("g2.credit_lru.stale_tail"), -0.5) << "the environment wins";
}

TEST_F(ConfigFileTest, BadCreditLruValuesInAFileAreNamedWithTheLine) {
  Config c;
  Status nan = c.LoadFile(Write("[g2]\ncredit_lru.stale_tail = nan\n"));
  EXPECT_EQ(nan.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(nan.message().find("g2.credit_lru.stale_tail = 'nan'"), std::string::npos)
      << nan.message();
  EXPECT_NE(nan.message().find("kvtier.toml:2"), std::string::npos) << nan.message();
  EXPECT_NE(nan.message().find("not a finite number"), std::string::npos) << nan.message();

  Status inf = c.LoadFile(Write("[g3.credit_lru]\nused_twice = -inf\n"));
  EXPECT_NE(inf.message().find("g3.credit_lru.used_twice = '-inf'"), std::string::npos)
      << inf.message();

  Status range = c.LoadFile(Write("[g2.credit_lru]\nghost_factor = -1\n"));
  EXPECT_NE(range.message().find("g2.credit_lru.ghost_factor = '-1'"), std::string::npos)
      << range.message();
  EXPECT_NE(range.message().find("from 0 to 64"), std::string::npos) << range.message();

  Status type = c.LoadFile(Write("[g2.credit_lru]\nused_thrice = true\n"));
  EXPECT_NE(type.message().find("g2.credit_lru.used_thrice = 'true'"), std::string::npos)
      << type.message();
  EXPECT_NE(type.message().find("not a number"), std::string::npos) << type.message();

  Status unknown = c.LoadFile(Write("[g2.credit_lru]\nstale = 0\n"));
  EXPECT_NE(unknown.message().find("unknown setting 'g2.credit_lru.stale'"), std::string::npos)
      << unknown.message();

  // A real number where a whole number belongs is refused, not truncated.
  Status real = c.LoadFile(Write("[g3]\nqueue_depth = 32.5\n"));
  EXPECT_NE(real.message().find("g3.queue_depth = 32.5"), std::string::npos) << real.message();
  EXPECT_NE(real.message().find("real number"), std::string::npos) << real.message();
  EXPECT_EQ(c.GetUint("g3.queue_depth"), 32u);
  for (const ConfigEntry& e : c.Entries()) {
    EXPECT_EQ(e.source, ConfigSource::kDefault) << e.spec->name << ": every file was refused";
  }
}

// A credit_lru setting for a tier whose policy is not credit-lru is allowed but warned about.
TEST(ConfigTest, CreditLruSettingsUnderAnotherPolicyAreWarnings) {
  Config c;
  EXPECT_TRUE(c.Warnings().empty());
  ASSERT_TRUE(c.Set("g2.policy", "lru").ok());
  EXPECT_TRUE(c.Warnings().empty()) << "defaults are not settings the user gave";
  ASSERT_TRUE(c.Set("g2.credit_lru.stale_tail", "0", ConfigSource::kEnvironment,
                    "KVTIER_G2_CREDIT_LRU_STALE_TAIL")
                  .ok());
  ASSERT_TRUE(c.Set("g3.credit_lru.used_twice", "1").ok());  // g3 is credit-lru: no warning
  std::vector<std::string> w = c.Warnings();
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("g2.credit_lru.stale_tail = 0 (from KVTIER_G2_CREDIT_LRU_STALE_TAIL)"),
            std::string::npos)
      << w[0];
  EXPECT_NE(w[0].find("g2.policy = lru"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("set g2.policy = credit-lru or adaptive, or remove the setting"),
            std::string::npos)
      << w[0];
  ASSERT_TRUE(c.Set("g3.policy", "arc").ok());
  EXPECT_EQ(c.Warnings().size(), 2u);
  ASSERT_TRUE(c.Set("g2.policy", "credit-lru").ok());
  ASSERT_TRUE(c.Set("g3.policy", "credit-lru").ok());
  EXPECT_TRUE(c.Warnings().empty());
  // adaptive's own settings apply only under adaptive (which also reads credit_lru's).
  ASSERT_TRUE(c.Set("g2.adaptive.half_life", "4").ok());
  w = c.Warnings();
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("g2.adaptive.half_life = 4 (from set) has no effect: g2.policy = "
                      "credit-lru; set g2.policy = adaptive, or remove the setting"),
            std::string::npos)
      << w[0];
  ASSERT_TRUE(c.Set("g2.policy", "adaptive").ok());
  EXPECT_TRUE(c.Warnings().empty()) << "adaptive reads both credit_lru.* and adaptive.*";
}

// The lab's policies (docs/policies.md: they did not earn a place in the product) are refused
// by name from every source, saying where they run and what the product offers; the product's
// are accepted. Only a lab process (EnableLabPolicies, lab/policies) turns the switch on.
constexpr const char* kLabPolicies[] = {"lineage-lru", "leaf-first-lru", "s3fifo", "belady"};

std::string LabRefusal(const std::string& name) {
  return name +
         " is a lab policy (docs/policy-study.md): use it with kvtier sim / replay; the product "
         "offers: adaptive, credit-lru, lru, arc, w-tinylfu, hit-density";
}

TEST(ConfigTest, LabPoliciesAreRefusedSayingWhereToRunThem) {
  Config c;
  for (const char* field : {"g2.policy", "g3.policy"}) {
    for (const char* name : kLabPolicies) {
      Status s = c.Set(field, name);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << field << " " << name;
      EXPECT_EQ(s.message(), std::string(field) + " = '" + name + "': " + LabRefusal(name));
      EXPECT_EQ(c.GetString(field), "adaptive") << "a refused value changes nothing";
    }
    for (const char* name : {"adaptive", "credit-lru", "lru", "arc", "w-tinylfu", "hit-density"}) {
      EXPECT_TRUE(c.Set(field, name).ok()) << field << " " << name;
    }
  }
  Status env = c.LoadEnvironment({"KVTIER_G3_POLICY=s3fifo"});
  EXPECT_EQ(env.message(), "g3.policy = 's3fifo' (from KVTIER_G3_POLICY): " + LabRefusal("s3fifo"));

  // The lab's switch: accepted while it is on, refused again once it is off.
  SetLabPolicyNamesAccepted(true);
  EXPECT_TRUE(c.Set("g2.policy", "lineage-lru").ok());
  EXPECT_EQ(c.GetString("g2.policy"), "lineage-lru");
  SetLabPolicyNamesAccepted(false);
  EXPECT_FALSE(c.Set("g2.policy", "lineage-lru").ok());
}

TEST_F(ConfigFileTest, LabPolicyInAFileIsRefusedWithItsLine) {
  Config c;
  Status s = c.LoadFile(Write("[g2]\ncapacity_bytes = \"1GiB\"\npolicy = \"leaf-first-lru\"\n"));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("g2.policy = 'leaf-first-lru' (from " + dir_ +
                             "/kvtier.toml:3): " + LabRefusal("leaf-first-lru")),
            std::string::npos)
      << s.message();
}

// `kvtier config` (the product's command) refuses one too, and exits non-zero.
TEST(ConfigTest, ConfigCommandRefusesALabPolicy) {
  const cli_run::CliRun run =
      cli_run::RunShell("KVTIER_G2_POLICY=s3fifo " + std::string(KVTIER_CLI_PATH) + " config 2>&1");
  EXPECT_NE(run.exit_code, 0) << run.out;
  EXPECT_NE(run.out.find(LabRefusal("s3fifo")), std::string::npos) << run.out;
}

// `kvtier config` shows the keys and their sources, prints the warning and still succeeds.
TEST(ConfigTest, ConfigCommandShowsCreditLruKeysAndWarns) {
  const std::string cmd = "KVTIER_G3_POLICY=lru KVTIER_G3_CREDIT_LRU_GHOST_FACTOR=2 " +
                          std::string(KVTIER_CLI_PATH) + " config 2>&1";
  const cli_run::CliRun run = cli_run::RunShell(cmd);
  const std::string& out = run.out;
  EXPECT_EQ(run.exit_code, 0) << out;
  EXPECT_NE(out.find("warning: g3.credit_lru.ghost_factor = 2"), std::string::npos) << out;
  EXPECT_NE(out.find("env KVTIER_G3_CREDIT_LRU_GHOST_FACTOR"), std::string::npos) << out;
  EXPECT_NE(out.find("g2.credit_lru.stale_tail     -1"), std::string::npos) << out;
}

TEST(ConfigTest, ParseByteSize) {
  EXPECT_EQ(*ParseByteSize("4096"), 4096u);
  EXPECT_EQ(*ParseByteSize("4K"), 4096u);
  EXPECT_EQ(*ParseByteSize("2MiB"), 2u << 20);
  EXPECT_EQ(*ParseByteSize("1T"), 1ull << 40);
  EXPECT_FALSE(ParseByteSize("").ok());
  EXPECT_FALSE(ParseByteSize("-1").ok());
  EXPECT_FALSE(ParseByteSize("5Q").ok());
  EXPECT_FALSE(ParseByteSize("99999999999999999999").ok());
  EXPECT_FALSE(ParseByteSize("20000000T").ok());
}

}  // namespace
}  // namespace kvtier

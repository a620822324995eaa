#include "kvtier/config.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

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
  EXPECT_NE(c.Set("g2.policy", "random").message().find("lineage-lru"), std::string::npos);
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

// `kvtier bench remote` run as a user would: briefly, with --json, against its own embedded
// redis-server and against one the test started; and its usage errors. Also `kvtier bench
// handoff` (the P/D handoff through a shared G2 and a Redis G4), small.
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include <gtest/gtest.h>

#include "cli_run.h"

#include "redis_test_util.h"

namespace {

using kvtier::cli_run::CliRun;

CliRun Kvtier(const std::string& args) {
  const std::string cmd = std::string(KVTIER_CLI_PATH) + " " + args + " 2>&1";
  return kvtier::cli_run::RunShell(cmd);
}

TEST(BenchRemoteCliTest, EmbeddedServerJsonHasTheKeys) {
  KVTIER_REQUIRE_REDIS();
  CliRun r =
      Kvtier("bench remote --value-bytes 256KiB --clients 2 --seconds 0.2 --rounds 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (const char* key : {"\"put_gbps\"", "\"get_gbps\"", "\"value_bytes\": 262144",
                          "\"clients\": 2", "\"server\": \"embedded\""}) {
    EXPECT_NE(r.out.find(key), std::string::npos) << key << " missing in " << r.out;
  }
  if (!kvtier::testing::FindOnPath("redis-benchmark").empty()) {
    for (const char* key : {"\"redis_benchmark_set_gbps\"", "\"redis_benchmark_get_gbps\"",
                            "\"put_ratio\"", "\"get_ratio\"", "\"redis_benchmark\": \"ran\""}) {
      EXPECT_NE(r.out.find(key), std::string::npos) << key << " missing in " << r.out;
    }
  }
}

TEST(BenchRemoteCliTest, GivenServerIsUsedAndLeftClean) {
  KVTIER_REQUIRE_REDIS();
  kvtier::testing::RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  CliRun r = Kvtier("bench remote --redis " + server.endpoint() +
                    " --value-bytes 64KiB --clients 3 --batch 8 --seconds 0.2 --rounds 1 "
                    "--no-redis-benchmark --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("\"server\": \"given\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"redis_benchmark\": \"skipped\""), std::string::npos) << r.out;
  EXPECT_EQ(server.DbSize(), 0);
  const std::string stats = server.Command({"INFO", "stats"}).text;
  EXPECT_NE(stats.find("total_commands_processed:"), std::string::npos);
}

TEST(BenchRemoteCliTest, UsageErrorsSayWhatToFix) {
  CliRun r = Kvtier("bench remote --cluster --json");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("--cluster needs --redis"), std::string::npos) << r.out;
  r = Kvtier("bench remote --redis localhost");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("'localhost'"), std::string::npos) << r.out;
  r = Kvtier("bench remote --clients 0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("--clients"), std::string::npos) << r.out;
}

TEST(BenchRemoteCliTest, ServerDownIsAFailureNotAHang) {
  KVTIER_REQUIRE_REDIS();
  kvtier::testing::RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  server.Stop();
  CliRun r = Kvtier("bench remote --redis " + server.endpoint() +
                    " --value-bytes 4KiB --seconds 0.1 --rounds 1 --no-redis-benchmark");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("Unavailable"), std::string::npos) << r.out;
}

// The handoff of a 256-token prompt (16 blocks of 2 MiB): through one daemon's G2 and across two
// daemons over the embedded Redis, every block byte-exact, each path beside its limit.
TEST(BenchHandoffCliTest, BothPathsDeliverEveryBlockByteExact) {
  KVTIER_REQUIRE_REDIS();
  // Streaming stores forced (auto streams only loads larger than the last-level cache), so the
  // one-host loads run both ways: streaming, and the comparison consumer's cached stores.
  CliRun r = Kvtier("bench handoff --tokens 256 --reps 1 --load-stores streaming --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (const char* key :
       {"\"blocks\": 16", "\"bytes_ok\": true", "\"g2_handoff_vs_memcpy\"", "\"g4_handoff_s\"",
        "\"memcpy_gbps\"", "\"g4_handoff_direct_to_g1\": true", "\"g4_via_g2_handoff_s\"",
        "\"g2_handoff_samples_s\": [", "\"memcpy_samples_s\": [", "\"g2_handoff_vs_memcpy_median\"",
        "\"load_stores_used\": \"streaming\"", "\"other_load_stores\": \"cached\"",
        "\"g2_handoff_phases\": {", "\"engine_copy_ms\"", "\"g4_handoff_samples_s\": [",
        "\"thp_shmem_enabled\""}) {
    EXPECT_NE(r.out.find(key), std::string::npos) << key << " missing in " << r.out;
  }
}

TEST(BenchHandoffCliTest, UsageErrorsSayWhatToFix) {
  CliRun r = Kvtier("bench handoff --tokens 8");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("--tokens 16..65536"), std::string::npos) << r.out;
  r = Kvtier("bench handoff --reps 0 --no-g4");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("--reps 1..100"), std::string::npos) << r.out;
  r = Kvtier("bench handoff --load-stores sometimes --no-g4");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("--load-stores auto|cached|streaming"), std::string::npos) << r.out;
  r = Kvtier("bench handoff --memcpy-pages big --no-g4");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("--memcpy-pages default|huge|small"), std::string::npos) << r.out;
  r = Kvtier("bench handoff --bogus 1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("--bogus"), std::string::npos) << r.out;
}

}  // namespace

// Runs the real `kvtier` binary as a user would and checks its output and exit codes.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "cli_run.h"

namespace {

using kvtier::cli_run::CliRun;

CliRun KvtierWithEnv(const std::string& env, const std::string& args) {
  const std::string cmd = env + " " + std::string(KVTIER_CLI_PATH) + " " + args + " 2>&1";
  return kvtier::cli_run::RunShell(cmd);
}

CliRun Kvtier(const std::string& args) { return KvtierWithEnv("", args); }

TEST(CliTest, HelpListsCommands) {
  CliRun r = Kvtier("--help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("bench copy"), std::string::npos);
  EXPECT_NE(r.out.find("bench index"), std::string::npos);
}

TEST(CliTest, UnknownCommandAndFlagAreUsageErrors) {
  CliRun r = Kvtier("frobnicate");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("unknown command 'frobnicate'"), std::string::npos);
  r = Kvtier("bench copy --blokcs 3");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("unknown flag --blokcs"), std::string::npos) << r.out;
  r = Kvtier("bench copy --tokens-per-block 4097");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("tokens_per_block"), std::string::npos) << r.out;
  r = Kvtier("bench copy --blocks lots");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("--blocks"), std::string::npos) << r.out;
}

TEST(CliTest, BenchCopyJsonHasTheKeys) {
  CliRun r = Kvtier("bench copy --blocks 8 --layers 4 --reps 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (const char* key : {"\"offload_gbps\"", "\"onboard_gbps\"", "\"memcpy_gbps\"", "\"threads\"",
                          "\"block_bytes\": 262144"}) {
    EXPECT_NE(r.out.find(key), std::string::npos) << key << " missing in " << r.out;
  }
}

// --shared: the attached-mapping path and its ratios to a private memcpy, in the same JSON.
TEST(CliTest, BenchCopySharedJsonHasTheKeys) {
  CliRun r = Kvtier("bench copy --shared --blocks 8 --layers 4 --reps 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (const char* key :
       {"\"shared\": true", "\"shared_save_gbps\"", "\"shared_load_gbps\"",
        "\"memcpy_private_gbps\"", "\"shared_ratio_to_memcpy_save\"",
        "\"shared_ratio_to_memcpy_load\"", "\"offload_gbps\"", "\"block_bytes\": 262144"}) {
    EXPECT_NE(r.out.find(key), std::string::npos) << key << " missing in " << r.out;
  }
  r = Kvtier("bench copy --help");
  EXPECT_NE(r.out.find("--shared"), std::string::npos) << r.out;
}

TEST(CliTest, BenchIndexJsonHasTheKeys) {
  CliRun r = Kvtier("bench index --tokens 4096 --reps 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (const char* key : {"\"tokens\": 4096", "\"hash_only_us\"", "\"lookup_us\""}) {
    EXPECT_NE(r.out.find(key), std::string::npos) << key << " missing in " << r.out;
  }
}

// The benchmark measures the product's hot path: a lab policy (docs/policies.md) is refused,
// saying where it runs.
TEST(CliTest, BenchIndexRefusesALabPolicy) {
  CliRun r = Kvtier("bench index --tokens 64 --reps 1 --policies lru,s3fifo");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--policies: s3fifo is a lab policy (docs/policy-study.md): use it with "
                       "kvtier sim / replay; the product offers: adaptive,"),
            std::string::npos)
      << r.out;
}

TEST(CliTest, BenchArenaJson) {
  CliRun r = Kvtier("bench arena --bytes 16MiB --reps 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("\"arena_startup_ms\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"first_touch_ms\""), std::string::npos) << r.out;
}

TEST(CliTest, BenchManagerJsonHasTheKeys) {
  char tmpl[] = "/tmp/kvtier-bench-manager-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  CliRun r = Kvtier(std::string("bench manager --prompts 1 --prompt-blocks 4 --commit-seconds 0.2 "
                                "--json --dir ") +
                    tmpl + "/d");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (const char* key :
       {"\"lookup_per_s\"", "\"commit_per_s\"", "\"commit_p99_us\"", "\"load_gbps_g2\"",
        "\"load_gbps_g3\"", "\"save_gbps\"", "\"load_g3_blocks\": 4"}) {
    EXPECT_NE(r.out.find(key), std::string::npos) << key << " missing in " << r.out;
  }
  rmdir(tmpl);
}

// kvtier replay attached to a real kvtier serve (KVTIER_SERVICE_SOCKET): the second replay
// process finds every block the first one saved in the daemon's G2; embedded, each starts empty.
TEST(CliTest, ReplayRunsAttachedToKvtierServe) {
  char tmpl[] = "/tmp/kvtier-cli-serve-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  const std::string socket = dir + "/sock/kvtier.sock", trace = dir + "/trace.jsonl";
  {
    FILE* f = std::fopen(trace.c_str(), "w");
    ASSERT_NE(f, nullptr);
    for (int i = 0; i < 6; ++i) {  // 8 shared blocks of 16 tokens, then one token of its own
      std::string line = "{\"tokens\": [";
      for (int t = 0; t < 128; ++t) line += std::to_string(1000 + t) + ",";
      line += std::to_string(i) + "]}\n";
      std::fputs(line.c_str(), f);
    }
    std::fclose(f);
  }
  const CliRun serve = kvtier::cli_run::RunShell(
      "KVTIER_G3_ENABLED=false KVTIER_G2_CAPACITY_BYTES=16MiB KVTIER_G2_LOCK_MEMORY=false " +
      std::string(KVTIER_CLI_PATH) + " serve --socket " + socket + " --for-seconds 60 > " + dir +
      "/serve.log 2>&1 & echo $!");
  const int pid = std::atoi(serve.out.c_str());
  ASSERT_GT(pid, 0) << serve.out;
  for (int i = 0; i < 200 && ::access(socket.c_str(), F_OK) != 0; ++i) ::usleep(50 * 1000);
  ASSERT_EQ(::access(socket.c_str(), F_OK), 0) << "kvtier serve did not listen within 10 s";
  const std::string replay =
      "replay --trace " + trace + " --tokens-per-block 16 --capacity-fraction 1 --json";
  auto hit_ratio = [](const std::string& out) {
    const size_t at = out.find("\"hit_ratio\": ");
    return at == std::string::npos ? -1.0 : std::atof(out.c_str() + at + 13);
  };
  const CliRun first = KvtierWithEnv("KVTIER_SERVICE_SOCKET=" + socket, replay);
  const CliRun second = KvtierWithEnv("KVTIER_SERVICE_SOCKET=" + socket, replay);
  const CliRun embedded = Kvtier(replay);
  ::kill(pid, SIGTERM);
  for (const CliRun* r : {&first, &second, &embedded}) {
    EXPECT_EQ(r->exit_code, 0) << r->out;
    EXPECT_NE(r->out.find("\"mismatched_blocks\": 0"), std::string::npos) << r->out;
  }
  EXPECT_NEAR(hit_ratio(first.out), 40.0 / 48, 1e-3) << first.out;  // the first request misses
  EXPECT_NEAR(hit_ratio(second.out), 1.0, 1e-3) << "not attached: " << second.out;
  EXPECT_NEAR(hit_ratio(embedded.out), 40.0 / 48, 1e-3) << embedded.out;
  std::string cmd = "rm -rf " + dir;
  EXPECT_EQ(std::system(cmd.c_str()), 0);
}

TEST(CliTest, ConfigShowsSourcesAndRefusesBadValues) {
  CliRun r = Kvtier("config");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("g2.capacity_bytes"), std::string::npos);
  r = KvtierWithEnv("KVTIER_G2_CAPACITY_BYTES=3GiB", "config --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("\"value\": \"3221225472\", \"source\": \"env\""), std::string::npos)
      << r.out;
  r = KvtierWithEnv("KVTIER_G3_QUEUE_DEPTH=lots", "config");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("g3.queue_depth = 'lots' (from KVTIER_G3_QUEUE_DEPTH)"), std::string::npos)
      << r.out;
  r = Kvtier("config --config /nonexistent/kvtier.toml");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("cannot be opened"), std::string::npos) << r.out;
}

}  // namespace

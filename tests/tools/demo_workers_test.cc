// `kvtier demo --workers 2 --redis HOST:PORT` end to end on the real model, against a
// redis-server this test starts: two worker processes, worker 2 loads worker 1's blocks from
// G4 and its first token equals recompute. Skipped when the model or redis-server is absent,
// and under ASan/TSan (real-model prefills take minutes there).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cli_run.h"
#include "redis_test_util.h"

namespace {

const char* kModelPath = KVTIER_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf";

std::string RunCommand(const std::string& cmd, int* rc) {
  kvtier::cli_run::CliRun r = kvtier::cli_run::RunShell(cmd);
  *rc = r.exit_code;
  return r.out;
}

// Values of `"key": <number>` in the demo's JSON, in order.
std::vector<long> Numbers(const std::string& json, const std::string& key) {
  std::vector<long> out;
  const std::string needle = "\"" + key + "\": ";
  for (size_t at = json.find(needle); at != std::string::npos; at = json.find(needle, at + 1)) {
    out.push_back(std::stol(json.substr(at + needle.size())));
  }
  return out;
}

TEST(DemoWorkersTest, WorkerTwoReusesWorkerOnesBlocksFromRedis) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "real-model prefills take minutes under a sanitizer; run in the release build";
#endif
  KVTIER_REQUIRE_REDIS();
  if (!std::filesystem::exists(kModelPath)) {
    GTEST_SKIP() << "real model absent: run scripts/fetch-model.sh";
  }
  kvtier::testing::RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  // A directory of its own (not a fixed name), so concurrent runs of the suite cannot collide.
  std::string tmpl =
      (std::filesystem::temp_directory_path() / "kvtier-demo-workers-XXXXXX").string();
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr) << "mkdtemp: " << std::strerror(errno);
  const std::filesystem::path dir = tmpl;
  int rc = -1;
  const std::string json =
      RunCommand("cd " + dir.string() + " && " + KVTIER_CLI_PATH +
                     " demo --workers 2 --turns 2 --json --model " + kModelPath + " --redis " +
                     server.endpoint() + " 2>/dev/null",
                 &rc);
  ASSERT_EQ(rc, 0) << json;
  const auto workers = Numbers(json, "worker");
  const auto g4 = Numbers(json, "blocks_g4");
  const auto reused = Numbers(json, "reused_tokens");
  const auto match = Numbers(json, "first_token_match");
  ASSERT_EQ(workers.size(), 4u) << json;
  ASSERT_EQ(g4.size(), 4u);
  EXPECT_EQ(reused[0], 0) << "worker 1, turn 0: nothing cached anywhere";
  EXPECT_EQ(g4[0] + g4[1], 0) << "worker 1 never loads from G4";
  EXPECT_GT(g4[2], 0) << "worker 2, turn 0: its own tiers are empty; the prefix comes from G4";
  EXPECT_GT(reused[2], 0);
  EXPECT_EQ(match[2], 1) << "worker 2's first token equals recompute";
  EXPECT_EQ(match[3], 1);
  EXPECT_EQ(Numbers(json, "g4_blocks_loaded_by_later_workers").at(0), g4[2] + g4[3]);
  std::filesystem::remove_all(dir);
}

}  // namespace

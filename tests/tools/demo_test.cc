// `kvtier demo` end to end on the real model (SmolLM2-135M-Instruct, fetched by
// scripts/fetch-model.sh): the JSON summary has its keys; the second user reuses the system
// prompt from G2; after each restart the whole prefix comes back from G3; every answer is
// readable text. Skipped when the model is absent, and under ASan/TSan (the real-model prefills
// take minutes there). Wall-clock TTFTs are not asserted here: they swing 2x between runs on a
// loaded machine (docs/demo.md); the demo's own "within_bound" check and its TTFT ratios are
// read from `kvtier demo` itself (the benchmark command), not from ctest.
#include <unistd.h>

#include <gtest/gtest.h>

#include <sys/wait.h>
#include "cli_run.h"

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace {

const char* kModelPath = KVTIER_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf";

// Runs `cmd`, returns its stdout and sets *rc to its exit status.
std::string RunCommand(const std::string& cmd, int* rc) {
  kvtier::cli_run::CliRun r = kvtier::cli_run::RunShell(cmd);
  *rc = r.exit_code;
  return r.out;
}

// Every value of `"key": <value>` in the flat-per-object JSON the demo prints (strings are
// returned unescaped for \" and \\ only; numbers and booleans as written).
std::vector<std::string> Values(const std::string& json, const std::string& key) {
  std::vector<std::string> values;
  const std::string needle = "\"" + key + "\": ";
  for (size_t at = json.find(needle); at != std::string::npos; at = json.find(needle, at + 1)) {
    size_t i = at + needle.size();
    std::string v;
    if (json[i] == '"') {
      for (++i; i < json.size() && json[i] != '"'; ++i) {
        if (json[i] == '\\' && i + 1 < json.size()) ++i;
        v += json[i];
      }
    } else {
      while (i < json.size() && json[i] != ',' && json[i] != '}') v += json[i++];
    }
    values.push_back(v);
  }
  return values;
}

TEST(DemoTest, TwoUsersThenARestartJson) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the demo prefills ~1,100-token prompts on the real model: minutes under "
                  "a sanitizer; run in the release build";
#endif
  if (!std::filesystem::exists(kModelPath)) {
    std::fprintf(stderr, "\n*** SKIPPING: %s is absent. Run scripts/fetch-model.sh. ***\n\n",
                 kModelPath);
    GTEST_SKIP() << "real model absent: run scripts/fetch-model.sh";
  }
  // A directory of its own: another checkout's test suite may run the demo at the same time,
  // and G3's directory lock would keep this one off G3.
  std::string tmpl = (std::filesystem::temp_directory_path() / "kvtier-demo-test-XXXXXX").string();
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const std::filesystem::path dir = tmpl;
  int rc = -1;
  const std::string json =
      RunCommand("cd " + dir.string() + " && " + KVTIER_CLI_PATH + " demo --model " + kModelPath +
                     " --users 2 --turns 1 --json --no-plot 2>/dev/null",
                 &rc);
  ASSERT_EQ(rc, 0) << json;
  ASSERT_FALSE(json.empty());
  EXPECT_EQ(json.front(), '{') << json;
  EXPECT_NE(json.find("\"turns\": ["), std::string::npos) << json;
  EXPECT_NE(json.find("\"summary\": {"), std::string::npos) << json;
  for (const char* key : {"ttft_ratio_g2", "ttft_ratio_g3", "overhead_no_reuse"}) {
    EXPECT_EQ(Values(json, key).size(), 1u) << key << " missing in " << json;
  }

  const auto users = Values(json, "user");
  const auto reused = Values(json, "reused_tokens");
  const auto sources = Values(json, "source");
  const auto answers = Values(json, "answer");
  ASSERT_EQ(users.size(), 4u) << json;
  ASSERT_EQ(reused.size(), 4u);
  ASSERT_EQ(sources.size(), 4u);
  ASSERT_EQ(answers.size(), 4u);
  const auto restarts = Values(json, "after_restart");
  const auto bounds = Values(json, "within_bound");
  ASSERT_EQ(restarts.size(), 4u);
  ASSERT_EQ(bounds.size(), 4u) << "the demo reports its TTFT check for every turn";
  for (size_t i = 0; i < 4; ++i) {
    // Turn 0 of user 0 has nothing to reuse; user 1's first turn shares the system prompt
    // (from G2); then kvtier restarts before each user returns, and the whole prefix comes
    // back from G3 (written there at the clean shutdown).
    if (i == 0) {
      EXPECT_EQ(sources[i], "none");
    } else {
      EXPECT_GT(std::stoul(reused[i]), 0u) << "turn " << i;
    }
    EXPECT_EQ(restarts[i], i >= 2 ? "true" : "false") << "turn " << i;
    if (i == 1) {
      EXPECT_EQ(sources[i], "G2");
    }
    if (i >= 2) {
      EXPECT_EQ(sources[i], "G3") << "turn " << i;
    }
    EXPECT_TRUE(bounds[i] == "true" || bounds[i] == "false") << "turn " << i << ": " << bounds[i];
    EXPECT_FALSE(answers[i].empty()) << "turn " << i;
    size_t letters = 0;
    for (char c : answers[i]) {
      EXPECT_TRUE(c == '\n' || (c >= 0x20 && c < 0x7f)) << "non-ASCII in: " << answers[i];
      letters += (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    }
    EXPECT_GE(letters * 2, answers[i].size()) << "not text: " << answers[i];
  }
  std::filesystem::remove_all(dir);
}

}  // namespace

// Helpers shared by the replay tests (replay_test.cc, replay_g4_test.cc): the sample traces, a
// temporary directory, and running the kvtier CLI with its JSON read back.
#pragma once

#include <stdlib.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "cli_run.h"
#include "sim/replay_trace.h"

namespace kvtier::cli::replay_testing {

// The sample traces under tests/data/.
inline const std::string kData = std::string(KVTIER_SOURCE_DIR) + "/tests/data/";

// A fresh directory under /tmp, removed with everything in it when the object goes.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/kvtier-replay-test-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) ADD_FAILURE() << "mkdtemp failed";
    path_ = tmpl;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// tests/data/<file>, format detected; a test failure (and an empty trace) when it does not load.
inline ReplayTrace Load(const std::string& file, uint32_t tpb) {
  auto t = ReplayTrace::Load(kData + file, "auto", tpb);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(*t) : ReplayTrace();
}

using cli_run::CliRun;
using cli_run::RunShell;

// The kvtier CLI with `args`: stdout only (the JSON), or stdout and stderr together.
inline CliRun Kvtier(const std::string& args) {
  return RunShell(std::string(KVTIER_CLI_PATH) + " " + args + " 2>/dev/null");
}
inline CliRun KvtierAll(const std::string& args) {
  return RunShell(std::string(KVTIER_CLI_PATH) + " " + args + " 2>&1");
}

// The number after the first "key": at or after `from` (a test failure and NaN when missing).
inline double JsonNumber(const std::string& json, const std::string& key, size_t from = 0) {
  const std::string k = "\"" + key + "\": ";
  const size_t at = json.find(k, from);
  if (at == std::string::npos) {
    ADD_FAILURE() << key << " missing in " << json;
    return std::nan("");
  }
  return std::strtod(json.c_str() + at + k.size(), nullptr);
}

// The string value of the first "key" ("" when missing).
inline std::string JsonString(const std::string& json, const std::string& key) {
  const std::string k = "\"" + key + "\": \"";
  const size_t at = json.find(k);
  if (at == std::string::npos) return "";
  const size_t end = json.find('"', at + k.size());
  return json.substr(at + k.size(), end - at - k.size());
}

}  // namespace kvtier::cli::replay_testing

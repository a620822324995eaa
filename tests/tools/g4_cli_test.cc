// The G4 settings in `kvtier config`: listed, validated, and the Redis password never printed.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include "cli_run.h"

#include <cstdio>
#include <string>

namespace {

std::string RunCommand(const std::string& cmd, int* rc) {
  kvtier::cli_run::CliRun r = kvtier::cli_run::RunShell(cmd);
  *rc = r.exit_code;
  return r.out;
}

TEST(G4Cli, ConfigListsG4AndNeverPrintsThePassword) {
  int rc = -1;
  const std::string cmd =
      std::string("KVTIER_G4_PASSWORD=hunter2-secret KVTIER_G4_BACKEND=redis ") + KVTIER_CLI_PATH +
      " config";
  std::string out = RunCommand(cmd + " 2>&1", &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("g4.lookup_deadline_ms"), std::string::npos) << out;
  EXPECT_NE(out.find("(set)"), std::string::npos) << out;
  EXPECT_EQ(out.find("hunter2-secret"), std::string::npos) << "the password leaked: " << out;
  out = RunCommand(cmd + " --json 2>&1", &rc);
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(out.find("hunter2-secret"), std::string::npos) << "the password leaked: " << out;
  // A backend that does not exist is refused, naming the choices.
  out = RunCommand(std::string("KVTIER_G4_BACKEND=s3 ") + KVTIER_CLI_PATH + " config 2>&1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("g4.backend"), std::string::npos) << out;
}

}  // namespace

// Running a shell command from a test (mostly the kvtier CLI) and reading what it printed.
#pragma once

#include <stdio.h>
#include <sys/wait.h>

#include <string>

namespace kvtier::cli_run {

struct CliRun {
  int exit_code;  // -1 when the command could not start or did not exit normally
  std::string out;
};

// Runs `command` with /bin/sh and returns its stdout (redirect stderr in the command to see it)
// and its exit code.
inline CliRun RunShell(const std::string& command) {
  CliRun r{-1, ""};
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace kvtier::cli_run

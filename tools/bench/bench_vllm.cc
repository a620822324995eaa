// kvtier bench vllm: vLLM on this machine, alone and with KV connectors (vLLM's
// ExampleConnector, kvtier on G2, kvtier on G2 + G3), on a multi-round chat. The work is a
// Python program in the cached vLLM environment (tools/vllm/bench_vllm.py, started by
// tools/vllm/run_bench.sh); this command finds and runs it with the caller's flags.
// kvtier bench pd: disaggregated prefill/decode through kvtier vs colocated vLLM on a mixed
// workload (tools/vllm/bench_pd.py, started by tools/vllm/run_bench_pd.sh), the same way.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"

// CMake defines both for the kvtier target (CMakeLists.txt); the fallbacks let a tool that
// compiles this file alone (the thread-safety check) see a complete translation unit.
#ifndef KVTIER_SOURCE_DIR
#define KVTIER_SOURCE_DIR "."
#endif
#ifndef KVTIER_BINARY_DIR
#define KVTIER_BINARY_DIR "./build"
#endif

namespace kvtier::cli {

namespace {

// Execs `bash tools/vllm/SCRIPT --build-dir BUILD argv[first..argc)`; `what` names the command
// in messages. Returns only when it cannot (1).
int ExecBenchScript(const char* what, const char* script_name, int argc, char** argv, int first) {
  const std::string script = std::string(KVTIER_SOURCE_DIR) + "/tools/vllm/" + script_name;
  if (access(script.c_str(), R_OK) != 0) {
    std::fprintf(stderr,
                 "%s: %s is missing: this command runs from a kvtier source tree "
                 "(it needs the repository's scripts and Python programs)\n",
                 what, script.c_str());
    return 1;
  }
  std::vector<char*> exec_argv;
  std::string bash = "bash";
  exec_argv.push_back(bash.data());
  std::string s = script;
  exec_argv.push_back(s.data());
  std::string build_flag = "--build-dir";
  std::string build_dir = KVTIER_BINARY_DIR;
  exec_argv.push_back(build_flag.data());
  exec_argv.push_back(build_dir.data());
  for (int i = first; i < argc; ++i) exec_argv.push_back(argv[i]);
  exec_argv.push_back(nullptr);
  execvp("bash", exec_argv.data());
  std::perror((std::string(what) + ": exec bash").c_str());
  return 1;
}

}  // namespace

int ExecBenchVllm(int argc, char** argv, int first) {
  return ExecBenchScript("kvtier bench vllm", "run_bench.sh", argc, argv, first);
}

int ExecBenchPd(int argc, char** argv, int first) {
  return ExecBenchScript("kvtier bench pd", "run_bench_pd.sh", argc, argv, first);
}

}  // namespace kvtier::cli

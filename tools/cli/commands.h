// The subcommands of the `kvtier` tool. Each returns the process exit code: 0 on success,
// 1 when the work failed, 2 for a usage error (with a message on stderr saying what to fix),
// 3 (kExitUnavailable) when a device the command needs cannot be used on this machine (e.g.
// `kvtier bench copy --device cuda` without a usable GPU, or in a build without CUDA).
#pragma once

#include "cli/cli_args.h"

namespace kvtier::cli {

inline constexpr int kExitUnavailable = 3;

int RunBenchCopy(const CliArgs& args);      // kvtier bench copy
int RunBenchCopyCuda(const CliArgs& args);  // kvtier bench copy --device cuda
int RunBenchIndex(const CliArgs& args);     // kvtier bench index
int RunBenchArena(const CliArgs& args);     // kvtier bench arena
int RunKeys(const CliArgs& args);           // kvtier keys
int RunConfig(const CliArgs& args);         // kvtier config
int RunBenchManager(const CliArgs& args);   // kvtier bench manager
int RunBenchDisk(const CliArgs& args);      // kvtier bench disk
int RunInspect(const CliArgs& args);        // kvtier inspect DIR
int RunSim(const CliArgs& args);            // kvtier sim --trace FILE
int RunGenTrace(const CliArgs& args);       // kvtier gen-trace --preset P --out FILE
int RunDemo(const CliArgs& args);           // kvtier demo
int RunReplayCommand(const CliArgs& args);  // kvtier replay --trace FILE
int RunDemoWorkers(const CliArgs& args);    // kvtier demo --workers N (tools/demo/demo_workers.cc)
int RunBenchRemote(const CliArgs& args);    // kvtier bench remote
int RunBenchEvents(const CliArgs& args);    // kvtier bench events
int RunBenchService(const CliArgs& args);   // kvtier bench service
int RunBenchHandoff(const CliArgs& args);   // kvtier bench handoff (P/D, docs/pd.md)
int RunServe(const CliArgs& args);          // kvtier serve (tools/cli/serve_command.cc)
int RunTop(const CliArgs& args);            // kvtier top URL... (tools/cli/top_command.cc)
// kvtier bench vllm: execs tools/vllm/run_bench.sh with argv[first..argc) (the Python program
// parses its own flags). Returns only when it cannot start it (1).
int ExecBenchVllm(int argc, char** argv, int first);
// kvtier bench pd: the same, with tools/vllm/run_bench_pd.sh (docs/pd.md).
int ExecBenchPd(int argc, char** argv, int first);
// kvtier router: execs `PYTHON -m kvtier.router` with this build's package (build/python) and
// argv[first..argc) (PYTHON: the build's interpreter, or --python PATH). Returns only when it
// cannot start it (1; 2 for a --python without a path).
int ExecRouter(int argc, char** argv, int first);

}  // namespace kvtier::cli

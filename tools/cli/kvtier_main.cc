// `kvtier`: the command-line tool. Dispatches `kvtier <command> [<subcommand>] [flags]` to the
// functions declared in commands.h.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli/cli_args.h"
#include "cli/commands.h"

namespace kvtier::cli {
namespace {

struct Command {
  std::vector<std::string> words;  // e.g. {"bench", "copy"}
  const char* summary;
  int (*run)(const CliArgs&);
};

const std::vector<Command>& Commands() {
  static const std::vector<Command> kCommands = {
      {{"bench", "copy"},
       "G1 <-> G2 block copies vs plain memcpy (--device cuda: GPU <-> pinned G2 vs cudaMemcpy)",
       RunBenchCopy},
      {{"bench", "index"},
       "hash a 131,072-token prompt, and hash + match it in the index",
       RunBenchIndex},
      {{"bench", "arena"},
       "G2 arena start-up vs a plain parallel first touch of the same bytes",
       RunBenchArena},
      {{"bench", "disk"},
       "G3 block writes and random reads (O_DIRECT, io_uring) vs fio",
       RunBenchDisk},
      {{"inspect"}, "report the blocks, bytes and corrupt blocks of a G3 directory", RunInspect},
      {{"bench", "manager"},
       "the BlockManager end to end: lookups, saves, loads from G2/G3, Commit latency",
       RunBenchManager},
      {{"keys"}, "print the block keys of a token sequence", RunKeys},
      {{"sim"}, "replay a block trace through one tier per eviction policy vs Belady", RunSim},
      {{"gen-trace"},
       "write a synthetic Mooncake-format workload from a named preset",
       RunGenTrace},
      {{"replay"},
       "replay a trace through the real manager and tiers: hit ratio, TTFT estimate, vs Belady",
       RunReplayCommand},
      {{"demo"},
       "multi-turn chat on the real model: TTFT recompute vs kvtier, reuse from G2 and G3",
       RunDemo},
      {{"bench", "service"},
       "Lookup of a 131,072-token prompt attached (kvtier serve) vs embedded",
       RunBenchService},
      {{"bench", "handoff"},
       "P/D handoff of a prefilled prompt: shared G2 vs memcpy, Redis G4 vs redis-benchmark GET",
       RunBenchHandoff},
      {{"serve"},
       "one kvtier per host: the daemon engines attach to (service.socket), shared G2 and G3",
       RunServe},
      {{"config"}, "print the effective configuration and where each value came from", RunConfig},
      {{"top"},
       "live view of running kvtier processes from their /metrics (KVTIER_METRICS_PORT)",
       RunTop},
      {{"bench", "remote"},
       "G4 Redis put/get throughput (pipelined batches) vs redis-benchmark SET/GET",
       RunBenchRemote},
      {{"bench", "events"},
       "KV events through the publisher (msgpack, ZMQ PUB) vs a raw ZMQ PUB send loop",
       RunBenchEvents},
      // Runs a Python program with its own flags: dispatched in main() before CliArgs.
      {{"bench", "vllm"},
       "vLLM (CPU) alone vs ExampleConnector vs kvtier on G2 and G2+G3: TTFT, multi-round chat",
       nullptr},
      {{"bench", "pd"},
       "1P1D through kvtier (one host; two hosts over Redis G4) vs colocated vLLM: TTFT, ITL",
       nullptr},
      {{"router"},
       "OpenAI-compatible proxy over vLLM workers: each request to the lowest estimated TTFT",
       nullptr},
  };
  return kCommands;
}

void PrintHelp(FILE* out) {
  std::fprintf(out,
               "kvtier: a KV-cache manager for LLM inference (G1 device, G2 DRAM, G3 SSD, G4 "
               "shared storage)\n\n"
               "usage: kvtier <command> [flags]      (add --json for machine-readable output)\n\n"
               "commands:\n");
  for (const Command& c : Commands()) {
    std::string name;
    for (const auto& w : c.words) name += (name.empty() ? "" : " ") + w;
    std::fprintf(out, "  %-14s %s\n", name.c_str(), c.summary);
  }
  std::fprintf(out, "\n`kvtier <command> --help` describes a command's flags.\n");
}

int Main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    PrintHelp(stdout);
    return argc < 2 ? 2 : 0;
  }
  if (argc >= 3 && std::strcmp(argv[1], "bench") == 0 && std::strcmp(argv[2], "vllm") == 0) {
    return ExecBenchVllm(argc, argv, 3);
  }
  if (argc >= 3 && std::strcmp(argv[1], "bench") == 0 && std::strcmp(argv[2], "pd") == 0) {
    return ExecBenchPd(argc, argv, 3);
  }
  if (std::strcmp(argv[1], "router") == 0) return ExecRouter(argc, argv, 2);
  for (const Command& c : Commands()) {
    if (static_cast<size_t>(argc - 1) < c.words.size() || c.run == nullptr) continue;
    bool match = true;
    for (size_t i = 0; i < c.words.size(); ++i) match = match && c.words[i] == argv[1 + i];
    if (!match) continue;
    auto args =
        CliArgs::Parse(argc, argv, 1 + static_cast<int>(c.words.size()),
                       {"json", "help", "headers-only", "no-fio", "keep", "no-plot", "cluster",
                        "no-redis-benchmark", "compare-belady", "sweep", "g4-warm", "describe",
                        "list", "once", "metrics-compare", "shared", "no-g4"});
    if (!args.ok()) {
      std::fprintf(stderr, "kvtier: %s\n", args.status().message().c_str());
      return 2;
    }
    return c.run(*args);
  }
  std::string given;
  for (int i = 1; i < argc && i < 3; ++i)
    given += (given.empty() ? "" : " ") + std::string(argv[i]);
  std::fprintf(stderr, "kvtier: unknown command '%s'\n\n", given.c_str());
  PrintHelp(stderr);
  return 2;
}

}  // namespace
}  // namespace kvtier::cli

// The last safety net: every input error has its own message and exit code on its own path;
// an exception that still escapes one (a library's, on input nobody foresaw) is reported in one
// line and exits 2 instead of aborting with a core dump.
int main(int argc, char** argv) {
  try {
    // The test suite's way to reach this net (tests/tools/cli_refusals_test.cc): no input does now.
    if (std::getenv("KVTIER_TEST_THROW_IN_MAIN") != nullptr) {
      throw std::runtime_error("KVTIER_TEST_THROW_IN_MAIN is set");
    }
    return kvtier::cli::Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr,
                 "kvtier: stopped by an unexpected error: %s; check the command's inputs "
                 "(kvtier <command> --help) and report it if they are right\n",
                 e.what());
    return 2;
  }
}

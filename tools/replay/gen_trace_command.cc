// kvtier gen-trace: writes a synthetic workload in the Mooncake trace format from a named preset
// (docs/workloads.md); the generator is tools/replay/trace_gen.h.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>

#include "cli/commands.h"
#include "replay/trace_gen.h"

namespace kvtier::cli {

namespace {

void PrintGenTraceHelp() {
  std::string presets;
  for (const replay::TracePreset& p : replay::TracePresets()) {
    presets += "    " + p.name + std::string(p.name.size() < 18 ? 18 - p.name.size() : 1, ' ') +
               p.summary + "\n";
  }
  std::printf(
      "usage: kvtier gen-trace --preset P [--seed S] [--requests N] [--param KEY=VALUE]...\n"
      "                        --out FILE\n"
      "       kvtier gen-trace --preset P [--param KEY=VALUE]... --describe\n"
      "       kvtier gen-trace --list\n"
      "  Writes a synthetic KV-cache workload as Mooncake JSONL (timestamp ms, input_length,\n"
      "  output_length, prefix-chained hash_ids of 512-token blocks), for kvtier sim / replay.\n"
      "  Same preset, seed and parameters: the same bytes, on every machine.\n"
      "\n"
      "  --preset P          one of the presets below (required)\n"
      "  --seed S            random seed, an unsigned integer (default 1)\n"
      "  --requests N        requests to write (default: the preset's)\n"
      "  --param KEY=VALUE   override one workload parameter (--describe lists them)\n"
      "  --out FILE          where to write the trace (required unless --describe; - = stdout)\n"
      "  --describe          print the preset's parameters and exit\n"
      "  --list              print the presets and exit\n"
      "\n"
      "  presets:\n%s",
      presets.c_str());
}

}  // namespace

int RunGenTrace(const CliArgs& args) {
  if (args.Has("help")) {
    PrintGenTraceHelp();
    return 0;
  }
  if (Status s = args.CheckKnown(
          {"help", "preset", "seed", "requests", "param", "out", "describe", "list"});
      !s.ok()) {
    return UsageError(s);
  }
  if (!args.positional().empty()) {
    return UsageError(Status::InvalidArgument("gen-trace takes no positional argument, got '" +
                                              args.positional().front() + "'"));
  }
  if (args.Has("list")) {
    for (const replay::TracePreset& p : replay::TracePresets()) {
      std::printf("%-18s %s\n", p.name.c_str(), p.summary.c_str());
    }
    return 0;
  }
  if (!args.Has("preset")) {
    return UsageError(Status::InvalidArgument(
        "--preset P is required (kvtier gen-trace --list shows the presets)"));
  }
  auto preset = replay::FindTracePreset(args.GetString("preset", ""));
  if (!preset.ok()) return UsageError(preset.status());
  replay::TraceParams params = preset->params;
  if (args.Has("requests")) {
    auto n = args.GetUint("requests", 0);
    if (!n.ok()) return UsageError(n.status());
    params.requests = *n;
  }
  for (const std::string& kv : args.GetAll("param")) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      return UsageError(Status::InvalidArgument("--param '" + kv + "': expected KEY=VALUE"));
    }
    if (Status s = replay::SetTraceParam(params, kv.substr(0, eq), kv.substr(eq + 1)); !s.ok()) {
      return UsageError(Status::InvalidArgument("--param " + s.message()));
    }
  }
  if (Status s = params.Validate(); !s.ok()) {
    return UsageError(Status::InvalidArgument("preset " + preset->name + ": " + s.message()));
  }
  auto seed = args.GetUint("seed", 1);
  if (!seed.ok()) return UsageError(seed.status());
  if (args.Has("describe")) {
    std::printf("preset %s: %s\n%s", preset->name.c_str(), preset->summary.c_str(),
                replay::DescribeTraceParams(params).c_str());
    return 0;
  }
  if (!args.Has("out")) {
    return UsageError(Status::InvalidArgument("--out FILE is required (- for stdout)"));
  }
  const std::string path = args.GetString("out", "");
  if (path == "-") {
    std::ostream& out = std::cout;
    if (Status s = replay::GenerateTrace(params, *seed, out); !s.ok()) return Failure(s);
    return 0;
  }
  // The trace is written beside `path` and renamed over it: a FIFO or a device node there would
  // be replaced (as root, `--out /dev/null` replaced /dev/null with a regular file).
  if (Status s = CheckOutputFile("out", path); !s.ok()) return UsageError(s);
  // A fresh name (O_EXCL), so no file already under it (a FIFO: the open would block) is used.
  std::string tmp = path + ".tmp.XXXXXX";
  const int tmp_fd = mkstemp(tmp.data());
  if (tmp_fd < 0) {
    return Failure(Status::IOError("cannot create " + tmp + ": " + std::strerror(errno)));
  }
  const mode_t mask = umask(0);  // mkstemp makes it 0600; a trace is as readable as any file
  umask(mask);
  fchmod(tmp_fd, 0666 & ~mask);
  ::close(tmp_fd);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      const int err = errno;
      std::remove(tmp.c_str());
      return Failure(Status::IOError("cannot write " + tmp + ": " + std::strerror(err)));
    }
    if (Status s = replay::GenerateTrace(params, *seed, out); !s.ok()) {
      std::remove(tmp.c_str());
      return Failure(Status::IOError(path + ": " + s.message()));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return Failure(
        Status::IOError("cannot rename " + tmp + " to " + path + ": " + std::strerror(err)));
  }
  return 0;
}

}  // namespace kvtier::cli

// `kvtier replay --workers N --router R` (docs/router.md): the multi-worker replay's flags and
// output; replay_command.cc hands over to it once the single-worker flags are parsed.
#pragma once

#include <string>

#include "cli/cli_args.h"
#include "replay/replay_runner.h"
#include "sim/replay_trace.h"

namespace kvtier::cli {

// Runs `--router R` (or every router for `--router all`) over `--workers N` workers, each
// with `replay`'s G2/G3 slots (per worker) and its G4 (shared). Prints a table, or with --json
// one object (several routers: {"runs": [...]} and the kvtier router's TTFT ratios). Returns the
// exit code: 0; 2 for a bad flag (saying which); 1 when a run fails or a loaded block differs.
int RunMultiWorkerCommand(const CliArgs& args, const ReplayTrace& trace,
                          const std::string& trace_path, const ReplayOptions& replay);

}  // namespace kvtier::cli

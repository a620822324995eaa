// --credit-lru KEY=VALUE, the repeatable flag of `kvtier sim` and `kvtier replay` that sets
// credit-lru's settings (CreditLruConfig, src/index/eviction_policy.h) for one run. KEY is a
// field name (used_twice, used_thrice, long_follow_up, stale_tail, ghost_factor), as in the
// config keys gN.credit_lru.KEY; later flags override earlier ones.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "cli/cli_args.h"
#include "index/eviction_policy.h"

namespace kvtier::cli {

// The --credit-lru settings of a command line: the resulting config (defaults where no flag
// set a field) and the flags' settings in order, each as (KEY, normalized value text).
struct CreditLruFlags {
  CreditLruConfig config;
  std::vector<std::pair<std::string, std::string>> given;
};

// Parses every --credit-lru of `args`. InvalidArgument (a usage error), quoting the flag and
// saying what to write, for a value that is not KEY=VALUE, an unknown KEY (listing the keys),
// a VALUE that is not a number, or one that is out of range or not finite (with the range).
Result<CreditLruFlags> ParseCreditLruFlags(const CliArgs& args);

// The settings as one JSON object: {"used_twice": 0.75, ..., "ghost_factor": 4}.
std::string CreditLruJson(const CreditLruConfig& config);

// Help text lines for --credit-lru, descriptions starting at `column` (the command's layout).
std::string CreditLruFlagsHelp(size_t column);

}  // namespace kvtier::cli

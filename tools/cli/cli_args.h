// Command-line arguments of the `kvtier` tool: positional words and --flags.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvtier/status.h"

namespace kvtier::cli {

// Parsed form of `kvtier <words...> [--flag[=value] | --flag value]...`. A flag followed by a
// word that does not start with "--" takes it as its value unless the flag is declared boolean
// by the command (see Parse).
class CliArgs {
 public:
  // Parses argv[first..argc). `boolean_flags` are flags that never take a value (e.g. "json").
  static Result<CliArgs> Parse(int argc, char** argv, int first,
                               const std::vector<std::string>& boolean_flags);

  const std::vector<std::string>& positional() const { return positional_; }
  bool Has(std::string_view flag) const;
  // The flag's value, or `fallback` when absent.
  std::string GetString(std::string_view flag, std::string fallback) const;
  // Every value given to a repeatable flag, in command-line order (empty when absent). The
  // single-value getters above see only the last one.
  std::vector<std::string> GetAll(std::string_view flag) const;
  // The flag's value as an unsigned integer (accepts K/M/G/KiB/MiB/GiB suffixes as powers of
  // 1024), or `fallback` when absent; InvalidArgument naming the flag when malformed.
  Result<uint64_t> GetUint(std::string_view flag, uint64_t fallback) const;
  Result<double> GetDouble(std::string_view flag, double fallback) const;
  // InvalidArgument naming the first flag that is not in `known` (typos must not pass silently).
  Status CheckKnown(const std::vector<std::string>& known) const;

 private:
  std::vector<std::string> positional_;
  std::map<std::string, std::string, std::less<>> flags_;
  std::vector<std::pair<std::string, std::string>> in_order_;  // every flag given, with repeats
};

// Prints "kvtier: <message>" to stderr and returns 2, the exit code of a usage error.
int UsageError(const Status& status);
// Prints "kvtier: <status>" to stderr and returns 1, the exit code of failed work.
int Failure(const Status& status);

// Parses "123", "4K", "2MiB", "1G" (powers of 1024). InvalidArgument otherwise.
Result<uint64_t> ParseSize(std::string_view text);

}  // namespace kvtier::cli

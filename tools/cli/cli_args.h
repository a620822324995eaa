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
  // InvalidArgument for an empty flag name ("--=x"). A flag that needs a value and has none
  // (the last word, or followed by another --flag) is not an error here: CheckKnown reports it,
  // after unknown flags, so a typo at the end of the line is named as unknown, not as valueless.
  static Result<CliArgs> Parse(int argc, char** argv, int first,
                               const std::vector<std::string>& boolean_flags);

  const std::vector<std::string>& positional() const { return positional_; }
  // True when the flag was given with its value (or is boolean and given).
  bool Has(std::string_view flag) const;
  // True when the flag was given, with or without its value: for dispatching to the command
  // whose CheckKnown then names a missing value.
  bool Named(std::string_view flag) const;
  // The flag's value, or `fallback` when absent.
  std::string GetString(std::string_view flag, std::string fallback) const;
  // Every value given to a repeatable flag, in command-line order (empty when absent). The
  // single-value getters above see only the last one.
  std::vector<std::string> GetAll(std::string_view flag) const;
  // The flag's value as an unsigned integer (accepts K/M/G/KiB/MiB/GiB suffixes as powers of
  // 1024), or `fallback` when absent; InvalidArgument naming the flag when malformed.
  Result<uint64_t> GetUint(std::string_view flag, uint64_t fallback) const;
  // The flag's value as a finite real number, or `fallback` when absent; InvalidArgument naming
  // the flag when it is not a number, or is nan, inf or out of double's range.
  Result<double> GetDouble(std::string_view flag, double fallback) const;
  // InvalidArgument naming the first flag that is not in `known` (typos must not pass silently);
  // then InvalidArgument naming the first flag that was given without its value. Every command
  // calls it before reading a flag.
  Status CheckKnown(const std::vector<std::string>& known) const;

 private:
  std::vector<std::string> positional_;
  std::map<std::string, std::string, std::less<>> flags_;
  std::vector<std::pair<std::string, std::string>> in_order_;  // every flag given, with repeats
  // Flags given without their value, in command-line order (not in flags_: Has() is false).
  std::vector<std::string> valueless_;
};

// Prints "kvtier: <message>" to stderr and returns 2, the exit code of a usage error.
int UsageError(const Status& status);
// Prints "kvtier: <status>" to stderr and returns 1, the exit code of failed work.
int Failure(const Status& status);

// Checks `path`, given by --`flag`, as a file the command is about to write (replacing it when
// it exists): InvalidArgument when it is empty, names something that is not a regular file (a
// directory; a FIFO or a device, which a rename over it would replace: as root even /dev/null),
// or lies in a directory that does not exist; each message says what to give instead.
Status CheckOutputFile(std::string_view flag, const std::string& path);

// Parses "123", "4K", "2MiB", "1G" (powers of 1024). InvalidArgument otherwise.
Result<uint64_t> ParseSize(std::string_view text);

}  // namespace kvtier::cli

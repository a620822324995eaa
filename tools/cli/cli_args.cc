#include "cli/cli_args.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "core/regular_file.h"
#include "kvtier/config.h"

namespace kvtier::cli {

Result<CliArgs> CliArgs::Parse(int argc, char** argv, int first,
                               const std::vector<std::string>& boolean_flags) {
  CliArgs args;
  for (int i = first; i < argc; ++i) {
    std::string word = argv[i];
    if (word.rfind("--", 0) != 0 || word == "--") {
      args.positional_.push_back(word);
      continue;
    }
    std::string name = word.substr(2);
    std::string value;
    const size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else if (std::find(boolean_flags.begin(), boolean_flags.end(), name) != boolean_flags.end()) {
      value = "true";
    } else if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
      value = argv[++i];
    } else if (!name.empty()) {
      args.valueless_.push_back(name);
      continue;
    }
    if (name.empty()) return Status::InvalidArgument("empty flag name in '" + word + "'");
    args.flags_[name] = value;
    args.in_order_.emplace_back(name, value);
  }
  return args;
}

bool CliArgs::Has(std::string_view flag) const { return flags_.find(flag) != flags_.end(); }

bool CliArgs::Named(std::string_view flag) const {
  return Has(flag) || std::find(valueless_.begin(), valueless_.end(), flag) != valueless_.end();
}

std::string CliArgs::GetString(std::string_view flag, std::string fallback) const {
  auto it = flags_.find(flag);
  return it == flags_.end() ? fallback : it->second;
}

std::vector<std::string> CliArgs::GetAll(std::string_view flag) const {
  std::vector<std::string> values;
  for (const auto& [name, value] : in_order_) {
    if (name == flag) values.push_back(value);
  }
  return values;
}

Result<uint64_t> CliArgs::GetUint(std::string_view flag, uint64_t fallback) const {
  auto it = flags_.find(flag);
  if (it == flags_.end()) return fallback;
  Result<uint64_t> v = ParseSize(it->second);
  if (!v.ok()) {
    return Status::InvalidArgument("--" + std::string(flag) + ": " + v.status().message());
  }
  return v;
}

Result<double> CliArgs::GetDouble(std::string_view flag, double fallback) const {
  auto it = flags_.find(flag);
  if (it == flags_.end()) return fallback;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(it->second.c_str(), &end);
  if (errno != 0 || end == it->second.c_str() || *end != '\0') {
    return Status::InvalidArgument("--" + std::string(flag) + " = '" + it->second +
                                   "' is not a number");
  }
  // strtod reads "nan" and "inf"; no flag means either, and a nan passes every range check.
  if (!std::isfinite(v)) {
    return Status::InvalidArgument("--" + std::string(flag) + " = '" + it->second +
                                   "' is not a finite number");
  }
  return v;
}

Status CliArgs::CheckKnown(const std::vector<std::string>& known) const {
  auto unknown = [&](const std::string& name) {
    std::string list;
    for (const auto& k : known) list += (list.empty() ? "--" : ", --") + k;
    return Status::InvalidArgument("unknown flag --" + name + "; this command takes " +
                                   (list.empty() ? "no flags" : list));
  };
  for (const auto& [name, value] : flags_) {
    if (std::find(known.begin(), known.end(), name) == known.end()) return unknown(name);
  }
  for (const std::string& name : valueless_) {
    if (std::find(known.begin(), known.end(), name) == known.end()) return unknown(name);
  }
  if (!valueless_.empty()) {
    const std::string& name = valueless_.front();
    return Status::InvalidArgument("flag --" + name + " needs a value (--" + name + " VALUE or --" +
                                   name + "=VALUE)");
  }
  return Status::Ok();
}

int UsageError(const Status& status) {
  std::fprintf(stderr, "kvtier: %s\n", status.message().c_str());
  return 2;
}

int Failure(const Status& status) {
  std::fprintf(stderr, "kvtier: %s\n", status.ToString().c_str());
  return 1;
}

Status CheckOutputFile(std::string_view flag, const std::string& path) {
  const std::string f = "--" + std::string(flag);
  if (path.empty()) return Status::InvalidArgument(f + " needs a file name");
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) {
      return Status::InvalidArgument(f + " " + path + " is " + FileKindName(st.st_mode) +
                                     ", not a regular file; give the path of a file to write");
    }
    return Status::Ok();
  }
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (parent.empty()) parent = ".";
  if (::stat(parent.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Status::InvalidArgument(f + " " + path + ": " + parent.string() +
                                   " is not an existing directory; create it or give another "
                                   "path");
  }
  return Status::Ok();
}

Result<uint64_t> ParseSize(std::string_view text) {
  Result<uint64_t> v = ParseByteSize(text);
  if (!v.ok()) {
    return Status::InvalidArgument("'" + std::string(text) + "' is " + v.status().message() +
                                   "; write digits with an optional K, M, G, T (or KiB, MiB, "
                                   "GiB, TiB) suffix");
  }
  return v;
}

}  // namespace kvtier::cli

// kvtier config: the effective configuration, and where each value came from.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cli/commands.h"
#include "cli/json_writer.h"
#include "kvtier/config.h"

namespace kvtier::cli {
namespace {

// "2GiB" when the size is a whole number of a binary unit, else plain bytes.
std::string HumanBytes(const std::string& bytes_text) {
  const uint64_t v = std::strtoull(bytes_text.c_str(), nullptr, 10);
  static const char* const kUnits[] = {"TiB", "GiB", "MiB", "KiB"};
  for (int i = 0; i < 4; ++i) {
    const uint64_t unit = 1ull << (10 * (4 - i));
    if (v != 0 && v % unit == 0) return std::to_string(v / unit) + kUnits[i];
  }
  return bytes_text;
}

}  // namespace

namespace {
// Secrets (g4.password) are never printed: "(set)" or empty.
std::string Shown(const ConfigEntry& e) {
  const std::string& n = e.spec->name;
  const bool secret = n.size() >= 8 && n.compare(n.size() - 8, 8, "password") == 0;
  return secret && !e.value.empty() ? "(set)" : e.value;
}
}  // namespace

int RunConfig(const CliArgs& args) {
  if (args.Has("help")) {
    std::printf(
        "usage: kvtier config [--config FILE] [--json]\n"
        "  Prints every setting, its effective value and its source: default, file (with the\n"
        "  line), or env (KVTIER_<SECTION>_<KEY>). The file is --config, else $KVTIER_CONFIG.\n"
        "  Precedence: default < file < environment. Settings that have no effect (a\n"
        "  gN.credit_lru.* value while gN.policy is not credit-lru) are warned about on stderr.\n");
    return 0;
  }
  if (Status s = args.CheckKnown({"help", "json", "config"}); !s.ok()) return UsageError(s);
  Result<Config> config = LoadConfig(args.GetString("config", ""));
  if (!config.ok()) {
    if (args.Has("json")) {
      // A script that asked for JSON gets JSON, with the error.
      JsonObject o;
      o.Add("error", config.status().message());
      std::printf("%s\n", o.Str().c_str());
    }
    return UsageError(config.status());
  }
  for (const std::string& warning : config->Warnings()) {
    std::fprintf(stderr, "kvtier: warning: %s\n", warning.c_str());
  }
  if (args.Has("json")) {
    std::string arr = "[";
    bool first = true;
    for (const ConfigEntry& e : config->Entries()) {
      JsonObject o;
      o.Add("name", e.spec->name)
          .Add("value", Shown(e))
          .Add("source", ConfigSourceName(e.source))
          .Add("origin", e.origin)
          .Add("default", e.spec->default_value)
          .Add("doc", e.spec->doc);
      arr += (first ? "" : ", ") + o.Str();
      first = false;
    }
    std::printf("%s]\n", arr.c_str());
    return 0;
  }
  std::printf("%-28s %-14s %-30s %s\n", "setting", "value", "source", "what it is");
  for (const ConfigEntry& e : config->Entries()) {
    std::string source = ConfigSourceName(e.source);
    if (!e.origin.empty()) source += " " + e.origin;
    const std::string value = e.spec->type == ConfigType::kBytes ? HumanBytes(e.value) : Shown(e);
    std::printf("%-28s %-14s %-30s %s\n", e.spec->name.c_str(), value.c_str(), source.c_str(),
                e.spec->doc.c_str());
  }
  return 0;
}

}  // namespace kvtier::cli

#include "cli/credit_lru_flags.h"

#include <charconv>
#include <string_view>

#include "cli/json_writer.h"

namespace kvtier::cli {

namespace {

std::string Keys() {
  std::string keys;
  for (const char* k : CreditLruConfig::kFieldNames)
    keys += (keys.empty() ? "" : ", ") + std::string(k);
  return keys;
}

// The shortest text that reads back as `v`.
std::string Shortest(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}

Status FlagError(const std::string& value, const std::string& what) {
  return Status::InvalidArgument("--credit-lru '" + value + "': " + what);
}

}  // namespace

Result<CreditLruFlags> ParseCreditLruFlags(const CliArgs& args) {
  CreditLruFlags out;
  for (const std::string& setting : args.GetAll("credit-lru")) {
    const size_t eq = setting.find('=');
    if (eq == std::string::npos) {
      return FlagError(setting,
                       "expected KEY=VALUE (e.g. --credit-lru stale_tail=0); keys: " + Keys());
    }
    const std::string key = setting.substr(0, eq);
    std::string_view text = std::string_view(setting).substr(eq + 1);
    if (!out.config.Get(key).ok()) {
      return FlagError(setting, "unknown key '" + key + "'; keys: " + Keys());
    }
    if (!text.empty() && text[0] == '+') text.remove_prefix(1);
    double value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
      return FlagError(setting, "'" + std::string(text) +
                                    "' is not a number; give a finite number, e.g. " + key + "=0");
    }
    if (value == 0) value = 0;  // -0 reads as 0
    Status set = out.config.Set(key, value);
    if (!set.ok()) return FlagError(setting, set.message());
    // The other fields held valid values already, so a failure names this one.
    if (Status s = out.config.Validate(); !s.ok()) {
      return FlagError(setting, s.message() + "; change the value");
    }
    out.given.emplace_back(key, Shortest(value));
  }
  return out;
}

std::string CreditLruJson(const CreditLruConfig& config) {
  JsonObject o;
  for (const char* field : CreditLruConfig::kFieldNames) {
    // Shortest round-trip text, so the echo is exactly the value used (finite: validated).
    const double value = *config.Get(field);
    o.Raw(field, Shortest(value));
  }
  return o.Str();
}

std::string CreditLruFlagsHelp(size_t column) {
  const char* const lines[] = {"a setting of the credit-lru policy (repeatable): used_twice,",
                               "used_thrice, long_follow_up, stale_tail (credits, x capacity,",
                               "in [-64, 64]), ghost_factor (in [0, 64]); defaults and when to",
                               "change them: docs/policies.md (e.g. stale_tail=0)"};
  std::string text;
  std::string flag = "  --credit-lru KEY=VALUE";
  for (const char* line : lines) {
    text += flag;
    text.append(flag.size() < column ? column - flag.size() : 1, ' ');
    text += line;
    text += '\n';
    flag.clear();
  }
  return text;
}

}  // namespace kvtier::cli

#include "kvtier/config.h"

#include <fcntl.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>

#include "core/config_registry.h"
#include "core/regular_file.h"

extern char** environ;

namespace kvtier {

std::string ShortestNumberText(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}

namespace {

std::string ShortestText(double v) { return ShortestNumberText(v); }

std::string EnvName(std::string_view field) {
  std::string env = "KVTIER_";
  for (char c : field) env += c == '.' ? '_' : static_cast<char>(std::toupper(c));
  return env;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(c));
  return out;
}

}  // namespace

Result<uint64_t> ParseByteSize(std::string_view text) {
  if (text.empty() || text[0] < '0' || text[0] > '9') {
    return Status::InvalidArgument("not a size");
  }
  uint64_t value = 0;
  size_t i = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    const uint64_t d = static_cast<uint64_t>(text[i] - '0');
    if (value > (UINT64_MAX - d) / 10) return Status::InvalidArgument("too large");
    value = value * 10 + d;
  }
  std::string_view suffix = text.substr(i);
  int shift = -1;
  if (suffix.empty() || suffix == "B")
    shift = 0;
  else if (suffix == "K" || suffix == "KiB")
    shift = 10;
  else if (suffix == "M" || suffix == "MiB")
    shift = 20;
  else if (suffix == "G" || suffix == "GiB")
    shift = 30;
  else if (suffix == "T" || suffix == "TiB")
    shift = 40;
  if (shift < 0) return Status::InvalidArgument("unknown suffix '" + std::string(suffix) + "'");
  if (shift > 0 && value > (UINT64_MAX >> shift)) return Status::InvalidArgument("too large");
  return value << shift;
}

namespace {

// The registered tables (config_registry.h), and the schema made of them when it is first read.
struct Registry {
  std::vector<ConfigKeyTable> tables;
  bool frozen = false;
  std::vector<ConfigFieldSpec> schema;  // by table order, then table order
  std::vector<const ConfigKey*> keys;   // keys[i] registered schema[i]
};

Registry& TheRegistry() {
  static Registry registry;
  return registry;
}

// The registry, frozen: its schema made once (thread-safe: a function-local static).
const Registry& FrozenRegistry() {
  static const Registry& frozen = []() -> const Registry& {
    Registry& r = TheRegistry();
    r.frozen = true;
    std::stable_sort(
        r.tables.begin(), r.tables.end(),
        [](const ConfigKeyTable& a, const ConfigKeyTable& b) { return a.order < b.order; });
    for (const ConfigKeyTable& t : r.tables) {
      for (const ConfigKey& k : t.keys) {
        r.schema.push_back(k.spec);
        r.keys.push_back(&k);
      }
    }
    return r;
  }();
  return frozen;
}

[[noreturn]] void RegistryError(const std::string& what) {
  std::fprintf(stderr, "kvtier: internal error: %s\n", what.c_str());
  std::abort();
}

const ConfigFieldSpec* FindSpec(std::string_view name) {
  for (const ConfigFieldSpec& s : Config::Schema()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

// The registered key of `spec` (an element of Config::Schema()).
const ConfigKey& KeyOf(const ConfigFieldSpec& spec) {
  const Registry& r = FrozenRegistry();
  return *r.keys[static_cast<size_t>(&spec - r.schema.data())];
}

std::string Allowed(const ConfigFieldSpec& spec) {
  if (const ConfigKey& key = KeyOf(spec); !key.allowed.empty()) return key.allowed;
  switch (spec.type) {
    case ConfigType::kBytes:
      return "a size in bytes from " + std::to_string(spec.min) +
             (spec.max == UINT64_MAX ? "" : " to " + std::to_string(spec.max)) +
             ", with an optional K, M, G, T suffix (e.g. 4GiB)";
    case ConfigType::kUint:
      return "a whole number from " + std::to_string(spec.min) + " to " + std::to_string(spec.max);
    case ConfigType::kBool:
      return "true or false";
    case ConfigType::kString:
      return "any text";
    case ConfigType::kChoice: {
      std::string s = "one of";
      for (size_t i = 0; i < spec.choices.size(); ++i) s += (i ? ", " : " ") + spec.choices[i];
      return s;
    }
    case ConfigType::kDouble:
      return "a finite number from " + ShortestText(spec.real_min) + " to " +
             ShortestText(spec.real_max) + " (e.g. " + spec.default_value + ", the default)";
  }
  return "";
}

// Normalized text for `value` by the field's type alone, or why the type refuses it.
Result<std::string> NormalizeType(const ConfigFieldSpec& spec, std::string_view value) {
  switch (spec.type) {
    case ConfigType::kBytes:
    case ConfigType::kUint: {
      Result<uint64_t> v = ParseByteSize(value);
      if (!v.ok() || (spec.type == ConfigType::kUint &&
                      value.find_first_not_of("0123456789") != std::string_view::npos)) {
        return Status::InvalidArgument(
            "not " + std::string(spec.type == ConfigType::kUint ? "a whole number" : "a size"));
      }
      if (*v < spec.min || *v > spec.max) return Status::InvalidArgument("out of range");
      return std::to_string(*v);
    }
    case ConfigType::kBool: {
      const std::string l = Lower(value);
      if (l == "true" || l == "1" || l == "yes" || l == "on") return std::string("true");
      if (l == "false" || l == "0" || l == "no" || l == "off") return std::string("false");
      return Status::InvalidArgument("not a boolean");
    }
    case ConfigType::kString:
      // Empty is allowed only where the default is empty ("not set", e.g. g4.password).
      if (value.empty() && !spec.default_value.empty()) return Status::InvalidArgument("empty");
      return std::string(value);
    case ConfigType::kChoice:
      for (const auto& c : spec.choices) {
        if (c == value) return c;
      }
      return Status::InvalidArgument("not a known choice");
    case ConfigType::kDouble: {
      std::string_view text = value;
      if (!text.empty() && text[0] == '+') text.remove_prefix(1);
      double v = 0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
        return Status::InvalidArgument(ec == std::errc::result_out_of_range ? "out of range"
                                                                            : "not a number");
      }
      if (!std::isfinite(v)) return Status::InvalidArgument("not a finite number");
      if (v < spec.real_min || v > spec.real_max) return Status::InvalidArgument("out of range");
      return ShortestText(v == 0 ? 0.0 : v);  // -0 reads as 0
    }
  }
  return Status::Internal("unknown field type");
}

// Normalized text for `value`, or why the field refuses it: its type's checks, then its key's.
Result<std::string> Normalize(const ConfigFieldSpec& spec, std::string_view value) {
  KVTIER_ASSIGN_OR_RETURN(std::string text, NormalizeType(spec, value));
  if (const ConfigKey& key = KeyOf(spec); key.check != nullptr) {
    KVTIER_RETURN_IF_ERROR(key.check(text));
  }
  return text;
}

// Config::Set's refusal of `value` for `spec`.
Status Refusal(const ConfigFieldSpec& spec, std::string_view value, const Status& why,
               const std::string& where) {
  return Status::InvalidArgument(spec.name + " = '" + std::string(value) + "'" + where + " is " +
                                 why.message() + "; allowed: " + Allowed(spec));
}

// Config::Set's verdict on `value` for `spec`: the text to keep, or the refusal (`where`: the
// origin's words, " (from ...)" or empty). The key's screen first, then Normalize.
Result<std::string> Judge(const ConfigFieldSpec& spec, std::string_view value,
                          const std::string& where) {
  if (const ConfigKey& key = KeyOf(spec); key.screen != nullptr) {
    Result<bool> taken = key.screen(value);
    if (!taken.ok()) {
      return Status::InvalidArgument(spec.name + " = '" + std::string(value) + "'" + where + ": " +
                                     taken.status().message());
    }
    if (*taken) return std::string(value);
  }
  Result<std::string> v = Normalize(spec, value);
  if (!v.ok()) return Refusal(spec, value, v.status(), where);
  return v;
}

}  // namespace

void RegisterConfigKeys(ConfigKeyTable table) {
  Registry& r = TheRegistry();
  for (size_t i = 0; i < table.keys.size(); ++i) {
    const std::string& name = table.keys[i].spec.name;
    bool twice = false;
    for (size_t j = 0; j < i; ++j) twice = twice || table.keys[j].spec.name == name;
    for (const ConfigKeyTable& t : r.tables) {
      for (const ConfigKey& other : t.keys) twice = twice || other.spec.name == name;
    }
    if (twice) RegistryError("config key '" + name + "' is registered twice");
  }
  if (r.frozen) {
    RegistryError("config keys registered after the first Config was made (" +
                  (table.keys.empty() ? std::string("an empty table") : table.keys[0].spec.name) +
                  "): register them at static initialization");
  }
  r.tables.push_back(std::move(table));
}

Status CheckConfigValue(std::string_view name, std::string_view value) {
  const ConfigFieldSpec* spec = FindSpec(name);
  if (spec == nullptr) {
    return Status::InvalidArgument("unknown setting '" + std::string(name) + "'");
  }
  Result<std::string> v = Judge(*spec, value, "");
  return v.ok() ? Status::Ok() : v.status();
}

const char* ConfigSourceName(ConfigSource source) {
  switch (source) {
    case ConfigSource::kDefault:
      return "default";
    case ConfigSource::kFile:
      return "file";
    case ConfigSource::kEnvironment:
      return "env";
    case ConfigSource::kOverride:
      return "set";
  }
  return "?";
}

const std::vector<ConfigFieldSpec>& Config::Schema() { return FrozenRegistry().schema; }

Config::Config() {
  for (const ConfigFieldSpec& spec : Schema()) {
    Result<std::string> v = Normalize(spec, spec.default_value);
    if (!v.ok()) {
      std::fprintf(stderr, "kvtier: built-in default of %s is invalid: %s\n", spec.name.c_str(),
                   v.status().ToString().c_str());
      std::abort();
    }
    values_[spec.name] = Value{*v, ConfigSource::kDefault, ""};
  }
}

Status Config::Set(std::string_view name, std::string_view value, ConfigSource source,
                   std::string_view origin) {
  const std::string where = origin.empty() ? "" : " (from " + std::string(origin) + ")";
  const ConfigFieldSpec* spec = FindSpec(name);
  if (spec == nullptr) {
    std::string known;
    for (const auto& s : Schema()) known += (known.empty() ? "" : ", ") + s.name;
    return Status::InvalidArgument("unknown setting '" + std::string(name) + "'" + where +
                                   "; known settings: " + known);
  }
  Result<std::string> v = Judge(*spec, value, where);
  if (!v.ok()) return v.status();
  values_[spec->name] = Value{*v, source, std::string(origin)};
  return Status::Ok();
}

Status Config::LoadFile(const std::string& path) {
  // Read through one descriptor of a regular file: a directory, a FIFO or a device given by
  // mistake is refused by name (a directory used to parse as an empty file, silently).
  Result<int> fd = OpenRegularFile(path, O_RDONLY);
  if (!fd.ok()) {
    if (fd.status().Is(StatusCode::kNotFound)) {
      return Status::NotFound("config file " + path +
                              " cannot be opened: it does not exist; check the path (given by "
                              "--config or KVTIER_CONFIG)");
    }
    return Status(fd.status().code(), "config file: " + fd.status().message() +
                                          "; give --config (or KVTIER_CONFIG) a TOML file");
  }
  std::string text;
  {
    constexpr size_t kMaxConfigBytes = size_t{16} << 20;
    char buf[65536];
    for (;;) {
      const ssize_t n = ::read(*fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int err = errno;
        ::close(*fd);
        return Status::FromErrno(err, "reading config file " + path);
      }
      if (n == 0) break;
      text.append(buf, static_cast<size_t>(n));
      if (text.size() > kMaxConfigBytes) {
        ::close(*fd);
        return Status::InvalidArgument("config file " + path + " is larger than " +
                                       std::to_string(kMaxConfigBytes) + " bytes");
      }
    }
    ::close(*fd);
  }
  toml::table root;
  try {
    root = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    std::ostringstream msg;
    msg << "config file " << path << ":" << e.source().begin.line << ":" << e.source().begin.column
        << ": " << e.description();
    return Status::InvalidArgument(msg.str());
  }
  // Applies every value of `table`, whose fields are named `prefix` + key; a sub-table ([g2]
  // credit_lru.stale_tail = 0, or [g2.credit_lru]) extends the prefix.
  std::function<Status(const toml::table&, const std::string&)> apply =
      [&](const toml::table& table, const std::string& prefix) -> Status {
    for (const auto& [key, value] : table) {
      const std::string name = prefix + std::string(key.str());
      if (const toml::table* sub = value.as_table()) {
        KVTIER_RETURN_IF_ERROR(apply(*sub, name + "."));
        continue;
      }
      const std::string origin = path + ":" + std::to_string(value.source().begin.line);
      std::string text;
      const ConfigFieldSpec* spec = FindSpec(name);
      if (auto s = value.value<std::string>()) {
        text = *s;
      } else if (auto f = value.value<double>(); f && value.is_floating_point()) {
        if (spec != nullptr && spec->type != ConfigType::kDouble) {
          return Status::InvalidArgument(name + " = " + ShortestText(*f) + " (from " + origin +
                                         ") is a real number; allowed: " + Allowed(*spec));
        }
        text = ShortestText(*f);  // nan and inf too: Set refuses them by name
      } else if (auto b = value.value<bool>(); b && value.is_boolean()) {
        text = *b ? "true" : "false";
      } else if (auto i = value.value<int64_t>(); i && value.is_integer()) {
        if (spec != nullptr && spec->type == ConfigType::kBool) {
          // TOML has booleans: `enabled = 1` is a mistake (the environment, which has only
          // text, may say 1).
          return Status::InvalidArgument(name + " = " + std::to_string(*i) + " (from " + origin +
                                         ") is an integer; allowed: true or false (unquoted)");
        }
        if (*i < 0 && !(spec != nullptr && spec->type == ConfigType::kDouble)) {
          return Status::InvalidArgument(
              name + " = " + std::to_string(*i) + " (from " + origin +
              ") is negative; allowed: " + (spec != nullptr ? Allowed(*spec) : "?"));
        }
        text = std::to_string(*i);
      } else {
        return Status::InvalidArgument(name + " (from " + origin +
                                       ") must be a string, a number or a boolean");
      }
      KVTIER_RETURN_IF_ERROR(Set(name, text, ConfigSource::kFile, origin));
    }
    return Status::Ok();
  };
  for (const auto& [table_key, node] : root) {
    const toml::table* table = node.as_table();
    if (table == nullptr) {
      return Status::InvalidArgument(
          "config file " + path + ":" + std::to_string(node.source().begin.line) + ": '" +
          std::string(table_key.str()) + "' must be a table such as [g2] holding settings");
    }
    KVTIER_RETURN_IF_ERROR(apply(*table, std::string(table_key.str()) + "."));
  }
  return Status::Ok();
}

namespace {

// KVTIER_* variables that are not settings but that kvtier reads elsewhere, so a user who sets
// one as documented is not refused: the config file's path, logging, the CLI's progress lines,
// the vLLM environment's location and base Python (scripts/setup-vllm.sh), and KVTIER_TEST_*,
// which belong to the test suite. Every other KVTIER_* name is refused (a typo must not pass
// silently); kvtier's own scripts export none that is not a setting.
bool IsReadElsewhere(const std::string& var) {
  static constexpr std::string_view kNames[] = {
      "KVTIER_CONFIG", "KVTIER_LOG_LEVEL", "KVTIER_PROGRESS", "KVTIER_CACHE", "KVTIER_BASE_PYTHON"};
  for (std::string_view n : kNames) {
    if (var == n) return true;
  }
  return var.rfind("KVTIER_TEST_", 0) == 0;
}

}  // namespace

Status Config::LoadEnvironment(const std::vector<std::string>& environ_vars) {
  for (const std::string& kv : environ_vars) {
    if (kv.rfind("KVTIER_", 0) != 0) continue;
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    const std::string var = kv.substr(0, eq);
    if (IsReadElsewhere(var)) continue;
    const ConfigFieldSpec* match = nullptr;
    for (const ConfigFieldSpec& s : Schema()) {
      if (EnvName(s.name) == var) match = &s;
    }
    if (match == nullptr) {
      std::string known = "KVTIER_CONFIG, KVTIER_LOG_LEVEL";
      for (const auto& s : Schema()) known += ", " + EnvName(s.name);
      return Status::InvalidArgument("environment variable " + var +
                                     " names no kvtier setting; known: " + known);
    }
    KVTIER_RETURN_IF_ERROR(Set(match->name, kv.substr(eq + 1), ConfigSource::kEnvironment, var));
  }
  return Status::Ok();
}

Status Config::LoadProcessEnvironment() {
  std::vector<std::string> vars;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) vars.emplace_back(*e);
  return LoadEnvironment(vars);
}

const Config::Value& Config::Find(std::string_view name, ConfigType type) const {
  const ConfigFieldSpec* spec = FindSpec(name);
  auto it = values_.find(name);
  const bool type_ok =
      spec != nullptr &&
      (spec->type == type || (type == ConfigType::kString && spec->type == ConfigType::kChoice));
  if (it == values_.end() || !type_ok) {
    // An unknown name is a key no linked module registered (config_registry.h).
    std::fprintf(
        stderr, "kvtier: internal error: config field '%.*s' %s\n", static_cast<int>(name.size()),
        name.data(),
        spec == nullptr ? "is not registered by any linked module" : "read with the wrong type");
    std::abort();
  }
  return it->second;
}

uint64_t Config::GetBytes(std::string_view name) const {
  return std::strtoull(Find(name, ConfigType::kBytes).text.c_str(), nullptr, 10);
}

uint64_t Config::GetUint(std::string_view name) const {
  return std::strtoull(Find(name, ConfigType::kUint).text.c_str(), nullptr, 10);
}

bool Config::GetBool(std::string_view name) const {
  return Find(name, ConfigType::kBool).text == "true";
}

const std::string& Config::GetString(std::string_view name) const {
  return Find(name, ConfigType::kString).text;
}

double Config::GetDouble(std::string_view name) const {
  return std::strtod(Find(name, ConfigType::kDouble).text.c_str(), nullptr);
}

bool Config::IsSet(std::string_view name) const {
  auto it = values_.find(name);
  if (it == values_.end()) {
    std::fprintf(stderr, "kvtier: internal error: IsSet of unknown config field '%.*s'\n",
                 static_cast<int>(name.size()), name.data());
    std::abort();
  }
  return it->second.source != ConfigSource::kDefault;
}

std::vector<std::string> Config::Warnings() const {
  std::vector<std::string> out;
  for (const ConfigKeyTable& t : FrozenRegistry().tables) {
    if (t.warnings == nullptr) continue;
    std::vector<std::string> w = t.warnings(*this);
    out.insert(out.end(), w.begin(), w.end());
  }
  return out;
}

std::vector<ConfigEntry> Config::Entries() const {
  std::vector<ConfigEntry> out;
  for (const ConfigFieldSpec& spec : Schema()) {
    const Value& v = values_.at(spec.name);
    out.push_back(ConfigEntry{&spec, v.text, v.source, v.origin});
  }
  return out;
}

Result<Config> LoadConfig(const std::string& file) {
  Config config;
  std::string path = file;
  if (path.empty()) {
    if (const char* env = std::getenv("KVTIER_CONFIG"); env != nullptr && *env != '\0') path = env;
  }
  if (!path.empty()) KVTIER_RETURN_IF_ERROR(config.LoadFile(path));
  KVTIER_RETURN_IF_ERROR(config.LoadProcessEnvironment());
  return config;
}

}  // namespace kvtier

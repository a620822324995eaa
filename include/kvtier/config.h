// Config: kvtier's settings, one named field each ("g2.capacity_bytes"), with a default, a
// type that validates values, and the source of its current value.
//
// Precedence, lowest to highest: the built-in default, a TOML file (LoadFile), KVTIER_*
// environment variables (LoadEnvironment), explicit Set() calls. Components read typed values
// (GetBytes, GetUint, ...) and build their own validated Config structs from them.
//
// In a TOML file, a field "a.b" is key b of table [a]. In the environment, it is KVTIER_A_B
// (upper case, dots as underscores): KVTIER_G2_CAPACITY_BYTES=8GiB. Sizes accept K, M, G, T
// (or KiB, MiB, GiB, TiB) suffixes, powers of 1024. Real numbers (kDouble: "0.75", "-1",
// "2.5e-1") must be finite; "nan" and "inf" are refused.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.h"

namespace kvtier {

enum class ConfigSource : uint8_t { kDefault, kFile, kEnvironment, kOverride };
const char* ConfigSourceName(ConfigSource source);  // "default", "file", "env", "set"

enum class ConfigType : uint8_t { kBytes, kUint, kBool, kString, kChoice, kDouble };

// The description of one field.
struct ConfigFieldSpec {
  std::string name;  // "g2.capacity_bytes"
  ConfigType type;
  std::string default_value;  // as text, e.g. "2GiB"
  std::string doc;            // one line: what it does
  uint64_t min = 0;           // kBytes, kUint: allowed range
  uint64_t max = UINT64_MAX;
  std::vector<std::string> choices;  // kChoice: allowed values
  double real_min = 0;               // kDouble: allowed range (finite numbers only)
  double real_max = 0;
};

// One field's effective value.
struct ConfigEntry {
  const ConfigFieldSpec* spec;
  std::string value;  // normalized text (sizes as bytes)
  ConfigSource source;
  std::string origin;  // file path, or environment variable name; empty for defaults
};

class Config {
 public:
  // All fields at their defaults.
  Config();

  // The schema: every field kvtier knows, in display order.
  static const std::vector<ConfigFieldSpec>& Schema();

  // Applies a TOML file. InvalidArgument (naming the file, and the line where toml++ reports
  // one) for a syntax error, an unknown table or key, or a value the field refuses; NotFound
  // when the file does not exist. Fields applied before an error keep their new values.
  Status LoadFile(const std::string& path);

  // Applies every KVTIER_<FIELD> variable of `environ_vars` ("NAME=value" strings, as in
  // environ). Variables that name no field are refused with InvalidArgument listing the known
  // ones (a typo must not pass silently), except those kvtier reads elsewhere (KVTIER_CONFIG,
  // KVTIER_LOG_LEVEL, KVTIER_PROGRESS; KVTIER_CACHE and KVTIER_BASE_PYTHON of
  // scripts/setup-vllm.sh) and KVTIER_TEST_*, which belong to the test suite.
  Status LoadEnvironment(const std::vector<std::string>& environ_vars);
  // LoadEnvironment over this process's environment.
  Status LoadProcessEnvironment();

  // Sets a field. InvalidArgument naming the field, the value, where it came from and what is
  // allowed, when the field is unknown or refuses the value.
  Status Set(std::string_view name, std::string_view value,
             ConfigSource source = ConfigSource::kOverride, std::string_view origin = "");

  // Typed reads. REQUIRES: `name` is in Schema() with the matching type (a programmer error
  // otherwise: the process aborts with a message).
  uint64_t GetBytes(std::string_view name) const;
  uint64_t GetUint(std::string_view name) const;
  bool GetBool(std::string_view name) const;
  const std::string& GetString(std::string_view name) const;  // kString and kChoice
  double GetDouble(std::string_view name) const;

  // True when field `name` was set explicitly: by a file (LoadFile), the environment
  // (LoadEnvironment) or Set() with any source but kDefault, even to its default's value; false
  // while it holds its built-in default. The manager uses it to tell a g3.dir the user chose
  // (which must open) from the default one (which may fall back). REQUIRES: `name` is in
  // Schema() (a programmer error otherwise: the process aborts with a message).
  bool IsSet(std::string_view name) const;

  // Settings that are valid but have no effect, one line each saying which and what to do:
  // a gN.credit_lru.* setting given (by a file, the environment or Set) while gN.policy is not
  // credit-lru. Empty when there is none. The manager logs them as warnings at start-up and
  // `kvtier config` prints them; neither refuses the configuration.
  std::vector<std::string> Warnings() const;

  // Every field with its value and source, in schema order.
  std::vector<ConfigEntry> Entries() const;

 private:
  struct Value {
    std::string text;
    ConfigSource source = ConfigSource::kDefault;
    std::string origin;
  };
  const Value& Find(std::string_view name, ConfigType type) const;

  std::map<std::string, Value, std::less<>> values_;
};

// Parses "123", "4K", "2MiB", "1G", "3T" (powers of 1024; "B" allowed). InvalidArgument saying
// what is wrong otherwise ("not a size", "too large", "unknown suffix 'x'").
Result<uint64_t> ParseByteSize(std::string_view text);

// Loads the configuration the way the `kvtier` tool and the demo do: defaults, then the TOML
// file named by `file` (or, when empty, by $KVTIER_CONFIG if set), then the environment.
Result<Config> LoadConfig(const std::string& file = "");

}  // namespace kvtier

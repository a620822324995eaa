// The settings' registry. Config (include/kvtier/config.h) is the generic machinery: files,
// KVTIER_* variables, Set, typed reads, sources, warnings, the `kvtier config` listing. It knows
// no setting by name: each module that reads settings registers its own keys here, in a table
// beside the typed options it fills from them (e.g. src/manager/manager_config_keys.cc).
//
// Invariants:
//  - Tables are registered during static initialization (a namespace-scope
//    ConfigKeysRegistration), before any Config is made or Config::Schema() read; the first of
//    those freezes the registry, and a registration after it is a programmer error (the process
//    aborts with a message), as is a name registered twice.
//  - Config::Schema() lists the keys by table `order`, then in each table's own order; that is
//    the order of `kvtier config` and of the "known settings" of an error.
//  - A library that registers keys must be linked whole where its keys are read: its
//    registration object is kept by a `--undefined` anchor (CMakeLists.txt), since a static
//    archive drops members nothing refers to.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/config.h"
#include "kvtier/status.h"

namespace kvtier {

// One setting as its module registers it: the field (name, type, default, doc, range), and
// what its type alone cannot say.
struct ConfigKey {
  ConfigFieldSpec spec;
  // A check after the type's own (parse, range, choice), given the normalized text ("64" for a
  // whole number): Ok, or InvalidArgument saying what is wrong ("not a power of two"); Config
  // puts the name, the value, its origin and `allowed` around it. Null: none.
  Status (*check)(std::string_view normalized) = nullptr;
  // What errors say is allowed, where the type's own words ("any text") are not enough. Empty:
  // the type's.
  std::string allowed = {};
  // A check of the value as given, before the type's own, for names a key judges whatever its
  // choices say (gN.policy's lab policies, src/index/policy_config_keys.h): Ok(true) takes the
  // value as given (the type's checks and `check` skipped), Ok(false) leaves it to them, and
  // InvalidArgument refuses it with a message that is whole: Config puts only the name, the
  // value and its origin before it ("g2.policy = 's3fifo' (from ...): <message>"), no
  // `allowed`. Null: none.
  Result<bool> (*screen)(std::string_view value) = nullptr;
};

// One module's settings.
struct ConfigKeyTable {
  // Where the table's keys are listed among the others' (lowest first).
  uint32_t order = 0;
  std::vector<ConfigKey> keys;
  // Settings of this table that are valid but have no effect, one line each saying which and
  // what to do (Config::Warnings). Null: none.
  std::vector<std::string> (*warnings)(const Config& config) = nullptr;
};

// Adds `table` to the settings of every Config. REQUIRES: the registry is not frozen yet, and
// no key of `table` is registered already (programmer errors: the process aborts, naming the
// key); call it from a ConfigKeysRegistration.
void RegisterConfigKeys(ConfigKeyTable table);

// At namespace scope, registers the table `make` returns during static initialization.
struct ConfigKeysRegistration {
  explicit ConfigKeysRegistration(ConfigKeyTable (*make)()) { RegisterConfigKeys(make()); }
};

// Whether Config::Set would take `value` for the setting `name`: Ok, or the InvalidArgument
// Set would return ("g3.queue_depth = '0' is out of range; allowed: a whole number from 1 to
// 4096"), and InvalidArgument "unknown setting" for a name no module registered. Typed options
// (e.g. src/manager/manager_settings.h) check their fields with it, so that a range is written
// once, in the key's table.
Status CheckConfigValue(std::string_view name, std::string_view value);

// The shortest text that reads back as `v` ("0.75", "-1", "16"): how a real number's default
// is written in a table, and how Config normalizes one.
std::string ShortestNumberText(double v);

}  // namespace kvtier

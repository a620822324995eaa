// The config keys of the embedded manager (manager_config_keys.cc says which, and how they are
// registered; kvtier serve's are proto/service_config_keys.h's). Exposed for the tests and for the
// typed options' checks; a program does not call these to get the keys: they are registered for it.
#pragma once

#include <string_view>

#include "core/config_registry.h"

namespace kvtier {

// hash.*, index.*, g2.* (with the policy settings), g3.*, transfer.*, manager.*, g4.*,
// metrics.*: listed first.
ConfigKeyTable ManagerConfigKeys();

// Ok when `value` is a comma-separated list of host:port (empty items skipped; empty: not set);
// InvalidArgument "not a list of host:port (...)" naming the bad item otherwise. The check of
// g4.endpoints.
Status CheckHostPortList(std::string_view value);

}  // namespace kvtier

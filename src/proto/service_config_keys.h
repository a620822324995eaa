// kvtier serve's settings (service.*, docs/service.md) as config keys. Both sides read them: the
// attached engine (src/client) and the daemon (src/daemon), each through its typed options
// (service_options.h), so they live here, in the library both link. service_config_keys.cc
// registers them with core's registry (core/config_registry.h).
#pragma once

#include "core/config_registry.h"

namespace kvtier::proto {

// service.*: listed after the manager's keys (order 100), before the event stream's (300).
// Exposed for the tests and the typed options' checks; a program does not call it to get the
// keys: they are registered for it.
ConfigKeyTable ServiceConfigKeys();

}  // namespace kvtier::proto

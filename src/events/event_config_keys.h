// The KV event stream's settings (events.*, docs/events.md) as config keys: the events module
// owns them; the manager, which starts the publisher, registers them
// (src/manager/manager_config_keys.cc) and reads them into its EventOptions.
#pragma once

#include <string_view>

#include "core/config_registry.h"

namespace kvtier {

// The events.* keys; listed after every other module's.
ConfigKeyTable EventConfigKeys();

// Ok when `address` is empty (off) or a ZMQ address (tcp://, ipc://, inproc://); otherwise
// InvalidArgument "not a ZMQ address (...)". The check of events.endpoint and
// events.replay_endpoint.
Status CheckZmqAddress(std::string_view address);

}  // namespace kvtier

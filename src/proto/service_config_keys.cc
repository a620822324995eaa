// The service.* keys, registered with core's registry at static initialization.
//
// CMakeLists.txt keeps this file linked wherever kvtier_proto is (the anchor
// kvtier_proto_config_keys below, through --undefined): nothing else refers to it, and a static
// archive drops members nothing refers to.
#include "proto/service_config_keys.h"

#include <cstdint>

// Linked with --undefined=kvtier_proto_config_keys (CMakeLists.txt): see above.
extern "C" {
extern const int kvtier_proto_config_keys;
const int kvtier_proto_config_keys = 1;
}

namespace kvtier::proto {

ConfigKeyTable ServiceConfigKeys() {
  using T = ConfigType;
  ConfigKeyTable table;
  table.order = 200;
  table.keys = {
      // kvtier serve: one kvtier per host that engines attach to (docs/service.md).
      {{"service.socket",
        T::kString,
        "",
        "Unix socket of kvtier serve: engines attach to it (empty: embedded, in-process); the "
        "daemon listens on it",
        0,
        UINT64_MAX,
        {}}},
      {{"service.instance",
        T::kString,
        "",
        "attached engines: the instance name; processes of one engine (vLLM's scheduler and "
        "worker) give the same one (empty: one instance per process)",
        0,
        UINT64_MAX,
        {}}},
      {{"service.lease_ms",
        T::kUint,
        "5000",
        "longest an attached engine may take to copy a batch of blocks between its G1 and G2",
        10,
        600000,
        {}}},
      {{"service.call_timeout_ms",
        T::kUint,
        "5000",
        "attached engines: a call kvtier serve has not answered by then is a miss (the daemon "
        "counts as gone until it answers again)",
        10,
        600000,
        {}}},
      {{"service.reattach_ms",
        T::kUint,
        "1000",
        "attached engines: after the daemon went away, the wait between attempts to attach again",
        1,
        600000,
        {}}},
      {{"service.max_pools",
        T::kUint,
        "1",
        "the daemon: G2 pools it holds at once (one per model and layout; a tensor-parallel "
        "engine has one per rank); g2.capacity_bytes is the daemon's whole G2, split evenly "
        "among them, and a pool no engine uses gives its share to a new one",
        1,
        64,
        {}}},
      {{"service.allowed_gids",
        T::kString,
        "",
        "the daemon: comma-separated group ids whose processes (primary or supplementary "
        "group) may attach besides its own uid; the socket's directory and the socket then "
        "belong to the first of them (0750, 0660)",
        0,
        UINT64_MAX,
        {}}},
      {{"service.daemon_uid",
        T::kString,
        "",
        "attached engines: the uid kvtier serve runs as (empty: the engine's own); an engine "
        "sends nothing to a listener of another uid (SO_PEERCRED)",
        0,
        UINT64_MAX,
        {}}},
      {{"service.max_connections",
        T::kUint,
        "256",
        "the daemon: connections open at once (each has a thread); past it a new one is refused "
        "and counted, never the daemon's end",
        4,
        65536,
        {}}},
  };
  return table;
}

namespace {

const ConfigKeysRegistration kServiceKeys(ServiceConfigKeys);

}  // namespace
}  // namespace kvtier::proto

// kvtier serve's settings (service.*), typed: one struct per side, each filled once from a
// Config (FromConfig) and checked (Validate). The attached engine (client/attached_manager.h,
// ServiceLookup) keeps a ServiceClientOptions, the daemon (daemon/server.h) a
// ServiceDaemonOptions; neither reads a service.* key by name.
//
// Each side reads, and refuses, only the keys it uses: an engine is not stopped by a bad
// service.allowed_gids (the daemon's), nor the daemon by a bad service.daemon_uid (the
// engine's). The keys are registered in service_config_keys.cc; Validate checks every field
// against its key's range through CheckConfigValue (core/config_registry.h), so a range is
// written once, in the key's table, and its InvalidArgument names the key, the value and what
// is allowed, as Config::Set does. FromConfig returns Validate's error, or the parse error of a
// text key that holds numbers (service.daemon_uid, service.allowed_gids).
//
// The defaults are the keys' too: a struct made in code starts from FromConfig(Config()), not
// from its zero-initialized fields.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kvtier/config.h"
#include "kvtier/status.h"

namespace kvtier::proto {

// Whether service.socket is set: an engine then attaches to kvtier serve (BlockManager::Create),
// and kvtier serve has a socket to listen on without --socket. It reads that key alone, so each
// side says what is missing before it reads, and refuses, the others.
bool ServiceSocketSet(const Config& config);

// service.* as an attached engine reads them.
struct ServiceClientOptions {
  std::string socket;  // service.socket; empty: the engine embeds the manager
  // service.instance; empty: one instance per process (the attached manager names it).
  std::string instance;
  // service.daemon_uid: who must answer on the socket; when the key is empty, this process's
  // effective uid.
  uid_t daemon_uid = 0;
  uint64_t call_timeout_ms = 0;  // service.call_timeout_ms
  uint64_t reattach_ms = 0;      // service.reattach_ms

  // InvalidArgument "service.daemon_uid: 'x' is not a uid; ..." for a daemon uid that is not a
  // number (or is -1); Validate's errors otherwise.
  static Result<ServiceClientOptions> FromConfig(const Config& config);
  Status Validate() const;
};

// service.* as kvtier serve reads them.
struct ServiceDaemonOptions {
  std::string socket;  // service.socket (kvtier serve --socket PATH goes before it)
  // service.allowed_gids: groups whose processes may attach besides the daemon's own uid; the
  // socket and its directory belong to the first.
  std::vector<gid_t> allowed_gids;
  uint64_t lease_ms = 0;         // service.lease_ms
  uint32_t max_pools = 0;        // service.max_pools
  uint64_t max_connections = 0;  // service.max_connections

  // InvalidArgument "service.allowed_gids: 'x' is not a group id; ..." for an item that is not
  // a number of at most 32 bits; Validate's errors otherwise.
  static Result<ServiceDaemonOptions> FromConfig(const Config& config);
  Status Validate() const;
};

}  // namespace kvtier::proto

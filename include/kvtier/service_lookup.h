// ServiceLookup: Lookup against kvtier serve (docs/service.md) for a process that holds no G1,
// such as vLLM's scheduler. The scheduler plans loads; its engine's workers are attached to the
// daemon (BlockManager with service.socket) and own the G1s. With this client the scheduler
// asks the daemon itself, under the worker's instance name, instead of asking its workers: a
// worker busy in a forward pass does not delay a lookup, and the lookup's request entry is the
// one the worker's later PrepareLoad, Commit and RequestFinished find.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kvtier/config.h"
#include "kvtier/connector.h"
#include "kvtier/status.h"

namespace kvtier {

class ServiceLookup {
 public:
  // Connects to service.socket (required: InvalidArgument without it) and joins the engine
  // instance named `instance_name` (the worker's service.instance; InvalidArgument when empty).
  // A daemon that is not there, or an instance that has not attached yet, is no error: Lookup
  // answers 0 tokens until both are, trying again at most every service.reattach_ms.
  static Result<std::unique_ptr<ServiceLookup>> Create(const Config& config,
                                                       const std::string& instance_name);
  ~ServiceLookup();
  ServiceLookup(const ServiceLookup&) = delete;
  ServiceLookup& operator=(const ServiceLookup&) = delete;

  // BlockManager::Lookup's contract, answered by the daemon for the named instance. A daemon
  // that is gone, restarted, or does not answer within service.call_timeout_ms, and an
  // instance that ended, make it answer 0 tokens (a miss), never an error or a hang. Errors:
  // InvalidArgument for a bad request (an empty id), as the daemon's manager finds it.
  // Thread-safe; calls from several threads each use their own connection.
  Result<LookupResult> Lookup(const RequestSpec& request, uint32_t num_computed_tokens);

  struct Stats {
    bool connected = false;
    uint64_t connects = 0;      // successful joins (the first included)
    uint64_t failed_calls = 0;  // lookups answered as misses: daemon or instance not there
    uint64_t lookups = 0;       // lookups the daemon answered
  };
  Stats stats();

 private:
  class Impl;
  explicit ServiceLookup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier

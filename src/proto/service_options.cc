#include "proto/service_options.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

#include "core/config_registry.h"

namespace kvtier::proto {
namespace {

// A field against its key's rules (CheckConfigValue): the refusal names the key.
Status CheckUint(std::string_view key, uint64_t value) {
  return CheckConfigValue(key, std::to_string(value));
}

// uid_t and gid_t are 32 bits. A daemon uid of all ones (-1, "no id" to the kernel) is refused;
// a group id of all ones has always been taken as given.
constexpr unsigned long kNoId = 0xfffffffful;

Status NotAUid(const std::string& text) {
  return Status::InvalidArgument("service.daemon_uid: '" + text +
                                 "' is not a uid; give the number kvtier serve runs as");
}

Status NotAGid(const std::string& item) {
  return Status::InvalidArgument("service.allowed_gids: '" + item +
                                 "' is not a group id; give comma-separated numbers");
}

// service.daemon_uid: empty is this process's effective uid.
Result<uid_t> ParseDaemonUid(const std::string& text) {
  if (text.empty()) return ::geteuid();
  char* end = nullptr;
  const unsigned long v = std::strtoul(text.c_str(), &end, 10);
  if (end == nullptr || *end != '\0' || text[0] == '-' || v >= kNoId) return NotAUid(text);
  return static_cast<uid_t>(v);
}

// service.allowed_gids: comma-separated numbers of at most 32 bits; empty is none.
Result<std::vector<gid_t>> ParseGids(const std::string& text) {
  std::vector<gid_t> gids;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(pos, comma - pos);
    char* end = nullptr;
    unsigned long v = std::strtoul(item.c_str(), &end, 10);
    if (item.empty() || end == nullptr || *end != '\0' || v > kNoId) return NotAGid(item);
    gids.push_back(static_cast<gid_t>(v));
    pos = comma + 1;
  }
  return gids;
}

}  // namespace

bool ServiceSocketSet(const Config& config) { return !config.GetString("service.socket").empty(); }

Result<ServiceClientOptions> ServiceClientOptions::FromConfig(const Config& config) {
  ServiceClientOptions o;
  o.socket = config.GetString("service.socket");
  o.instance = config.GetString("service.instance");
  KVTIER_ASSIGN_OR_RETURN(o.daemon_uid, ParseDaemonUid(config.GetString("service.daemon_uid")));
  o.call_timeout_ms = config.GetUint("service.call_timeout_ms");
  o.reattach_ms = config.GetUint("service.reattach_ms");
  KVTIER_RETURN_IF_ERROR(o.Validate());
  return o;
}

Status ServiceClientOptions::Validate() const {
  if (daemon_uid == static_cast<uid_t>(kNoId)) return NotAUid(std::to_string(daemon_uid));
  KVTIER_RETURN_IF_ERROR(CheckUint("service.call_timeout_ms", call_timeout_ms));
  return CheckUint("service.reattach_ms", reattach_ms);
}

Result<ServiceDaemonOptions> ServiceDaemonOptions::FromConfig(const Config& config) {
  ServiceDaemonOptions o;
  o.socket = config.GetString("service.socket");
  KVTIER_ASSIGN_OR_RETURN(o.allowed_gids, ParseGids(config.GetString("service.allowed_gids")));
  o.lease_ms = config.GetUint("service.lease_ms");
  // Its key's range (1..64) is within 32 bits.
  o.max_pools = static_cast<uint32_t>(config.GetUint("service.max_pools"));
  o.max_connections = config.GetUint("service.max_connections");
  KVTIER_RETURN_IF_ERROR(o.Validate());
  return o;
}

Status ServiceDaemonOptions::Validate() const {
  KVTIER_RETURN_IF_ERROR(CheckUint("service.lease_ms", lease_ms));
  KVTIER_RETURN_IF_ERROR(CheckUint("service.max_pools", max_pools));
  return CheckUint("service.max_connections", max_connections);
}

}  // namespace kvtier::proto

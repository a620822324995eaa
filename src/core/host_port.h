// "host:port" as kvtier's settings write a network endpoint (g4.endpoints): a name or an IPv4
// address, or an IPv6 address in brackets, then a port in 1..65535. Parsed in one place so that
// `kvtier config` refuses what the Redis store would refuse at start-up.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.h"

namespace kvtier {

struct HostPort {
  std::string host;
  uint16_t port = 0;
  std::string ToString() const { return host + ":" + std::to_string(port); }
};

// Parses "host:port" or "[v6addr]:port". InvalidArgument starting with `what` and the quoted
// text, saying what is wrong: empty, "has no :port", "has an empty host", "port must be a
// number in 1..65535", or malformed brackets.
Result<HostPort> ParseHostPort(std::string_view text, std::string_view what = "endpoint");

// The items of a comma-separated list of endpoints (g4.endpoints), spaces around each item
// trimmed and empty items dropped. Does not parse the items.
std::vector<std::string> SplitEndpoints(std::string_view text);

}  // namespace kvtier

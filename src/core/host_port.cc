#include "core/host_port.h"

#include <charconv>

namespace kvtier {

Result<HostPort> ParseHostPort(std::string_view text, std::string_view what) {
  const std::string name(what);
  const std::string quoted = "'" + std::string(text) + "'";
  if (text.empty()) {
    return Status::InvalidArgument(name + " is empty: give host:port, e.g. 127.0.0.1:6379");
  }
  std::string_view host, port;
  if (text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return Status::InvalidArgument(name + " " + quoted +
                                     " is malformed: an IPv6 host is written [addr]:port");
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) {
      return Status::InvalidArgument(name + " " + quoted +
                                     " has no :port: give host:port, e.g. 127.0.0.1:6379");
    }
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return Status::InvalidArgument(name + " " + quoted +
                                     " is malformed: write an IPv6 host as [addr]:port");
    }
  }
  if (host.empty()) return Status::InvalidArgument(name + " " + quoted + " has an empty host");
  uint32_t value = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || value < 1 ||
      value > 65535) {
    return Status::InvalidArgument(name + " " + quoted + ": port must be a number in 1..65535");
  }
  return HostPort{std::string(host), static_cast<uint16_t>(value)};
}

std::vector<std::string> SplitEndpoints(std::string_view text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view item = text.substr(start, comma - start);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (!item.empty()) out.emplace_back(item);
    start = comma + 1;
  }
  return out;
}

}  // namespace kvtier

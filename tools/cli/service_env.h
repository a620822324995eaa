// The KVTIER_SERVICE_* variables that put a tool's manager on kvtier serve (docs/service.md),
// for tools that build their own configuration instead of reading the whole environment.
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

namespace kvtier::cli {

// "NAME=value" for each of KVTIER_SERVICE_SOCKET and KVTIER_SERVICE_INSTANCE that is set, for
// Config::LoadEnvironment.
inline std::vector<std::string> ServiceEnvironment() {
  std::vector<std::string> out;
  for (const char* name : {"KVTIER_SERVICE_SOCKET", "KVTIER_SERVICE_INSTANCE"}) {
    if (const char* v = std::getenv(name); v != nullptr) out.push_back(std::string(name) + "=" + v);
  }
  return out;
}

}  // namespace kvtier::cli

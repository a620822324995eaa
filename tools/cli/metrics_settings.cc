#include "cli/metrics_settings.h"

#include <cstdlib>

#include "kvtier/config.h"

namespace kvtier::cli {

Result<std::vector<std::pair<std::string, std::string>>> MetricsSettings() {
  Config c;
  if (const char* file = std::getenv("KVTIER_CONFIG"); file != nullptr && *file != '\0') {
    KVTIER_RETURN_IF_ERROR(c.LoadFile(file));
  }
  for (const char* var : {"KVTIER_METRICS_PORT", "KVTIER_METRICS_BIND"}) {
    const char* v = std::getenv(var);
    if (v == nullptr) continue;
    const std::string name =
        std::string(var) == "KVTIER_METRICS_PORT" ? "metrics.port" : "metrics.bind";
    KVTIER_RETURN_IF_ERROR(c.Set(name, v, ConfigSource::kEnvironment, var));
  }
  std::vector<std::pair<std::string, std::string>> out;
  for (const ConfigEntry& e : c.Entries()) {
    if (e.spec->name.rfind("metrics.", 0) == 0 && e.source != ConfigSource::kDefault) {
      out.emplace_back(e.spec->name, e.value);
    }
  }
  return out;
}

}  // namespace kvtier::cli

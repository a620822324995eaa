// The metrics.* settings (docs/metrics.md) for commands that build their manager's config
// themselves (replay, demo, bench manager): they take the endpoint's port and address from
// KVTIER_METRICS_PORT / KVTIER_METRICS_BIND (and from $KVTIER_CONFIG's [metrics] table) like
// any process holding a BlockManager, without taking the rest of that configuration.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "kvtier/status.h"

namespace kvtier::cli {

// (name, value) pairs for Config::Set: metrics.port and metrics.bind where the environment or
// the $KVTIER_CONFIG file sets them; empty when neither does. InvalidArgument naming the
// variable for a bad value (e.g. KVTIER_METRICS_PORT=70000).
Result<std::vector<std::pair<std::string, std::string>>> MetricsSettings();

}  // namespace kvtier::cli

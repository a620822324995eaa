#include "replay/replay_cost.h"

#include <algorithm>
#include <cmath>

namespace kvtier::cli {

Status CostModel::Validate() const {
  auto bad = [](double v) { return !std::isfinite(v) || v <= 0; };
  if (bad(prefill_tokens_per_s)) {
    return Status::InvalidArgument("prefill tokens/s = " + std::to_string(prefill_tokens_per_s) +
                                   ": must be a positive number");
  }
  if (kv_bytes_per_token == 0) {
    return Status::InvalidArgument("KV bytes per token must be at least 1");
  }
  for (TierId t = kTierG2; t < kNumTiers; ++t) {
    if (bad(load_bytes_per_s[t])) {
      return Status::InvalidArgument("load bandwidth of G" + std::to_string(t + 1) + " = " +
                                     std::to_string(load_bytes_per_s[t]) +
                                     " bytes/s: must be a positive number");
    }
  }
  return Status::Ok();
}

double CostModel::LoadSeconds(const std::array<uint64_t, kNumTiers>& blocks_by_tier,
                              uint32_t tokens_per_block) const {
  double s = 0;
  for (TierId t = kTierG2; t < kNumTiers; ++t) {
    if (blocks_by_tier[t] == 0) continue;
    const double bytes = static_cast<double>(blocks_by_tier[t]) * tokens_per_block *
                         static_cast<double>(kv_bytes_per_token);
    s += bytes / load_bytes_per_s[t];
  }
  return s;
}

double CostModel::ComputeSeconds(uint64_t tokens) const {
  return static_cast<double>(tokens) / prefill_tokens_per_s;
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  // Nearest rank: the smallest value with at least p% of the values at or below it.
  const double rank = std::ceil(std::clamp(p, 0.0, 100.0) / 100.0 * values.size());
  const size_t i = rank < 1 ? 0 : static_cast<size_t>(rank) - 1;
  return values[std::min(i, values.size() - 1)];
}

}  // namespace kvtier::cli

// ManagerStats: a BlockManager's counters and gauges (BlockManager::Stats), generated from the
// table in kvtier/manager_stats_fields.h, where each field's contract is written. The same table
// is readable at run time (kManagerStatsFields) and field by field (ForEachStatField), for code
// that treats every field alike: the /metrics collector, the service protocol, the attached
// manager's sums across daemon restarts, the Python bindings.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <type_traits>

#include "kvtier/tier.h"

namespace kvtier {

// The paths of ManagerStats::bytes_by_path, in its order.
struct TransferPath {
  TierId from;
  TierId to;
};
inline constexpr size_t kNumTransferPaths = 8;
inline constexpr std::array<TransferPath, kNumTransferPaths> kTransferPaths = {{
    {kTierG1, kTierG2},
    {kTierG2, kTierG1},
    {kTierG2, kTierG3},
    {kTierG3, kTierG2},
    {kTierG3, kTierG1},
    {kTierG2, kTierG4},
    {kTierG4, kTierG2},
    {kTierG4, kTierG1},
}};

// The types a field may have (the table's `type` column).
using StatU64 = uint64_t;
using StatFlag = bool;
using StatPerTier = std::array<uint64_t, kNumTiers>;          // indexed by TierId
using StatPerPath = std::array<uint64_t, kNumTransferPaths>;  // indexed like kTransferPaths

enum class StatShape : uint8_t { kU64, kFlag, kPerTier, kPerPath };

// kCounter: only grows over a manager's life. kGauge: a value now.
enum class StatKind : uint8_t { kCounter, kGauge };

// How vLLM's /metrics shows a field (manager_stats_fields.h, the `vllm` column).
enum class StatVllm : uint8_t { kOwnName, kFigure, kNone };

struct ManagerStats {
#define KVTIER_STAT(name, type, ...) type name{};
#include "kvtier/manager_stats_fields.h"
#undef KVTIER_STAT
};

// One row of the table.
struct StatField {
  const char* name;  // the ManagerStats member
  StatShape shape;
  StatKind kind;
  StatVllm vllm;
  const char* metric;  // Prometheus family on kvtier's /metrics; "" for none
  const char* label;   // tier label of a scalar sharing its family ("g2"), or ""
  const char* help;
};

namespace stats_internal {
template <typename T>
consteval StatShape ShapeOf() {
  if constexpr (std::is_same_v<T, StatFlag>) {
    return StatShape::kFlag;
  } else if constexpr (std::is_same_v<T, StatPerTier>) {
    return StatShape::kPerTier;
  } else if constexpr (std::is_same_v<T, StatPerPath>) {
    return StatShape::kPerPath;
  } else {
    static_assert(std::is_same_v<T, StatU64>, "a stat is StatU64, StatFlag or StatPer*");
    return StatShape::kU64;
  }
}
}  // namespace stats_internal

// Every field, in the table's order.
inline constexpr StatField kManagerStatsFields[] = {
#define KVTIER_STAT(name, type, kind, vllm, metric, label, help) \
  {#name, stats_internal::ShapeOf<type>(), StatKind::kind, StatVllm::vllm, metric, label, help},
#include "kvtier/manager_stats_fields.h"
#undef KVTIER_STAT
};
inline constexpr size_t kNumManagerStatsFields = std::size(kManagerStatsFields);

// Calls f(field, stats.<member>...) for every row in the table's order: `field` is its
// StatField, then the member of each of `stats` (ManagerStats, const or not) by reference, a
// uint64_t, bool or std::array as the row's type says. With two structs, f sees the same
// member of both (to add one to the other, say).
template <typename F, typename... Stats>
void ForEachStatField(F&& f, Stats&... stats) {
  size_t row = 0;
#define KVTIER_STAT(name, ...) f(kManagerStatsFields[row++], stats.name...);
#include "kvtier/manager_stats_fields.h"
#undef KVTIER_STAT
}

}  // namespace kvtier

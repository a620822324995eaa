// ManagerStats with every field set to a value no other field holds, for tests that check a
// consumer of the stats table (kvtier/manager_stats_fields.h) carries every field.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kvtier/manager_stats.h"

namespace kvtier::testing {

// Field i (in the table's order) holds 1000 * (i + 1) + `seed`, element e of an array field
// that plus e; a flag holds true (its default is false, so a lost flag shows).
inline ManagerStats DistinctStats(uint64_t seed = 7) {
  ManagerStats s;
  uint64_t row = 0;
  ForEachStatField(
      [&](const StatField&, auto& v) {
        ++row;
        using V = std::remove_cvref_t<decltype(v)>;
        if constexpr (std::is_same_v<V, bool>) {
          v = true;
        } else if constexpr (std::is_same_v<V, uint64_t>) {
          v = 1000 * row + seed;
        } else {
          for (uint64_t e = 0; e < v.size(); ++e) v[e] = 1000 * row + seed + e;
        }
      },
      s);
  return s;
}

}  // namespace kvtier::testing

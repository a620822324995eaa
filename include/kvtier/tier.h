// The tiers of the hierarchy, fastest first.
#pragma once

#include <cstdint>

namespace kvtier {

using TierId = uint8_t;
inline constexpr TierId kTierG1 = 0;  // engine memory (GPU, or host memory for CPU engines)
inline constexpr TierId kTierG2 = 1;  // host DRAM arena
inline constexpr TierId kTierG3 = 2;  // local SSD
inline constexpr TierId kTierG4 = 3;  // networked storage shared by workers
inline constexpr TierId kNumTiers = 4;
inline constexpr uint8_t kAllTiers = (1u << kNumTiers) - 1;

// "G1".."G4"; "G?" for anything else.
const char* TierName(TierId tier);

}  // namespace kvtier

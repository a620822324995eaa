#include "kvtier/tier.h"

namespace kvtier {

const char* TierName(TierId tier) {
  static const char* const kNames[] = {"G1", "G2", "G3", "G4"};
  return tier < kNumTiers ? kNames[tier] : "G?";
}

}  // namespace kvtier

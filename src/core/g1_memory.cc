#include "kvtier/g1_memory.h"

#include <string>

namespace kvtier {

Status G1Memory::Validate() const {
  KVTIER_RETURN_IF_ERROR(layout.Validate());
  if (num_blocks == 0) {
    return Status::InvalidArgument("G1 memory has num_blocks = 0; it must hold at least one block");
  }
  const bool contiguous = layout.g1_arrangement == G1Arrangement::kBlockContiguous;
  const size_t want = contiguous ? 1 : size_t{layout.num_layers} * layout.num_planes;
  if (regions.size() != want) {
    return Status::InvalidArgument("G1 memory has " + std::to_string(regions.size()) +
                                   " regions; the " + G1ArrangementName(layout.g1_arrangement) +
                                   " arrangement of this layout needs " + std::to_string(want) +
                                   (contiguous ? "" : " (one per layer and plane)"));
  }
  const uint64_t chunk = contiguous ? layout.BlockBytes() : layout.ChunkBytes();
  for (size_t i = 0; i < regions.size(); ++i) {
    if (regions[i].base == nullptr) {
      return Status::InvalidArgument("G1 region " + std::to_string(i) + " has a null base");
    }
    if (regions[i].block_stride < chunk) {
      return Status::InvalidArgument("G1 region " + std::to_string(i) + " has block_stride " +
                                     std::to_string(regions[i].block_stride) +
                                     ", smaller than the " + std::to_string(chunk) +
                                     " bytes each block's chunk takes");
    }
  }
  return Status::Ok();
}

}  // namespace kvtier

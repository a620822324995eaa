// G1Memory: where the engine keeps its paged KV blocks (GPU memory or, for CPU engines, host
// memory), described so kvtier can gather a block out of it and scatter one back in.
#pragma once

#include <cstdint>
#include <vector>

#include "kvtier/layout.h"
#include "kvtier/status.h"

namespace kvtier {

// One contiguous range of the engine's KV memory holding one chunk per block at a fixed stride.
struct G1Region {
  uint8_t* base = nullptr;    // address of block 0's chunk
  uint64_t block_stride = 0;  // bytes from block b's chunk to block b+1's
};

// The engine's KV memory. For G1Arrangement::kLayerSeparate, regions has one entry per
// (layer, plane), in the order layer * num_planes + plane, each chunk ChunkBytes() long. For
// kBlockContiguous, regions has one entry whose chunk is a whole block (BlockBytes()).
struct G1Memory {
  KvLayout layout;
  uint32_t num_blocks = 0;  // blocks the engine has in G1
  std::vector<G1Region> regions;
  bool on_device = false;  // true for GPU memory (only the CUDA backend may touch it)

  // Ok, or InvalidArgument when the layout is invalid, the region count does not match the
  // arrangement, a base is null or a stride is smaller than the chunk it holds.
  Status Validate() const;

  // Address of chunk (layer, plane) of G1 block `block`. REQUIRES: Validate().ok(),
  // block < num_blocks, layer < num_layers, plane < num_planes.
  uint8_t* Chunk(uint32_t block, uint32_t layer, uint32_t plane) const {
    if (layout.g1_arrangement == G1Arrangement::kBlockContiguous) {
      return regions[0].base + block * regions[0].block_stride + layout.ChunkOffset(layer, plane);
    }
    const G1Region& r = regions[layer * layout.num_planes + plane];
    return r.base + block * r.block_stride;
  }
};

}  // namespace kvtier

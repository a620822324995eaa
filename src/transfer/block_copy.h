// Moving one block between the engine's G1 arrangement and a contiguous slot (G2, or a staging
// buffer for G3/G4) in the canonical at-rest order. These are the memcpy backend's kernels.
#pragma once

#include <cstdint>

#include "kvtier/g1_memory.h"

namespace kvtier {

// Copies G1 block `block` (all layers and planes) to dst, BlockBytes() long, canonical order.
// REQUIRES: g1.Validate().ok(), !g1.on_device, block < g1.num_blocks; dst does not overlap G1.
void GatherBlock(const G1Memory& g1, uint32_t block, uint8_t* dst);

// Copies the canonical block at src into G1 block `block`. Same requirements as GatherBlock.
void ScatterBlock(const G1Memory& g1, const uint8_t* src, uint32_t block);

// Copies only layer `layer` of the canonical block at src into G1 block `block`, so a load can
// complete layer by layer. REQUIRES: as ScatterBlock, and layer < num_layers.
void ScatterLayer(const G1Memory& g1, const uint8_t* src, uint32_t block, uint32_t layer);

// memcpy for large, non-overlapping, cold buffers: streaming (non-temporal) stores when the
// CPU has AVX2 and the range is large, plain memcpy otherwise. Neither pointer needs alignment.
void CopyLarge(uint8_t* dst, const uint8_t* src, uint64_t bytes);

}  // namespace kvtier

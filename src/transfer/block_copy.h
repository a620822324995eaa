// Moving one block between the engine's G1 arrangement and a contiguous slot (G2, or a staging
// buffer for G3/G4) in the canonical at-rest order. These are the memcpy backend's kernels.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

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

// Appends to `out` the pieces of G1 memory that G1 block `block`'s canonical payload maps to,
// in canonical order (one per layer and plane; one for a block-contiguous G1), so a block can be
// received straight into G1 (RemoteGet::pieces). REQUIRES: as GatherBlock.
void AppendBlockPieces(const G1Memory& g1, uint32_t block, std::vector<std::span<uint8_t>>* out);

// memcpy for large, non-overlapping, cold buffers. Neither pointer needs alignment. Ranges of
// 256 B..1 MiB whose dst - src is not a multiple of 64 are copied by a 64-byte vector loop
// (glibc's `rep movsb` runs at half speed on them on AMD EPYC); everything else by memcpy.
void CopyLarge(uint8_t* dst, const uint8_t* src, uint64_t bytes);

}  // namespace kvtier

// Moving one block between the engine's G1 arrangement and a contiguous slot (G2, or a staging
// buffer for G3/G4) in the canonical at-rest order. These are the memcpy backend's kernels.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "kvtier/g1_memory.h"

namespace kvtier {

// Copies G1 block `block` (all layers and planes) to dst, BlockBytes() long, canonical order.
// REQUIRES: g1.Validate().ok(), !g1.on_device, block < g1.num_blocks; dst does not overlap G1.
void GatherBlock(const G1Memory& g1, uint32_t block, uint8_t* dst);

// How a copy's stores treat the CPU caches.
//   kCached     ordinary stores: the destination's lines are read first (read for ownership)
//               and stay in the caches.
//   kStreaming  non-temporal stores, which go to memory without reading the destination, as
//               glibc's memcpy does for copies larger than the last-level cache. For a load
//               larger than that cache (the engine cannot find its first layers in the cache
//               by the time it reads them anyway): a 512 MiB load of 32 KiB chunks took
//               1.2-1.5x a memcpy of 512 MiB with cached stores, 1.0-1.2x streaming
//               (AMD EPYC, 2026-12-07, docs/pd.md). The stores are fenced before the copy
//               returns, so the bytes are visible to whoever is told of it next.
enum class Stores { kCached, kStreaming };

// The bytes from which a load is copied with streaming stores, by `transfer.load_stores`:
// "auto": the last-level cache's size (sysconf; 32 MiB where the system does not say);
// "cached": never (UINT64_MAX); "streaming": always (0).
uint64_t StreamLoadBytes(std::string_view load_stores);

// Copies the canonical block at src into G1 block `block`. Same requirements as GatherBlock.
void ScatterBlock(const G1Memory& g1, const uint8_t* src, uint32_t block,
                  Stores stores = Stores::kCached);

// Copies only layer `layer` of the canonical block at src into G1 block `block`, so a load can
// complete layer by layer. REQUIRES: as ScatterBlock, and layer < num_layers.
void ScatterLayer(const G1Memory& g1, const uint8_t* src, uint32_t block, uint32_t layer,
                  Stores stores = Stores::kCached);

// Appends to `out` the pieces of G1 memory that G1 block `block`'s canonical payload maps to,
// in canonical order (one per layer and plane; one for a block-contiguous G1), so a block can be
// received straight into G1 (RemoteGet::pieces). REQUIRES: as GatherBlock.
void AppendBlockPieces(const G1Memory& g1, uint32_t block, std::vector<std::span<uint8_t>>* out);

// memcpy for large, non-overlapping, cold buffers. Neither pointer needs alignment. Ranges of
// 256 B..1 MiB whose dst - src is not a multiple of 64 are copied by a 64-byte vector loop
// (glibc's `rep movsb` runs at half speed on them on AMD EPYC); everything else by memcpy.
// kStreaming: non-temporal stores from the first 64-byte boundary of dst (AVX2 where the CPU
// has it, else SSE2), fenced before it returns.
void CopyLarge(uint8_t* dst, const uint8_t* src, uint64_t bytes, Stores stores = Stores::kCached);

}  // namespace kvtier

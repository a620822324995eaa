// What the transfer tests share: a small layout that moves many blocks quickly, the byte pattern
// that makes a misplaced byte show, and a one-block move.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kvtier/layout.h"
#include "transfer/transfer_engine.h"

namespace kvtier::testing {

// 4 layers x 2 planes x 2 KiB chunks (4 KiB layers, 16 KiB blocks), G1 arranged as `arrangement`.
inline KvLayout SmallLayout(G1Arrangement arrangement = G1Arrangement::kLayerSeparate) {
  return KvLayout{.num_layers = 4,
                  .num_kv_heads = 2,
                  .head_dim = 64,
                  .tokens_per_block = 8,
                  .g1_arrangement = arrangement};
}

// The byte block `b` holds at canonical offset `off`: any misplaced byte shows.
inline uint8_t Pattern(uint64_t b, uint64_t off) {
  return static_cast<uint8_t>((b * 131 + off * 7 + off / 4096) & 0xff);
}

// A move of one block between G1 block `g1_block` and G2 slot `g2_slot`.
inline BlockTransfer Move(BlockTransfer::Op op, uint32_t g1_block, uint32_t g2_slot) {
  BlockTransfer m;
  m.op = op;
  m.g1_block = g1_block;
  m.g2_slot = g2_slot;
  return m;
}

// G1 of `blocks` blocks of `layout` in host memory: `mem` (sized here) holds one region per
// layer and plane, each `blocks` chunks long.
inline G1Memory HostG1(const KvLayout& layout, uint32_t blocks, std::vector<uint8_t>& mem) {
  mem.assign(layout.BlockBytes() * blocks, 0);
  G1Memory g1;
  g1.layout = layout;
  g1.num_blocks = blocks;
  const uint64_t chunk = layout.ChunkBytes();
  for (uint32_t r = 0; r < layout.num_layers * layout.num_planes; ++r) {
    g1.regions.push_back({mem.data() + r * chunk * blocks, chunk});
  }
  return g1;
}

// A host arena of `slots` G2 slots for blocks of `layout`.
inline std::unique_ptr<HostArena> G2Arena(const KvLayout& layout, uint32_t slots) {
  HostArena::Config ac;
  ac.slot_bytes = G2PayloadOffset(layout) + layout.BlockBytes();
  ac.capacity_bytes = (ac.slot_bytes + 4095) / 4096 * 4096 * slots;
  return std::move(HostArena::Create(ac)).value();
}

}  // namespace kvtier::testing

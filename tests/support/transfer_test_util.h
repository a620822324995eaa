// What the transfer tests share: a small layout that moves many blocks quickly, the byte pattern
// that makes a misplaced byte show, and a one-block move.
#pragma once

#include <cstdint>

#include "kvtier/layout.h"
#include "transfer/transfer_engine.h"

namespace kvtier::testing {

// 4 layers x 2 planes x 2 KiB chunks (4 KiB layers, 16 KiB blocks), G1 arranged as `arrangement`.
inline KvLayout SmallLayout(G1Arrangement arrangement = G1Arrangement::kLayerSeparate) {
  KvLayout l;
  l.num_layers = 4;
  l.num_kv_heads = 2;
  l.head_dim = 64;
  l.tokens_per_block = 8;
  l.g1_arrangement = arrangement;
  return l;
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

}  // namespace kvtier::testing

#include "transfer/block_copy.h"

#include <cstring>

namespace kvtier {

void CopyLarge(uint8_t* dst, const uint8_t* src, uint64_t bytes) { std::memcpy(dst, src, bytes); }

void GatherBlock(const G1Memory& g1, uint32_t block, uint8_t* dst) {
  const KvLayout& l = g1.layout;
  if (l.g1_arrangement == G1Arrangement::kBlockContiguous) {
    CopyLarge(dst, g1.Chunk(block, 0, 0), l.BlockBytes());
    return;
  }
  const uint64_t chunk = l.ChunkBytes();
  for (uint32_t layer = 0; layer < l.num_layers; ++layer) {
    for (uint32_t plane = 0; plane < l.num_planes; ++plane) {
      CopyLarge(dst, g1.Chunk(block, layer, plane), chunk);
      dst += chunk;
    }
  }
}

void ScatterLayer(const G1Memory& g1, const uint8_t* src, uint32_t block, uint32_t layer) {
  const KvLayout& l = g1.layout;
  const uint64_t chunk = l.ChunkBytes();
  const uint8_t* p = src + l.ChunkOffset(layer, 0);
  if (l.g1_arrangement == G1Arrangement::kBlockContiguous) {
    CopyLarge(g1.Chunk(block, layer, 0), p, l.LayerBytes());
    return;
  }
  for (uint32_t plane = 0; plane < l.num_planes; ++plane) {
    CopyLarge(g1.Chunk(block, layer, plane), p, chunk);
    p += chunk;
  }
}

void ScatterBlock(const G1Memory& g1, const uint8_t* src, uint32_t block) {
  const KvLayout& l = g1.layout;
  if (l.g1_arrangement == G1Arrangement::kBlockContiguous) {
    CopyLarge(g1.Chunk(block, 0, 0), src, l.BlockBytes());
    return;
  }
  for (uint32_t layer = 0; layer < l.num_layers; ++layer) ScatterLayer(g1, src, block, layer);
}

}  // namespace kvtier

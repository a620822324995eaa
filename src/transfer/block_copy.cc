#include "transfer/block_copy.h"

#include <cstring>

namespace kvtier {

namespace {

// Copies below this go through the vector loop when the two pointers are not equally aligned;
// from here up glibc's memcpy takes its non-temporal path, which is as fast at any alignment.
constexpr uint64_t kLoopBelow = uint64_t{1} << 20;

}  // namespace

void CopyLarge(uint8_t* dst, const uint8_t* src, uint64_t bytes) {
  // glibc's memcpy copies mid-sized ranges (a KV chunk: tens of KiB) with `rep movsb`, which on
  // AMD EPYC runs at about half speed when dst - src is not a multiple of 64: a page-aligned G2
  // slot copied into a malloc'ed G1 (data 16 bytes into its page) took 83-109 ms instead of
  // 48-52 ms per 512 MiB of 32 KiB chunks. A plain 64-byte vector loop runs at 46-57 ms at any
  // alignment (measured 2026-12-04, docs/pd.md). Equally aligned ranges keep memcpy.
  const uintptr_t skew =
      (reinterpret_cast<uintptr_t>(dst) - reinterpret_cast<uintptr_t>(src)) & uintptr_t{63};
  if (skew == 0 || bytes < 256 || bytes >= kLoopBelow) {
    std::memcpy(dst, src, bytes);
    return;
  }
  uint64_t i = 0;
  for (; i + 64 <= bytes; i += 64) __builtin_memcpy(dst + i, src + i, 64);
  std::memcpy(dst + i, src + i, bytes - i);
}

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

void AppendBlockPieces(const G1Memory& g1, uint32_t block, std::vector<std::span<uint8_t>>* out) {
  const KvLayout& l = g1.layout;
  if (l.g1_arrangement == G1Arrangement::kBlockContiguous) {
    out->emplace_back(g1.Chunk(block, 0, 0), l.BlockBytes());
    return;
  }
  for (uint32_t layer = 0; layer < l.num_layers; ++layer) {
    for (uint32_t plane = 0; plane < l.num_planes; ++plane) {
      out->emplace_back(g1.Chunk(block, layer, plane), l.ChunkBytes());
    }
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

// PagedKvCache: the engine's G1 memory: a fixed number of KV blocks in kvtier's layer-separate
// arrangement, and the allocator of those blocks.
//
// For each (layer, plane) there is one region of num_blocks chunks at a stride of ChunkBytes();
// a chunk holds tokens_per_block x kv_heads x head_dim elements, token-major, so the K (plane 0)
// or V (plane 1) vector of token slot s for kv head g starts at element
// (s * kv_heads + g) * head_dim. The regions are exactly what memory() describes to kvtier
// (BlockManager::RegisterDeviceMemory), so kvtier gathers and scatters blocks in place.
//
// Not thread-safe: one engine thread allocates and frees; kvtier's workers only touch the
// chunks of blocks the engine lent them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kvtier/g1_memory.h"
#include "kvtier/layout.h"
#include "kvtier/status.h"

namespace kvtier::engine {

class PagedKvCache {
 public:
  // InvalidArgument when the layout is invalid, its dtype is not fp32 or bf16, its arrangement
  // is not layer-separate, it has not 2 planes, or num_blocks is 0. The memory is zeroed.
  static Result<std::unique_ptr<PagedKvCache>> Create(const KvLayout& layout, uint32_t num_blocks);
  ~PagedKvCache();
  PagedKvCache(const PagedKvCache&) = delete;
  PagedKvCache& operator=(const PagedKvCache&) = delete;

  const KvLayout& layout() const { return layout_; }
  uint32_t num_blocks() const { return num_blocks_; }
  uint32_t tokens_per_block() const { return layout_.tokens_per_block; }

  // The regions, for kvtier. Valid while this cache lives.
  const G1Memory& memory() const { return memory_; }

  // Chunk (layer, plane) of `block` as floats. REQUIRES: an fp32 cache, block < num_blocks,
  // layer < num_layers, plane < 2.
  float* Chunk(uint32_t block, uint32_t layer, uint32_t plane) const {
    return reinterpret_cast<float*>(memory_.Chunk(block, layer, plane));
  }
  // The same chunk as bf16 values (the upper 16 bits of an fp32). REQUIRES: a bf16 cache.
  uint16_t* ChunkBf16(uint32_t block, uint32_t layer, uint32_t plane) const {
    return reinterpret_cast<uint16_t*>(memory_.Chunk(block, layer, plane));
  }
  bool bf16() const { return layout_.dtype == DType::kBf16; }

  // Takes `n` free blocks (lowest ids first). ResourceExhausted, taking none, when fewer than
  // n are free.
  Result<std::vector<uint32_t>> Allocate(uint32_t n);
  // Returns blocks to the free list. InvalidArgument (freeing none) for an id out of range or
  // not allocated.
  Status Free(std::span<const uint32_t> blocks);
  uint32_t free_blocks() const { return static_cast<uint32_t>(free_.size()); }

  // Copies every layer and plane of block `src` to block `dst`. REQUIRES: both < num_blocks.
  void CopyBlock(uint32_t src, uint32_t dst);

 private:
  PagedKvCache() = default;

  KvLayout layout_;
  uint32_t num_blocks_ = 0;
  std::vector<float*> regions_;  // owned: one aligned allocation per (layer, plane)
  G1Memory memory_;
  std::vector<uint32_t> free_;  // a stack; top = lowest id
  std::vector<uint8_t> in_use_;
};

}  // namespace kvtier::engine

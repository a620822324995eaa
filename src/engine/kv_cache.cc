#include "engine/kv_cache.h"

#include <cstdlib>
#include <cstring>

namespace kvtier::engine {

Result<std::unique_ptr<PagedKvCache>> PagedKvCache::Create(const KvLayout& layout,
                                                           uint32_t num_blocks) {
  KVTIER_RETURN_IF_ERROR(layout.Validate());
  if (layout.dtype != DType::kFp32 && layout.dtype != DType::kBf16) {
    return Status::InvalidArgument(std::string("engine KV cache needs fp32 or bf16 KV, not ") +
                                   DTypeName(layout.dtype));
  }
  if (layout.g1_arrangement != G1Arrangement::kLayerSeparate || layout.num_planes != 2) {
    return Status::InvalidArgument("engine KV cache needs a layer-separate layout with K and V");
  }
  if (num_blocks == 0) return Status::InvalidArgument("engine KV cache needs at least one block");
  std::unique_ptr<PagedKvCache> c(new PagedKvCache());
  c->layout_ = layout;
  c->num_blocks_ = num_blocks;
  const uint64_t chunk = layout.ChunkBytes();
  const uint64_t bytes = (chunk * num_blocks + 63) / 64 * 64;
  c->memory_.layout = layout;
  c->memory_.num_blocks = num_blocks;
  for (uint32_t r = 0; r < layout.num_layers * layout.num_planes; ++r) {
    void* p = std::aligned_alloc(64, bytes);
    if (p == nullptr) {
      return Status::ResourceExhausted("cannot allocate " + std::to_string(bytes) +
                                       " bytes of KV cache");
    }
    std::memset(p, 0, bytes);
    c->regions_.push_back(static_cast<float*>(p));
    c->memory_.regions.push_back(G1Region{static_cast<uint8_t*>(p), chunk});
  }
  KVTIER_RETURN_IF_ERROR(c->memory_.Validate());
  c->in_use_.assign(num_blocks, 0);
  c->free_.reserve(num_blocks);
  for (uint32_t b = num_blocks; b-- > 0;) c->free_.push_back(b);
  return c;
}

PagedKvCache::~PagedKvCache() {
  for (float* p : regions_) std::free(p);
}

Result<std::vector<uint32_t>> PagedKvCache::Allocate(uint32_t n) {
  if (n > free_.size()) {
    return Status::ResourceExhausted("KV cache has " + std::to_string(free_.size()) +
                                     " free blocks; " + std::to_string(n) + " requested");
  }
  std::vector<uint32_t> out(n);
  for (uint32_t k = 0; k < n; ++k) {
    out[k] = free_.back();
    free_.pop_back();
    in_use_[out[k]] = 1;
  }
  return out;
}

Status PagedKvCache::Free(std::span<const uint32_t> blocks) {
  // Mark each block 2 while checking, so a duplicate in `blocks` is caught too.
  for (size_t k = 0; k < blocks.size(); ++k) {
    const uint32_t b = blocks[k];
    if (b >= num_blocks_ || in_use_[b] != 1) {
      for (size_t j = 0; j < k; ++j) in_use_[blocks[j]] = 1;
      return Status::InvalidArgument("cannot free KV block " + std::to_string(b) +
                                     ": out of range, not allocated or listed twice");
    }
    in_use_[b] = 2;
  }
  for (uint32_t b : blocks) {
    in_use_[b] = 0;
    free_.push_back(b);
  }
  return Status::Ok();
}

void PagedKvCache::CopyBlock(uint32_t src, uint32_t dst) {
  const uint64_t chunk = layout_.ChunkBytes();
  for (uint32_t l = 0; l < layout_.num_layers; ++l) {
    for (uint32_t p = 0; p < layout_.num_planes; ++p) {
      std::memcpy(memory_.Chunk(dst, l, p), memory_.Chunk(src, l, p), chunk);
    }
  }
}

}  // namespace kvtier::engine

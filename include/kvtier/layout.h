// KvLayout: the shape of one KV block, and how the engine arranges blocks in G1.
//
// Every kvtier-owned tier (G2, G3, G4) stores a block as one contiguous byte range in the
// canonical order layer-major, then plane (K, V), then the (layer, plane) chunk of
// tokens_per_block x kv_heads x head_dim elements exactly as the engine keeps it. The G1
// arrangement only says where those chunks sit in the engine's memory; it is not part of the
// fingerprint, because it does not change the stored bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kvtier/status.h"

namespace kvtier {

enum class DType : uint8_t { kFp32 = 0, kFp16 = 1, kBf16 = 2, kFp8 = 3 };

// Bytes per element: 4, 2, 2, 1.
uint32_t DTypeBytes(DType dtype);
// "fp32", "fp16", "bf16", "fp8".
const char* DTypeName(DType dtype);
// Parses a name returned by DTypeName; InvalidArgument lists the accepted names otherwise.
Result<DType> ParseDType(std::string_view name);

enum class G1Arrangement : uint8_t {
  // One region per (layer, plane); block b's chunk sits at region_base + b * block_stride.
  // vLLM's and SGLang's paged KV caches look like this.
  kLayerSeparate = 0,
  // One region; block b is one contiguous range at base + b * block_stride, in the canonical
  // order described above.
  kBlockContiguous = 1,
};
const char* G1ArrangementName(G1Arrangement arrangement);
Result<G1Arrangement> ParseG1Arrangement(std::string_view name);

struct KvLayout {
  // Limits enforced by Validate().
  static constexpr uint32_t kMaxLayers = 1024;
  static constexpr uint32_t kMaxKvHeads = 1024;
  static constexpr uint32_t kMaxHeadDim = 8192;
  // Any block size up to this, not only powers of two: vLLM picks sizes such as 528 or 784 for
  // hybrid models so that attention pages line up with state-space pages, and its CPU backend
  // takes any multiple of 32. What the limit bounds: the at-rest header (20 KiB of token ids at
  // 4096 tokens, block_format.h) and DecodedBlockHeader's token array.
  static constexpr uint32_t kMaxTokensPerBlock = 4096;
  static constexpr uint64_t kMaxBlockBytes = 1ull << 30;

  uint32_t num_layers = 32;
  uint32_t num_planes = 2;  // 2 = K and V; 1 = a single latent plane (MLA)
  uint32_t num_kv_heads = 8;
  uint32_t head_dim = 128;
  uint32_t tokens_per_block = 16;  // 1..kMaxTokensPerBlock, any value
  DType dtype = DType::kFp16;
  G1Arrangement g1_arrangement = G1Arrangement::kLayerSeparate;

  // Ok, or InvalidArgument naming the first bad field, its value and the allowed range.
  Status Validate() const;

  // Bytes of one (layer, plane) chunk of one block. REQUIRES: Validate().ok().
  uint64_t ChunkBytes() const {
    return uint64_t{tokens_per_block} * num_kv_heads * head_dim * DTypeBytes(dtype);
  }
  // Bytes of one layer of one block (all planes).
  uint64_t LayerBytes() const { return ChunkBytes() * num_planes; }
  // Bytes of one whole block (all layers and planes).
  uint64_t BlockBytes() const { return LayerBytes() * num_layers; }
  // Offset of chunk (layer, plane) inside a block stored in the canonical order.
  uint64_t ChunkOffset(uint32_t layer, uint32_t plane) const {
    return (uint64_t{layer} * num_planes + plane) * ChunkBytes();
  }

  // A stable 64-bit fingerprint of everything that determines the stored bytes (all fields
  // but g1_arrangement). Identical across processes, machines and kvtier versions that keep
  // the same at-rest format.
  uint64_t Fingerprint() const;

  // "32L x 2P x 8H x 128D x 16T fp16 (2.00 MiB/block, layer-separate)".
  std::string ToString() const;
};

}  // namespace kvtier

#include "kvtier/layout.h"

#include <cstdio>
#include <string>

#include "core/sha256.h"

namespace kvtier {

uint32_t DTypeBytes(DType dtype) {
  switch (dtype) {
    case DType::kFp32:
      return 4;
    case DType::kFp16:
      return 2;
    case DType::kBf16:
      return 2;
    case DType::kFp8:
      return 1;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFp32:
      return "fp32";
    case DType::kFp16:
      return "fp16";
    case DType::kBf16:
      return "bf16";
    case DType::kFp8:
      return "fp8";
  }
  return "?";
}

Result<DType> ParseDType(std::string_view name) {
  for (DType d : {DType::kFp32, DType::kFp16, DType::kBf16, DType::kFp8}) {
    if (name == DTypeName(d)) return d;
  }
  return Status::InvalidArgument("dtype '" + std::string(name) +
                                 "' is not known; use one of fp32, fp16, bf16, fp8");
}

const char* G1ArrangementName(G1Arrangement arrangement) {
  switch (arrangement) {
    case G1Arrangement::kLayerSeparate:
      return "layer-separate";
    case G1Arrangement::kBlockContiguous:
      return "block-contiguous";
  }
  return "?";
}

Result<G1Arrangement> ParseG1Arrangement(std::string_view name) {
  for (G1Arrangement a : {G1Arrangement::kLayerSeparate, G1Arrangement::kBlockContiguous}) {
    if (name == G1ArrangementName(a)) return a;
  }
  return Status::InvalidArgument("G1 arrangement '" + std::string(name) +
                                 "' is not known; use layer-separate or block-contiguous");
}

namespace {

Status OutOfRange(const char* field, uint64_t value, const char* allowed) {
  return Status::InvalidArgument("layout field " + std::string(field) + " = " +
                                 std::to_string(value) + " is out of range; allowed: " + allowed);
}

}  // namespace

Status KvLayout::Validate() const {
  if (num_layers < 1 || num_layers > kMaxLayers)
    return OutOfRange("num_layers", num_layers, "1..1024");
  if (num_planes != 1 && num_planes != 2) {
    return OutOfRange("num_planes", num_planes, "1 (MLA latent) or 2 (K and V)");
  }
  if (num_kv_heads < 1 || num_kv_heads > kMaxKvHeads) {
    return OutOfRange("num_kv_heads", num_kv_heads, "1..1024");
  }
  if (head_dim < 1 || head_dim > kMaxHeadDim) return OutOfRange("head_dim", head_dim, "1..8192");
  if (tokens_per_block < 1 || tokens_per_block > kMaxTokensPerBlock) {
    const std::string allowed =
        "1.." + std::to_string(kMaxTokensPerBlock) + " (any size, not only powers of two)";
    return OutOfRange("tokens_per_block", tokens_per_block, allowed.c_str());
  }
  if (DTypeBytes(dtype) == 0) {
    return OutOfRange("dtype", static_cast<uint64_t>(dtype), "fp32, fp16, bf16, fp8");
  }
  if (g1_arrangement != G1Arrangement::kLayerSeparate &&
      g1_arrangement != G1Arrangement::kBlockContiguous) {
    return OutOfRange("g1_arrangement", static_cast<uint64_t>(g1_arrangement),
                      "layer-separate or block-contiguous");
  }
  if (BlockBytes() > kMaxBlockBytes) {
    return OutOfRange("block bytes (layers x planes x tokens x heads x head_dim x dtype)",
                      BlockBytes(), "at most 1 GiB per block");
  }
  return Status::Ok();
}

uint64_t KvLayout::Fingerprint() const {
  // Canonical little-endian serialization, versioned so that a future field can be added
  // without colliding with today's fingerprints.
  uint8_t buf[32] = {'k', 'v', 'l', 'a', 'y', 'o', 'u', 't', '1'};
  size_t n = 9;
  auto put32 = [&](uint32_t v) {
    for (int i = 0; i < 4; ++i) buf[n++] = static_cast<uint8_t>(v >> (8 * i));
  };
  put32(num_layers);
  put32(num_planes);
  put32(num_kv_heads);
  put32(head_dim);
  put32(tokens_per_block);
  buf[n++] = static_cast<uint8_t>(dtype);
  uint8_t digest[32];
  Sha256(buf, n, digest);
  uint64_t fp = 0;
  for (int i = 0; i < 8; ++i) fp = (fp << 8) | digest[i];
  return fp;
}

std::string KvLayout::ToString() const {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%uL x %uP x %uH x %uD x %uT %s (%.2f MiB/block, %s)", num_layers,
                num_planes, num_kv_heads, head_dim, tokens_per_block, DTypeName(dtype),
                static_cast<double>(BlockBytes()) / (1 << 20), G1ArrangementName(g1_arrangement));
  return buf;
}

}  // namespace kvtier

// f16/bf16 conversion and block dequantization for the GGUF types the engine loads.
//
// Block layouts (GGUF spec; all scales are IEEE half floats, little-endian):
//   Q8_0: d, int8 q[32]                       x[j] = d * q[j]
//   Q4_0: d, uint8 qs[16]                     x[j] = d * ((qs[j] & 15) - 8),
//                                             x[j + 16] = d * ((qs[j] >> 4) - 8)
//   Q4_1: d, m, uint8 qs[16]                  x[j] = d * (qs[j] & 15) + m,
//                                             x[j + 16] = d * (qs[j] >> 4) + m
#include <bit>
#include <cmath>
#include <cstring>

#include "engine/gguf.h"

namespace kvtier::engine {
namespace {

uint16_t Load16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

}  // namespace

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float.
    const float mag = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -mag : mag;
  }
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf or NaN (payload kept)
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

float Bf16ToFloat(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

uint16_t FloatToHalf(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    return sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u);
  }
  const float a = std::bit_cast<float>(abs);
  if (a >= 65520.0f) return sign | 0x7c00u;  // rounds to infinity
  if (a < std::ldexp(1.0f, -14)) {
    // Subnormal half: round a / 2^-24 to nearest even.
    const float q = std::nearbyint(std::ldexp(a, 24));
    return sign | static_cast<uint16_t>(q);
  }
  // Normal: keep 10 mantissa bits, round to nearest even.
  uint32_t e = (abs >> 23) - 127 + 15;
  uint32_t m = abs & 0x7fffffu;
  uint32_t half = (e << 10) | (m >> 13);
  const uint32_t rest = m & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // may carry into exponent
  return sign | static_cast<uint16_t>(half);
}

Status DequantizeRow(GgmlType type, const uint8_t* src, uint64_t n, float* dst) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return Status::Ok();
    case GgmlType::kF16:
      for (uint64_t k = 0; k < n; ++k) dst[k] = HalfToFloat(Load16(src + 2 * k));
      return Status::Ok();
    case GgmlType::kBF16:
      for (uint64_t k = 0; k < n; ++k) dst[k] = Bf16ToFloat(Load16(src + 2 * k));
      return Status::Ok();
    case GgmlType::kQ8_0:
      for (uint64_t b = 0; b < n / 32; ++b) {
        const uint8_t* blk = src + b * 34;
        const float d = HalfToFloat(Load16(blk));
        for (int j = 0; j < 32; ++j) {
          dst[b * 32 + j] = d * static_cast<float>(static_cast<int8_t>(blk[2 + j]));
        }
      }
      return Status::Ok();
    case GgmlType::kQ4_0:
      for (uint64_t b = 0; b < n / 32; ++b) {
        const uint8_t* blk = src + b * 18;
        const float d = HalfToFloat(Load16(blk));
        const uint8_t* qs = blk + 2;
        for (int j = 0; j < 16; ++j) {
          dst[b * 32 + j] = d * static_cast<float>((qs[j] & 0x0f) - 8);
          dst[b * 32 + j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
        }
      }
      return Status::Ok();
    case GgmlType::kQ4_1:
      for (uint64_t b = 0; b < n / 32; ++b) {
        const uint8_t* blk = src + b * 20;
        const float d = HalfToFloat(Load16(blk));
        const float m = HalfToFloat(Load16(blk + 2));
        const uint8_t* qs = blk + 4;
        for (int j = 0; j < 16; ++j) {
          dst[b * 32 + j] = d * static_cast<float>(qs[j] & 0x0f) + m;
          dst[b * 32 + j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
        }
      }
      return Status::Ok();
    default:
      break;
  }
  const GgmlTypeTraits* t = GetGgmlTypeTraits(static_cast<uint32_t>(type));
  return Status::InvalidArgument(std::string("cannot dequantize ggml type ") +
                                 (t ? t->name : std::to_string(static_cast<uint32_t>(type))) +
                                 " (supported: F32, F16, BF16, Q4_0, Q4_1, Q8_0)");
}

}  // namespace kvtier::engine

#include "transfer/block_copy.h"

#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <cstring>

namespace kvtier {

namespace {

// Copies below this go through the vector loop when the two pointers are not equally aligned;
// from here up glibc's memcpy takes its non-temporal path, which is as fast at any alignment.
constexpr uint64_t kLoopBelow = uint64_t{1} << 20;

void CopyCached(uint8_t* dst, const uint8_t* src, uint64_t bytes);

#if defined(__x86_64__)
// The body of a streaming copy: dst is 64-byte aligned, bytes a multiple of `step`.
void StreamSse2(uint8_t* dst, const uint8_t* src, uint64_t bytes) {
  for (uint64_t i = 0; i < bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
}

__attribute__((target("avx2"))) void StreamAvx2(uint8_t* dst, const uint8_t* src, uint64_t bytes) {
  for (uint64_t i = 0; i < bytes; i += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 64));
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 96), d);
  }
}

// AVX2 was faster than SSE2 at full memory bandwidth (1.0x vs 1.2x memcpy); AVX-512 was not
// faster than AVX2 (AMD EPYC, 2026-12-07).
bool HasAvx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return has;
}

void CopyStreaming(uint8_t* dst, const uint8_t* src, uint64_t bytes) {
  const bool avx2 = HasAvx2();
  const uint64_t step = avx2 ? 128 : 64;
  const uint64_t head = (64 - (reinterpret_cast<uintptr_t>(dst) & 63)) & 63;
  if (bytes < head + step) {
    CopyCached(dst, src, bytes);
    return;
  }
  CopyCached(dst, src, head);
  const uint64_t body = (bytes - head) / step * step;
  if (avx2) {
    StreamAvx2(dst + head, src + head, body);
  } else {
    StreamSse2(dst + head, src + head, body);
  }
  CopyCached(dst + head + body, src + head + body, bytes - head - body);
  _mm_sfence();  // the streamed lines are in memory before anyone is told of the copy
}
#else
void CopyStreaming(uint8_t* dst, const uint8_t* src, uint64_t bytes) {
  CopyCached(dst, src, bytes);
}
#endif

void CopyCached(uint8_t* dst, const uint8_t* src, uint64_t bytes) {
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

}  // namespace

uint64_t StreamLoadBytes(std::string_view load_stores) {
  if (load_stores == "cached") return UINT64_MAX;
  if (load_stores == "streaming") return 0;
  static const uint64_t llc = [] {
    const long l3 = ::sysconf(_SC_LEVEL3_CACHE_SIZE);
    return l3 > 0 ? static_cast<uint64_t>(l3) : uint64_t{32} << 20;
  }();
  return llc;
}

void CopyLarge(uint8_t* dst, const uint8_t* src, uint64_t bytes, Stores stores) {
  if (stores == Stores::kStreaming) {
    CopyStreaming(dst, src, bytes);
  } else {
    CopyCached(dst, src, bytes);
  }
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

void ScatterLayer(const G1Memory& g1, const uint8_t* src, uint32_t block, uint32_t layer,
                  Stores stores) {
  const KvLayout& l = g1.layout;
  const uint64_t chunk = l.ChunkBytes();
  const uint8_t* p = src + l.ChunkOffset(layer, 0);
  if (l.g1_arrangement == G1Arrangement::kBlockContiguous) {
    CopyLarge(g1.Chunk(block, layer, 0), p, l.LayerBytes(), stores);
    return;
  }
  for (uint32_t plane = 0; plane < l.num_planes; ++plane) {
    CopyLarge(g1.Chunk(block, layer, plane), p, chunk, stores);
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

void ScatterBlock(const G1Memory& g1, const uint8_t* src, uint32_t block, Stores stores) {
  const KvLayout& l = g1.layout;
  if (l.g1_arrangement == G1Arrangement::kBlockContiguous) {
    CopyLarge(g1.Chunk(block, 0, 0), src, l.BlockBytes(), stores);
    return;
  }
  for (uint32_t layer = 0; layer < l.num_layers; ++layer) {
    ScatterLayer(g1, src, block, layer, stores);
  }
}

}  // namespace kvtier

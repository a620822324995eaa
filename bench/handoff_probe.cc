// Standalone probes behind docs/pd.md's "Where the one-host time goes" (issue 40): the one-host
// handoff's copy (512 MiB as 32 layers x 256 blocks x 2 planes of 32 KiB chunks, layer-major,
// from a 4 KiB-paged memfd laid out as G2 slots into 64 malloc-like G1 regions) against memcpy,
// with cached and non-temporal stores, 4 KiB and 2 MiB pages, a pre-faulted and a fresh G1.
// The variants run in turns, `rounds` times; it prints min / median / max and the median of
// each round's ratio to the first variant (memcpy between 4 KiB-paged buffers). Not built by
// CMake:
//
//   g++ -O3 -std=c++20 -o /tmp/handoff_probe bench/handoff_probe.cc
//   /tmp/handoff_probe stores|pages|faults [rounds]
#include <immintrin.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

constexpr uint64_t kBlocks = 256, kChunk = 32768, kRegions = 64, kLayers = 32;
constexpr uint64_t kBytes = kBlocks * kChunk * kRegions;
constexpr uint64_t kStride = (2 << 20) + 4096;  // a G2 slot: header area + 2 MiB payload
constexpr uint64_t kHuge = 2 << 20;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
long MinorFaults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

using Copy = void (*)(uint8_t*, const uint8_t*, uint64_t);

// kvtier's cached copy before issue 40 (CopyLarge): a 64-byte loop when dst - src is not a
// multiple of 64, else memcpy.
void Cached(uint8_t* dst, const uint8_t* src, uint64_t n) {
  if (((uintptr_t)dst - (uintptr_t)src) % 64 == 0 || n >= (1u << 20)) {
    std::memcpy(dst, src, n);
    return;
  }
  uint64_t i = 0;
  for (; i + 64 <= n; i += 64) __builtin_memcpy(dst + i, src + i, 64);
  std::memcpy(dst + i, src + i, n - i);
}
uint64_t Head(uint8_t* dst, const uint8_t* src, uint64_t n) {
  const uint64_t h = std::min<uint64_t>(n, (64 - ((uintptr_t)dst & 63)) & 63);
  std::memcpy(dst, src, h);
  return h;
}
void NtSse2(uint8_t* dst, const uint8_t* src, uint64_t n) {
  uint64_t i = Head(dst, src, n);
  for (; i + 64 <= n; i += 64) {
    for (int k = 0; k < 4; ++k) {
      _mm_stream_si128((__m128i*)(dst + i + 16 * k),
                       _mm_loadu_si128((const __m128i*)(src + i + 16 * k)));
    }
  }
  std::memcpy(dst + i, src + i, n - i);
  _mm_sfence();
}
__attribute__((target("avx2"))) void NtAvx2(uint8_t* dst, const uint8_t* src, uint64_t n) {
  uint64_t i = Head(dst, src, n);
  for (; i + 128 <= n; i += 128) {
    __m256i r[4];
    for (int k = 0; k < 4; ++k) r[k] = _mm256_loadu_si256((const __m256i*)(src + i + 32 * k));
    for (int k = 0; k < 4; ++k) _mm256_stream_si256((__m256i*)(dst + i + 32 * k), r[k]);
  }
  std::memcpy(dst + i, src + i, n - i);
  _mm_sfence();
}
__attribute__((target("avx512f"))) void NtAvx512(uint8_t* dst, const uint8_t* src, uint64_t n) {
  uint64_t i = Head(dst, src, n);
  for (; i + 256 <= n; i += 256) {
    __m512i r[4];
    for (int k = 0; k < 4; ++k) r[k] = _mm512_loadu_si512(src + i + 64 * k);
    for (int k = 0; k < 4; ++k) _mm512_stream_si512((__m512i*)(dst + i + 64 * k), r[k]);
  }
  std::memcpy(dst + i, src + i, n - i);
  _mm_sfence();
}

// An anonymous mapping, 2 MiB-aligned, advised (0: not), pre-faulted; data at +offset.
uint8_t* Anon(uint64_t bytes, int advice, uint64_t offset = 16) {
  void* p =
      mmap(nullptr, bytes + 2 * kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) std::abort();
  uint8_t* a = (uint8_t*)(((uintptr_t)p + kHuge - 1) & ~(kHuge - 1));
  if (advice) madvise(a, bytes + kHuge, advice);
  std::memset(a + offset, 1, bytes);
  return a + offset;
}

struct Variant {
  std::string name;
  std::function<void()> run;
  std::vector<double> s;
  long faults = 0;
};

}  // namespace

int main(int argc, char** argv) {
  const std::string set = argc > 1 ? argv[1] : "stores";
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 11;
  // G2: a memfd of slots (4 KiB pages unless shmem THP allows more), and a 2 MiB-paged stand-in.
  const uint64_t g2_bytes = kBlocks * kStride + kHuge;
  const int fd = memfd_create("probe-g2", 0);
  if (fd < 0 || ftruncate(fd, g2_bytes) != 0) return 1;
  auto* g2 = (uint8_t*)mmap(nullptr, g2_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  madvise(g2, g2_bytes, MADV_HUGEPAGE);
  std::memset(g2, 3, g2_bytes);
  uint8_t* g2_huge = Anon(g2_bytes, MADV_HUGEPAGE, 0);
  std::vector<uint8_t*> g1, g1_huge;
  for (uint64_t r = 0; r < kRegions; ++r) {
    g1.push_back(Anon((kBlocks + 1) * kChunk, 0));
    g1_huge.push_back(Anon((kBlocks + 1) * kChunk, MADV_HUGEPAGE));
  }
  uint8_t *a = Anon(kBytes, 0), *b = Anon(kBytes, 0);
  uint8_t *ha = Anon(kBytes, MADV_HUGEPAGE), *hb = Anon(kBytes, MADV_HUGEPAGE);
  auto load = [&](Copy copy, const uint8_t* src, const std::vector<uint8_t*>& dst) {
    for (uint64_t l = 0; l < kLayers; ++l)
      for (uint64_t blk = 0; blk < kBlocks; ++blk)
        for (uint64_t p = 0; p < 2; ++p) {
          const uint64_t r = l * 2 + p;
          copy(dst[r] + blk * kChunk, src + blk * kStride + 4096 + r * kChunk, kChunk);
        }
  };
  auto fresh = [&](Copy copy) {
    std::vector<uint8_t*> d;
    for (uint64_t r = 0; r < kRegions; ++r) {
      d.push_back((uint8_t*)mmap(nullptr, (kBlocks + 1) * kChunk, PROT_READ | PROT_WRITE,
                                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) +
                  16);
    }
    load(copy, g2, d);
    for (uint8_t* p : d) munmap(p - 16, (kBlocks + 1) * kChunk);
  };
  std::vector<Variant> v = {{"memcpy, 4 KiB pages", [&] { std::memcpy(b, a, kBytes); }}};
  if (set == "stores") {
    v.push_back({"load, cached (kvtier before)", [&] { load(Cached, g2, g1); }});
    v.push_back({"load, NT SSE2", [&] { load(NtSse2, g2, g1); }});
    v.push_back({"load, NT AVX2 (kvtier now)", [&] { load(NtAvx2, g2, g1); }});
    v.push_back({"load, NT AVX-512", [&] { load(NtAvx512, g2, g1); }});
  } else if (set == "pages") {
    v.push_back({"memcpy, 2 MiB pages", [&] { std::memcpy(hb, ha, kBytes); }});
    v.push_back({"load NT, 4K G2 -> 4K G1", [&] { load(NtAvx2, g2, g1); }});
    v.push_back({"load NT, 2M G2 -> 4K G1", [&] { load(NtAvx2, g2_huge, g1); }});
    v.push_back({"load NT, 2M G2 -> 2M G1", [&] { load(NtAvx2, g2_huge, g1_huge); }});
    v.push_back({"load cached, 4K G2 -> 4K G1", [&] { load(Cached, g2, g1); }});
    v.push_back({"load cached, 2M G2 -> 2M G1", [&] { load(Cached, g2_huge, g1_huge); }});
  } else if (set == "faults") {
    v.push_back({"load NT, pre-faulted G1", [&] { load(NtAvx2, g2, g1); }});
    v.push_back({"load NT, fresh G1", [&] { fresh(NtAvx2); }});
    v.push_back({"load cached, pre-faulted G1", [&] { load(Cached, g2, g1); }});
    v.push_back({"load cached, fresh G1", [&] { fresh(Cached); }});
  } else {
    std::fprintf(stderr, "usage: %s stores|pages|faults [rounds]\n", argv[0]);
    return 2;
  }
  for (int r = 0; r < rounds; ++r) {
    for (Variant& x : v) {
      const long f0 = MinorFaults();
      const double t0 = Now();
      x.run();
      x.s.push_back(Now() - t0);
      x.faults = MinorFaults() - f0;
    }
  }
  std::printf("%-30s %8s %8s %8s  %s  %s\n", "512 MiB", "min ms", "median", "max", "ratio",
              "faults");
  for (Variant& x : v) {
    std::vector<double> s = x.s, q;
    std::sort(s.begin(), s.end());
    for (int r = 0; r < rounds; ++r) q.push_back(x.s[r] / v[0].s[r]);
    std::sort(q.begin(), q.end());
    std::printf("%-30s %8.1f %8.1f %8.1f  %.2f  %ld\n", x.name.c_str(), s[0] * 1e3,
                s[s.size() / 2] * 1e3, s.back() * 1e3, q[q.size() / 2], x.faults);
  }
  return 0;
}

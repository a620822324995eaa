// The body of the device gather/scatter kernel: one thread's share of one CopyUnit.
//
// This header compiles both as CUDA (the kernel in cuda_copy_kernel.cu calls CopyUnitSlice with
// threadIdx/blockDim) and as plain C++ (tests run the very same function on the CPU for every
// simulated thread, so the indexing is checked without a GPU). It must stay free of CUDA-only
// constructs outside the KVTIER_HOST_DEVICE macro.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define KVTIER_HOST_DEVICE __host__ __device__
#else
#define KVTIER_HOST_DEVICE
#endif

namespace kvtier {

// One contiguous copy of `bytes` bytes from address `src` to address `dst`, both as the device
// sees them. Built by BuildDeviceCopyPlan (device_copy_plan.h), which bounds bytes.
struct CopyUnit {
  uint64_t src = 0;
  uint64_t dst = 0;
  uint64_t bytes = 0;
};
static_assert(sizeof(CopyUnit) == 24, "CopyUnit is uploaded to the device as raw bytes");

// 16 bytes moved as one load and one store.
struct alignas(16) CopyVec16 {
  uint64_t lo;
  uint64_t hi;
};

// Copies the part of `u` that thread `tid` of `nthreads` owns: 16-byte vectors i = tid,
// tid + nthreads, ... when src, dst and bytes are all multiples of 16, else single bytes with
// the same striding. Four independent loads are issued before their stores, so a thread keeps
// several PCIe reads in flight when the source is mapped host memory. Every thread of a group
// calling this with tid = 0..nthreads-1 copies every byte of `u` exactly once and touches no
// byte outside [src, src + bytes) and [dst, dst + bytes). REQUIRES: nthreads >= 1,
// tid < nthreads, the ranges do not overlap.
KVTIER_HOST_DEVICE inline void CopyUnitSlice(const CopyUnit& u, uint64_t tid, uint64_t nthreads) {
  if (((u.src | u.dst | u.bytes) & 15) == 0) {
    const CopyVec16* s = reinterpret_cast<const CopyVec16*>(u.src);
    CopyVec16* d = reinterpret_cast<CopyVec16*>(u.dst);
    const uint64_t n = u.bytes / 16;
    uint64_t i = tid;
    for (; i + 3 * nthreads < n; i += 4 * nthreads) {
      const CopyVec16 a = s[i];
      const CopyVec16 b = s[i + nthreads];
      const CopyVec16 c = s[i + 2 * nthreads];
      const CopyVec16 e = s[i + 3 * nthreads];
      d[i] = a;
      d[i + nthreads] = b;
      d[i + 2 * nthreads] = c;
      d[i + 3 * nthreads] = e;
    }
    for (; i < n; i += nthreads) d[i] = s[i];
    return;
  }
  const uint8_t* s = reinterpret_cast<const uint8_t*>(u.src);
  uint8_t* d = reinterpret_cast<uint8_t*>(u.dst);
  for (uint64_t i = tid; i < u.bytes; i += nthreads) d[i] = s[i];
}

}  // namespace kvtier

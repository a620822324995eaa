// The gather/scatter kernel: the device side of a DeviceCopyPlan layer. Kept to one small,
// bounds-checked loop (CopyUnitSlice, shared with the CPU tests) so that a mistake shows on the
// CPU: there is no GPU where this was written.
#include "transfer/cuda_copy_kernel.h"

namespace kvtier {
namespace {

__global__ void CopyUnitsKernel(const CopyUnit* __restrict__ units, uint32_t count) {
  for (uint32_t i = blockIdx.x; i < count; i += gridDim.x) {
    const CopyUnit u = units[i];
    CopyUnitSlice(u, threadIdx.x, blockDim.x);
  }
}

}  // namespace

cudaError_t LaunchCopyUnits(const CopyUnit* units, uint32_t count, uint32_t threads,
                            uint32_t max_blocks, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const uint32_t blocks = count < max_blocks ? count : max_blocks;
  CopyUnitsKernel<<<blocks, threads, 0, stream>>>(units, count);
  return cudaGetLastError();
}

}  // namespace kvtier

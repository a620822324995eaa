// Launcher of the device gather/scatter kernel (cuda_copy_kernel.cu). Host code includes only
// this and the CUDA runtime API header; nvcc compiles the kernel itself.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "transfer/device_copy_kernel.h"

namespace kvtier {

// Enqueues on `stream` one kernel that runs units[0..count) (an array in device memory): each
// thread block takes units blockIdx.x, blockIdx.x + gridDim.x, ... and its `threads` threads
// share each unit (CopyUnitSlice). grid = min(count, max_blocks). Returns the launch error
// (cudaSuccess when enqueued); count == 0 enqueues nothing.
cudaError_t LaunchCopyUnits(const CopyUnit* units, uint32_t count, uint32_t threads,
                            uint32_t max_blocks, cudaStream_t stream);

}  // namespace kvtier

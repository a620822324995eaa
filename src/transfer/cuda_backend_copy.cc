// The CUDA transfer backend, part 3 of 3: device allocations and plain (unbatched) copies, which
// tests and `kvtier bench copy` use to set up device memory and to time cudaMemcpy as the raw
// limit. The class is in cuda_backend_internal.h; set-up and registration are in cuda_backend.cc,
// the batch path in cuda_backend_batch.cc. See device_backend.h and docs/cuda.md.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "core/log.h"
#include "transfer/cuda_backend_internal.h"
#include "transfer/device_backend.h"

namespace kvtier {
namespace cuda_internal {

Result<uint8_t*> CudaBackend::AllocateDevice(uint64_t bytes) {
  (void)cudaSetDevice(config_.device);
  void* p = nullptr;
  KVTIER_RETURN_IF_ERROR(
      CudaCheck(cudaMalloc(&p, bytes), "cudaMalloc of " + std::to_string(bytes) + " bytes"));
  return static_cast<uint8_t*>(p);
}

void CudaBackend::FreeDevice(uint8_t* ptr) {
  if (ptr == nullptr) return;
  const cudaError_t e = cudaFree(ptr);
  if (e != cudaSuccess) KVTIER_LOG(kWarn) << "cudaFree: " << CudaErrorText(e);
}

Status CudaBackend::CopyToDevice(uint8_t* dev, const uint8_t* host, uint64_t bytes) {
  (void)cudaSetDevice(config_.device);
  KVTIER_RETURN_IF_ERROR(
      CudaCheck(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device"));
  // From pageable memory cudaMemcpy may return before the DMA landed, and the backend's
  // non-blocking streams do not wait for the legacy stream: wait for it here. (Only the
  // legacy stream: a stalled load stream, see the test hook, must not block this.)
  return CudaCheck(cudaStreamSynchronize(0), "cudaStreamSynchronize after a copy to the device");
}

Status CudaBackend::CopyFromDevice(uint8_t* host, const uint8_t* dev, uint64_t bytes) {
  (void)cudaSetDevice(config_.device);
  return CudaCheck(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy from device");
}

Result<DeviceCopyBackend::PlainCopyTime> CudaBackend::TimePlainCopy(CopyDirection dir, uint8_t* dev,
                                                                    uint8_t* host, uint64_t bytes,
                                                                    uint32_t reps) {
  (void)cudaSetDevice(config_.device);
  cudaStream_t s = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  Status st = CudaCheck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  if (st.ok()) st = CudaCheck(cudaEventCreate(&e0), "cudaEventCreate");
  if (st.ok()) st = CudaCheck(cudaEventCreate(&e1), "cudaEventCreate");
  PlainCopyTime best{1e30, 1e30};
  const bool d2h = dir == CopyDirection::kDeviceToHost;
  for (uint32_t r = 0; st.ok() && r < reps; ++r) {
    const auto wall0 = std::chrono::steady_clock::now();
    st = CudaCheck(cudaEventRecord(e0, s), "cudaEventRecord");
    if (st.ok()) {
      st = CudaCheck(cudaMemcpyAsync(d2h ? static_cast<void*>(host) : static_cast<void*>(dev),
                                     d2h ? static_cast<const void*>(dev) : host, bytes,
                                     d2h ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, s),
                     "cudaMemcpyAsync (plain)");
    }
    if (st.ok()) st = CudaCheck(cudaEventRecord(e1, s), "cudaEventRecord");
    if (st.ok()) st = CudaCheck(cudaEventSynchronize(e1), "cudaEventSynchronize");
    const double wall_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    float ms = 0;
    if (st.ok()) st = CudaCheck(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
    if (st.ok()) {
      best.device_s = std::min(best.device_s, ms / 1e3);
      best.wall_s = std::min(best.wall_s, wall_s);
    }
  }
  if (e0 != nullptr) (void)cudaEventDestroy(e0);
  if (e1 != nullptr) (void)cudaEventDestroy(e1);
  if (s != nullptr) (void)cudaStreamDestroy(s);
  if (!st.ok()) return st;
  return best;
}

}  // namespace cuda_internal
}  // namespace kvtier

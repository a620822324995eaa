// The engine-side kernels and runtime calls of the GPU ordering tests (cuda_test_kernels.h).
#include <cuda_runtime_api.h>

#include "cuda_test_kernels.h"

namespace kvtier::cuda_test {
namespace {

cudaStream_t S(uintptr_t stream) { return reinterpret_cast<cudaStream_t>(stream); }

__device__ uint64_t GlobalTimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void SpinKernel(uint64_t ns) {
  const uint64_t start = GlobalTimer();
  while (GlobalTimer() - start < ns) {
  }
}

__global__ void FillKernel(uint8_t* dev, uint64_t bytes, uint32_t seed, uint64_t off0, bool zero) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < bytes;
       i += uint64_t{gridDim.x} * blockDim.x) {
    dev[i] = zero ? 0 : TestByte(seed, off0 + i);
  }
}

__global__ void CheckKernel(const uint8_t* dev, uint64_t bytes, uint32_t seed, uint64_t off0,
                            unsigned long long* bad_count) {
  unsigned long long bad = 0;
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < bytes;
       i += uint64_t{gridDim.x} * blockDim.x) {
    bad += dev[i] != TestByte(seed, off0 + i) ? 1 : 0;
  }
  if (bad != 0) atomicAdd(bad_count, bad);
}

constexpr unsigned kBlocks = 64, kThreads = 256;

}  // namespace

std::string ErrorText(int error) {
  return std::string(cudaGetErrorString(static_cast<cudaError_t>(error))) + " (error " +
         std::to_string(error) + ")";
}

int CreateStream(uintptr_t* stream) {
  cudaStream_t s = nullptr;
  const cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  *stream = reinterpret_cast<uintptr_t>(s);
  return e;
}
int DestroyStream(uintptr_t stream) { return stream == 0 ? 0 : cudaStreamDestroy(S(stream)); }
int SyncStream(uintptr_t stream) { return cudaStreamSynchronize(S(stream)); }
int StreamBusy(uintptr_t stream, bool* busy) {
  const cudaError_t e = cudaStreamQuery(S(stream));
  *busy = e == cudaErrorNotReady;
  if (e == cudaErrorNotReady) return cudaSuccess;
  return e;
}
int BeginCapture(uintptr_t stream) {
  return cudaStreamBeginCapture(S(stream), cudaStreamCaptureModeRelaxed);
}
int EndCapture(uintptr_t stream) {
  cudaGraph_t graph = nullptr;
  const cudaError_t e = cudaStreamEndCapture(S(stream), &graph);
  if (graph != nullptr) (void)cudaGraphDestroy(graph);
  return e;
}

int Malloc(uint8_t** dev, uint64_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  *dev = static_cast<uint8_t*>(p);
  return e;
}
int Free(void* dev) { return cudaFree(dev); }
int MemsetSync(uint8_t* dev, int value, uint64_t bytes) {
  const cudaError_t e = cudaMemset(dev, value, bytes);
  return e != cudaSuccess ? e : cudaDeviceSynchronize();
}
int CopyToHostSync(void* host, const void* dev, uint64_t bytes) {
  return cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost);
}

int LaunchSpin(uintptr_t stream, uint64_t ns) {
  SpinKernel<<<1, 1, 0, S(stream)>>>(ns);
  return cudaGetLastError();
}
int LaunchFill(uintptr_t stream, uint8_t* dev, uint64_t bytes, uint32_t seed, uint64_t off0,
               bool zero) {
  FillKernel<<<kBlocks, kThreads, 0, S(stream)>>>(dev, bytes, seed, off0, zero);
  return cudaGetLastError();
}
int LaunchCheck(uintptr_t stream, const uint8_t* dev, uint64_t bytes, uint32_t seed, uint64_t off0,
                unsigned long long* bad_count) {
  CheckKernel<<<kBlocks, kThreads, 0, S(stream)>>>(dev, bytes, seed, off0, bad_count);
  return cudaGetLastError();
}

}  // namespace kvtier::cuda_test

// The engine's side of the GPU ordering tests (cuda_stream_order_test.cc): streams, memory and
// the kernels an engine would run on its own stream, as plain functions so the test itself is
// plain C++ and includes no CUDA header. Built from cuda_test_kernels.cu (nvcc) only when the
// CUDA backend is; every function returns 0 (cudaSuccess) or the cudaError_t as an int, which
// ErrorText names.
#pragma once

#include <cstdint>
#include <string>

#ifdef __CUDACC__
#define KVTIER_TEST_HD __host__ __device__
#else
#define KVTIER_TEST_HD
#endif

namespace kvtier::cuda_test {

// The byte a test block of pattern `seed` holds at canonical offset `off`.
KVTIER_TEST_HD inline uint8_t TestByte(uint32_t seed, uint64_t off) {
  return static_cast<uint8_t>((seed * 131u + off * 7u + off / 4096u + 1u) & 0xffu);
}

// "<cudaGetErrorString> (error N)".
std::string ErrorText(int error);

// A stream like an engine's (non-blocking, as PyTorch's streams are), as an integer handle.
int CreateStream(uintptr_t* stream);
int DestroyStream(uintptr_t stream);
int SyncStream(uintptr_t stream);
// *busy = the stream still has work queued or running (cudaStreamQuery: cudaErrorNotReady).
int StreamBusy(uintptr_t stream, bool* busy);
// Graph capture of `stream` in relaxed mode (other threads' CUDA calls are not affected).
int BeginCapture(uintptr_t stream);
int EndCapture(uintptr_t stream);  // and destroys the captured graph

int Malloc(uint8_t** dev, uint64_t bytes);
int Free(void* dev);
int MemsetSync(uint8_t* dev, int value, uint64_t bytes);
int CopyToHostSync(void* host, const void* dev, uint64_t bytes);

// Enqueues on `stream` a one-thread kernel that spins for `ns` nanoseconds (%globaltimer): an
// engine's slow kernel.
int LaunchSpin(uintptr_t stream, uint64_t ns);
// Enqueues a kernel writing TestByte(seed, off0 + i) (or 0 when zero) to dev[i], i < bytes.
int LaunchFill(uintptr_t stream, uint8_t* dev, uint64_t bytes, uint32_t seed, uint64_t off0,
               bool zero);
// Enqueues a kernel adding to *bad_count (device memory) the i < bytes with
// dev[i] != TestByte(seed, off0 + i).
int LaunchCheck(uintptr_t stream, const uint8_t* dev, uint64_t bytes, uint32_t seed, uint64_t off0,
                unsigned long long* bad_count);

}  // namespace kvtier::cuda_test

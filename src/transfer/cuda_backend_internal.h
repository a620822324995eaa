// The CUDA transfer backend's private header (see device_backend.h for its contract and
// docs/cuda.md): the CudaBackend class and the small CUDA helpers its three source files share.
// cuda_backend.cc holds the probe, set-up, tear-down and the registration of G1 and host memory;
// cuda_backend_batch.cc the batch pool, Submit/OrderAfterStream, the enqueue path and the
// completion threads; cuda_backend_copy.cc the plain copies and allocations used by tests and
// benchmarks. Only those files include this header; every other caller goes through
// CreateCudaBackend.
//
// Structure: one stream per direction (saves: device -> host; loads: host -> device, at the
// higher stream priority), one ordering event per direction (OrderAfterStream), a pool of at most
// max_batches Batch objects (each with its plan, descriptor buffers and one event per layer, reused
// across submissions so the hot path allocates nothing once warm), and one completion thread per
// direction that waits on a batch's layer events in order and runs its callbacks. Submitters of one
// direction enqueue under submit_mu_[dir], so the in-flight FIFO of a direction is in stream order.
//
// NOT YET VERIFIED ON A GPU: this code was compiled and its CPU-side paths (probe, refusals)
// tested on a machine without a GPU driver; see docs/cuda.md.
#pragma once

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/mutex.h"
#include "transfer/device_backend.h"

namespace kvtier {
namespace cuda_internal {

// "<CUDA message> (error N)".
std::string CudaErrorText(cudaError_t e);

// Ok, or IOError "<what>: <CUDA message> (error N)".
Status CudaCheck(cudaError_t e, const std::string& what);

// A stream handle for messages: "0 (the legacy default stream)" or its address in hex.
std::string StreamText(uintptr_t stream);

// A CUDA version number (12080) as "12.8"; "none" for 0 or less.
std::string VersionText(int v);

class CudaBackend final : public DeviceCopyBackend {
 public:
  static Result<std::unique_ptr<DeviceCopyBackend>> Create(const Config& config);
  ~CudaBackend() override;

  std::string Describe() const override { return description_; }
  Method method() const override { return method_; }
  Status RegisterG1(const G1Memory& g1) override;
  Status RegisterHost(uint8_t* base, uint64_t bytes) override;
  Status Submit(CopyDirection dir, std::span<const DeviceBlockCopy> copies, LayerCallback on_layer,
                DoneCallback on_done, bool wait_for_room) override EXCLUDES(mu_);
  Status OrderAfterStream(CopyDirection dir, uintptr_t engine_stream) override;

  Result<uint8_t*> AllocateDevice(uint64_t bytes) override;
  void FreeDevice(uint8_t* ptr) override;
  Status CopyToDevice(uint8_t* dev, const uint8_t* host, uint64_t bytes) override;
  Status CopyFromDevice(uint8_t* host, const uint8_t* dev, uint64_t bytes) override;
  Result<PlainCopyTime> TimePlainCopy(CopyDirection dir, uint8_t* dev, uint8_t* host,
                                      uint64_t bytes, uint32_t reps) override;
  void StallNextLoadAfterLayerForTest(uint32_t layer) override EXCLUDES(stall_mu_);
  void ReleaseStallForTest() override EXCLUDES(stall_mu_);

 private:
  struct Batch {
    CopyDirection dir = CopyDirection::kDeviceToHost;
    DeviceCopyPlan plan;
    CopyUnit* host_units = nullptr;  // pinned staging of the plan's units (kernel method)
    CopyUnit* dev_units = nullptr;   // the units in device memory (kernel method)
    size_t unit_capacity = 0;
    // Buffers outgrown by this batch, freed with the backend: cudaFree and cudaFreeHost
    // synchronize the whole device, which a submission must never wait for.
    std::vector<CopyUnit*> retired_host, retired_dev;
    std::vector<uint32_t> group_ends;       // PlanLaunchGroups: one launch and event per group
    std::vector<cudaEvent_t> layer_events;  // one per launch group, recorded after it
    uint32_t groups_enqueued = 0;
    uint32_t layers_enqueued = 0;  // the layers of the enqueued groups
    Status enqueue_error;
    LayerCallback on_layer;
    DoneCallback on_done;
    std::vector<void*> dsts, srcs;  // batch-memcpy arguments of one layer
    std::vector<size_t> sizes;
  };

  explicit CudaBackend(const Config& config) : config_(config) {}
  Status Init();
  Status Enqueue(Batch* b, cudaStream_t stream) EXCLUDES(stall_mu_);
  Status EnsureUnitCapacity(Batch* b, size_t units);
  void FreeBatch(Batch* b);
  // A free batch; null when none is free and waiting is not allowed.
  Batch* AcquireBatch(bool wait_for_room) EXCLUDES(mu_);
  void ReleaseBatch(Batch* b) EXCLUDES(mu_);
  void CompletionLoop(int dir) EXCLUDES(mu_);
  static void StallHostFunc(void* self);
  static int Index(CopyDirection dir) { return dir == CopyDirection::kDeviceToHost ? 0 : 1; }

  const Config config_;
  Method method_ = Method::kKernel;
  std::string description_;
  cudaStream_t streams_[2] = {nullptr, nullptr};
  // OrderAfterStream's events, one per direction, recorded and waited for under submit_mu_[d].
  cudaEvent_t order_events_[2] = {nullptr, nullptr};
  G1Memory g1_;
  bool g1_registered_ = false;
  uint8_t* host_base_ = nullptr;
  uint64_t host_bytes_ = 0;
  bool host_owned_ = false;  // this backend called cudaHostRegister and must unregister
  HostWindow window_;        // as the method addresses host memory

  Mutex submit_mu_[2];
  Mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Batch>> batches_ GUARDED_BY(mu_);
  std::vector<Batch*> free_ GUARDED_BY(mu_);
  std::deque<Batch*> inflight_[2] GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread completion_[2];

  Mutex stall_mu_;
  std::condition_variable stall_cv_;
  int64_t stall_after_layer_ GUARDED_BY(stall_mu_) = -1;  // armed for the next load batch
  bool stall_released_ GUARDED_BY(stall_mu_) = false;
};

}  // namespace cuda_internal
}  // namespace kvtier

// The CUDA transfer backend, part 2 of 3: the batch pool, Submit and OrderAfterStream, the
// enqueue path (descriptor upload, kernel / batch-memcpy / memcpy launches, one event per launch
// group), the test stall, and the completion threads that run the callbacks. The class is in
// cuda_backend_internal.h; set-up and registration are in cuda_backend.cc, the plain copies in
// cuda_backend_copy.cc. See device_backend.h and docs/cuda.md.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "core/log.h"
#include "core/mutex.h"
#include "tier/cond_wait.h"
#include "transfer/cuda_backend_internal.h"
#include "transfer/cuda_copy_kernel.h"
#include "transfer/device_backend.h"

namespace kvtier {
namespace cuda_internal {

namespace {

// cudaMemcpyBatchAsync changed its signature in CUDA 13.0 (the failIdx argument went away).
// Both are dispatched here on CUDART_VERSION at compile time; CreateCudaBackend checks the
// runtime's and driver's versions (>= 12.8) at run time before this method may be used.
cudaError_t MemcpyBatch(void** dsts, void** srcs, size_t* sizes, size_t count,
                        cudaStream_t stream) {
#if CUDART_VERSION >= 12080
  cudaMemcpyAttributes attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  size_t attr_index = 0;
#if CUDART_VERSION >= 13000
  return cudaMemcpyBatchAsync(dsts, srcs, sizes, count, &attr, &attr_index, 1, stream);
#else
  size_t fail_index = 0;
  return cudaMemcpyBatchAsync(dsts, srcs, sizes, count, &attr, &attr_index, 1, &fail_index, stream);
#endif
#else
  (void)dsts;
  (void)srcs;
  (void)sizes;
  (void)count;
  (void)stream;
  return cudaErrorNotSupported;
#endif
}

// The backend whose completion thread is running on this thread, if any.
thread_local const void* tls_completion_backend = nullptr;

}  // namespace

CudaBackend::Batch* CudaBackend::AcquireBatch(bool wait_for_room) {
  // On a completion thread, waiting could deadlock (the batches it waits for end there).
  const bool in_callback = tls_completion_backend == this;
  MutexLock lock(&mu_);
  for (;;) {
    if (!free_.empty()) {
      Batch* b = free_.back();
      free_.pop_back();
      return b;
    }
    if (batches_.size() < config_.max_batches || (in_callback && wait_for_room)) {
      batches_.push_back(std::make_unique<Batch>());
      return batches_.back().get();
    }
    if (!wait_for_room) return nullptr;
    CondWait(&cv_, &mu_);
  }
}

void CudaBackend::ReleaseBatch(Batch* b) {
  b->on_layer = nullptr;
  b->on_done = nullptr;
  b->enqueue_error = Status::Ok();
  {
    MutexLock lock(&mu_);
    free_.push_back(b);
  }
  cv_.notify_all();
}

void CudaBackend::FreeBatch(Batch* b) {
  if (b->host_units != nullptr) (void)cudaFreeHost(b->host_units);
  if (b->dev_units != nullptr) (void)cudaFree(b->dev_units);
  for (cudaEvent_t e : b->layer_events) (void)cudaEventDestroy(e);
  for (CopyUnit* p : b->retired_host) (void)cudaFreeHost(p);
  for (CopyUnit* p : b->retired_dev) (void)cudaFree(p);
  b->host_units = nullptr;
  b->dev_units = nullptr;
  b->unit_capacity = 0;
  b->layer_events.clear();
  b->retired_host.clear();
  b->retired_dev.clear();
}

Status CudaBackend::EnsureUnitCapacity(Batch* b, size_t units) {
  if (units <= b->unit_capacity) return Status::Ok();
  // Grows rarely and geometrically (to the largest batch seen; outgrown buffers are kept until
  // the backend goes, so the waste stays under the final size).
  constexpr size_t kMinUnits = 4096;  // 96 KiB: 64 blocks of 2 MiB in 32 KiB chunks
  const size_t cap = std::max({units, b->unit_capacity * 2, kMinUnits});
  if (b->host_units != nullptr) b->retired_host.push_back(b->host_units);
  if (b->dev_units != nullptr) b->retired_dev.push_back(b->dev_units);
  b->host_units = nullptr;
  b->dev_units = nullptr;
  b->unit_capacity = 0;
  void* h = nullptr;
  void* d = nullptr;
  KVTIER_RETURN_IF_ERROR(
      CudaCheck(cudaHostAlloc(&h, cap * sizeof(CopyUnit), cudaHostAllocDefault),
                "cudaHostAlloc of " + std::to_string(cap) + " copy descriptors"));
  const cudaError_t e = cudaMalloc(&d, cap * sizeof(CopyUnit));
  if (e != cudaSuccess) {
    (void)cudaFreeHost(h);
    return CudaCheck(e, "cudaMalloc of " + std::to_string(cap) + " copy descriptors");
  }
  b->host_units = static_cast<CopyUnit*>(h);
  b->dev_units = static_cast<CopyUnit*>(d);
  b->unit_capacity = cap;
  return Status::Ok();
}

Status CudaBackend::Submit(CopyDirection dir, std::span<const DeviceBlockCopy> copies,
                           LayerCallback on_layer, DoneCallback on_done, bool wait_for_room) {
  if (!g1_registered_) return Status::FailedPrecondition("no device G1 registered with CUDA");
  if (host_base_ == nullptr) {
    return Status::FailedPrecondition("no host memory registered with CUDA");
  }
  Batch* b = AcquireBatch(wait_for_room);
  if (b == nullptr) {
    return Status::ResourceExhausted("CUDA backend: all " + std::to_string(config_.max_batches) +
                                     " batches are in flight; the " + CopyDirectionName(dir) +
                                     " batch was not started");
  }
  Status planned = BuildDeviceCopyPlan(g1_, window_, dir, copies, config_.max_unit_bytes, &b->plan);
  if (!planned.ok()) {
    ReleaseBatch(b);
    return planned;
  }
  b->dir = dir;
  b->on_layer = std::move(on_layer);
  b->on_done = std::move(on_done);
  const int d = Index(dir);
  {
    MutexLock submit(&submit_mu_[d]);
    (void)cudaSetDevice(config_.device);
    Status s = Enqueue(b, streams_[d]);
    if (!s.ok() && b->layers_enqueued == 0) {
      // Nothing will signal this batch; let whatever was enqueued (a descriptor upload) drain
      // before the batch's buffers are reused.
      (void)cudaStreamSynchronize(streams_[d]);
      ReleaseBatch(b);
      return s;
    }
    b->enqueue_error = s;  // some layers are on their way: the completion thread reports it
    MutexLock lock(&mu_);
    inflight_[d].push_back(b);
  }
  cv_.notify_all();
  return Status::Ok();
}

Status CudaBackend::OrderAfterStream(CopyDirection dir, uintptr_t engine_stream) {
  const int d = Index(dir);
  const cudaStream_t engine = reinterpret_cast<cudaStream_t>(engine_stream);
  const std::string what = std::string("ordering the CUDA backend's ") + CopyDirectionName(dir) +
                           " work after the engine's stream " + StreamText(engine_stream);
  // One event per direction, reused by every call, is enough and allocates nothing:
  // cudaStreamWaitEvent waits for the work the event captured at its most recent record before
  // the wait was enqueued, and a later cudaEventRecord does not change what an enqueued wait
  // waits for (CUDA runtime API, cudaEventRecord). submit_mu_[d] keeps each record next to its
  // wait (two callers must not interleave record, record, wait, wait) and orders the wait
  // before the batches submitted after this call.
  MutexLock submit(&submit_mu_[d]);
  (void)cudaSetDevice(config_.device);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaError_t e = cudaStreamIsCapturing(engine, &capture);
  if (e == cudaSuccess && capture != cudaStreamCaptureStatusNone) {
    return Status::FailedPrecondition(
        what +
        ": that stream is capturing a CUDA graph; waiting for it would pull the "
        "backend's stream into the capture. Start loads and saves outside graph capture");
  }
  if (e == cudaSuccess) e = cudaEventRecord(order_events_[d], engine);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(streams_[d], order_events_[d], 0);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return Status::IOError(what + ": " + CudaErrorText(e) + "; pass a live CUDA stream of device " +
                           std::to_string(config_.device));
  }
  return Status::Ok();
}

Status CudaBackend::Enqueue(Batch* b, cudaStream_t stream) {
  const DeviceCopyPlan& plan = b->plan;
  b->layers_enqueued = 0;
  b->groups_enqueued = 0;
  int64_t stall_layer = -1;
  if (b->dir == CopyDirection::kHostToDevice) {
    MutexLock lock(&stall_mu_);
    stall_layer = stall_after_layer_;
    stall_after_layer_ = -1;
  }
  PlanLaunchGroups(plan, config_.min_launch_bytes, stall_layer, &b->group_ends);
  const size_t groups = b->group_ends.size();
  while (b->layer_events.size() < groups) {
    cudaEvent_t e = nullptr;
    KVTIER_RETURN_IF_ERROR(
        CudaCheck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync),
                  "cudaEventCreate"));
    b->layer_events.push_back(e);
  }
  const size_t n = plan.units.size();
  if (method_ == Method::kKernel && n > 0) {
    KVTIER_RETURN_IF_ERROR(EnsureUnitCapacity(b, n));
    std::memcpy(b->host_units, plan.units.data(), n * sizeof(CopyUnit));
    KVTIER_RETURN_IF_ERROR(
        CudaCheck(cudaMemcpyAsync(b->dev_units, b->host_units, n * sizeof(CopyUnit),
                                  cudaMemcpyHostToDevice, stream),
                  "uploading copy descriptors"));
  }
  const char* what = CopyDirectionName(b->dir);
  uint32_t first = 0;  // the group's first layer
  for (size_t g = 0; g < groups; ++g) {
    const uint32_t end = b->group_ends[g];
    const uint32_t begin_unit = plan.layer_begin[first];
    const uint32_t count = plan.layer_begin[end] - begin_unit;
    const std::span<const CopyUnit> units =
        std::span<const CopyUnit>(plan.units).subspan(begin_unit, count);
    // Messages are built only for an error: the hot path allocates nothing once warm.
    auto layers_text = [first, end] {
      return end - first == 1 ? "layer " + std::to_string(first)
                              : "layers " + std::to_string(first) + ".." + std::to_string(end - 1);
    };
    if (method_ == Method::kKernel) {
      const cudaError_t e =
          LaunchCopyUnits(b->dev_units + begin_unit, count, config_.kernel_threads,
                          config_.kernel_max_blocks, stream);
      if (e != cudaSuccess) {
        return CudaCheck(e,
                         std::string("launching the ") + what + " copy kernel, " + layers_text());
      }
    } else if (method_ == Method::kMemcpyBatch) {
      // One call per layer even inside a group: one call over a whole group's units ran slower
      // on an H200 (a 256-block batch of 8 KiB units: 0.09x of cudaMemcpy, per layer 0.17x).
      for (uint32_t l = first; l < end; ++l) {
        const std::span<const CopyUnit> lu = plan.Layer(l);
        const uint32_t n = static_cast<uint32_t>(lu.size());
        if (n == 0) continue;
        b->dsts.resize(n);
        b->srcs.resize(n);
        b->sizes.resize(n);
        for (uint32_t i = 0; i < n; ++i) {
          b->dsts[i] = reinterpret_cast<void*>(lu[i].dst);
          b->srcs[i] = reinterpret_cast<void*>(lu[i].src);
          b->sizes[i] = lu[i].bytes;
        }
        const cudaError_t e =
            MemcpyBatch(b->dsts.data(), b->srcs.data(), b->sizes.data(), n, stream);
        if (e != cudaSuccess) {
          return CudaCheck(
              e, std::string("cudaMemcpyBatchAsync (") + what + "), layer " + std::to_string(l));
        }
      }
    } else {
      for (const CopyUnit& u : units) {
        const cudaError_t e =
            cudaMemcpyAsync(reinterpret_cast<void*>(u.dst), reinterpret_cast<const void*>(u.src),
                            u.bytes, cudaMemcpyDefault, stream);
        if (e != cudaSuccess) {
          return CudaCheck(e, std::string("cudaMemcpyAsync (") + what + "), " + layers_text());
        }
      }
    }
    if (const cudaError_t e = cudaEventRecord(b->layer_events[g], stream); e != cudaSuccess) {
      return CudaCheck(e, "cudaEventRecord");
    }
    ++b->groups_enqueued;
    b->layers_enqueued = end;
    if (static_cast<int64_t>(end) - 1 == stall_layer) {
      {
        MutexLock lock(&stall_mu_);
        stall_released_ = false;
      }
      KVTIER_RETURN_IF_ERROR(
          CudaCheck(cudaLaunchHostFunc(stream, &CudaBackend::StallHostFunc, this),
                    "cudaLaunchHostFunc (test stall)"));
    }
    first = end;
  }
  return Status::Ok();
}

void CudaBackend::StallHostFunc(void* self) {
  // Runs on a CUDA runtime thread and must not call CUDA.
  auto* b = static_cast<CudaBackend*>(self);
  MutexLock lock(&b->stall_mu_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!b->stall_released_ && std::chrono::steady_clock::now() < deadline) {
    CondWaitFor(&b->stall_cv_, &b->stall_mu_, std::chrono::milliseconds(100));
  }
}

void CudaBackend::StallNextLoadAfterLayerForTest(uint32_t layer) {
  MutexLock lock(&stall_mu_);
  stall_after_layer_ = layer;
}

void CudaBackend::ReleaseStallForTest() {
  {
    MutexLock lock(&stall_mu_);
    stall_released_ = true;
  }
  stall_cv_.notify_all();
}

void CudaBackend::CompletionLoop(int dir) {
  tls_completion_backend = this;
  (void)cudaSetDevice(config_.device);
  for (;;) {
    Batch* b = nullptr;
    {
      MutexLock lock(&mu_);
      while (!stopping_ && inflight_[dir].empty()) CondWait(&cv_, &mu_);
      if (inflight_[dir].empty()) return;
      b = inflight_[dir].front();  // popped after its callbacks: the destructor waits for it
    }
    Status status;
    uint32_t first = 0;
    for (uint32_t g = 0; g < b->groups_enqueued; ++g) {
      cudaError_t e = cudaErrorNotReady;
      if (config_.completion_spin_us > 0) {
        const auto until = std::chrono::steady_clock::now() +
                           std::chrono::microseconds(config_.completion_spin_us);
        while ((e = cudaEventQuery(b->layer_events[g])) == cudaErrorNotReady &&
               std::chrono::steady_clock::now() < until) {
        }
      }
      if (e == cudaErrorNotReady) e = cudaEventSynchronize(b->layer_events[g]);
      if (e != cudaSuccess) {
        status = Status::IOError(std::string("CUDA ") + CopyDirectionName(b->dir) +
                                 " copy failed on the device before layer " +
                                 std::to_string(first) + " landed: " + CudaErrorText(e));
        KVTIER_LOG(kError) << status.message();
        break;
      }
      for (; first < b->group_ends[g]; ++first) {
        if (b->on_layer) b->on_layer(first);
      }
    }
    if (status.ok() && !b->enqueue_error.ok()) status = b->enqueue_error;
    if (status.ok() && b->layers_enqueued < b->plan.num_layers()) {
      status = Status::Internal("CUDA batch ended with layers not enqueued");
    }
    if (b->on_done) b->on_done(status);
    b->on_layer = nullptr;
    b->on_done = nullptr;
    b->enqueue_error = Status::Ok();
    {
      MutexLock lock(&mu_);
      inflight_[dir].pop_front();
      free_.push_back(b);
    }
    cv_.notify_all();
  }
}

}  // namespace cuda_internal
}  // namespace kvtier

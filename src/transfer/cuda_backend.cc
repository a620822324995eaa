// The CUDA transfer backend (see device_backend.h and docs/cuda.md).
//
// Structure: one stream per direction (saves: device -> host; loads: host -> device, at the
// higher stream priority), one ordering event per direction (OrderAfterStream), a pool of at most
// max_batches Batch objects (each with its plan, descriptor buffers and one event per layer, reused
// across submissions so the hot path allocates nothing once warm), and one completion thread per
// direction that waits on a batch's layer events in order and runs its callbacks. Submitters of one
// direction enqueue under submit_mu_[dir], so the in-flight FIFO of a direction is in stream order.
//
// NOT YET VERIFIED ON A GPU: this file was compiled and its CPU-side paths (probe, refusals)
// tested on a machine without a GPU driver; see docs/cuda.md.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "core/log.h"
#include "core/mutex.h"
#include "tier/cond_wait.h"
#include "transfer/cuda_copy_kernel.h"
#include "transfer/device_backend.h"

namespace kvtier {

namespace {

std::string CudaErrorText(cudaError_t e) {
  return std::string(cudaGetErrorString(e)) + " (error " + std::to_string(static_cast<int>(e)) +
         ")";
}

// Ok, or IOError "<what>: <CUDA message> (error N)".
Status CudaCheck(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status::IOError(what + ": " + CudaErrorText(e));
}

std::string StreamText(uintptr_t stream) {
  if (stream == 0) return "0 (the legacy default stream)";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(stream));
  return buf;
}

std::string VersionText(int v) {
  if (v <= 0) return "none";
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

Status ProbeOnce() {
  int runtime = 0;
  int driver = 0;
  // Neither fails without a driver: the driver version then reads 0.
  (void)cudaRuntimeGetVersion(&runtime);
  (void)cudaDriverGetVersion(&driver);
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  const std::string versions =
      " (CUDA runtime " + VersionText(runtime) + ", driver " + VersionText(driver) + ")";
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // clears the error so later calls do not report it again
    return Status::Unavailable("CUDA backend unavailable: " + CudaErrorText(e) +
                               "; no usable GPU driver/device" + versions);
  }
  if (count <= 0) {
    return Status::Unavailable(
        "CUDA backend unavailable: no CUDA device (0 devices); no usable "
        "GPU driver/device" +
        versions);
  }
  return Status::Ok();
}

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

Result<std::unique_ptr<DeviceCopyBackend>> CudaBackend::Create(const Config& config) {
  KVTIER_RETURN_IF_ERROR(config.Validate());
  KVTIER_RETURN_IF_ERROR(ProbeCuda());
  std::unique_ptr<CudaBackend> b(new CudaBackend(config));
  KVTIER_RETURN_IF_ERROR(b->Init());
  for (int d = 0; d < 2; ++d) {
    b->completion_[d] = std::thread([p = b.get(), d] { p->CompletionLoop(d); });
  }
  return std::unique_ptr<DeviceCopyBackend>(std::move(b));
}

Status CudaBackend::Init() {
  int count = 0;
  KVTIER_RETURN_IF_ERROR(CudaCheck(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
  if (config_.device >= count) {
    return Status::Unavailable("CUDA device " + std::to_string(config_.device) +
                               " does not exist; this machine has " + std::to_string(count) +
                               " (ordinals 0.." + std::to_string(count - 1) + ")");
  }
  KVTIER_RETURN_IF_ERROR(CudaCheck(cudaSetDevice(config_.device), "cudaSetDevice"));
  int runtime = 0, driver = 0;
  KVTIER_RETURN_IF_ERROR(CudaCheck(cudaRuntimeGetVersion(&runtime), "cudaRuntimeGetVersion"));
  KVTIER_RETURN_IF_ERROR(CudaCheck(cudaDriverGetVersion(&driver), "cudaDriverGetVersion"));
  method_ = config_.method == Method::kAuto ? Method::kKernel : config_.method;
  if (method_ == Method::kMemcpyBatch &&
      (CUDART_VERSION < 12080 || runtime < 12080 || driver < 12080)) {
    return Status::Unavailable(
        "the batch method needs cudaMemcpyBatchAsync (CUDA 12.8 or "
        "newer); this build has CUDA " +
        VersionText(CUDART_VERSION) + ", runtime " + VersionText(runtime) + ", driver " +
        VersionText(driver) + "; use --method kernel");
  }
  cudaDeviceProp prop;
  KVTIER_RETURN_IF_ERROR(
      CudaCheck(cudaGetDeviceProperties(&prop, config_.device), "cudaGetDeviceProperties"));
  int can_map = 0;
  KVTIER_RETURN_IF_ERROR(
      CudaCheck(cudaDeviceGetAttribute(&can_map, cudaDevAttrCanMapHostMemory, config_.device),
                "cudaDeviceGetAttribute(CanMapHostMemory)"));
  if (method_ == Method::kKernel && !can_map) {
    return Status::Unavailable("CUDA device " + std::to_string(config_.device) +
                               " cannot map host memory, which the kernel method needs; use "
                               "--method batch or memcpy");
  }
  int least = 0, greatest = 0;
  KVTIER_RETURN_IF_ERROR(
      CudaCheck(cudaDeviceGetStreamPriorityRange(&least, &greatest), "stream priority range"));
  KVTIER_RETURN_IF_ERROR(
      CudaCheck(cudaStreamCreateWithPriority(&streams_[Index(CopyDirection::kDeviceToHost)],
                                             cudaStreamNonBlocking, least),
                "cudaStreamCreate (saves)"));
  KVTIER_RETURN_IF_ERROR(
      CudaCheck(cudaStreamCreateWithPriority(&streams_[Index(CopyDirection::kHostToDevice)],
                                             cudaStreamNonBlocking, greatest),
                "cudaStreamCreate (loads)"));
  for (cudaEvent_t& e : order_events_) {
    KVTIER_RETURN_IF_ERROR(CudaCheck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                                     "cudaEventCreate (ordering after the engine's stream)"));
  }
  description_ = "CUDA runtime " + VersionText(runtime) + ", driver " + VersionText(driver) +
                 ", device " + std::to_string(config_.device) + ": " + prop.name + " (sm_" +
                 std::to_string(prop.major) + std::to_string(prop.minor) + "), method " +
                 DeviceCopyMethodName(method_);
  KVTIER_LOG(kInfo) << "CUDA backend: " << description_;
  return Status::Ok();
}

CudaBackend::~CudaBackend() {
  ReleaseStallForTest();  // a stalled test batch must not hold up the drain below
  {
    MutexLock lock(&mu_);
    while (!inflight_[0].empty() || !inflight_[1].empty()) CondWait(&cv_, &mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : completion_) {
    if (t.joinable()) t.join();
  }
  (void)cudaSetDevice(config_.device);
  {
    MutexLock lock(&mu_);
    for (auto& b : batches_) FreeBatch(b.get());
  }
  for (cudaStream_t s : streams_) {
    if (s != nullptr) (void)cudaStreamDestroy(s);
  }
  for (cudaEvent_t e : order_events_) {
    if (e != nullptr) (void)cudaEventDestroy(e);
  }
  if (host_owned_) {
    const cudaError_t e = cudaHostUnregister(host_base_);
    if (e != cudaSuccess) {
      KVTIER_LOG(kWarn) << "CUDA backend: cudaHostUnregister of the G2 arena failed: "
                        << CudaErrorText(e);
    }
  }
}

Status CudaBackend::RegisterG1(const G1Memory& g1) {
  KVTIER_RETURN_IF_ERROR(g1.Validate());
  if (!g1.on_device) {
    return Status::InvalidArgument("the CUDA backend takes device G1 memory (on_device = true)");
  }
  if (g1_registered_) return Status::FailedPrecondition("the CUDA backend's G1 is registered");
  // Every region must be memory of this device: a host pointer marked on_device would make the
  // kernel fault (or the copies fail) far from the cause.
  for (size_t i = 0; i < g1.regions.size(); ++i) {
    cudaPointerAttributes attr;
    std::memset(&attr, 0, sizeof(attr));
    const cudaError_t e = cudaPointerGetAttributes(&attr, g1.regions[i].base);
    if (e != cudaSuccess) (void)cudaGetLastError();
    const bool device_memory =
        e == cudaSuccess &&
        (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) &&
        attr.device == config_.device;
    if (!device_memory) {
      return Status::InvalidArgument(
          "G1 region " + std::to_string(i) +
          " is marked on_device but is not memory of CUDA "
          "device " +
          std::to_string(config_.device) +
          (e == cudaSuccess ? std::string(" (CUDA memory type ") +
                                  std::to_string(static_cast<int>(attr.type)) + ")"
                            : "; " + CudaErrorText(e)) +
          "; register the engine's device KV tensors, or host memory with on_device = false");
    }
  }
  g1_ = g1;
  g1_registered_ = true;
  return Status::Ok();
}

Status CudaBackend::RegisterHost(uint8_t* base, uint64_t bytes) {
  if (base == nullptr || bytes == 0) {
    return Status::InvalidArgument("CUDA RegisterHost needs a non-empty host range");
  }
  if (host_base_ != nullptr) {
    return Status::FailedPrecondition("the CUDA backend's host memory is registered");
  }
  KVTIER_RETURN_IF_ERROR(CudaCheck(cudaSetDevice(config_.device), "cudaSetDevice"));
  // Once, over the whole pre-faulted arena: pinning per slot would cost a driver call and a
  // page-table walk per block. Portable: every context may use it; mapped: the kernel reaches
  // it through its device alias.
  cudaError_t e = cudaHostRegister(base, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
  bool owned = true;
  if (e == cudaErrorHostMemoryAlreadyRegistered) {
    (void)cudaGetLastError();
    owned = false;
    KVTIER_LOG(kWarn) << "CUDA backend: the G2 arena was already registered with CUDA; using "
                         "that registration";
  } else if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return Status::IOError("cudaHostRegister of the G2 arena (" + std::to_string(bytes) +
                           " bytes) failed: " + CudaErrorText(e) +
                           "; is the memory locked-memory limit (ulimit -l) large enough?");
  }
  void* alias = base;
  if (method_ == Method::kKernel) {
    e = cudaHostGetDevicePointer(&alias, base, 0);
    if (e != cudaSuccess) {
      if (owned) (void)cudaHostUnregister(base);
      return CudaCheck(e, "cudaHostGetDevicePointer of the G2 arena");
    }
  }
  host_base_ = base;
  host_bytes_ = bytes;
  host_owned_ = owned;
  window_.base = base;
  window_.bytes = bytes;
  window_.device_base = reinterpret_cast<uintptr_t>(alias);
  return Status::Ok();
}

// The backend whose completion thread is running on this thread, if any.
thread_local const void* tls_completion_backend = nullptr;

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

}  // namespace

bool CudaBackendBuilt() { return true; }

Status ProbeCuda() {
  // Thread-safe one-time initialization; the failure is logged once per process.
  static const Status probed = [] {
    Status s = ProbeOnce();
    if (!s.ok()) KVTIER_LOG(kWarn) << s.message();
    return s;
  }();
  return probed;
}

Result<std::unique_ptr<DeviceCopyBackend>> CreateCudaBackend(
    const DeviceCopyBackend::Config& config) {
  return CudaBackend::Create(config);
}

}  // namespace kvtier

// The CUDA transfer backend, part 1 of 3: the probe, CudaBackend's set-up (Create, Init), its
// tear-down, and the registration of G1 and of the G2 arena. The class and its structure are in
// cuda_backend_internal.h; the batch/enqueue/completion path is in cuda_backend_batch.cc and the
// plain copies are in cuda_backend_copy.cc. See device_backend.h and docs/cuda.md.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "core/log.h"
#include "core/mutex.h"
#include "tier/cond_wait.h"
#include "transfer/cuda_backend_internal.h"
#include "transfer/device_backend.h"

namespace kvtier {
namespace cuda_internal {

std::string CudaErrorText(cudaError_t e) {
  return std::string(cudaGetErrorString(e)) + " (error " + std::to_string(static_cast<int>(e)) +
         ")";
}

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

namespace {

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

}  // namespace

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

}  // namespace cuda_internal

bool CudaBackendBuilt() { return true; }

Status ProbeCuda() {
  // Thread-safe one-time initialization; the failure is logged once per process.
  static const Status probed = [] {
    Status s = cuda_internal::ProbeOnce();
    if (!s.ok()) KVTIER_LOG(kWarn) << s.message();
    return s;
  }();
  return probed;
}

Result<std::unique_ptr<DeviceCopyBackend>> CreateCudaBackend(
    const DeviceCopyBackend::Config& config) {
  return cuda_internal::CudaBackend::Create(config);
}

}  // namespace kvtier

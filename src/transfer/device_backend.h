// DeviceCopyBackend: moves blocks between a device G1 (GPU memory) and pinned host memory (the
// G2 arena). The only implementation is the CUDA backend (cuda_backend.cc), built when CMake
// finds nvcc (option KVTIER_CUDA); other builds link cuda_backend_stub.cc, whose probe reports
// that the build has no CUDA backend. Nothing outside this interface includes a CUDA header, so
// the rest of the library compiles and runs without CUDA.
//
// Lifecycle: ProbeCuda() (cached, logged once) -> CreateCudaBackend() -> RegisterG1 and
// RegisterHost (each once, before the first Submit) -> Submit from any thread -> destruction
// waits for every submitted batch to end and for its callbacks to return.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/g4_fetch.h"
#include "kvtier/block_key.h"
#include "kvtier/g1_memory.h"
#include "kvtier/status.h"
#include "transfer/device_copy_plan.h"

namespace kvtier {

class DeviceCopyBackend {
 public:
  // How a batch's units are run on the device.
  enum class Method : uint8_t {
    kAuto = 0,     // kKernel
    kKernel,       // a gather/scatter kernel over mapped pinned host memory, one launch per layer
    kMemcpyBatch,  // cudaMemcpyBatchAsync, one call per layer (CUDA >= 12.8 runtime and driver)
    kMemcpyPerChunk,  // one cudaMemcpyAsync per unit (a slow reference path)
  };

  struct Config {
    int device = 0;  // CUDA device ordinal
    Method method = Method::kAuto;
    uint32_t max_batches = 32;  // batches in flight at most (both directions); 1..1024
    uint64_t max_unit_bytes = kDefaultCopyUnitBytes;  // see BuildDeviceCopyPlan
    uint32_t kernel_threads = 256;                    // threads per kernel block: 32..1024, x32
    uint32_t kernel_max_blocks = 1024;                // kernel grid size cap per launch, >= 1
    // A batch's layers are moved in launch groups of at least this many bytes (one launch and
    // one event per group; 0: one per layer). See PlanLaunchGroups (device_copy_plan.h).
    uint64_t min_launch_bytes = kDefaultMinLaunchBytes;
    // The completion threads poll a group's event for up to this long before they sleep on it
    // (cudaEventBlockingSync): 0 = sleep at once. Polling trades a core's time while a batch
    // is in flight for the wake-up latency of a small batch.
    uint32_t completion_spin_us = 0;
    // Ok, or InvalidArgument naming the field, its value and the allowed range.
    Status Validate() const;
  };

  // Called once per layer, in layer order, once that layer of every copy of the batch has
  // landed (both directions): when the launch group holding it landed (Config::min_launch_bytes;
  // a batch smaller than that reports all its layers together, when it ends). On the backend's
  // completion thread; must be quick.
  using LayerCallback = std::function<void(uint32_t layer)>;
  // Called once when the batch ended, after its last LayerCallback: Ok when every layer landed,
  // else the error (then the layers not reported landed did not land, or not verifiably).
  using DoneCallback = std::function<void(const Status& status)>;

  virtual ~DeviceCopyBackend() = default;

  // "CUDA runtime 13.0, driver 13.0, device 0: NVIDIA H200 (sm_90), method kernel".
  virtual std::string Describe() const = 0;
  // The method in use (never kAuto).
  virtual Method method() const = 0;

  // Registers the engine's device KV memory. InvalidArgument when g1 does not validate or is
  // not on_device; FailedPrecondition when called twice.
  virtual Status RegisterG1(const G1Memory& g1) = 0;
  // Pins [base, base + bytes) once (cudaHostRegister, mapped) so the device can reach it.
  // REQUIRES: the memory is already faulted in and outlives the backend. InvalidArgument for
  // null/empty; FailedPrecondition when called twice; IOError when the driver refuses.
  virtual Status RegisterHost(uint8_t* base, uint64_t bytes) = 0;

  // Starts moving `copies` in direction `dir`; returns at once. Ok: the callbacks will run (on
  // the backend's thread). An error (InvalidArgument for a bad copy, FailedPrecondition when G1
  // or host memory is not registered, IOError when the device refused the work up front,
  // ResourceExhausted when max_batches are in flight and !wait_for_room): nothing was started
  // and no callback runs. With wait_for_room (loads), waits while max_batches are in flight;
  // without (saves), never waits. A Submit from inside a callback never waits either (the
  // waited-for batch could only end on that thread): it may exceed max_batches.
  virtual Status Submit(CopyDirection dir, std::span<const DeviceBlockCopy> copies,
                        LayerCallback on_layer, DoneCallback on_done, bool wait_for_room) = 0;

  // Orders this backend's `dir` work after the engine's: every `dir` batch submitted after this
  // call starts on the device only once the work queued on `engine_stream` before this call
  // has finished. `engine_stream` is a cudaStream_t of the backend's device, as an integer
  // (0 = the legacy default stream, as PyTorch's default stream appears; the per-thread
  // default stream means the calling thread's). Returns at once: one event recorded on the
  // engine's stream and waited for by the backend's `dir` stream, on the device; the host
  // never waits for the engine's work. Batches submitted before this call are not affected.
  // Ok; FailedPrecondition when the engine's stream is capturing a CUDA graph (the wait would
  // pull the backend's stream into the capture); IOError naming the CUDA error otherwise (an
  // invalid handle, a stream of another device or context). On an error nothing was ordered.
  virtual Status OrderAfterStream(CopyDirection dir, uintptr_t engine_stream) = 0;

  // ---- device memory helpers for tests and benchmarks (synchronous) ----
  // Device memory of `bytes` bytes, freed by FreeDevice. IOError naming the CUDA error.
  virtual Result<uint8_t*> AllocateDevice(uint64_t bytes) = 0;
  virtual void FreeDevice(uint8_t* ptr) = 0;
  // Synchronous: returns when the bytes are on the device.
  virtual Status CopyToDevice(uint8_t* dev, const uint8_t* host, uint64_t bytes) = 0;
  // Synchronous; ordered with the legacy default stream only, not with the backend's streams:
  // call it after the batches whose bytes it reads ended.
  virtual Status CopyFromDevice(uint8_t* host, const uint8_t* dev, uint64_t bytes) = 0;
  // The fastest of `reps` plain cudaMemcpyAsync calls of `bytes` bytes between device memory
  // `dev` and registered host memory `host` on a fresh stream: the raw limit the backend is
  // compared with. device_s: between two events around the copy (the copy alone); wall_s: on
  // the host, from before the first event's record until cudaEventSynchronize on the second
  // returned (what a caller waiting for the copy sees, the footing of a backend batch timed
  // from Submit to its done callback).
  struct PlainCopyTime {
    double device_s = 0;
    double wall_s = 0;
  };
  virtual Result<PlainCopyTime> TimePlainCopy(CopyDirection dir, uint8_t* dev, uint8_t* host,
                                              uint64_t bytes, uint32_t reps) = 0;
  // ---- optional: G4 loads fetched by the G1's owner (kvtier serve's attached engines) ----
  // Called once per item, on the backend's thread, when that item ended: Ok once its object
  // landed in its G1 block and verified; NotFound, Corruption (failed verification), TimedOut,
  // Unavailable or IOError otherwise (its G1 block then holds no usable bytes).
  using FetchCallback = std::function<void(size_t item, const Status& status)>;
  // True when G4 loads into G1 block `g1_block` may go through Fetch instead of a G2 slot.
  virtual bool CanFetch(uint32_t /*g1_block*/) const { return false; }
  // Starts fetching every item straight into its G1 block by `deadline` (steady clock); returns
  // at once. Ok: on_item runs once per item. An error: nothing was started, no callback runs.
  // REQUIRES: CanFetch(item.g1_block) for every item.
  virtual Status Fetch(std::vector<G4Fetch> /*items*/,
                       std::chrono::steady_clock::time_point /*deadline*/,
                       FetchCallback /*on_item*/) {
    return Status::FailedPrecondition("this device backend does not fetch from G4");
  }

  // Test hook: the next host-to-device batch stops on the device after layer `layer` landed
  // (its later layers wait) until ReleaseStallForTest() or 30 s pass.
  virtual void StallNextLoadAfterLayerForTest(uint32_t layer) = 0;
  virtual void ReleaseStallForTest() = 0;
};

// "auto", "kernel", "batch", "memcpy".
const char* DeviceCopyMethodName(DeviceCopyBackend::Method method);
// Parses a name returned by DeviceCopyMethodName; InvalidArgument lists the accepted names.
Result<DeviceCopyBackend::Method> ParseDeviceCopyMethod(const std::string& name);

// True when this build contains the CUDA backend (CMake found nvcc and KVTIER_CUDA is ON).
bool CudaBackendBuilt();

// Whether a CUDA device can be used: Ok, or Unavailable with the reason, e.g. "CUDA backend
// unavailable: CUDA driver version is insufficient for CUDA runtime version (error 35); no
// usable GPU driver/device". Probed once per process (later calls return the cached result);
// an unavailable result is logged once, as a warning. Never crashes or aborts without a driver.
Status ProbeCuda();

// The CUDA backend on config.device. InvalidArgument for a bad config; Unavailable as
// ProbeCuda(), or when the device ordinal does not exist or kMemcpyBatch is asked for without
// CUDA >= 12.8; IOError when creating streams fails.
Result<std::unique_ptr<DeviceCopyBackend>> CreateCudaBackend(
    const DeviceCopyBackend::Config& config);

}  // namespace kvtier

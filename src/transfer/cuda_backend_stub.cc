// The CUDA backend's entry points in a build without it (no nvcc found, or -DKVTIER_CUDA=OFF).
#include "transfer/device_backend.h"

namespace kvtier {

namespace {
constexpr char kNotBuilt[] =
    "CUDA backend unavailable: this build has no CUDA backend (CMake found no nvcc, or "
    "KVTIER_CUDA=OFF); no usable GPU driver/device. Rebuild with the CUDA toolkit installed";
}  // namespace

bool CudaBackendBuilt() { return false; }

Status ProbeCuda() { return Status::Unavailable(kNotBuilt); }

Result<std::unique_ptr<DeviceCopyBackend>> CreateCudaBackend(
    const DeviceCopyBackend::Config& config) {
  KVTIER_RETURN_IF_ERROR(config.Validate());
  return Status::Unavailable(kNotBuilt);
}

}  // namespace kvtier

#include "transfer/device_backend.h"

#include <string>

namespace kvtier {

Status DeviceCopyBackend::Config::Validate() const {
  if (device < 0) {
    return Status::InvalidArgument("cuda device = " + std::to_string(device) +
                                   "; a device ordinal is 0 or more");
  }
  if (max_batches < 1 || max_batches > 1024) {
    return Status::InvalidArgument("cuda max_batches = " + std::to_string(max_batches) +
                                   " is out of range; allowed: 1..1024");
  }
  if (max_unit_bytes < kMinCopyUnitBytes || max_unit_bytes % 16 != 0) {
    return Status::InvalidArgument("cuda max_unit_bytes = " + std::to_string(max_unit_bytes) +
                                   " must be a multiple of 16, at least 16");
  }
  if (kernel_threads < 32 || kernel_threads > 1024 || kernel_threads % 32 != 0) {
    return Status::InvalidArgument("cuda kernel_threads = " + std::to_string(kernel_threads) +
                                   " must be a multiple of 32 in 32..1024");
  }
  if (kernel_max_blocks < 1) {
    return Status::InvalidArgument("cuda kernel_max_blocks = 0; allowed: 1 or more");
  }
  return Status::Ok();
}

const char* DeviceCopyMethodName(DeviceCopyBackend::Method method) {
  switch (method) {
    case DeviceCopyBackend::Method::kAuto:
      return "auto";
    case DeviceCopyBackend::Method::kKernel:
      return "kernel";
    case DeviceCopyBackend::Method::kMemcpyBatch:
      return "batch";
    case DeviceCopyBackend::Method::kMemcpyPerChunk:
      return "memcpy";
  }
  return "unknown";
}

Result<DeviceCopyBackend::Method> ParseDeviceCopyMethod(const std::string& name) {
  using M = DeviceCopyBackend::Method;
  for (M m : {M::kAuto, M::kKernel, M::kMemcpyBatch, M::kMemcpyPerChunk}) {
    if (name == DeviceCopyMethodName(m)) return m;
  }
  return Status::InvalidArgument("unknown device copy method '" + name +
                                 "'; use auto, kernel, batch or memcpy");
}

}  // namespace kvtier

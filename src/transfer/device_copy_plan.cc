#include "transfer/device_copy_plan.h"

#include <limits>
#include <string>

namespace kvtier {

const char* CopyDirectionName(CopyDirection dir) {
  return dir == CopyDirection::kDeviceToHost ? "device-to-host" : "host-to-device";
}

namespace {

Status CheckCopy(const G1Memory& g1, const HostWindow& host, const DeviceBlockCopy& c,
                 size_t index) {
  if (c.g1_block >= g1.num_blocks) {
    return Status::InvalidArgument("device copy " + std::to_string(index) + " names G1 block " +
                                   std::to_string(c.g1_block) + "; G1 has " +
                                   std::to_string(g1.num_blocks) + " blocks");
  }
  if (c.host == nullptr) {
    return Status::InvalidArgument("device copy " + std::to_string(index) +
                                   " has a null host pointer");
  }
  const uint64_t block = g1.layout.BlockBytes();
  const uintptr_t lo = reinterpret_cast<uintptr_t>(host.base);
  const uintptr_t p = reinterpret_cast<uintptr_t>(c.host);
  if (p < lo || p - lo > host.bytes || host.bytes - (p - lo) < block) {
    return Status::InvalidArgument(
        "device copy " + std::to_string(index) + ": the host block at offset " +
        std::to_string(static_cast<int64_t>(p - lo)) + " (" + std::to_string(block) +
        " bytes) is outside the registered host memory (" + std::to_string(host.bytes) +
        " bytes); only the registered G2 arena can be copied to or from the device");
  }
  return Status::Ok();
}

}  // namespace

Status BuildDeviceCopyPlan(const G1Memory& g1, const HostWindow& host, CopyDirection dir,
                           std::span<const DeviceBlockCopy> copies, uint64_t max_unit_bytes,
                           DeviceCopyPlan* plan) {
  plan->units.clear();
  plan->layer_begin.clear();
  plan->bytes = 0;
  KVTIER_RETURN_IF_ERROR(g1.Validate());
  if (!g1.on_device) {
    return Status::InvalidArgument("a device copy plan needs a G1 with on_device = true");
  }
  if (max_unit_bytes < kMinCopyUnitBytes || max_unit_bytes % 16 != 0) {
    return Status::InvalidArgument(
        "device copy max_unit_bytes = " + std::to_string(max_unit_bytes) +
        " must be a multiple of 16, at least 16");
  }
  if (host.base == nullptr || host.bytes == 0) {
    return Status::InvalidArgument("device copy plan: no host memory registered");
  }
  for (size_t i = 0; i < copies.size(); ++i)
    KVTIER_RETURN_IF_ERROR(CheckCopy(g1, host, copies[i], i));

  const KvLayout& l = g1.layout;
  const uint64_t chunk = l.ChunkBytes();
  const uint64_t units_per_chunk = (chunk + max_unit_bytes - 1) / max_unit_bytes;
  const uint64_t worst = units_per_chunk * l.num_planes * l.num_layers * copies.size();
  if (worst > std::numeric_limits<uint32_t>::max()) {
    return Status::InvalidArgument("device copy batch of " + std::to_string(copies.size()) +
                                   " blocks needs too many copy units; submit fewer blocks");
  }
  plan->units.reserve(worst);
  plan->layer_begin.reserve(l.num_layers + 1);
  const bool to_host = dir == CopyDirection::kDeviceToHost;
  const uintptr_t host_lo = reinterpret_cast<uintptr_t>(host.base);

  auto emit_run = [&](uint64_t dev, uint64_t hst, uint64_t run) {
    for (uint64_t off = 0; off < run; off += max_unit_bytes) {
      const uint64_t n = run - off < max_unit_bytes ? run - off : max_unit_bytes;
      CopyUnit u;
      u.src = to_host ? dev + off : hst + off;
      u.dst = to_host ? hst + off : dev + off;
      u.bytes = n;
      plan->units.push_back(u);
    }
    plan->bytes += run;
  };

  for (uint32_t layer = 0; layer < l.num_layers; ++layer) {
    plan->layer_begin.push_back(static_cast<uint32_t>(plan->units.size()));
    for (const DeviceBlockCopy& c : copies) {
      const uint64_t hst = host.device_base + (reinterpret_cast<uintptr_t>(c.host) - host_lo) +
                           l.ChunkOffset(layer, 0);
      // A run of planes that G1 keeps back to back; the host side is always contiguous.
      uint64_t run_dev = reinterpret_cast<uintptr_t>(g1.Chunk(c.g1_block, layer, 0));
      uint64_t run_host = hst;
      uint64_t run = chunk;
      for (uint32_t p = 1; p < l.num_planes; ++p) {
        const uint64_t dev = reinterpret_cast<uintptr_t>(g1.Chunk(c.g1_block, layer, p));
        if (dev == run_dev + run) {
          run += chunk;
          continue;
        }
        emit_run(run_dev, run_host, run);
        run_dev = dev;
        run_host = hst + uint64_t{p} * chunk;
        run = chunk;
      }
      emit_run(run_dev, run_host, run);
    }
  }
  plan->layer_begin.push_back(static_cast<uint32_t>(plan->units.size()));
  return Status::Ok();
}

void RunPlanLayerOnHost(const DeviceCopyPlan& plan, uint32_t layer, uint32_t threads) {
  for (const CopyUnit& u : plan.Layer(layer)) {
    for (uint32_t t = 0; t < threads; ++t) CopyUnitSlice(u, t, threads);
  }
}

void PlanLaunchGroups(const DeviceCopyPlan& plan, uint64_t min_launch_bytes, int64_t break_after,
                      std::vector<uint32_t>* ends) {
  ends->clear();
  const uint32_t layers = plan.num_layers();
  if (layers == 0) return;
  // Every layer moves the same bytes (each copy's LayerBytes()): no pass over the units.
  const uint64_t layer_bytes = plan.bytes / layers;
  uint64_t group_bytes = 0;
  for (uint32_t l = 0; l < layers; ++l) {
    group_bytes += layer_bytes;
    if (group_bytes >= min_launch_bytes || static_cast<int64_t>(l) == break_after ||
        l + 1 == layers) {
      ends->push_back(l + 1);
      group_bytes = 0;
    }
  }
}

}  // namespace kvtier

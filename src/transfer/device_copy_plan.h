// DeviceCopyPlan: the host-side planning of a batch of block copies between a device G1 and
// host memory (G2 slots), as the list of contiguous copies (CopyUnit) the device backend runs.
//
// It is plain C++ (no CUDA), so every address, size, bound and the layer-major order is tested
// on the CPU; the CUDA backend only uploads the units and runs them, one kernel (or one batched
// memcpy) per layer, with an event after each layer.
//
// Invariants of a built plan: units are grouped by layer, layer 0 first (layer_begin has
// num_layers + 1 entries, non-decreasing, layer_begin[0] == 0, the last == units.size()); inside
// a layer, blocks are in the order given and each block's chunks in canonical (plane) order;
// every unit has 1 <= bytes <= max_unit_bytes; the units of one block and layer cover exactly the
// layer's LayerBytes() on both sides, once; `bytes` is the sum of all unit sizes.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvtier/g1_memory.h"
#include "kvtier/status.h"
#include "transfer/device_copy_kernel.h"

namespace kvtier {

enum class CopyDirection : uint8_t {
  kDeviceToHost = 0,  // a save: gather G1 blocks into canonical host blocks
  kHostToDevice = 1,  // a load: scatter canonical host blocks into G1 blocks
};
// "device-to-host" or "host-to-device".
const char* CopyDirectionName(CopyDirection dir);

// One block to move: G1 block `g1_block`, and the canonical block (BlockBytes() long) at `host`.
struct DeviceBlockCopy {
  uint32_t g1_block = 0;
  uint8_t* host = nullptr;
};

// Host memory the device can address: the bytes [base, base + bytes) appear to the device at
// device_base (the mapped alias of pinned memory; equal to base under unified addressing).
struct HostWindow {
  const uint8_t* base = nullptr;
  uint64_t bytes = 0;
  uint64_t device_base = 0;
};

struct DeviceCopyPlan {
  std::vector<CopyUnit> units;
  std::vector<uint32_t> layer_begin;
  uint64_t bytes = 0;

  uint32_t num_layers() const {
    return layer_begin.empty() ? 0 : static_cast<uint32_t>(layer_begin.size() - 1);
  }
  // The units of layer `layer`. REQUIRES: layer < num_layers().
  std::span<const CopyUnit> Layer(uint32_t layer) const {
    return std::span<const CopyUnit>(units).subspan(layer_begin[layer],
                                                    layer_begin[layer + 1] - layer_begin[layer]);
  }
};

// Smallest and default max_unit_bytes. Units are cut at multiples of max_unit_bytes from the
// start of a contiguous run, so a multiple of 16 keeps 16-byte alignment inside a run.
inline constexpr uint64_t kMinCopyUnitBytes = 16;
inline constexpr uint64_t kDefaultCopyUnitBytes = 64 * 1024;

// Fills `plan` (reusing its capacity; no allocation once it is large enough) with the units
// that move `copies` in direction `dir`: for each layer, for each copy, the layer's chunks,
// adjacent chunks merged when G1 holds them back to back, runs cut into units of at most
// max_unit_bytes. Returns InvalidArgument, and leaves `plan` empty, when: g1 does not validate
// or is not on_device; max_unit_bytes is < 16 or not a multiple of 16; `host` is empty or null;
// a copy names a G1 block >= g1.num_blocks, has a null host pointer, or its BlockBytes() do not
// lie inside `host`; the plan would exceed 2^32 - 1 units.
Status BuildDeviceCopyPlan(const G1Memory& g1, const HostWindow& host, CopyDirection dir,
                           std::span<const DeviceBlockCopy> copies, uint64_t max_unit_bytes,
                           DeviceCopyPlan* plan);

// Runs layer `layer` of `plan` on the CPU exactly as the device kernel does (CopyUnitSlice for
// thread 0..threads-1 of each unit). For tests, with host memory standing in for device memory
// (G1Memory::on_device set on host buffers). REQUIRES: layer < plan.num_layers(), threads >= 1.
void RunPlanLayerOnHost(const DeviceCopyPlan& plan, uint32_t layer, uint32_t threads);

// Default DeviceCopyBackend::Config::min_launch_bytes: one launch and one event per 8 MiB of a
// batch at least. Each launch and event cost the host ~5 us and the device a drain between
// kernels; per-layer launches of a small batch (4 blocks of Llama-3-8B: 256 KiB per layer) ran
// at 0.38-0.46x of one cudaMemcpy on an H200, see docs/cuda.md.
inline constexpr uint64_t kDefaultMinLaunchBytes = 8ull << 20;

// Cuts the plan's layers into launch groups: runs of consecutive layers, in order, that the
// backend moves with one launch (kernel method) and reports landed with one event. A group is
// closed after a layer once the group holds at least min_launch_bytes (0: every layer is a group
// of its own, the per-layer behaviour), and always after layer `break_after` when it is >= 0 (a
// test hook that must stall between that layer and the next). Fills `ends` with each group's
// exclusive end layer: strictly increasing, the last == plan.num_layers(); empty for a plan
// with no layers. Layers are reported landed only when their whole group landed, so a larger
// minimum delays the first layer's landing by at most min_launch_bytes of copying. REQUIRES:
// a plan from BuildDeviceCopyPlan (every layer moves the same bytes, plan.bytes / layers).
void PlanLaunchGroups(const DeviceCopyPlan& plan, uint64_t min_launch_bytes, int64_t break_after,
                      std::vector<uint32_t>* ends);

}  // namespace kvtier

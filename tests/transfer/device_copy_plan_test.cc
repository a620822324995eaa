// The CUDA backend's host-side planning and its kernel body, run on the CPU: host buffers stand
// in for device memory (the plan never dereferences addresses; RunPlanLayerOnHost runs the
// kernel's CopyUnitSlice for every simulated thread).
#include "transfer/device_copy_plan.h"

#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "transfer/block_copy.h"
#include "transfer_test_util.h"

namespace kvtier {
namespace {

using testing::Pattern;
using testing::SmallLayout;

// A "device" G1 in host memory. Layer-separate regions are placed far apart (K and V of a
// layer are not adjacent unless `interleave_kv`, where each layer's region holds [K | V] per
// block, FlashInfer style, so the planner can merge them).
struct FakeG1 {
  std::vector<uint8_t> mem;
  G1Memory g1;

  FakeG1(const KvLayout& l, uint32_t blocks, bool interleave_kv = false) {
    g1.layout = l;
    g1.num_blocks = blocks;
    g1.on_device = true;
    const uint64_t chunk = l.ChunkBytes();
    if (l.g1_arrangement == G1Arrangement::kBlockContiguous) {
      mem.assign(l.BlockBytes() * blocks, 0);
      g1.regions.push_back({mem.data(), l.BlockBytes()});
      return;
    }
    mem.assign(l.BlockBytes() * blocks, 0);
    const uint64_t region = chunk * blocks;
    for (uint32_t layer = 0; layer < l.num_layers; ++layer) {
      for (uint32_t p = 0; p < l.num_planes; ++p) {
        if (interleave_kv) {
          uint8_t* base = mem.data() + layer * region * l.num_planes + p * chunk;
          g1.regions.push_back({base, chunk * l.num_planes});
        } else {
          g1.regions.push_back({mem.data() + (layer * l.num_planes + p) * region, chunk});
        }
      }
    }
  }
  void Fill(uint32_t block, uint64_t id) {
    const KvLayout& l = g1.layout;
    for (uint32_t layer = 0; layer < l.num_layers; ++layer)
      for (uint32_t p = 0; p < l.num_planes; ++p) {
        uint8_t* c = g1.Chunk(block, layer, p);
        for (uint64_t i = 0; i < l.ChunkBytes(); ++i)
          c[i] = Pattern(id, l.ChunkOffset(layer, p) + i);
      }
  }
  // Bytes of `block` that differ from pattern `id`, in layer `only_layer` (or all).
  uint64_t Mismatches(uint32_t block, uint64_t id, int only_layer = -1) const {
    const KvLayout& l = g1.layout;
    uint64_t bad = 0;
    for (uint32_t layer = 0; layer < l.num_layers; ++layer) {
      if (only_layer >= 0 && layer != static_cast<uint32_t>(only_layer)) continue;
      for (uint32_t p = 0; p < l.num_planes; ++p) {
        const uint8_t* c = g1.Chunk(block, layer, p);
        for (uint64_t i = 0; i < l.ChunkBytes(); ++i)
          bad += c[i] != Pattern(id, l.ChunkOffset(layer, p) + i);
      }
    }
    return bad;
  }
};

HostWindow WindowOf(std::vector<uint8_t>& host) {
  return HostWindow{host.data(), host.size(), reinterpret_cast<uintptr_t>(host.data())};
}

void RunAll(const DeviceCopyPlan& plan, uint32_t threads) {
  for (uint32_t l = 0; l < plan.num_layers(); ++l) RunPlanLayerOnHost(plan, l, threads);
}

class PlanRoundTrip : public ::testing::TestWithParam<std::tuple<G1Arrangement, bool, uint64_t>> {};

// Save scattered blocks device -> host with the planned units, compare with the memcpy
// backend's GatherBlock; load them back host -> device into other blocks; byte-exact.
TEST_P(PlanRoundTrip, ScatteredBlocksAreByteExact) {
  const auto [arrangement, interleave, max_unit] = GetParam();
  const KvLayout l = SmallLayout(arrangement);
  FakeG1 dev(l, 16, interleave);
  const std::vector<uint32_t> src_blocks = {11, 2, 7, 0, 15};
  const std::vector<uint32_t> dst_blocks = {3, 14, 1, 9, 6};
  for (uint32_t b : src_blocks) dev.Fill(b, 100 + b);
  // Host slots with a gap between them, in shuffled order, as G2 slots are.
  const uint64_t stride = l.BlockBytes() + 4096;
  std::vector<uint8_t> host(stride * 8, 0xEE);
  const std::vector<uint32_t> slots = {5, 0, 7, 2, 3};
  std::vector<DeviceBlockCopy> saves, loads;
  for (size_t i = 0; i < src_blocks.size(); ++i) {
    saves.push_back({src_blocks[i], host.data() + slots[i] * stride + 4096});
    loads.push_back({dst_blocks[i], host.data() + slots[i] * stride + 4096});
  }
  DeviceCopyPlan plan;
  ASSERT_TRUE(BuildDeviceCopyPlan(dev.g1, WindowOf(host), CopyDirection::kDeviceToHost, saves,
                                  max_unit, &plan)
                  .ok());
  EXPECT_EQ(plan.bytes, l.BlockBytes() * saves.size());
  RunAll(plan, 7);  // an odd thread count: the striding must still cover every byte once
  G1Memory host_view = dev.g1;
  host_view.on_device = false;
  std::vector<uint8_t> expect(l.BlockBytes());
  for (size_t i = 0; i < saves.size(); ++i) {
    GatherBlock(host_view, src_blocks[i], expect.data());
    EXPECT_EQ(std::memcmp(saves[i].host, expect.data(), expect.size()), 0) << "block " << i;
    // The 4 KiB header area before each payload is untouched.
    const uint8_t* header = saves[i].host - 4096;
    for (int j = 0; j < 4096; ++j) ASSERT_EQ(header[j], 0xEE) << "slot " << slots[i];
  }

  DeviceCopyPlan load_plan;
  ASSERT_TRUE(BuildDeviceCopyPlan(dev.g1, WindowOf(host), CopyDirection::kHostToDevice, loads,
                                  max_unit, &load_plan)
                  .ok());
  // Layer by layer: after layer k, layers <= k are in place and later ones are not.
  for (uint32_t layer = 0; layer < l.num_layers; ++layer) {
    RunPlanLayerOnHost(load_plan, layer, 256);
    for (size_t i = 0; i < loads.size(); ++i) {
      EXPECT_EQ(dev.Mismatches(dst_blocks[i], 100 + src_blocks[i], layer), 0u);
      if (layer + 1 < l.num_layers) {
        EXPECT_GT(dev.Mismatches(dst_blocks[i], 100 + src_blocks[i], layer + 1), 0u);
      }
    }
  }
  for (size_t i = 0; i < loads.size(); ++i) {
    EXPECT_EQ(dev.Mismatches(dst_blocks[i], 100 + src_blocks[i]), 0u);
    EXPECT_EQ(dev.Mismatches(src_blocks[i], 100 + src_blocks[i]), 0u);  // sources unchanged
  }
  // Blocks nobody loaded into are still zero.
  for (uint32_t b : {4u, 5u, 8u, 10u, 12u, 13u}) {
    for (uint32_t layer = 0; layer < l.num_layers; ++layer) {
      const uint8_t* c = dev.g1.Chunk(b, layer, 0);
      for (uint64_t i = 0; i < l.ChunkBytes(); ++i) ASSERT_EQ(c[i], 0) << "block " << b;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Arrangements, PlanRoundTrip,
    ::testing::Values(std::make_tuple(G1Arrangement::kLayerSeparate, false, kDefaultCopyUnitBytes),
                      std::make_tuple(G1Arrangement::kLayerSeparate, true, kDefaultCopyUnitBytes),
                      std::make_tuple(G1Arrangement::kLayerSeparate, false, uint64_t{48}),
                      std::make_tuple(G1Arrangement::kBlockContiguous, false,
                                      kDefaultCopyUnitBytes),
                      std::make_tuple(G1Arrangement::kBlockContiguous, false, uint64_t{1008})),
    [](const auto& info) {
      std::string name = G1ArrangementName(std::get<0>(info.param));
      if (std::get<1>(info.param)) name += "_kv_adjacent";
      name += "_unit" + std::to_string(std::get<2>(info.param));
      for (char& c : name) c = c == '-' ? '_' : c;
      return name;
    });

TEST(DeviceCopyPlanTest, UnitsAreLayerMajorWithExactAddresses) {
  const KvLayout l = SmallLayout(G1Arrangement::kLayerSeparate);
  FakeG1 dev(l, 8);
  std::vector<uint8_t> host(l.BlockBytes() * 4);
  HostWindow w = WindowOf(host);
  w.device_base = 0x7000'0000'0000ull;  // a mapped alias different from the host address
  const std::vector<DeviceBlockCopy> copies = {{6, host.data() + l.BlockBytes() * 2},
                                               {1, host.data()}};
  DeviceCopyPlan plan;
  ASSERT_TRUE(
      BuildDeviceCopyPlan(dev.g1, w, CopyDirection::kHostToDevice, copies, 1 << 20, &plan).ok());
  ASSERT_EQ(plan.num_layers(), l.num_layers);
  ASSERT_EQ(plan.units.size(), size_t{l.num_layers} * 2 * l.num_planes);
  size_t u = 0;
  for (uint32_t layer = 0; layer < l.num_layers; ++layer) {
    EXPECT_EQ(plan.layer_begin[layer], u);
    for (size_t c = 0; c < copies.size(); ++c) {
      for (uint32_t p = 0; p < l.num_planes; ++p, ++u) {
        const CopyUnit& unit = plan.units[u];
        const uint64_t host_off =
            static_cast<uint64_t>(copies[c].host - host.data()) + l.ChunkOffset(layer, p);
        EXPECT_EQ(unit.src, w.device_base + host_off) << "unit " << u;
        EXPECT_EQ(unit.dst,
                  reinterpret_cast<uintptr_t>(dev.g1.Chunk(copies[c].g1_block, layer, p)));
        EXPECT_EQ(unit.bytes, l.ChunkBytes());
      }
    }
  }
  EXPECT_EQ(plan.layer_begin.back(), plan.units.size());
  EXPECT_EQ(plan.bytes, 2 * l.BlockBytes());

  // Device -> host swaps the two sides.
  ASSERT_TRUE(
      BuildDeviceCopyPlan(dev.g1, w, CopyDirection::kDeviceToHost, copies, 1 << 20, &plan).ok());
  EXPECT_EQ(plan.units[0].src, reinterpret_cast<uintptr_t>(dev.g1.Chunk(6, 0, 0)));
  EXPECT_EQ(plan.units[0].dst, w.device_base + l.BlockBytes() * 2);
}

TEST(DeviceCopyPlanTest, AdjacentPlanesMergeAndRunsSplitAtTheUnitSize) {
  // Block-contiguous: a layer of one block is one run of LayerBytes() (4 KiB).
  const KvLayout l = SmallLayout(G1Arrangement::kBlockContiguous);
  FakeG1 dev(l, 4);
  std::vector<uint8_t> host(l.BlockBytes());
  const std::vector<DeviceBlockCopy> one = {{2, host.data()}};
  DeviceCopyPlan plan;
  ASSERT_TRUE(BuildDeviceCopyPlan(dev.g1, WindowOf(host), CopyDirection::kDeviceToHost, one,
                                  kDefaultCopyUnitBytes, &plan)
                  .ok());
  ASSERT_EQ(plan.units.size(), l.num_layers);
  for (const CopyUnit& u : plan.units) EXPECT_EQ(u.bytes, l.LayerBytes());
  // Units of at most 1,008 bytes: 4,096 = 4 x 1,008 + 64, cut from the start of the run.
  ASSERT_TRUE(
      BuildDeviceCopyPlan(dev.g1, WindowOf(host), CopyDirection::kDeviceToHost, one, 1008, &plan)
          .ok());
  ASSERT_EQ(plan.units.size(), size_t{l.num_layers} * 5);
  for (uint32_t layer = 0; layer < l.num_layers; ++layer) {
    auto units = plan.Layer(layer);
    ASSERT_EQ(units.size(), 5u);
    uint64_t covered = 0;
    for (size_t i = 0; i < units.size(); ++i) {
      EXPECT_EQ(units[i].bytes, i < 4 ? 1008u : 64u);
      EXPECT_EQ(units[i].src, reinterpret_cast<uintptr_t>(dev.g1.Chunk(2, layer, 0)) + covered);
      covered += units[i].bytes;
    }
    EXPECT_EQ(covered, l.LayerBytes());
  }
  // Layer-separate with K and V apart: two units per layer; interleaved [K | V]: one.
  const KvLayout ls = SmallLayout(G1Arrangement::kLayerSeparate);
  FakeG1 apart(ls, 4, false), together(ls, 4, true);
  ASSERT_TRUE(BuildDeviceCopyPlan(apart.g1, WindowOf(host), CopyDirection::kHostToDevice, one,
                                  kDefaultCopyUnitBytes, &plan)
                  .ok());
  EXPECT_EQ(plan.units.size(), size_t{ls.num_layers} * 2);
  ASSERT_TRUE(BuildDeviceCopyPlan(together.g1, WindowOf(host), CopyDirection::kHostToDevice, one,
                                  kDefaultCopyUnitBytes, &plan)
                  .ok());
  EXPECT_EQ(plan.units.size(), size_t{ls.num_layers});
  EXPECT_EQ(plan.units[0].bytes, ls.LayerBytes());
}

TEST(DeviceCopyPlanTest, BadCopiesAreRefusedAndLeaveThePlanEmpty) {
  const KvLayout l = SmallLayout(G1Arrangement::kLayerSeparate);
  FakeG1 dev(l, 8);
  std::vector<uint8_t> host(l.BlockBytes() * 2);
  const HostWindow w = WindowOf(host);
  DeviceCopyPlan plan;
  auto build = [&](std::vector<DeviceBlockCopy> copies, uint64_t unit = kDefaultCopyUnitBytes,
                   const G1Memory* g1 = nullptr, HostWindow win = {}) {
    if (win.base == nullptr && win.bytes == 0 && win.device_base == 0) win = w;
    // Seed the plan so that "left empty" is checked.
    plan.units.assign(3, CopyUnit{});
    plan.layer_begin.assign(2, 0);
    plan.bytes = 7;
    return BuildDeviceCopyPlan(g1 ? *g1 : dev.g1, win, CopyDirection::kHostToDevice, copies, unit,
                               &plan);
  };
  auto expect_refused = [&](const Status& s, const char* needle) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.ToString();
    EXPECT_TRUE(plan.units.empty());
    EXPECT_TRUE(plan.layer_begin.empty());
    EXPECT_EQ(plan.bytes, 0u);
  };
  expect_refused(build({{8, host.data()}}), "G1 block 8");
  expect_refused(build({{0, host.data()}, {1, nullptr}}), "null host pointer");
  // Host ranges before, straddling the end of, and past the registered window.
  std::vector<uint8_t> elsewhere(l.BlockBytes());
  expect_refused(build({{0, elsewhere.data()}}), "outside the registered host memory");
  expect_refused(build({{0, host.data() + l.BlockBytes() + 16}}),
                 "outside the registered host memory");
  expect_refused(build({{0, host.data() + host.size()}}), "outside the registered host memory");
  expect_refused(build({{0, host.data()}}, 24), "multiple of 16");
  expect_refused(build({{0, host.data()}}, 0), "multiple of 16");
  G1Memory on_host = dev.g1;
  on_host.on_device = false;
  expect_refused(build({{0, host.data()}}, kDefaultCopyUnitBytes, &on_host), "on_device");
  G1Memory broken = dev.g1;
  broken.regions.pop_back();
  expect_refused(build({{0, host.data()}}, kDefaultCopyUnitBytes, &broken), "regions");
  expect_refused(
      build({{0, host.data()}}, kDefaultCopyUnitBytes, nullptr, HostWindow{host.data(), 0, 1}),
      "no host memory");
  // The last block that fits exactly is fine; an empty batch is a plan of empty layers.
  EXPECT_TRUE(build({{7, host.data() + l.BlockBytes()}}).ok());
  ASSERT_TRUE(build({}).ok());
  EXPECT_EQ(plan.num_layers(), l.num_layers);
  EXPECT_TRUE(plan.units.empty());
}

TEST(DeviceCopyPlanTest, TooManyUnitsIsRefusedBeforeAnyAllocation) {
  // 1 MiB chunks in 16-byte units: 65,536 units per chunk x 2 planes x 32 layers = 4 Mi units
  // per block; 1,025 blocks pass 2^32. Addresses are never dereferenced by the planner.
  KvLayout l;
  l.num_layers = 32;
  l.num_kv_heads = 64;
  l.head_dim = 128;
  l.tokens_per_block = 64;  // 64 x 64 x 128 x 2 = 1 MiB chunks
  G1Memory g1;
  g1.layout = l;
  g1.num_blocks = 2048;
  g1.on_device = true;
  for (uint32_t r = 0; r < l.num_layers * l.num_planes; ++r) {
    g1.regions.push_back({reinterpret_cast<uint8_t*>(uint64_t{1} << 40), l.ChunkBytes()});
  }
  uint8_t* fake = reinterpret_cast<uint8_t*>(uint64_t{1} << 44);
  const HostWindow w{fake, l.BlockBytes() * 2048, uint64_t{1} << 44};
  std::vector<DeviceBlockCopy> copies;
  for (uint32_t b = 0; b < 1025; ++b) copies.push_back({b, fake + l.BlockBytes() * b});
  DeviceCopyPlan plan;
  Status s = BuildDeviceCopyPlan(g1, w, CopyDirection::kHostToDevice, copies, 16, &plan);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("too many copy units"), std::string::npos) << s.ToString();
  EXPECT_TRUE(plan.units.empty());
}

// Launch groups: consecutive layers, closed once min_launch_bytes is reached, always after the
// break layer, the last ending at num_layers.
TEST(DeviceCopyPlanTest, LaunchGroupsCoverTheLayersInOrder) {
  const KvLayout l = SmallLayout(G1Arrangement::kLayerSeparate);  // 4 layers, 4 KiB per layer
  FakeG1 dev(l, 8);
  std::vector<uint8_t> host(l.BlockBytes() * 2);
  const std::vector<DeviceBlockCopy> copies = {{3, host.data()}, {5, host.data() + l.BlockBytes()}};
  DeviceCopyPlan plan;
  ASSERT_TRUE(BuildDeviceCopyPlan(dev.g1, WindowOf(host), CopyDirection::kHostToDevice, copies,
                                  1 << 20, &plan)
                  .ok());
  const uint64_t layer_bytes = 2 * l.LayerBytes();  // 8 KiB: both copies' share of a layer
  std::vector<uint32_t> ends;
  PlanLaunchGroups(plan, 0, -1, &ends);
  EXPECT_EQ(ends, (std::vector<uint32_t>{1, 2, 3, 4}));
  PlanLaunchGroups(plan, layer_bytes, -1, &ends);
  EXPECT_EQ(ends, (std::vector<uint32_t>{1, 2, 3, 4}));
  PlanLaunchGroups(plan, layer_bytes + 1, -1, &ends);
  EXPECT_EQ(ends, (std::vector<uint32_t>{2, 4}));
  PlanLaunchGroups(plan, 3 * layer_bytes, -1, &ends);
  EXPECT_EQ(ends, (std::vector<uint32_t>{3, 4}));  // the last group is whatever is left
  PlanLaunchGroups(plan, uint64_t{1} << 40, -1, &ends);
  EXPECT_EQ(ends, (std::vector<uint32_t>{4}));
  PlanLaunchGroups(plan, uint64_t{1} << 40, 1, &ends);  // a break after layer 1
  EXPECT_EQ(ends, (std::vector<uint32_t>{2, 4}));
  PlanLaunchGroups(plan, 3 * layer_bytes, 0, &ends);
  EXPECT_EQ(ends, (std::vector<uint32_t>{1, 4}));
  PlanLaunchGroups(plan, 0, 3, &ends);  // a break on the last layer changes nothing
  EXPECT_EQ(ends, (std::vector<uint32_t>{1, 2, 3, 4}));
  DeviceCopyPlan empty;
  PlanLaunchGroups(empty, 0, -1, &ends);
  EXPECT_TRUE(ends.empty());
}

// The kernel body alone: every byte of a unit copied exactly once, none outside it, for
// aligned (vector path, with and without the unrolled remainder) and unaligned units, and
// thread counts from 1 to more threads than vectors.
TEST(CopyUnitSliceTest, CoversEveryByteOnceAndNothingElse) {
  constexpr uint64_t kGuard = 64;
  for (uint64_t bytes : {0ull, 1ull, 15ull, 16ull, 48ull, 64ull, 80ull, 112ull, 1000ull, 4096ull,
                         4112ull, 8192ull, 12288ull + 16, 65536ull + 48}) {
    for (uint64_t misalign : {0ull, 1ull, 8ull}) {
      for (uint32_t threads : {1u, 3u, 32u, 256u, 1024u}) {
        // Source: distinct bytes; destination: guard-filled. Both 16-aligned + misalign.
        std::vector<uint8_t> src_buf(bytes + 2 * kGuard + 16), dst_buf(bytes + 2 * kGuard + 16);
        uint8_t* src = src_buf.data() + (16 - reinterpret_cast<uintptr_t>(src_buf.data()) % 16) +
                       kGuard + misalign;
        uint8_t* dst =
            dst_buf.data() + (16 - reinterpret_cast<uintptr_t>(dst_buf.data()) % 16) + kGuard;
        for (uint64_t i = 0; i < bytes; ++i) src[i] = static_cast<uint8_t>(i * 37 + 11);
        std::memset(dst_buf.data(), 0xA5, dst_buf.size());
        // Content and guards here; ThreadsShareNoByte checks that no two threads write a byte.
        const CopyUnit u{reinterpret_cast<uintptr_t>(src), reinterpret_cast<uintptr_t>(dst), bytes};
        for (uint32_t t = 0; t < threads; ++t) CopyUnitSlice(u, t, threads);
        for (uint64_t i = 0; i < bytes; ++i) {
          ASSERT_EQ(dst[i], src[i]) << bytes << " bytes, misalign " << misalign << ", " << threads
                                    << " threads, byte " << i;
        }
        for (uint8_t* p = dst_buf.data(); p < dst; ++p) ASSERT_EQ(*p, 0xA5) << "guard before";
        for (uint8_t* p = dst + bytes; p < dst_buf.data() + dst_buf.size(); ++p) {
          ASSERT_EQ(*p, 0xA5) << "guard after, " << bytes << " bytes";
        }
      }
    }
  }
}

// Disjointness: with a zeroed source, each thread in turn writes into a destination that the
// test resets to a marker; the bytes each thread changed are counted, and every byte must be
// claimed by exactly one thread.
TEST(CopyUnitSliceTest, ThreadsShareNoByte) {
  for (uint64_t bytes : {4096ull + 48, 8192ull + 32, 999ull}) {
    for (uint32_t threads : {3u, 32u, 256u}) {
      std::vector<uint8_t> src(bytes + 16, 0), dst(bytes + 16, 1);
      uint8_t* s = src.data() + (16 - reinterpret_cast<uintptr_t>(src.data()) % 16) % 16;
      uint8_t* d = dst.data() + (16 - reinterpret_cast<uintptr_t>(dst.data()) % 16) % 16;
      std::vector<uint32_t> claims(bytes, 0);
      for (uint32_t t = 0; t < threads; ++t) {
        std::memset(d, 1, bytes);
        CopyUnitSlice(
            CopyUnit{reinterpret_cast<uintptr_t>(s), reinterpret_cast<uintptr_t>(d), bytes}, t,
            threads);
        for (uint64_t i = 0; i < bytes; ++i) claims[i] += d[i] == 0;
      }
      for (uint64_t i = 0; i < bytes; ++i) {
        ASSERT_EQ(claims[i], 1u) << bytes << " bytes, " << threads << " threads, byte " << i;
      }
    }
  }
}

}  // namespace
}  // namespace kvtier

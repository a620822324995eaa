// The CUDA backend. Two kinds of tests:
//  - tests that run everywhere: the probe's answer on a machine without a GPU driver, the
//    refusals (bad config, device G1 without CUDA), the CLI's --device cuda exit code;
//  - GPU tests (byte-exact round trips of scattered blocks in both G1 arrangements and with
//    every copy method, per-layer completion in order, WaitLayer before later layers land),
//    which SKIP with the probe's reason where no GPU can be used. bench/gpu.sh fails when they
//    skip on a GPU machine.
#include <sys/wait.h>

#include <stdlib.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli_run.h"

#include "tier/disk_tier.h"
#include "transfer/device_backend.h"
#include "transfer/transfer_engine.h"

namespace kvtier {
namespace {

#define SKIP_WITHOUT_GPU()                                                   \
  do {                                                                       \
    Status probe_ = ProbeCuda();                                             \
    if (!probe_.ok()) GTEST_SKIP() << "no usable GPU: " << probe_.message(); \
  } while (0)

// ---------------------------------------------------------------------------------------------
// Everywhere

TEST(CudaProbeTest, ReportsWhyThereIsNoGpu) {
  Status s = ProbeCuda();
  if (s.ok()) GTEST_SKIP() << "a usable GPU is present; this test covers machines without one";
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_EQ(s.message().rfind("CUDA backend unavailable: ", 0), 0u) << s.ToString();
  EXPECT_NE(s.message().find("no usable GPU driver/device"), std::string::npos) << s.ToString();
  if (CudaBackendBuilt()) {
    // No driver: 35 (cudaErrorInsufficientDriver); a driver but no device: 100.
    const bool known = s.message().find("(error 35)") != std::string::npos ||
                       s.message().find("(error 100)") != std::string::npos;
    EXPECT_TRUE(known) << s.ToString();
  } else {
    EXPECT_NE(s.message().find("this build has no CUDA backend"), std::string::npos);
  }
  // Cached: the same answer again, without probing (and logging) again.
  Status again = ProbeCuda();
  EXPECT_EQ(again.ToString(), s.ToString());
}

TEST(CudaProbeTest, CreateWithoutGpuIsUnavailableAndABadConfigIsInvalid) {
  DeviceCopyBackend::Config bad;
  bad.kernel_threads = 100;
  auto b = CreateCudaBackend(bad);
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument) << b.status().ToString();
  EXPECT_NE(b.status().message().find("kernel_threads = 100"), std::string::npos);
  if (ProbeCuda().ok()) return;
  auto c = CreateCudaBackend({});
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(c.status().message(), ProbeCuda().message());
}

TEST(CudaConfigTest, ValidateNamesTheField) {
  DeviceCopyBackend::Config c;
  EXPECT_TRUE(c.Validate().ok());
  c.max_unit_bytes = 100;
  EXPECT_NE(c.Validate().message().find("max_unit_bytes"), std::string::npos);
  c = {};
  c.max_batches = 0;
  EXPECT_NE(c.Validate().message().find("max_batches"), std::string::npos);
  c = {};
  c.device = -1;
  EXPECT_NE(c.Validate().message().find("device"), std::string::npos);
  c = {};
  c.kernel_max_blocks = 0;
  EXPECT_NE(c.Validate().message().find("kernel_max_blocks"), std::string::npos);
  for (const char* name : {"auto", "kernel", "batch", "memcpy"}) {
    auto m = ParseDeviceCopyMethod(name);
    ASSERT_TRUE(m.ok()) << name;
    EXPECT_STREQ(DeviceCopyMethodName(*m), name);
  }
  EXPECT_NE(ParseDeviceCopyMethod("dma").status().message().find("kernel, batch or memcpy"),
            std::string::npos);
}

using cli_run::CliRun;

CliRun Kvtier(const std::string& args, bool stdout_only = false) {
  const std::string cmd =
      std::string(KVTIER_CLI_PATH) + " " + args + (stdout_only ? " 2>/dev/null" : " 2>&1");
  return cli_run::RunShell(cmd);
}

TEST(CudaCliTest, BenchCopyDeviceCudaWithoutGpuExitsThree) {
  if (ProbeCuda().ok()) GTEST_SKIP() << "a usable GPU is present; bench/gpu.sh runs the bench";
  CliRun r = Kvtier("bench copy --device cuda");
  EXPECT_EQ(r.exit_code, 3) << r.out;
  EXPECT_NE(r.out.find("CUDA backend unavailable"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("no usable GPU driver/device"), std::string::npos) << r.out;
  // --json: stdout is still one JSON object, saying why.
  r = Kvtier("bench copy --device cuda --json", true);
  EXPECT_EQ(r.exit_code, 3) << r.out;
  EXPECT_EQ(r.out.rfind("{", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("\"available\": false"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"error\": \"CUDA backend unavailable"), std::string::npos) << r.out;
}

TEST(CudaCliTest, BadDeviceAndMethodAreUsageErrors) {
  CliRun r = Kvtier("bench copy --device tpu");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--device"), std::string::npos) << r.out;
  r = Kvtier("bench copy --device cuda --method dma");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("kernel, batch or memcpy"), std::string::npos) << r.out;
  r = Kvtier("bench copy --method kernel");  // a CUDA flag without --device cuda
  EXPECT_EQ(r.exit_code, 2) << r.out;
}

// ---------------------------------------------------------------------------------------------
// GPU only

KvLayout SmallLayout(G1Arrangement arrangement) {
  KvLayout l;
  l.num_layers = 8;
  l.num_kv_heads = 2;
  l.head_dim = 64;
  l.tokens_per_block = 16;  // 4 KiB chunks, 64 KiB blocks
  l.g1_arrangement = arrangement;
  return l;
}

uint8_t Pattern(uint64_t id, uint64_t off) {
  return static_cast<uint8_t>((id * 131 + off * 7 + off / 4096 + 1) & 0xff);
}

// A device G1 (one cudaMalloc cut into regions), its host mirror for expectations, a G2 arena
// and a TransferEngine that drives the CUDA backend with `method`.
struct DeviceRig {
  KvLayout layout;
  uint32_t blocks = 24;
  std::unique_ptr<DeviceCopyBackend> helper;  // allocations and plain copies only
  uint8_t* dev = nullptr;
  uint64_t dev_bytes = 0;
  G1Memory g1;
  std::unique_ptr<HostArena> arena;
  std::unique_ptr<TransferEngine> engine;

  DeviceRig(G1Arrangement arrangement, DeviceCopyBackend::Method method, uint32_t max_batches = 32,
            uint64_t min_launch_bytes = kDefaultMinLaunchBytes, uint32_t completion_spin_us = 0)
      : layout(SmallLayout(arrangement)) {
    helper = std::move(CreateCudaBackend({})).value();
    dev_bytes = layout.BlockBytes() * blocks;
    dev = std::move(helper->AllocateDevice(dev_bytes)).value();
    g1.layout = layout;
    g1.num_blocks = blocks;
    g1.on_device = true;
    if (arrangement == G1Arrangement::kBlockContiguous) {
      g1.regions.push_back({dev, layout.BlockBytes()});
    } else {
      const uint64_t region = layout.ChunkBytes() * blocks;
      for (uint32_t r = 0; r < layout.num_layers * layout.num_planes; ++r) {
        g1.regions.push_back({dev + r * region, layout.ChunkBytes()});
      }
    }
    HostArena::Config ac;
    ac.slot_bytes = G2PayloadOffset(layout) + layout.BlockBytes();
    ac.capacity_bytes = (ac.slot_bytes + 4095) / 4096 * 4096 * 32;
    ac.lock_memory = false;
    arena = std::move(HostArena::Create(ac)).value();
    TransferEngine::Config tc;
    tc.cuda.method = method;
    tc.cuda.max_batches = max_batches;
    tc.cuda.min_launch_bytes = min_launch_bytes;
    tc.cuda.completion_spin_us = completion_spin_us;
    engine = std::move(TransferEngine::Create(tc)).value();
    Status s = engine->RegisterHostArena(arena.get(), layout);
    EXPECT_TRUE(s.ok()) << s.ToString();
    s = engine->RegisterG1(g1);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  ~DeviceRig() {
    engine.reset();
    helper->FreeDevice(dev);
  }

  // Offset of chunk (layer, plane) of `block` inside the device allocation.
  uint64_t DevOffset(uint32_t block, uint32_t l, uint32_t p) const {
    return static_cast<uint64_t>(g1.Chunk(block, l, p) - dev);
  }
  // The device bytes, read back.
  std::vector<uint8_t> ReadDevice() const {
    std::vector<uint8_t> out(dev_bytes);
    Status s = helper->CopyFromDevice(out.data(), dev, dev_bytes);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return out;
  }
  void WriteDevice(const std::vector<uint8_t>& bytes) {
    Status s = helper->CopyToDevice(dev, bytes.data(), dev_bytes);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  // Writes pattern `id` into block `block` of a host mirror.
  void FillMirror(std::vector<uint8_t>* mirror, uint32_t block, uint64_t id) const {
    for (uint32_t l = 0; l < layout.num_layers; ++l)
      for (uint32_t p = 0; p < layout.num_planes; ++p) {
        uint8_t* c = mirror->data() + DevOffset(block, l, p);
        for (uint64_t i = 0; i < layout.ChunkBytes(); ++i)
          c[i] = Pattern(id, layout.ChunkOffset(l, p) + i);
      }
  }
  uint64_t Mismatches(const std::vector<uint8_t>& mirror, uint32_t block, uint64_t id,
                      int only_layer = -1) const {
    uint64_t bad = 0;
    for (uint32_t l = 0; l < layout.num_layers; ++l) {
      if (only_layer >= 0 && l != static_cast<uint32_t>(only_layer)) continue;
      for (uint32_t p = 0; p < layout.num_planes; ++p) {
        const uint8_t* c = mirror.data() + DevOffset(block, l, p);
        for (uint64_t i = 0; i < layout.ChunkBytes(); ++i)
          bad += c[i] != Pattern(id, layout.ChunkOffset(l, p) + i);
      }
    }
    return bad;
  }
  uint64_t SlotMismatches(uint32_t slot, uint64_t id) const {
    const uint8_t* s = arena->SlotData(slot) + G2PayloadOffset(layout);
    uint64_t bad = 0;
    for (uint64_t i = 0; i < layout.BlockBytes(); ++i) bad += s[i] != Pattern(id, i);
    return bad;
  }
};

BlockTransfer Move(BlockTransfer::Op op, uint32_t g1_block, uint32_t g2_slot) {
  BlockTransfer m;
  m.op = op;
  m.g1_block = g1_block;
  m.g2_slot = g2_slot;
  return m;
}

// Launch groups of the round trip: every layer its own launch, two layers per launch, or the
// default (the whole small batch in one launch); and the default with completion threads that
// poll the events for 500 us before they sleep on them.
enum class Launches { kPerLayer, kTwoLayers, kDefault, kDefaultPolling };

class CudaRoundTrip : public ::testing::TestWithParam<
                          std::tuple<G1Arrangement, DeviceCopyBackend::Method, Launches>> {};

TEST_P(CudaRoundTrip, ScatteredBlocksAreByteExact) {
  SKIP_WITHOUT_GPU();
  const auto [arrangement, method, launches] = GetParam();
  if (method == DeviceCopyBackend::Method::kMemcpyBatch) {
    auto probe = CreateCudaBackend({.method = DeviceCopyBackend::Method::kMemcpyBatch});
    if (!probe.ok()) GTEST_SKIP() << probe.status().message();
  }
  const uint64_t batch_layer_bytes = 7 * SmallLayout(arrangement).LayerBytes();  // 7 copies
  const uint64_t min_launch = launches == Launches::kPerLayer    ? 0
                              : launches == Launches::kTwoLayers ? 2 * batch_layer_bytes
                                                                 : kDefaultMinLaunchBytes;
  DeviceRig rig(arrangement, method, 32, min_launch,
                launches == Launches::kDefaultPolling ? 500 : 0);
  ASSERT_NE(rig.engine->device_backend(), nullptr);
  const std::vector<uint32_t> src = {17, 3, 22, 8, 0, 13, 5};
  const std::vector<uint32_t> dst = {1, 20, 9, 14, 23, 6, 11};
  const std::vector<uint32_t> slots = {30, 2, 17, 9, 0, 25, 12};
  std::vector<uint8_t> mirror(rig.dev_bytes, 0);
  for (uint32_t b : src) rig.FillMirror(&mirror, b, 500 + b);
  rig.WriteDevice(mirror);

  std::vector<BlockTransfer> saves;
  for (size_t i = 0; i < src.size(); ++i)
    saves.push_back(Move(BlockTransfer::Op::kG1ToG2, src[i], slots[i]));
  auto save = rig.engine->Submit(saves, TransferPriority::kSave);
  ASSERT_TRUE(save.ok()) << save.status().ToString();
  ASSERT_TRUE((*save)->Wait().ok()) << (*save)->Wait().ToString();
  for (size_t i = 0; i < src.size(); ++i) {
    EXPECT_EQ(rig.SlotMismatches(slots[i], 500 + src[i]), 0u) << "slot " << slots[i];
  }

  std::vector<BlockTransfer> loads;
  for (size_t i = 0; i < dst.size(); ++i)
    loads.push_back(Move(BlockTransfer::Op::kG2ToG1, dst[i], slots[i]));
  auto load = rig.engine->Submit(loads, TransferPriority::kLoad);
  ASSERT_TRUE(load.ok()) << load.status().ToString();
  for (uint32_t l = 0; l < rig.layout.num_layers; ++l) EXPECT_TRUE((*load)->WaitLayer(l).ok());
  ASSERT_TRUE((*load)->Wait().ok()) << (*load)->Wait().ToString();
  const std::vector<uint8_t> got = rig.ReadDevice();
  std::vector<uint8_t> expect = mirror;
  for (size_t i = 0; i < dst.size(); ++i) rig.FillMirror(&expect, dst[i], 500 + src[i]);
  uint64_t differing = 0;
  for (uint64_t i = 0; i < got.size(); ++i) differing += got[i] != expect[i];
  EXPECT_EQ(differing, 0u) << "device bytes differ from the expected G1 after the load";
  const auto st = rig.engine->stats();
  EXPECT_EQ(st.moves_ok, src.size() + dst.size());
  EXPECT_EQ(st.moves_failed, 0u);
  EXPECT_EQ(rig.engine->queued_saves(), 0u);
}

INSTANTIATE_TEST_SUITE_P(
    ArrangementsAndMethods, CudaRoundTrip,
    ::testing::Combine(::testing::Values(G1Arrangement::kLayerSeparate,
                                         G1Arrangement::kBlockContiguous),
                       ::testing::Values(DeviceCopyBackend::Method::kKernel,
                                         DeviceCopyBackend::Method::kMemcpyBatch,
                                         DeviceCopyBackend::Method::kMemcpyPerChunk),
                       ::testing::Values(Launches::kPerLayer, Launches::kTwoLayers,
                                         Launches::kDefault, Launches::kDefaultPolling)),
    [](const auto& info) {
      std::string name = G1ArrangementName(std::get<0>(info.param));
      name += std::string("_") + DeviceCopyMethodName(std::get<1>(info.param));
      const Launches launches = std::get<2>(info.param);
      name += launches == Launches::kPerLayer         ? "_per_layer"
              : launches == Launches::kTwoLayers      ? "_two_layers"
              : launches == Launches::kDefaultPolling ? "_polling"
                                                      : "";
      for (char& c : name) c = c == '-' ? '_' : c;
      return name;
    });

// Every layer reported once, in order, whether each layer is its own launch, layers share a
// launch (three per group: 3, 3, 2), or the whole batch is one launch.
class CudaLayerOrder : public ::testing::TestWithParam<uint64_t> {};

TEST_P(CudaLayerOrder, LayersCompleteInOrder) {
  SKIP_WITHOUT_GPU();
  const uint64_t layers_per_launch = GetParam();  // 0: the default minimum
  const uint64_t batch_layer_bytes = 16 * SmallLayout(G1Arrangement::kLayerSeparate).LayerBytes();
  DeviceRig rig(
      G1Arrangement::kLayerSeparate, DeviceCopyBackend::Method::kKernel, 32,
      layers_per_launch == 0 ? kDefaultMinLaunchBytes : layers_per_launch * batch_layer_bytes);
  DeviceCopyBackend* backend = rig.engine->device_backend();
  ASSERT_NE(backend, nullptr);
  std::vector<DeviceBlockCopy> copies;
  for (uint32_t i = 0; i < 16; ++i) {
    copies.push_back({(i * 7) % rig.blocks, rig.arena->SlotData(i) + G2PayloadOffset(rig.layout)});
  }
  std::mutex mu;
  std::condition_variable cv;
  std::vector<uint32_t> order;
  bool done = false;
  Status final_status = Status::Internal("not done");
  Status s = backend->Submit(
      CopyDirection::kHostToDevice, copies,
      [&](uint32_t layer) {
        std::lock_guard<std::mutex> lock(mu);
        order.push_back(layer);
      },
      [&](const Status& st) {
        std::lock_guard<std::mutex> lock(mu);
        final_status = st;
        done = true;
        cv.notify_all();
      },
      /*wait_for_room=*/true);
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return done; }));
  EXPECT_TRUE(final_status.ok()) << final_status.ToString();
  ASSERT_EQ(order.size(), rig.layout.num_layers);
  for (uint32_t l = 0; l < order.size(); ++l) EXPECT_EQ(order[l], l);
}

INSTANTIATE_TEST_SUITE_P(LaunchGroups, CudaLayerOrder, ::testing::Values(1, 3, 0),
                         [](const auto& info) {
                           return info.param == 0 ? std::string("default")
                                                  : std::to_string(info.param) + "_per_launch";
                         });

TEST(CudaBackendTest, WaitLayerReturnsBeforeLaterLayersLand) {
  SKIP_WITHOUT_GPU();
  DeviceRig rig(G1Arrangement::kLayerSeparate, DeviceCopyBackend::Method::kKernel);
  std::vector<uint8_t> zeros(rig.dev_bytes, 0);
  rig.WriteDevice(zeros);
  // G2 slots 0..3 hold patterns 900..903.
  for (uint32_t slot = 0; slot < 4; ++slot) {
    uint8_t* s = rig.arena->SlotData(slot) + G2PayloadOffset(rig.layout);
    for (uint64_t i = 0; i < rig.layout.BlockBytes(); ++i) s[i] = Pattern(900 + slot, i);
  }
  std::vector<BlockTransfer> loads;
  const std::vector<uint32_t> dst = {4, 19, 0, 11};
  for (uint32_t i = 0; i < 4; ++i) loads.push_back(Move(BlockTransfer::Op::kG2ToG1, dst[i], i));
  // The device holds the batch after layer 1 until the test releases it.
  rig.engine->device_backend()->StallNextLoadAfterLayerForTest(1);
  auto job = rig.engine->Submit(loads, TransferPriority::kLoad);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  ASSERT_TRUE((*job)->WaitLayer(0).ok());
  ASSERT_TRUE((*job)->WaitLayer(1).ok());
  EXPECT_FALSE((*job)->Done()) << "the job finished although layers 2.. were held back";
  std::vector<uint8_t> got = rig.ReadDevice();
  for (uint32_t i = 0; i < 4; ++i) {
    EXPECT_EQ(rig.Mismatches(got, dst[i], 900 + i, 0), 0u);
    EXPECT_EQ(rig.Mismatches(got, dst[i], 900 + i, 1), 0u);
    EXPECT_GT(rig.Mismatches(got, dst[i], 900 + i, 2), 0u) << "layer 2 landed during the stall";
  }
  rig.engine->device_backend()->ReleaseStallForTest();
  ASSERT_TRUE((*job)->Wait().ok());
  got = rig.ReadDevice();
  for (uint32_t i = 0; i < 4; ++i) EXPECT_EQ(rig.Mismatches(got, dst[i], 900 + i), 0u);
}

// With the device's only batch held by a stalled load, a save is dropped and counted at once
// (never waited for), and the load still completes when released.
TEST(CudaBackendTest, SavesAreDroppedNotWaitedForWhenTheDeviceIsFull) {
  SKIP_WITHOUT_GPU();
  DeviceRig rig(G1Arrangement::kLayerSeparate, DeviceCopyBackend::Method::kKernel,
                /*max_batches=*/1);
  rig.engine->device_backend()->StallNextLoadAfterLayerForTest(0);
  auto load = rig.engine->Submit({Move(BlockTransfer::Op::kG2ToG1, 2, 1)}, TransferPriority::kLoad);
  ASSERT_TRUE(load.ok()) << load.status().ToString();
  ASSERT_TRUE((*load)->WaitLayer(0).ok());
  auto save = rig.engine->Submit({Move(BlockTransfer::Op::kG1ToG2, 5, 3)}, TransferPriority::kSave);
  ASSERT_TRUE(save.ok()) << save.status().ToString();
  Status st = (*save)->Wait();  // ends at once: dropped
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
  EXPECT_EQ(rig.engine->stats().saves_dropped, 1u);
  EXPECT_EQ(rig.engine->queued_saves(), 0u);
  EXPECT_FALSE((*load)->Done());
  rig.engine->device_backend()->ReleaseStallForTest();
  EXPECT_TRUE((*load)->Wait().ok());
}

// G1 (device) -> G2 -> G3, then G3 -> G1 (device) staged through a G2 slot: the staged half
// goes to the device as a load.
TEST(CudaBackendTest, G3LoadsStageThroughG2IntoTheDevice) {
  SKIP_WITHOUT_GPU();
  DeviceRig rig(G1Arrangement::kLayerSeparate, DeviceCopyBackend::Method::kKernel);
  char tmpl[] = "/tmp/kvtier-cuda-g3-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  DiskTier::Config dc;
  dc.dir = tmpl;
  dc.payload_bytes = rig.layout.BlockBytes();
  dc.layout_fingerprint = rig.layout.Fingerprint();
  dc.capacity_bytes = 16 * (kBlockHeaderBytes + dc.payload_bytes) + (1 << 20);
  auto opened = DiskTier::Open(dc);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  std::unique_ptr<DiskTier> disk = std::move(opened->tier);
  ASSERT_TRUE(rig.engine->RegisterDisk(disk.get()).ok());
  std::vector<uint8_t> mirror(rig.dev_bytes, 0);
  rig.FillMirror(&mirror, 7, 77);
  rig.WriteDevice(mirror);
  auto disk_move = [&](BlockTransfer::Op op, uint32_t g1_block, uint32_t slot) {
    BlockTransfer m = Move(op, g1_block, slot);
    m.key = BlockKey{0x1234, 77};
    m.parent = BlockKey{1, 2};
    m.namespace_id = 5;
    for (uint32_t t = 0; t < rig.layout.tokens_per_block; ++t) m.tokens.push_back(t + 1);
    return m;
  };
  auto save = rig.engine->Submit({Move(BlockTransfer::Op::kG1ToG2, 7, 4)}, TransferPriority::kSave);
  ASSERT_TRUE(save.ok() && (*save)->Wait().ok());
  auto write =
      rig.engine->Submit({disk_move(BlockTransfer::Op::kG2ToG3, 0, 4)}, TransferPriority::kSave);
  ASSERT_TRUE(write.ok() && (*write)->Wait().ok());
  auto load =
      rig.engine->Submit({disk_move(BlockTransfer::Op::kG3ToG1, 18, 9)}, TransferPriority::kLoad);
  ASSERT_TRUE(load.ok()) << load.status().ToString();
  Status st = (*load)->Wait();
  ASSERT_TRUE(st.ok()) << st.ToString();
  const std::vector<uint8_t> got = rig.ReadDevice();
  EXPECT_EQ(rig.Mismatches(got, 18, 77), 0u);
  rig.engine.reset();  // finishes disk I/O before the tier closes
  disk.reset();
  std::filesystem::remove_all(tmpl);
}

TEST(CudaBackendTest, HostMemoryMarkedOnDeviceIsRefused) {
  SKIP_WITHOUT_GPU();
  auto backend = std::move(CreateCudaBackend({})).value();
  KvLayout l = SmallLayout(G1Arrangement::kBlockContiguous);
  std::vector<uint8_t> host(l.BlockBytes() * 2);
  G1Memory g1;
  g1.layout = l;
  g1.num_blocks = 2;
  g1.on_device = true;
  g1.regions.push_back({host.data(), l.BlockBytes()});
  Status s = backend->RegisterG1(g1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("not memory of CUDA device"), std::string::npos) << s.ToString();
}

TEST(CudaBackendTest, CopiesOutsideTheRegisteredArenaAreRefused) {
  SKIP_WITHOUT_GPU();
  DeviceRig rig(G1Arrangement::kLayerSeparate, DeviceCopyBackend::Method::kKernel);
  std::vector<uint8_t> elsewhere(rig.layout.BlockBytes());
  const DeviceBlockCopy bad{0, elsewhere.data()};
  bool called = false;
  Status s = rig.engine->device_backend()->Submit(
      CopyDirection::kDeviceToHost, std::span<const DeviceBlockCopy>(&bad, 1),
      [&](uint32_t) { called = true; }, [&](const Status&) { called = true; },
      /*wait_for_room=*/true);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_FALSE(called);
}

}  // namespace
}  // namespace kvtier

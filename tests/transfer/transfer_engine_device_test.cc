// The TransferEngine's device path (what a device G1 goes through), on the CPU: the CUDA backend
// is replaced by HostDeviceBackend, which runs the same plans and kernel body on host memory.
// A stand-in, because there is no GPU here; cuda_backend_test.cc runs the real backend on one.
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "host_device_backend.h"
#include "tier/disk_tier.h"
#include "transfer/transfer_engine.h"
#include "transfer_test_util.h"

namespace kvtier {
namespace {

using testing::Move;
using testing::SmallLayout;

uint8_t Pattern(uint64_t id, uint64_t off) {
  return static_cast<uint8_t>((id * 131 + off * 7 + off / 4096 + 1) & 0xff);
}

struct DeviceRig {
  KvLayout layout;
  uint32_t blocks = 16;
  std::vector<uint8_t> mem;  // "device" memory
  G1Memory g1;
  std::unique_ptr<HostArena> arena;
  HostDeviceBackend* device = nullptr;  // owned by the engine
  std::unique_ptr<TransferEngine> engine;

  explicit DeviceRig(G1Arrangement arrangement = G1Arrangement::kLayerSeparate,
                     uint32_t max_batches = 32, uint32_t max_queued_saves = 1024)
      : layout(SmallLayout(arrangement)) {
    mem.assign(layout.BlockBytes() * blocks, 0);
    g1.layout = layout;
    g1.num_blocks = blocks;
    g1.on_device = true;
    if (arrangement == G1Arrangement::kBlockContiguous) {
      g1.regions.push_back({mem.data(), layout.BlockBytes()});
    } else {
      const uint64_t region = layout.ChunkBytes() * blocks;
      for (uint32_t r = 0; r < layout.num_layers * layout.num_planes; ++r) {
        g1.regions.push_back({mem.data() + r * region, layout.ChunkBytes()});
      }
    }
    HostArena::Config ac;
    ac.slot_bytes = G2PayloadOffset(layout) + layout.BlockBytes();
    ac.capacity_bytes = (ac.slot_bytes + 4095) / 4096 * 4096 * 16;
    ac.lock_memory = false;
    arena = std::move(HostArena::Create(ac)).value();
    TransferEngine::Config tc;
    tc.cuda.max_batches = max_batches;
    tc.max_queued_saves = max_queued_saves;
    tc.device_backend_factory =
        [this](const DeviceCopyBackend::Config& c) -> Result<std::unique_ptr<DeviceCopyBackend>> {
      auto b = std::make_unique<HostDeviceBackend>(c);
      device = b.get();
      return std::unique_ptr<DeviceCopyBackend>(std::move(b));
    };
    engine = std::move(TransferEngine::Create(tc)).value();
    // G1 first, then the arena: the arena is pinned when it arrives.
    Status s = engine->RegisterG1(g1);
    EXPECT_TRUE(s.ok()) << s.ToString();
    s = engine->RegisterHostArena(arena.get(), layout);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }

  void Fill(uint32_t block, uint64_t id) {
    for (uint32_t l = 0; l < layout.num_layers; ++l)
      for (uint32_t p = 0; p < layout.num_planes; ++p) {
        uint8_t* c = g1.Chunk(block, l, p);
        for (uint64_t i = 0; i < layout.ChunkBytes(); ++i)
          c[i] = Pattern(id, layout.ChunkOffset(l, p) + i);
      }
  }
  uint64_t Mismatches(uint32_t block, uint64_t id, int only_layer = -1) const {
    uint64_t bad = 0;
    for (uint32_t l = 0; l < layout.num_layers; ++l) {
      if (only_layer >= 0 && l != static_cast<uint32_t>(only_layer)) continue;
      for (uint32_t p = 0; p < layout.num_planes; ++p) {
        const uint8_t* c = g1.Chunk(block, l, p);
        for (uint64_t i = 0; i < layout.ChunkBytes(); ++i)
          bad += c[i] != Pattern(id, layout.ChunkOffset(l, p) + i);
      }
    }
    return bad;
  }
  void FillSlot(uint32_t slot, uint64_t id) {
    uint8_t* s = arena->SlotData(slot) + G2PayloadOffset(layout);
    for (uint64_t i = 0; i < layout.BlockBytes(); ++i) s[i] = Pattern(id, i);
  }
  uint64_t SlotMismatches(uint32_t slot, uint64_t id) const {
    const uint8_t* s = arena->SlotData(slot) + G2PayloadOffset(layout);
    uint64_t bad = 0;
    for (uint64_t i = 0; i < layout.BlockBytes(); ++i) bad += s[i] != Pattern(id, i);
    return bad;
  }
};

class DevicePathRoundTrip : public ::testing::TestWithParam<G1Arrangement> {};

TEST_P(DevicePathRoundTrip, ScatteredSavesAndLoadsAreByteExact) {
  DeviceRig rig(GetParam());
  ASSERT_NE(rig.device, nullptr);
  EXPECT_EQ(rig.device->host_registrations, 1);  // the arena is pinned once
  const std::vector<uint32_t> src = {9, 2, 14, 0, 7}, dst = {1, 12, 5, 15, 3},
                              slots = {11, 0, 6, 3, 9};
  for (uint32_t b : src) rig.Fill(b, 300 + b);
  std::vector<BlockTransfer> saves, loads;
  for (size_t i = 0; i < src.size(); ++i) {
    saves.push_back(Move(BlockTransfer::Op::kG1ToG2, src[i], slots[i]));
    loads.push_back(Move(BlockTransfer::Op::kG2ToG1, dst[i], slots[i]));
  }
  auto save = rig.engine->Submit(saves, TransferPriority::kSave);
  ASSERT_TRUE(save.ok()) << save.status().ToString();
  ASSERT_TRUE((*save)->Wait().ok());
  for (size_t i = 0; i < src.size(); ++i) EXPECT_EQ(rig.SlotMismatches(slots[i], 300 + src[i]), 0u);
  EXPECT_EQ(rig.engine->queued_saves(), 0u);  // device saves released their queue places

  auto load = rig.engine->Submit(loads, TransferPriority::kLoad);
  ASSERT_TRUE(load.ok()) << load.status().ToString();
  for (uint32_t l = 0; l < rig.layout.num_layers; ++l) EXPECT_TRUE((*load)->WaitLayer(l).ok());
  ASSERT_TRUE((*load)->Wait().ok());
  for (size_t i = 0; i < dst.size(); ++i) EXPECT_EQ(rig.Mismatches(dst[i], 300 + src[i]), 0u);
  const auto st = rig.engine->stats();
  EXPECT_EQ(st.moves_ok, 10u);
  EXPECT_EQ(st.moves_failed, 0u);
  const uint64_t bytes = rig.layout.BlockBytes() * src.size();
  EXPECT_EQ(st.bytes_by_op[static_cast<size_t>(BlockTransfer::Op::kG1ToG2)], bytes);
  EXPECT_EQ(st.bytes_by_op[static_cast<size_t>(BlockTransfer::Op::kG2ToG1)], bytes);
  EXPECT_EQ(st.moves_by_op[static_cast<size_t>(BlockTransfer::Op::kG2ToG1)], 5u);
}

INSTANTIATE_TEST_SUITE_P(Arrangements, DevicePathRoundTrip,
                         ::testing::Values(G1Arrangement::kLayerSeparate,
                                           G1Arrangement::kBlockContiguous),
                         [](const auto& info) {
                           return info.param == G1Arrangement::kLayerSeparate ? "layer_separate"
                                                                              : "block_contiguous";
                         });

// G3 -> device G1 through a staging pool of two slots: six blocks in one batch, each read into a
// pool slot, copied to the device, and the slot handed to the next read; byte-exact.
TEST(TransferEngineDeviceTest, G3LoadsStageThroughThePoolIntoTheDevice) {
  DeviceRig rig;
  char tmpl[] = "/tmp/kvtier-device-g3-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  DiskTier::Config dc;
  dc.dir = tmpl;
  dc.payload_bytes = rig.layout.BlockBytes();
  dc.layout_fingerprint = rig.layout.Fingerprint();
  dc.capacity_bytes = 32 * (kBlockHeaderBytes + dc.payload_bytes) + (1 << 20);
  auto opened = DiskTier::Open(dc);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  std::unique_ptr<DiskTier> disk = std::move(opened->tier);
  ASSERT_TRUE(rig.engine->RegisterDisk(disk.get()).ok());
  ASSERT_TRUE(rig.engine->RegisterStagingSlots({14, 15}).ok());
  auto disk_move = [&](BlockTransfer::Op op, uint64_t id, uint32_t g1_block, uint32_t slot) {
    BlockTransfer m = Move(op, g1_block, slot);
    m.key = BlockKey{id * 0x9e3779b97f4a7c15ull + 3, id};
    m.parent = BlockKey{1, id};
    m.namespace_id = 5;
    for (uint32_t t = 0; t < rig.layout.tokens_per_block; ++t)
      m.tokens.push_back(static_cast<TokenId>(id * 10 + t));
    return m;
  };
  std::vector<BlockTransfer> saves, writes, loads;
  for (uint32_t b = 0; b < 6; ++b) {
    rig.Fill(b, 900 + b);
    saves.push_back(Move(BlockTransfer::Op::kG1ToG2, b, b));
    writes.push_back(disk_move(BlockTransfer::Op::kG2ToG3, b, 0, b));
    loads.push_back(
        disk_move(BlockTransfer::Op::kG3ToG1, b, 8 + b, BlockTransfer::kAnyStagingSlot));
  }
  ASSERT_TRUE((*rig.engine->Submit(saves, TransferPriority::kSave))->Wait().ok());
  ASSERT_TRUE((*rig.engine->Submit(writes, TransferPriority::kSave))->Wait().ok());
  auto load = rig.engine->Submit(loads, TransferPriority::kLoad);
  ASSERT_TRUE(load.ok()) << load.status().ToString();
  for (uint32_t l = 0; l < rig.layout.num_layers; ++l) EXPECT_TRUE((*load)->WaitLayer(l).ok());
  ASSERT_TRUE((*load)->Wait().ok());
  for (uint32_t b = 0; b < 6; ++b) EXPECT_EQ(rig.Mismatches(8 + b, 900 + b), 0u) << b;
  rig.engine.reset();  // waits for the pool to be whole again, then the tier may close
  disk.reset();
  std::filesystem::remove_all(tmpl);
}

TEST(TransferEngineDeviceTest, WaitLayerReturnsWhileLaterLayersAreHeld) {
  DeviceRig rig;
  for (uint32_t s = 0; s < 3; ++s) rig.FillSlot(s, 700 + s);
  rig.device->StallNextLoadAfterLayerForTest(1);
  auto job = rig.engine->Submit(
      {Move(BlockTransfer::Op::kG2ToG1, 4, 0), Move(BlockTransfer::Op::kG2ToG1, 8, 1),
       Move(BlockTransfer::Op::kG2ToG1, 13, 2)},
      TransferPriority::kLoad);
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE((*job)->WaitLayer(0).ok());
  ASSERT_TRUE((*job)->WaitLayer(1).ok());
  EXPECT_FALSE((*job)->Done());
  EXPECT_EQ(rig.Mismatches(4, 700, 1), 0u);
  EXPECT_GT(rig.Mismatches(4, 700, 2), 0u) << "layer 2 landed while held";
  EXPECT_EQ((*job)->MoveStatus(0).code(), StatusCode::kFailedPrecondition);  // still in flight
  rig.device->ReleaseStallForTest();
  ASSERT_TRUE((*job)->Wait().ok());
  EXPECT_EQ(rig.Mismatches(4, 700), 0u);
  EXPECT_EQ(rig.Mismatches(8, 701), 0u);
  EXPECT_EQ(rig.Mismatches(13, 702), 0u);
}

TEST(TransferEngineDeviceTest, ADeviceFaultFailsTheMovesAndNoWaiterHangs) {
  DeviceRig rig;
  rig.FillSlot(0, 50);
  rig.FillSlot(1, 51);
  rig.device->FailNextBatchAtLayer(2);
  auto load = rig.engine->Submit(
      {Move(BlockTransfer::Op::kG2ToG1, 3, 0), Move(BlockTransfer::Op::kG2ToG1, 6, 1)},
      TransferPriority::kLoad);
  ASSERT_TRUE(load.ok());
  EXPECT_TRUE((*load)->WaitLayer(1).ok());  // landed before the fault
  Status l2 = (*load)->WaitLayer(2);
  EXPECT_EQ(l2.code(), StatusCode::kIOError) << l2.ToString();
  EXPECT_NE(l2.message().find("injected device fault"), std::string::npos);
  EXPECT_EQ((*load)->WaitLayer(3).code(), StatusCode::kIOError);
  EXPECT_EQ((*load)->Wait().code(), StatusCode::kIOError);
  EXPECT_EQ((*load)->failed_moves(), 2u);
  EXPECT_EQ(rig.Mismatches(3, 50, 1), 0u);
  EXPECT_GT(rig.Mismatches(3, 50, 2), 0u);

  // A save that faults fails its moves and gives its save-queue places back.
  rig.device->FailNextBatchAtLayer(0);
  auto save = rig.engine->Submit({Move(BlockTransfer::Op::kG1ToG2, 3, 5)}, TransferPriority::kSave);
  ASSERT_TRUE(save.ok());
  EXPECT_EQ((*save)->Wait().code(), StatusCode::kIOError);
  EXPECT_EQ(rig.engine->queued_saves(), 0u);
  const auto st = rig.engine->stats();
  EXPECT_EQ(st.moves_failed, 3u);
  EXPECT_EQ(st.moves_ok, 0u);
}

TEST(TransferEngineDeviceTest, SavesAreDroppedWhenTheDeviceIsFullAndLoadsWait) {
  DeviceRig rig(G1Arrangement::kLayerSeparate, /*max_batches=*/1);
  rig.FillSlot(0, 1);
  rig.device->StallNextLoadAfterLayerForTest(0);
  auto held = rig.engine->Submit({Move(BlockTransfer::Op::kG2ToG1, 2, 0)}, TransferPriority::kLoad);
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE((*held)->WaitLayer(0).ok());
  auto save = rig.engine->Submit(
      {Move(BlockTransfer::Op::kG1ToG2, 5, 3), Move(BlockTransfer::Op::kG1ToG2, 6, 4)},
      TransferPriority::kSave);
  ASSERT_TRUE(save.ok());
  EXPECT_EQ((*save)->Wait().code(), StatusCode::kResourceExhausted);  // at once, not waited
  EXPECT_EQ(rig.engine->stats().saves_dropped, 2u);
  EXPECT_EQ(rig.engine->queued_saves(), 0u);
  // A load waits for room instead: it is accepted and completes after the release.
  rig.FillSlot(1, 2);
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    rig.device->ReleaseStallForTest();
  });
  auto load = rig.engine->Submit({Move(BlockTransfer::Op::kG2ToG1, 9, 1)}, TransferPriority::kLoad);
  releaser.join();
  ASSERT_TRUE(load.ok());
  EXPECT_TRUE((*load)->Wait().ok());
  EXPECT_TRUE((*held)->Wait().ok());
  EXPECT_EQ(rig.Mismatches(9, 2), 0u);
  EXPECT_EQ(rig.Mismatches(2, 1), 0u);
}

TEST(TransferEngineDeviceTest, RegistrationRules) {
  DeviceRig rig;
  // One device G1 per engine.
  Status again = rig.engine->RegisterG1(rig.g1);
  EXPECT_EQ(again.code(), StatusCode::kFailedPrecondition) << again.ToString();
  // The pinned arena cannot be swapped for another.
  HostArena::Config ac;
  ac.slot_bytes = G2PayloadOffset(rig.layout) + rig.layout.BlockBytes();
  ac.capacity_bytes = (ac.slot_bytes + 4095) / 4096 * 4096 * 2;
  ac.lock_memory = false;
  auto other = std::move(HostArena::Create(ac)).value();
  Status swap = rig.engine->RegisterHostArena(other.get(), rig.layout);
  EXPECT_EQ(swap.code(), StatusCode::kFailedPrecondition) << swap.ToString();
  EXPECT_EQ(rig.device->host_registrations, 1);
  // A factory that fails (as CreateCudaBackend does without a GPU): the engine says why.
  TransferEngine::Config tc;
  tc.device_backend_factory =
      [](const DeviceCopyBackend::Config&) -> Result<std::unique_ptr<DeviceCopyBackend>> {
    return Status::Unavailable("CUDA backend unavailable: test (error 100)");
  };
  auto engine = std::move(TransferEngine::Create(tc)).value();
  Status s = engine->RegisterG1(rig.g1);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("G1 is device memory"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("(error 100)"), std::string::npos) << s.ToString();
  EXPECT_EQ(engine->device_backend(), nullptr);
}

}  // namespace
}  // namespace kvtier

#include "transfer/transfer_engine.h"

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <vector>

#include <gtest/gtest.h>

#include "transfer/block_copy.h"
#include "transfer_test_util.h"

namespace kvtier {
namespace {

using testing::Move;
using testing::Pattern;
using testing::SmallLayout;

struct Rig {
  KvLayout layout = SmallLayout();
  uint32_t g1_blocks = 16;
  std::vector<uint8_t> g1_mem;
  G1Memory g1;
  std::unique_ptr<HostArena> arena;
  std::unique_ptr<TransferEngine> engine;

  explicit Rig(TransferEngine::Config cfg = {}, uint32_t g2_slots = 32) {
    g1 = testing::HostG1(layout, g1_blocks, g1_mem);
    arena = testing::G2Arena(layout, g2_slots);
    engine = std::move(TransferEngine::Create(cfg)).value();
    EXPECT_TRUE(engine->RegisterHostArena(arena.get(), layout).ok());
    EXPECT_TRUE(engine->RegisterG1(g1).ok());
  }
  void FillG1(uint32_t block, uint64_t pattern_id) {
    for (uint32_t l = 0; l < layout.num_layers; ++l) {
      for (uint32_t p = 0; p < layout.num_planes; ++p) {
        uint8_t* c = g1.Chunk(block, l, p);
        for (uint64_t i = 0; i < layout.ChunkBytes(); ++i)
          c[i] = Pattern(pattern_id, layout.ChunkOffset(l, p) + i);
      }
    }
  }
  // Bytes of G1 block `block` that differ from pattern `pattern_id`, in layer `layer` (or all).
  uint64_t G1Mismatches(uint32_t block, uint64_t pattern_id, int layer = -1) {
    uint64_t bad = 0;
    for (uint32_t l = 0; l < layout.num_layers; ++l) {
      if (layer >= 0 && l != static_cast<uint32_t>(layer)) continue;
      for (uint32_t p = 0; p < layout.num_planes; ++p) {
        const uint8_t* c = g1.Chunk(block, l, p);
        for (uint64_t i = 0; i < layout.ChunkBytes(); ++i)
          bad += c[i] != Pattern(pattern_id, layout.ChunkOffset(l, p) + i);
      }
    }
    return bad;
  }
  uint64_t SlotMismatches(uint32_t slot, uint64_t pattern_id) {
    const uint8_t* s = arena->SlotData(slot) + G2PayloadOffset(layout);
    uint64_t bad = 0;
    for (uint64_t i = 0; i < layout.BlockBytes(); ++i) bad += s[i] != Pattern(pattern_id, i);
    return bad;
  }
};

TEST(TransferEngineTest, OffloadThenOnboardIsByteExact) {
  Rig rig;
  std::vector<BlockTransfer> saves;
  for (uint32_t b = 0; b < 8; ++b) {
    rig.FillG1(b, 100 + b);
    saves.push_back(Move(BlockTransfer::Op::kG1ToG2, b, 20 - b));
  }
  auto job = rig.engine->Submit(saves, TransferPriority::kSave);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  ASSERT_TRUE((*job)->Wait().ok());
  for (uint32_t b = 0; b < 8; ++b) EXPECT_EQ(rig.SlotMismatches(20 - b, 100 + b), 0u) << b;

  std::vector<BlockTransfer> loads;
  for (uint32_t b = 0; b < 8; ++b) loads.push_back(Move(BlockTransfer::Op::kG2ToG1, 8 + b, 20 - b));
  auto load = rig.engine->Submit(loads, TransferPriority::kLoad);
  ASSERT_TRUE(load.ok());
  for (uint32_t l = 0; l < rig.layout.num_layers; ++l) {
    ASSERT_TRUE((*load)->WaitLayer(l).ok());
    // Once WaitLayer(l) returns, layer l of every block is in place, even if later ones are not.
    for (uint32_t b = 0; b < 8; ++b) EXPECT_EQ(rig.G1Mismatches(8 + b, 100 + b, l), 0u);
  }
  ASSERT_TRUE((*load)->Wait().ok());
  for (uint32_t b = 0; b < 8; ++b) EXPECT_EQ(rig.G1Mismatches(8 + b, 100 + b), 0u);
  const auto stats = rig.engine->stats();
  EXPECT_EQ(stats.moves_ok, 16u);
  EXPECT_EQ(stats.bytes_by_op[0], 8 * rig.layout.BlockBytes());
  EXPECT_EQ(stats.bytes_by_op[1], 8 * rig.layout.BlockBytes());
}

TEST(TransferEngineTest, CallbacksRunOncePerMoveAndBeforeWaitReturns) {
  Rig rig;
  std::atomic<int> moves{0}, done{0};
  std::vector<BlockTransfer> batch;
  for (uint32_t b = 0; b < 5; ++b) batch.push_back(Move(BlockTransfer::Op::kG1ToG2, b, b));
  auto job = rig.engine->Submit(
      batch, TransferPriority::kSave,
      [&](const TransferJob&, size_t, const Status& s) { moves += s.ok() ? 1 : 100; },
      [&](const TransferJob& j) { done += j.failed_moves() == 0 ? 1 : 100; });
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE((*job)->Wait().ok());
  EXPECT_EQ(moves.load(), 5);
  EXPECT_EQ(done.load(), 1);
  EXPECT_TRUE((*job)->Done());
}

TEST(TransferEngineTest, BadMovesAreRefusedBeforeAnythingStarts) {
  Rig rig;
  std::vector<BlockTransfer> batch = {Move(BlockTransfer::Op::kG1ToG2, 0, 0),
                                      Move(BlockTransfer::Op::kG1ToG2, 0, 999)};
  auto job = rig.engine->Submit(batch, TransferPriority::kSave);
  EXPECT_EQ(job.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(job.status().message().find("G2 slot 999"), std::string::npos);
  auto g1 = rig.engine->Submit({Move(BlockTransfer::Op::kG2ToG1, 77, 0)}, TransferPriority::kLoad);
  EXPECT_NE(g1.status().message().find("G1 block 77"), std::string::npos);
  auto g3 = rig.engine->Submit({Move(BlockTransfer::Op::kG2ToG3, 0, 0)}, TransferPriority::kSave);
  EXPECT_EQ(g3.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(rig.engine->stats().jobs, 0u);
}

TEST(TransferEngineTest, DeviceG1IsUnavailableWithoutCuda) {
  Rig rig;
  G1Memory dev = rig.g1;
  dev.on_device = true;
  Status s = rig.engine->RegisterG1(dev);
  if (ProbeCuda().ok()) {
    // A GPU is there: host buffers marked on_device are refused as not being device memory.
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find("not memory of CUDA device"), std::string::npos) << s.ToString();
    return;
  }
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("CUDA backend unavailable"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("Register G1 in host memory"), std::string::npos) << s.ToString();
  EXPECT_EQ(rig.engine->device_backend(), nullptr);
  // The host G1 registered before still works.
  rig.FillG1(3, 42);
  auto job = rig.engine->Submit({Move(BlockTransfer::Op::kG1ToG2, 3, 0)}, TransferPriority::kSave);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_TRUE((*job)->Wait().ok());
  EXPECT_EQ(rig.SlotMismatches(0, 42), 0u);
}

TEST(TransferEngineTest, ArenaTooSmallForHeaderAndBlockIsRefused) {
  KvLayout l = SmallLayout();
  HostArena::Config ac;
  ac.slot_bytes = l.BlockBytes();  // no room for the header area
  ac.capacity_bytes = 8 * ((ac.slot_bytes + 4095) / 4096 * 4096);
  auto arena = std::move(HostArena::Create(ac)).value();
  auto engine = std::move(TransferEngine::Create({})).value();
  Status s = engine->RegisterHostArena(arena.get(), l);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("header"), std::string::npos);
}

// A gate that holds the only worker inside a callback until the test opens it.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false, open = false;
  void Enter() {
    std::unique_lock<std::mutex> lock(mu);
    entered = true;
    cv.notify_all();
    cv.wait(lock, [&] { return open; });
  }
  void WaitEntered() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return entered; });
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu);
    open = true;
    cv.notify_all();
  }
};

TEST(TransferEngineTest, SaveQueueIsBoundedAndOverflowIsDroppedAndCounted) {
  TransferEngine::Config cfg;
  cfg.copy_threads = 1;
  cfg.max_queued_saves = 4;
  Rig rig(cfg);
  Gate gate;
  auto blocker =
      rig.engine->Submit({Move(BlockTransfer::Op::kG1ToG2, 0, 0)}, TransferPriority::kSave,
                         [&](const TransferJob&, size_t, const Status&) { gate.Enter(); });
  ASSERT_TRUE(blocker.ok());
  gate.WaitEntered();  // the worker is busy; nothing else drains the queue
  std::vector<BlockTransfer> three;
  for (uint32_t i = 1; i <= 3; ++i) three.push_back(Move(BlockTransfer::Op::kG1ToG2, i, i));
  auto a = rig.engine->Submit(three, TransferPriority::kSave);
  ASSERT_TRUE(a.ok());
  auto b = rig.engine->Submit({three[0], three[1]}, TransferPriority::kSave);
  EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(rig.engine->stats().saves_dropped, 2u);
  // A load is never refused for space.
  auto load = rig.engine->Submit({Move(BlockTransfer::Op::kG2ToG1, 9, 5)}, TransferPriority::kLoad);
  EXPECT_TRUE(load.ok());
  gate.Open();
  EXPECT_TRUE((*a)->Wait().ok());
  EXPECT_TRUE((*load)->Wait().ok());
  EXPECT_EQ(rig.engine->queued_saves(), 0u);
}

TEST(TransferEngineTest, LoadsRunBeforeQueuedSaves) {
  TransferEngine::Config cfg;
  cfg.copy_threads = 1;
  Rig rig(cfg);
  Gate gate;
  std::mutex order_mu;
  std::vector<char> order;
  auto record = [&](char c) {
    std::lock_guard<std::mutex> lock(order_mu);
    order.push_back(c);
  };
  auto blocker =
      rig.engine->Submit({Move(BlockTransfer::Op::kG1ToG2, 0, 0)}, TransferPriority::kSave,
                         [&](const TransferJob&, size_t, const Status&) { gate.Enter(); });
  ASSERT_TRUE(blocker.ok());
  gate.WaitEntered();
  std::vector<BlockTransfer> saves, loads;
  for (uint32_t i = 1; i <= 3; ++i) saves.push_back(Move(BlockTransfer::Op::kG1ToG2, i, i));
  for (uint32_t i = 1; i <= 3; ++i)
    loads.push_back(Move(BlockTransfer::Op::kG2ToG1, 8 + i, 10 + i));
  auto s = rig.engine->Submit(saves, TransferPriority::kSave,
                              [&](const TransferJob&, size_t, const Status&) { record('s'); });
  auto l = rig.engine->Submit(loads, TransferPriority::kLoad,
                              [&](const TransferJob&, size_t, const Status&) { record('l'); });
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(l.ok());
  gate.Open();
  ASSERT_TRUE((*s)->Wait().ok());
  ASSERT_TRUE((*l)->Wait().ok());
  EXPECT_EQ(std::string(order.begin(), order.end()), "lllsss");
}

// G3 paths, on a real disk tier in a temporary directory (O_DIRECT through io_uring).
class TransferEngineDiskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvtier-transfer-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    rig_ = std::make_unique<Rig>();
    DiskTier::Config dc;
    dc.dir = dir_;
    dc.payload_bytes = rig_->layout.BlockBytes();
    dc.layout_fingerprint = rig_->layout.Fingerprint();
    dc.capacity_bytes = 64 * (kBlockHeaderBytes + dc.payload_bytes) + (1 << 20);
    auto opened = DiskTier::Open(dc);
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    disk_ = std::move(opened->tier);
    ASSERT_TRUE(rig_->engine->RegisterDisk(disk_.get()).ok());
  }
  void TearDown() override {
    rig_->engine.reset();  // finishes disk I/O before the tier closes
    disk_.reset();
    std::filesystem::remove_all(dir_);
  }
  // Fills G1 blocks 0..n-1 with patterns first_pattern + b; `gathers` takes each to G2 slot b,
  // `writes` slot b on to G3 as block b.
  static void FillForG3(Rig& rig, uint32_t n, uint64_t first_pattern,
                        std::vector<BlockTransfer>* gathers, std::vector<BlockTransfer>* writes) {
    for (uint32_t b = 0; b < n; ++b) {
      rig.FillG1(b, first_pattern + b);
      gathers->push_back(Move(BlockTransfer::Op::kG1ToG2, b, b));
      writes->push_back(DiskMove(BlockTransfer::Op::kG2ToG3, b, 0, b));
    }
  }
  static BlockTransfer DiskMove(BlockTransfer::Op op, uint64_t id, uint32_t g1_block,
                                uint32_t slot) {
    BlockTransfer m = Move(op, g1_block, slot);
    m.key = BlockKey{id * 0x9e3779b97f4a7c15ull + 3, id};
    m.parent = BlockKey{1, id};
    m.namespace_id = 5;
    for (uint32_t t = 0; t < 8; ++t) m.tokens.push_back(static_cast<TokenId>(id * 10 + t));
    return m;
  }
  std::string dir_;
  std::unique_ptr<Rig> rig_;
  std::unique_ptr<DiskTier> disk_;
};

TEST_F(TransferEngineDiskTest, G1ToG3AndBackThroughG2IsByteExact) {
  Rig& rig = *rig_;
  // G1 -> G2 -> G3.
  std::vector<BlockTransfer> gathers, writes;
  FillForG3(rig, 6, 500, &gathers, &writes);
  ASSERT_TRUE((*rig.engine->Submit(gathers, TransferPriority::kSave))->Wait().ok());
  auto w = rig.engine->Submit(writes, TransferPriority::kSave);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Wait().ok()) << (*w)->Wait().ToString();
  // Wipe the G2 copies so only G3 can supply the bytes.
  for (uint32_t b = 0; b < 6; ++b) std::memset(rig.arena->SlotData(b), 0, rig.arena->slot_bytes());
  // G3 -> G1 staged through fresh G2 slots, and G3 -> G2.
  std::vector<BlockTransfer> loads;
  for (uint32_t b = 0; b < 6; ++b)
    loads.push_back(DiskMove(BlockTransfer::Op::kG3ToG1, b, 10 + b, 20 + b));
  auto l = rig.engine->Submit(loads, TransferPriority::kLoad);
  ASSERT_TRUE(l.ok());
  for (uint32_t layer = 0; layer < rig.layout.num_layers; ++layer)
    ASSERT_TRUE((*l)->WaitLayer(layer).ok());
  ASSERT_TRUE((*l)->Wait().ok());
  for (uint32_t b = 0; b < 6; ++b) {
    EXPECT_EQ(rig.G1Mismatches(10 + b, 500 + b), 0u) << b;
    EXPECT_EQ(rig.SlotMismatches(20 + b, 500 + b), 0u) << "the staging slot holds the block too";
  }
  auto r =
      rig.engine->Submit({DiskMove(BlockTransfer::Op::kG3ToG2, 2, 0, 30)}, TransferPriority::kLoad);
  ASSERT_TRUE((*r)->Wait().ok());
  EXPECT_EQ(rig.SlotMismatches(30, 502), 0u);
}

// Twelve G3 -> G1 moves through a staging pool of two slots, in one batch: the pool's slots are
// reused as moves finish, every block lands byte-exact, a missing block fails alone (and gives
// its slot back), and afterwards both slots are free again (the engine's shutdown waits for it).
TEST_F(TransferEngineDiskTest, StagingPoolSmallerThanTheBatchIsReused) {
  Rig& rig = *rig_;
  std::vector<BlockTransfer> gathers, writes;
  FillForG3(rig, 12, 700, &gathers, &writes);
  ASSERT_TRUE((*rig.engine->Submit(gathers, TransferPriority::kSave))->Wait().ok());
  ASSERT_TRUE((*rig.engine->Submit(writes, TransferPriority::kSave))->Wait().ok());
  BlockTransfer pooled = DiskMove(BlockTransfer::Op::kG3ToG1, 0, 0, 0);
  pooled.g2_slot = BlockTransfer::kAnyStagingSlot;
  EXPECT_EQ(rig.engine->Submit({pooled}, TransferPriority::kLoad).status().code(),
            StatusCode::kFailedPrecondition)
      << "no pool registered yet";
  EXPECT_EQ(rig.engine->RegisterStagingSlots({}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rig.engine->RegisterStagingSlots({rig.arena->num_slots()}).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(rig.engine->RegisterStagingSlots({30, 31}).ok());
  BlockTransfer not_g3 = Move(BlockTransfer::Op::kG2ToG1, 1, 0);
  not_g3.g2_slot = BlockTransfer::kAnyStagingSlot;
  EXPECT_EQ(rig.engine->Submit({not_g3}, TransferPriority::kLoad).status().code(),
            StatusCode::kInvalidArgument);

  std::memset(rig.g1_mem.data(), 0, rig.g1_mem.size());  // only G3 can supply the bytes now
  std::vector<BlockTransfer> loads;
  for (uint32_t b = 0; b < 13; ++b) {
    // Move 6 names a block never written: a miss in the middle of the batch.
    BlockTransfer m = DiskMove(BlockTransfer::Op::kG3ToG1, b == 6 ? 99 : (b > 6 ? b - 1 : b), b, 0);
    m.g2_slot = BlockTransfer::kAnyStagingSlot;
    loads.push_back(std::move(m));
  }
  auto l = rig.engine->Submit(loads, TransferPriority::kLoad);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ((*l)->Wait().code(), StatusCode::kNotFound);
  EXPECT_EQ((*l)->failed_moves(), 1u);
  for (uint32_t b = 0; b < 13; ++b) {
    if (b == 6) continue;
    const uint32_t id = b > 6 ? b - 1 : b;
    EXPECT_EQ(rig.G1Mismatches(b, 700 + id), 0u) << b;
  }
  // The pool is whole again: another batch larger than it still completes.
  for (auto& m : loads) m.key = DiskMove(BlockTransfer::Op::kG3ToG1, 3, 0, 0).key;
  for (auto& m : loads) m.tokens = DiskMove(BlockTransfer::Op::kG3ToG1, 3, 0, 0).tokens;
  auto again = rig.engine->Submit(loads, TransferPriority::kLoad);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE((*again)->Wait().ok()) << (*again)->Wait().ToString();
  EXPECT_EQ(rig.G1Mismatches(12, 703), 0u);
}

TEST_F(TransferEngineDiskTest, FailedG3LoadFailsItsLayersInsteadOfHanging) {
  Rig& rig = *rig_;
  // Key 42 was never written: the read is a miss (NotFound).
  std::vector<BlockTransfer> loads = {DiskMove(BlockTransfer::Op::kG3ToG1, 42, 3, 7)};
  auto l = rig.engine->Submit(loads, TransferPriority::kLoad);
  ASSERT_TRUE(l.ok());
  Status layer0 = (*l)->WaitLayer(0);
  EXPECT_EQ(layer0.code(), StatusCode::kNotFound) << layer0.ToString();
  EXPECT_EQ((*l)->WaitLayer(rig.layout.num_layers - 1).code(), StatusCode::kNotFound);
  EXPECT_EQ((*l)->Wait().code(), StatusCode::kNotFound);
  EXPECT_EQ((*l)->failed_moves(), 1u);
  EXPECT_EQ(rig.engine->stats().moves_failed, 1u);
  EXPECT_EQ((*l)->WaitLayer(99).code(), StatusCode::kInvalidArgument);
}

TEST_F(TransferEngineDiskTest, MismatchedDiskGeometryIsRefused) {
  KvLayout other = rig_->layout;
  other.num_layers = 8;
  Rig rig2;
  auto arena = testing::G2Arena(other, 4);
  auto engine = std::move(TransferEngine::Create({})).value();
  ASSERT_TRUE(engine->RegisterHostArena(arena.get(), other).ok());
  Status s = engine->RegisterDisk(disk_.get());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

// The destructor's contract: every accepted move has ended when it returns. G2 -> G3 writes
// that are still queued for a memcpy worker when the destructor starts become disk I/O only when
// a worker takes them, so the destructor must wait for the queues and the disk together (it once
// waited for the disk first and could return with writes still in flight). One worker, many
// writes, the engine destroyed right after Submit: the job must be finished, every write ok and
// readable from G3 with a fresh engine.
TEST_F(TransferEngineDiskTest, DestructorFinishesQueuedG3WritesBeforeReturning) {
  for (int round = 0; round < 3; ++round) {  // 48 blocks: the tier holds 64
    TransferEngine::Config cfg;
    cfg.copy_threads = 1;
    auto rig = std::make_unique<Rig>(cfg);
    ASSERT_TRUE(rig->engine->RegisterDisk(disk_.get()).ok());
    std::vector<BlockTransfer> gathers, writes;
    for (uint32_t b = 0; b < 16; ++b) {
      const uint64_t id = round * 100 + b;
      rig->FillG1(b, id);
      gathers.push_back(Move(BlockTransfer::Op::kG1ToG2, b, b));
      writes.push_back(DiskMove(BlockTransfer::Op::kG2ToG3, id, 0, b));
    }
    ASSERT_TRUE((*rig->engine->Submit(gathers, TransferPriority::kSave))->Wait().ok());
    auto w = rig->engine->Submit(writes, TransferPriority::kSave);
    ASSERT_TRUE(w.ok());
    std::shared_ptr<TransferJob> job = *w;
    rig->engine.reset();
    ASSERT_TRUE(job->Done()) << "round " << round << ": the destructor returned before its moves";
    EXPECT_EQ(job->failed_moves(), 0u) << job->Wait().ToString();
    // A fresh engine on the same disk tier reads every block back.
    rig->engine = std::move(TransferEngine::Create({})).value();
    ASSERT_TRUE(rig->engine->RegisterHostArena(rig->arena.get(), rig->layout).ok());
    ASSERT_TRUE(rig->engine->RegisterG1(rig->g1).ok());
    ASSERT_TRUE(rig->engine->RegisterDisk(disk_.get()).ok());
    for (uint32_t b = 0; b < 16; ++b)
      std::memset(rig->arena->SlotData(b), 0, rig->arena->slot_bytes());
    std::vector<BlockTransfer> reads;
    for (uint32_t b = 0; b < 16; ++b)
      reads.push_back(DiskMove(BlockTransfer::Op::kG3ToG2, round * 100 + b, 0, b));
    ASSERT_TRUE((*rig->engine->Submit(reads, TransferPriority::kLoad))->Wait().ok());
    for (uint32_t b = 0; b < 16; ++b) EXPECT_EQ(rig->SlotMismatches(b, round * 100 + b), 0u) << b;
    rig->engine.reset();
  }
}

}  // namespace
}  // namespace kvtier

// TransferEngine G4 moves over a real shared-filesystem store (files in a temp directory):
// G2->G4 puts with the header encoded from the slot, verified G4->G2 / G4->G1 gets, corrupt,
// torn and foreign objects refused, deadlines (a slow store: a wrapper that sleeps, the only
// fake here, because a filesystem cannot be made slow on demand), the bounded G4 save queue.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "disk_test_util.h"
#include "tier/remote_store.h"
#include "transfer/transfer_engine.h"
#include "transfer_test_util.h"

namespace kvtier {
namespace {

using kvtier::testing::Pattern;
using kvtier::testing::SmallLayout;
using kvtier::testing::TempDir;

// Sleeps `delay` (or until the deadline, whichever is first) before each call, then forwards;
// a call that reaches its deadline while sleeping fails TimedOut like a real store's would.
// Or holds every call at a gate until the test opens it.
class SlowStore final : public RemoteStore {
 public:
  explicit SlowStore(RemoteStore* inner) : inner_(inner) {}
  std::chrono::milliseconds delay{0};
  // How late a call returns past its deadline at most (the contract allows a poll's worth).
  std::chrono::milliseconds overrun{0};
  std::atomic<int> calls{0};
  void CloseGate() {
    std::lock_guard<std::mutex> l(mu_);
    gated_ = true;
  }
  void OpenGate() {
    std::lock_guard<std::mutex> l(mu_);
    gated_ = false;
    cv_.notify_all();
  }
  void Put(std::span<const RemotePut> items, RemoteDeadline deadline,
           std::span<Status> results) override {
    if (!Wait(deadline)) return Fail(results);
    inner_->Put(items, deadline, results);
  }
  void Get(std::span<RemoteGet> items, RemoteDeadline deadline,
           std::span<Status> results) override {
    if (!Wait(deadline)) return Fail(results);
    inner_->Get(items, deadline, results);
  }
  Status Contains(std::span<const std::string> names, RemoteDeadline deadline,
                  std::span<uint8_t> present) override {
    if (!Wait(deadline)) return Status::TimedOut("slow store");
    return inner_->Contains(names, deadline, present);
  }
  Status Remove(std::span<const std::string> names, RemoteDeadline deadline) override {
    return inner_->Remove(names, deadline);
  }
  std::string Describe() const override { return "slow+" + inner_->Describe(); }
  RemoteStoreStats Stats() const override { return inner_->Stats(); }

 private:
  bool Wait(RemoteDeadline deadline) {
    ++calls;
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return !gated_; });
    l.unlock();
    const auto until = std::min(deadline, RemoteClock::now() + delay);
    std::this_thread::sleep_until(until + overrun);
    return RemoteClock::now() < deadline;
  }
  static void Fail(std::span<Status> results) {
    for (Status& s : results) s = Status::TimedOut("slow store: deadline passed");
  }
  RemoteStore* inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool gated_ = false;
};

struct Rig {
  KvLayout layout = SmallLayout();
  uint32_t g1_blocks = 16;
  std::vector<uint8_t> g1_mem;
  G1Memory g1;
  TempDir dir;
  std::unique_ptr<RemoteStore> fs;
  std::unique_ptr<SlowStore> slow;
  std::unique_ptr<HostArena> arena;
  std::unique_ptr<TransferEngine> engine;

  explicit Rig(TransferEngine::RemoteConfig rc = {}) {
    g1 = testing::HostG1(layout, g1_blocks, g1_mem);
    arena = testing::G2Arena(layout, 32);
    fs = std::move(OpenFsStore(FsStoreOptions{dir.sub("g4"), {}})).value();
    slow = std::make_unique<SlowStore>(fs.get());
    engine = std::move(TransferEngine::Create({})).value();
    EXPECT_TRUE(engine->RegisterHostArena(arena.get(), layout).ok());
    EXPECT_TRUE(engine->RegisterG1(g1).ok());
    EXPECT_TRUE(engine->RegisterRemote(slow.get(), rc).ok());
  }
  ~Rig() { engine.reset(); }  // drains before the stores go
  void FillSlot(uint32_t slot, uint64_t id) {
    uint8_t* p = arena->SlotData(slot) + G2PayloadOffset(layout);
    for (uint64_t i = 0; i < layout.BlockBytes(); ++i) p[i] = Pattern(id, i);
  }
  uint64_t SlotMismatches(uint32_t slot, uint64_t id) {
    const uint8_t* p = arena->SlotData(slot) + G2PayloadOffset(layout);
    uint64_t bad = 0;
    for (uint64_t i = 0; i < layout.BlockBytes(); ++i) bad += p[i] != Pattern(id, i);
    return bad;
  }
  uint64_t G1Mismatches(uint32_t block, uint64_t id) {
    uint64_t bad = 0;
    for (uint32_t l = 0; l < layout.num_layers; ++l) {
      for (uint32_t p = 0; p < layout.num_planes; ++p) {
        const uint8_t* c = g1.Chunk(block, l, p);
        for (uint64_t i = 0; i < layout.ChunkBytes(); ++i)
          bad += c[i] != Pattern(id, layout.ChunkOffset(l, p) + i);
      }
    }
    return bad;
  }
  std::string PathOf(uint64_t id) {
    const std::string name = RemoteObjectName(kNs, Key(id));
    return dir.sub("g4/" + name.substr(22, 2) + "/" + name);
  }
  static constexpr uint64_t kNs = 0x5151;
  static BlockKey Key(uint64_t id) { return BlockKey{id * 0x9e3779b97f4a7c15ull, id}; }
  // Fills slots 0..n-1 with blocks first_id + b and returns their puts to G4.
  std::vector<BlockTransfer> FillSlotsForPuts(uint32_t n, uint64_t first_id) {
    std::vector<BlockTransfer> puts;
    for (uint32_t b = 0; b < n; ++b) {
      FillSlot(b, first_id + b);
      puts.push_back(RemoteMove(BlockTransfer::Op::kG2ToG4, first_id + b, 0, b));
    }
    return puts;
  }
  static BlockTransfer RemoteMove(BlockTransfer::Op op, uint64_t id, uint32_t g1_block,
                                  uint32_t slot) {
    BlockTransfer m;
    m.op = op;
    m.key = Key(id);
    m.parent = Key(id + 1000);
    m.namespace_id = kNs;
    for (uint32_t t = 0; t < 8; ++t) m.tokens.push_back(static_cast<TokenId>(id * 100 + t));
    m.g1_block = g1_block;
    m.g2_slot = slot;
    return m;
  }
};

using Op = BlockTransfer::Op;

TEST(TransferRemote, G2ToG4ThenBackToG2AndG1IsByteExact) {
  Rig rig;
  const std::vector<BlockTransfer> puts = rig.FillSlotsForPuts(6, 500);
  auto job = rig.engine->Submit(puts, TransferPriority::kSave);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  ASSERT_TRUE((*job)->Wait().ok()) << (*job)->Wait().ToString();
  // The object is the whole slot: header (naming the block) + payload.
  EXPECT_EQ(std::filesystem::file_size(rig.PathOf(500)),
            kBlockHeaderBytes + rig.layout.BlockBytes());

  std::vector<BlockTransfer> gets;
  for (uint32_t b = 0; b < 3; ++b) gets.push_back(Rig::RemoteMove(Op::kG4ToG2, 500 + b, 0, 10 + b));
  for (uint32_t b = 3; b < 6; ++b) gets.push_back(Rig::RemoteMove(Op::kG4ToG1, 500 + b, b, 10 + b));
  auto load = rig.engine->Submit(gets, TransferPriority::kLoad);
  ASSERT_TRUE(load.ok());
  for (uint32_t l = 0; l < rig.layout.num_layers; ++l) ASSERT_TRUE((*load)->WaitLayer(l).ok());
  ASSERT_TRUE((*load)->Wait().ok());
  for (uint32_t b = 0; b < 6; ++b) EXPECT_EQ(rig.SlotMismatches(10 + b, 500 + b), 0u) << b;
  for (uint32_t b = 3; b < 6; ++b) EXPECT_EQ(rig.G1Mismatches(b, 500 + b), 0u) << b;
  const auto s = rig.engine->stats();
  const uint64_t obj = kBlockHeaderBytes + rig.layout.BlockBytes();
  EXPECT_EQ(s.bytes_by_op[static_cast<size_t>(Op::kG2ToG4)], 6 * obj);
  EXPECT_EQ(s.bytes_by_op[static_cast<size_t>(Op::kG4ToG2)], 6 * obj);
  EXPECT_EQ(s.remote_corrupt + s.remote_failures + s.remote_timeouts, 0u);
}

TEST(TransferRemote, CorruptTornForeignAndMissingObjectsAreNeverServed) {
  Rig rig;
  const std::vector<BlockTransfer> puts = rig.FillSlotsForPuts(4, 700);
  ASSERT_TRUE((*rig.engine->Submit(puts, TransferPriority::kSave))->Wait().ok());
  {  // 700: one payload byte flipped on the shared filesystem
    std::fstream f(rig.PathOf(700), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(kBlockHeaderBytes + 77);
    f.put('\x5a');
  }
  // 701: torn (cut short)
  ASSERT_EQ(truncate(rig.PathOf(701).c_str(), kBlockHeaderBytes + 100), 0);
  // 702: asked with other tokens (what a key collision would look like): refused.
  // 703: missing from G4 (another worker removed it).
  std::filesystem::remove(rig.PathOf(703));

  std::vector<BlockTransfer> gets;
  for (uint32_t b = 0; b < 4; ++b) gets.push_back(Rig::RemoteMove(Op::kG4ToG1, 700 + b, b, 10 + b));
  gets[2].tokens[3] ^= 1;
  std::fill(rig.g1_mem.begin(), rig.g1_mem.end(), 0xcc);
  auto load = rig.engine->Submit(gets, TransferPriority::kLoad);
  ASSERT_TRUE(load.ok());
  EXPECT_FALSE((*load)->WaitLayer(0).ok()) << "a failed move fails its layers, never hangs";
  (void)(*load)->Wait();
  EXPECT_TRUE((*load)->MoveStatus(0).Is(StatusCode::kCorruption))
      << (*load)->MoveStatus(0).ToString();
  EXPECT_NE((*load)->MoveStatus(0).message().find("bad-payload"), std::string::npos);
  EXPECT_TRUE((*load)->MoveStatus(1).Is(StatusCode::kCorruption))
      << (*load)->MoveStatus(1).ToString();
  EXPECT_TRUE((*load)->MoveStatus(2).Is(StatusCode::kCorruption))
      << (*load)->MoveStatus(2).ToString();
  EXPECT_NE((*load)->MoveStatus(2).message().find("wrong-tokens"), std::string::npos);
  EXPECT_TRUE((*load)->MoveStatus(3).Is(StatusCode::kNotFound))
      << (*load)->MoveStatus(3).ToString();
  // Nothing reached G1.
  EXPECT_TRUE(
      std::all_of(rig.g1_mem.begin(), rig.g1_mem.end(), [](uint8_t b) { return b == 0xcc; }));
  EXPECT_EQ(rig.engine->stats().remote_corrupt, 3u);

  // Another namespace (tenant) names another object: a miss, never the other tenant's bytes.
  BlockTransfer foreign = Rig::RemoteMove(Op::kG4ToG2, 701, 0, 20);
  foreign.namespace_id = 0x7777;
  auto f = rig.engine->Submit({foreign}, TransferPriority::kLoad);
  EXPECT_TRUE((*f)->Wait().Is(StatusCode::kNotFound));
}

TEST(TransferRemote, ALateLoadFailsByItsDeadlineAndNeverHangs) {
  TransferEngine::RemoteConfig rc;
  rc.threads = 1;
  rc.load_timeout = std::chrono::milliseconds(80);
  Rig rig(rc);
  rig.FillSlot(0, 1);
  ASSERT_TRUE(
      (*rig.engine->Submit({Rig::RemoteMove(Op::kG2ToG4, 1, 0, 0)}, TransferPriority::kSave))
          ->Wait()
          .ok());
  rig.slow->delay = std::chrono::milliseconds(2000);
  // The first call returns 40 ms past its deadline, so the second batch's deadline (submitted
  // right after) has surely passed by then, even under a sanitizer's slower Submit.
  rig.slow->overrun = std::chrono::milliseconds(40);
  const auto t0 = std::chrono::steady_clock::now();
  // Two batches on one remote thread: the first runs into its deadline inside the call, the
  // second waits behind it and fails without a call.
  auto a = rig.engine->Submit({Rig::RemoteMove(Op::kG4ToG1, 1, 0, 5)}, TransferPriority::kLoad);
  auto b = rig.engine->Submit({Rig::RemoteMove(Op::kG4ToG1, 1, 1, 6)}, TransferPriority::kLoad);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE((*a)->WaitLayer(0).Is(StatusCode::kTimedOut));
  EXPECT_TRUE((*b)->Wait().Is(StatusCode::kTimedOut));
  const auto waited = std::chrono::steady_clock::now() - t0;
  // Well short of the 2 s the server would take; slack for a loaded machine.
  EXPECT_LT(waited, std::chrono::milliseconds(1500)) << "an 80 ms deadline, a 2 s server";
  EXPECT_EQ(rig.engine->stats().remote_timeouts, 2u);
  EXPECT_EQ(rig.slow->calls.load(), 2) << "the put, and the first load; the queued one: no call";
}

TEST(TransferRemote, G4SavesAreBoundedAndTheOverflowIsDroppedAndCounted) {
  TransferEngine::RemoteConfig rc;
  rc.threads = 1;
  rc.max_queued_saves = 2;
  Rig rig(rc);
  rig.slow->CloseGate();
  for (uint32_t b = 0; b < 4; ++b) rig.FillSlot(b, 900 + b);
  auto first =
      rig.engine->Submit({Rig::RemoteMove(Op::kG2ToG4, 900, 0, 0)}, TransferPriority::kSave);
  ASSERT_TRUE(first.ok());
  // Wait until the only remote thread holds the first batch at the gate.
  while (rig.slow->calls.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto second = rig.engine->Submit(
      {Rig::RemoteMove(Op::kG2ToG4, 901, 0, 1), Rig::RemoteMove(Op::kG2ToG4, 902, 0, 2)},
      TransferPriority::kSave);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(rig.engine->queued_remote_saves(), 2u);
  auto third =
      rig.engine->Submit({Rig::RemoteMove(Op::kG2ToG4, 903, 0, 3)}, TransferPriority::kSave);
  EXPECT_TRUE(third.status().Is(StatusCode::kResourceExhausted)) << third.status().ToString();
  EXPECT_EQ(rig.engine->stats().saves_dropped, 1u);
  // Loads never wait behind saves for room: a load is accepted while the save queue is full.
  auto load =
      rig.engine->Submit({Rig::RemoteMove(Op::kG4ToG2, 900, 0, 9)}, TransferPriority::kLoad);
  EXPECT_TRUE(load.ok());
  rig.slow->OpenGate();
  EXPECT_TRUE((*first)->Wait().ok());
  EXPECT_TRUE((*second)->Wait().ok());
  (void)(*load)->Wait();
  EXPECT_EQ(rig.engine->queued_remote_saves(), 0u);
}

// A load is cut into store calls of load_call_bytes (at least one block each); every block lands.
TEST(TransferRemote, ALoadIsCutIntoCallsOfLoadCallBytes) {
  for (const uint64_t call_blocks : {1ull, 2ull, 1000ull}) {
    TransferEngine::RemoteConfig rc;
    rc.threads = 1;
    const uint64_t slot_bytes = G2PayloadOffset(SmallLayout()) + SmallLayout().BlockBytes();
    rc.load_call_bytes = call_blocks == 1 ? 1 : call_blocks * slot_bytes;
    Rig rig(rc);
    const std::vector<BlockTransfer> puts = rig.FillSlotsForPuts(6, 700);
    auto saved = rig.engine->Submit(puts, TransferPriority::kSave);
    ASSERT_TRUE(saved.ok() && (*saved)->Wait().ok());
    const int calls_before = rig.slow->calls.load();
    std::vector<BlockTransfer> gets;
    for (uint32_t b = 0; b < 6; ++b)
      gets.push_back(Rig::RemoteMove(Op::kG4ToG1, 700 + b, b, 10 + b));
    auto load = rig.engine->Submit(gets, TransferPriority::kLoad);
    ASSERT_TRUE(load.ok());
    ASSERT_TRUE((*load)->Wait().ok()) << (*load)->Wait().ToString();
    const int expected_calls =
        call_blocks >= 6 ? 1 : static_cast<int>((6 + call_blocks - 1) / call_blocks);
    EXPECT_EQ(rig.slow->calls.load() - calls_before, expected_calls) << call_blocks;
    for (uint32_t b = 0; b < 6; ++b) EXPECT_EQ(rig.G1Mismatches(b, 700 + b), 0u) << b;
  }
}

TEST(TransferRemote, G4MovesNeedAStoreAndValidConfig) {
  KvLayout l = SmallLayout();
  auto arena = testing::G2Arena(l, 8);
  auto engine = std::move(TransferEngine::Create({})).value();
  ASSERT_TRUE(engine->RegisterHostArena(arena.get(), l).ok());
  auto job = engine->Submit({Rig::RemoteMove(Op::kG4ToG2, 1, 0, 0)}, TransferPriority::kLoad);
  EXPECT_TRUE(job.status().Is(StatusCode::kFailedPrecondition)) << job.status().ToString();
  TempDir dir;
  auto fs = std::move(OpenFsStore(FsStoreOptions{dir.sub("g4"), {}})).value();
  TransferEngine::RemoteConfig bad;
  bad.threads = 0;
  EXPECT_TRUE(engine->RegisterRemote(fs.get(), bad).Is(StatusCode::kInvalidArgument));
  bad = {};
  bad.load_timeout = std::chrono::milliseconds(0);
  EXPECT_TRUE(engine->RegisterRemote(fs.get(), bad).Is(StatusCode::kInvalidArgument));
  bad = {};
  bad.load_call_bytes = 0;
  EXPECT_TRUE(engine->RegisterRemote(fs.get(), bad).Is(StatusCode::kInvalidArgument));
  EXPECT_TRUE(engine->RegisterRemote(nullptr, {}).Is(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace kvtier

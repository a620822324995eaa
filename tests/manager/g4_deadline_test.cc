// Nothing waits forever on G4: the engine's WaitLayer returns by the load deadline whatever the
// store's call is doing, the engine recomputes, and a call that returns late touches neither G1
// nor a G2 slot that was reused. Real files and real FIFOs: a FIFO swapped in under a
// shared-filesystem object name between the lookup and the load, and a store call stuck in a
// blocking open(2) of a FIFO (what a read from a hard-mounted NFS server that stopped answering
// does).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "hang_guard.h"
#include "manager/block_manager_impl.h"
#include "manager/embedded_manager.h"
#include "manager_test_util.h"
#include "tier/remote_store.h"

namespace kvtier {
namespace {

using testing::MiniEngine;
using testing::Prompt;
using testing::ReleaseFifoReaders;
using testing::RunGuarded;
using testing::SmallConfig;
using testing::TempDirectory;
using testing::TestLayout;
using testing::WaitFor;

constexpr uint32_t kTpb = 16;
constexpr uint32_t kG1Blocks = 64;
constexpr int kLoadDeadlineMs = 400;
// Slack on top of the deadline for a loaded 2-core machine. Without a deadline of its own the
// wait never returns, so any finite limit tells the two apart.
constexpr auto kWaitLimit = std::chrono::milliseconds(kLoadDeadlineMs) + std::chrono::seconds(20);

Config FsConfig(const std::string& dir, uint64_t g2_blocks = 16) {
  Config c = SmallConfig("", g2_blocks, 0);
  EXPECT_TRUE(c.Set("g4.backend", "fs").ok());
  EXPECT_TRUE(c.Set("g4.dir", dir).ok());
  EXPECT_TRUE(c.Set("g4.load_deadline_ms", std::to_string(kLoadDeadlineMs)).ok());
  return c;
}

// The G4 object file of block `key` of `prompt`'s namespace in the fs store at `dir`.
std::string ObjectPath(const std::string& dir, const BlockKey& key) {
  KeyNamespace kn{"test-model", TestLayout().Fingerprint(), "", ""};
  const std::string name = RemoteObjectName(BlockHasher::Create(kn, kTpb)->root().hi, key);
  return dir + "/" + name.substr(22, 2) + "/" + name;
}

// Writes `prompt`'s blocks to the G4 store of `config` through a first manager.
void PublishToG4(const Config& config, const std::vector<TokenId>& prompt) {
  auto a = testing::MakeTestManager(config);
  ASSERT_NE(a, nullptr);
  MiniEngine ea(a.get(), kG1Blocks);
  ea.Run("publish", prompt);
  a->WaitForSaves();
  ASSERT_EQ(a->Stats().g4_saved_blocks, prompt.size() / kTpb);
}

// Waits every layer; returns the first failure.
Status WaitAllLayers(BlockManager* m) {
  Status first;
  for (uint32_t l = 0; l < TestLayout().num_layers; ++l) {
    Status s = m->WaitLayer(l);
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

// The reproduction: the lookup stat()s a regular file; before the load opens it, a
// FIFO takes its name. The load used to block in open(2) for good, and so did WaitLayer.
TEST(G4Deadline, AFifoSwappedInUnderAnObjectNameDoesNotHoldTheEngine) {
  TempDirectory dir;
  const std::string g4 = dir.path() + "/g4";
  const Config config = FsConfig(g4);
  const std::vector<TokenId> prompt = Prompt(21, 4 * kTpb + 3);
  PublishToG4(config, prompt);

  auto b = testing::MakeTestManager(config);
  ASSERT_NE(b, nullptr);
  MiniEngine eb(b.get(), kG1Blocks);
  const std::vector<BlockKey> keys = eb.Keys(prompt);
  auto lr = b->Lookup({"b", prompt, "", "", {}}, 0);
  ASSERT_TRUE(lr.ok());
  ASSERT_EQ(lr->blocks_by_tier[kTierG4], 4u);
  // Between the lookup and the load: block 1's object becomes a FIFO.
  const std::string fifo = ObjectPath(g4, keys[1]);
  ASSERT_EQ(::unlink(fifo.c_str()), 0) << fifo;
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0) << std::strerror(errno);

  const std::vector<uint32_t> blocks = eb.AllocBlocks(5);
  auto planned = b->PrepareLoad("b", blocks, lr->num_tokens);
  ASSERT_TRUE(planned.ok()) << planned.status().ToString();
  EXPECT_EQ(*planned, 4 * kTpb);
  ASSERT_TRUE(b->StartLoad().ok());
  Status waited;
  const auto call = RunGuarded([&] { waited = WaitAllLayers(b.get()); }, kWaitLimit,
                               [&] { ReleaseFifoReaders(fifo); });
  EXPECT_TRUE(call.returned_in_time)
      << "WaitLayer was still waiting after " << call.took.count() << " ms (released by the test)";
  EXPECT_FALSE(waited.ok()) << "block 1 cannot load";
  EXPECT_EQ(b->LoadedTokens("b"), 1 * kTpb) << "block 0 loads; 1 fails; 2-3 follow a failure";
  std::vector<uint8_t> expect(TestLayout().BlockBytes());
  testing::KeyContent(keys[0], expect.data(), expect.size());
  EXPECT_EQ(eb.BlockBytes(blocks[0]), expect);
  EXPECT_FALSE(b->RequestFinished("b"));
  eb.FreeBlocks(blocks);

  // A FIFO is no object (the load ended Corruption): the manager deletes it from the store,
  // off the engine's path, and closing leaves nothing behind (ASan checks the rest).
  // The remover counts a deletion after the store's call returns: wait for the counter.
  EXPECT_TRUE(WaitFor([&] { return b->Stats().g4_removed_corrupt == 1u; }))
      << "the bad object is deleted";
  EXPECT_FALSE(std::filesystem::exists(fifo));
  b->WaitForSaves();
  const ManagerStats s = b->Stats();
  EXPECT_GE(s.g4_load_failures, 1u);
  EXPECT_EQ(s.g4_removed_corrupt, 1u);
  EXPECT_EQ(s.g4_rejected_keys, 1u) << "and not offered again";
  EXPECT_EQ(s.pinned_blocks, 0u);
  EXPECT_EQ(s.g2_free_slots + s.g2_blocks + s.g2_staging_slots, s.g2_slots) << "no slot leaked";
}

// A G4 store whose armed Get blocks, before it reads anything, in a real blocking open(2) of a
// FIFO (what FsStore did with a FIFO under an object name, and what a read from a hard-mounted
// NFS server that stopped answering does) until the test opens the FIFO for writing. Then it
// runs the real store's Get with a fresh deadline, so the object does land in the caller's G2
// slot: a late result, long after the load's deadline.
class StallingStore final : public RemoteStore {
 public:
  StallingStore(std::unique_ptr<RemoteStore> inner, std::string fifo)
      : inner_(std::move(inner)), fifo_(std::move(fifo)) {}

  void Arm() { armed_.store(true); }
  bool stalled() const { return stalled_.load(); }

  void Put(std::span<const RemotePut> items, RemoteDeadline deadline,
           std::span<Status> results) override {
    inner_->Put(items, deadline, results);
  }
  void Get(std::span<RemoteGet> items, RemoteDeadline deadline,
           std::span<Status> results) override {
    if (armed_.exchange(false)) {
      stalled_.store(true);
      const int fd = ::open(fifo_.c_str(), O_RDONLY | O_CLOEXEC);  // blocks until a writer
      if (fd >= 0) ::close(fd);
      stalled_.store(false);
      deadline = RemoteClock::now() + std::chrono::seconds(30);  // the late read still happens
    }
    inner_->Get(items, deadline, results);
  }
  Status Contains(std::span<const std::string> names, RemoteDeadline deadline,
                  std::span<uint8_t> present) override {
    return inner_->Contains(names, deadline, present);
  }
  Status Remove(std::span<const std::string> names, RemoteDeadline deadline) override {
    return inner_->Remove(names, deadline);
  }
  std::string Describe() const override { return "stalling " + inner_->Describe(); }
  RemoteStoreStats Stats() const override { return inner_->Stats(); }

 private:
  std::unique_ptr<RemoteStore> inner_;
  const std::string fifo_;
  std::atomic<bool> armed_{false};
  std::atomic<bool> stalled_{false};
};

// Loads what kvtier holds of `prompt` without saving anything (so nothing is evicted), adds
// the blocks loaded to *checked, and returns how many differ from their keys' bytes.
uint64_t LoadAndCheck(BlockManager* m, MiniEngine* e, const std::string& id,
                      const std::vector<TokenId>& prompt, uint64_t* checked) {
  auto lr = m->Lookup({id, prompt, "", "", {}}, 0);
  EXPECT_TRUE(lr.ok());
  if (!lr.ok()) return 0;
  const std::vector<uint32_t> blocks =
      e->AllocBlocks(static_cast<uint32_t>((prompt.size() + kTpb - 1) / kTpb));
  auto planned = m->PrepareLoad(id, blocks, lr->num_tokens);
  EXPECT_TRUE(planned.ok());
  EXPECT_TRUE(m->StartLoad().ok());
  (void)WaitAllLayers(m);
  const uint32_t loaded = m->LoadedTokens(id) / kTpb;
  const std::vector<BlockKey> keys = e->Keys(prompt);
  std::vector<uint8_t> expect(TestLayout().BlockBytes());
  uint64_t bad = 0;
  for (uint32_t i = 0; i < loaded; ++i) {
    testing::KeyContent(keys[i], expect.data(), expect.size());
    if (e->BlockBytes(blocks[i]) != expect) ++bad;
  }
  *checked += loaded;
  EXPECT_FALSE(m->RequestFinished(id));
  e->FreeBlocks(blocks);
  return bad;
}

// The deadline holds while the store's call is stuck in a syscall: WaitLayer fails by the
// deadline, the engine recomputes, and when the call returns much later its result is thrown
// away: G1 keeps what the engine computed, and the G2 slot the call wrote into was kept out of
// use until then (the traffic meanwhile churned every other slot), then freed.
TEST(G4Deadline, ALoadsDeadlineHoldsWhileTheStoreCallIsStuck) {
  TempDirectory dir;
  const std::string g4 = dir.path() + "/g4";
  const Config config = FsConfig(g4);
  // One block (and the last token, always computed): one Get call, which stalls.
  const std::vector<TokenId> prompt = Prompt(31, 1 * kTpb + 3);
  PublishToG4(config, prompt);

  const std::string fifo = dir.path() + "/stall";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  ManagerOptions options;
  options.layout = TestLayout();
  options.model_id = "test-model";
  options.config = config;
  StallingStore* stall = nullptr;
  auto impl = BlockManagerImpl::Create(
      options, {}, [&](std::unique_ptr<RemoteStore> inner) -> std::unique_ptr<RemoteStore> {
        auto s = std::make_unique<StallingStore>(std::move(inner), fifo);
        stall = s.get();
        return s;
      });
  ASSERT_TRUE(impl.ok()) << impl.status().ToString();
  EmbeddedManager b(std::move(impl).value());
  ASSERT_NE(stall, nullptr);
  MiniEngine eb(&b, kG1Blocks);

  stall->Arm();
  auto lr = b.Lookup({"p", prompt, "", "", {}}, 0);
  ASSERT_TRUE(lr.ok());
  ASSERT_EQ(lr->blocks_by_tier[kTierG4], 1u);
  const std::vector<uint32_t> blocks = eb.AllocBlocks(2);
  auto planned = b.PrepareLoad("p", blocks, lr->num_tokens);
  ASSERT_TRUE(planned.ok());
  ASSERT_EQ(*planned, kTpb);
  ASSERT_TRUE(b.StartLoad().ok());
  Status waited;
  const auto call = RunGuarded([&] { waited = WaitAllLayers(&b); }, kWaitLimit,
                               [&] { ReleaseFifoReaders(fifo); });
  ASSERT_TRUE(call.returned_in_time)
      << "WaitLayer was still waiting after " << call.took.count() << " ms (released by the test)";
  EXPECT_TRUE(waited.Is(StatusCode::kTimedOut)) << waited.ToString();
  ASSERT_TRUE(stall->stalled()) << "the deadline held while the call was still in open(2)";
  EXPECT_EQ(b.LoadedTokens("p"), 0u);
  // The engine recomputes the block into G1.
  eb.FillBlock(blocks[0], 0x5a);
  const std::vector<uint8_t> recomputed = eb.BlockBytes(blocks[0]);
  EXPECT_FALSE(b.RequestFinished("p"));
  ManagerStats s = b.Stats();
  EXPECT_EQ(s.g4_abandoned_loads, 1u);
  EXPECT_EQ(s.g4_late_returns, 0u);
  EXPECT_EQ(s.pinned_blocks, 0u);

  // Traffic while the call is stuck: 60 blocks through G2's 12 cache slots, so every slot that
  // is free to use is reused several times over.
  uint64_t mismatched = 0;
  for (uint32_t i = 0; i < 10; ++i) {
    mismatched += eb.Run("c" + std::to_string(i), Prompt(200 + i, 6 * kTpb + 1)).mismatched_blocks;
  }
  b.WaitForSaves();
  ASSERT_TRUE(stall->stalled());

  // The call returns: it reads the object into the slot it was given, long after the deadline.
  ASSERT_TRUE(WaitFor([&] {
    ReleaseFifoReaders(fifo);
    return !stall->stalled();
  }));
  ASSERT_TRUE(WaitFor([&] { return b.Stats().g4_late_returns == 1; }));
  EXPECT_EQ(eb.BlockBytes(blocks[0]), recomputed) << "a late result never reaches G1";
  eb.FreeBlocks(blocks);
  // Every block G2 holds is still the one its key names: the late write hit no reused slot.
  // Loads only (nothing saved, so nothing evicted before it is read).
  uint64_t checked = 0;
  for (uint32_t i = 0; i < 10; ++i) {
    mismatched +=
        LoadAndCheck(&b, &eb, "d" + std::to_string(i), Prompt(200 + i, 6 * kTpb + 1), &checked);
  }
  EXPECT_GE(checked, 8u) << "G2's cache slots were read back";
  EXPECT_EQ(mismatched, 0u);
  auto again = eb.Run("p2", prompt);
  EXPECT_EQ(again.loaded_tokens, kTpb) << "G4 serves the block normally again";
  EXPECT_EQ(again.mismatched_blocks, 0u);
  b.WaitForSaves();
  s = b.Stats();
  EXPECT_EQ(s.pinned_blocks, 0u);
  EXPECT_EQ(s.g2_free_slots + s.g2_blocks + s.g2_staging_slots, s.g2_slots)
      << "the lent slot came back once the call returned";
}

// Keeps releasing the FIFO's stalled reader until the StallingStore says it returned, so a
// test that fails half-way never leaves a remote thread in open(2) (the manager's destructor
// would wait for it).
struct Unstall {
  std::string fifo;
  StallingStore* stall;
  ~Unstall() {
    (void)WaitFor([&] {
      ReleaseFifoReaders(fifo);
      return stall == nullptr || !stall->stalled();
    });
  }
};

// A manager built from `config` whose G4 store is wrapped in a StallingStore on the FIFO at
// `fifo` (*stall points to it).
std::unique_ptr<BlockManager> StallingManager(const Config& config, const std::string& fifo,
                                              StallingStore** stall) {
  ManagerOptions options;
  options.layout = TestLayout();
  options.model_id = "test-model";
  options.config = config;
  auto impl = BlockManagerImpl::Create(
      options, {}, [&](std::unique_ptr<RemoteStore> inner) -> std::unique_ptr<RemoteStore> {
        auto s = std::make_unique<StallingStore>(std::move(inner), fifo);
        *stall = s.get();
        return s;
      });
  EXPECT_TRUE(impl.ok()) << impl.status().ToString();
  if (!impl.ok()) return nullptr;
  return std::make_unique<EmbeddedManager>(std::move(impl).value());
}

// A G3 block that one load finds corrupt while its batch is still running (held open by a
// stalled G4 load in the same batch) is invalidated at once: the batch keeps its pin until it
// ends, but a Lookup meanwhile never offers the block, and a Commit of the recomputed block
// meanwhile saves it (a pinned key that no tier holds is not "already stored").
TEST(G4Deadline, ACorruptG3BlockStillPinnedByItsBatchIsNotOfferedAndIsSavedAgain) {
  TempDirectory dir;
  const std::string g4 = dir.path() + "/g4";
  const std::string g3 = dir.path() + "/g3";
  std::filesystem::create_directories(g3);
  const std::vector<TokenId> remote = Prompt(41, 1 * kTpb + 3);
  PublishToG4(FsConfig(g4), remote);

  Config config = SmallConfig(g3, 12, 64);  // 4 staging + 8 cache slots
  ASSERT_TRUE(config.Set("g4.backend", "fs").ok());
  ASSERT_TRUE(config.Set("g4.dir", g4).ok());
  ASSERT_TRUE(config.Set("g4.load_deadline_ms", "20000").ok());  // the stall, not the deadline
  ASSERT_TRUE(config.Set("g4.lookup_deadline_ms", "5000").ok());
  const std::string fifo = dir.path() + "/stall";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  StallingStore* stall = nullptr;
  auto b = StallingManager(config, fifo, &stall);
  ASSERT_NE(b, nullptr);
  ASSERT_NE(stall, nullptr);
  Unstall unstall{fifo, stall};
  MiniEngine eb(b.get(), kG1Blocks);
  const std::vector<TokenId> local = Prompt(42, 4 * kTpb + 1);
  eb.Run("p", local);
  // The write-through put `local` in G4 too: out of it, so only G3 can supply it.
  for (const BlockKey& k : eb.Keys(local)) std::filesystem::remove(ObjectPath(g4, k));
  // Other prompts until G2's policy has demoted all of `local` to G3 (three do it in most runs;
  // which blocks the adaptive policy evicts first depends on its history).
  Result<LookupResult> probe = Status::Internal("not looked up");
  for (uint32_t i = 1; i <= 12; ++i) {
    eb.Run("f" + std::to_string(i), Prompt(42 + i, 4 * kTpb + 1));
    b->WaitForSaves();
    for (const BlockKey& k : eb.Keys(local)) std::filesystem::remove(ObjectPath(g4, k));
    probe = b->Lookup({"probe", local, "", "", {}}, 0);
    ASSERT_TRUE(probe.ok());
    EXPECT_FALSE(b->RequestFinished("probe"));
    if (probe->blocks_by_tier[kTierG3] == 4u) break;
  }
  ASSERT_EQ(probe->blocks_by_tier[kTierG3], 4u)
      << "`local` is in G3 only; G2 has " << probe->blocks_by_tier[kTierG2];
  ASSERT_GT(testing::CorruptG3Payloads(g3), 0);

  // One batch: the G4 block of `remote` (stalls) and the G3 blocks of `local` (corrupt).
  stall->Arm();
  auto lq = b->Lookup({"q", remote, "", "", {}}, 0);
  ASSERT_TRUE(lq.ok());
  ASSERT_EQ(lq->blocks_by_tier[kTierG4], 1u);
  const std::vector<uint32_t> q_blocks = eb.AllocBlocks(2);
  ASSERT_TRUE(b->PrepareLoad("q", q_blocks, lq->num_tokens).ok());
  auto lp = b->Lookup({"l", local, "", "", {}}, 0);
  ASSERT_TRUE(lp.ok());
  ASSERT_EQ(lp->blocks_by_tier[kTierG3], 4u);
  const std::vector<uint32_t> l_blocks = eb.AllocBlocks(5);
  ASSERT_TRUE(b->PrepareLoad("l", l_blocks, lp->num_tokens).ok());
  ASSERT_TRUE(b->StartLoad().ok());
  ASSERT_TRUE(WaitFor([&] { return b->Stats().corrupt_blocks >= 4 && stall->stalled(); }))
      << "corrupt blocks " << b->Stats().corrupt_blocks << " (want 4), G4 load stalled "
      << stall->stalled() << ", load failures " << b->Stats().load_failures
      << " (failed once in 338 TSan tests under ctest -j2, session 24; 0 of 20 alone)";
  EXPECT_GT(b->Stats().pinned_blocks, 0u) << "the batch still runs and holds its pins";

  auto again = b->Lookup({"again", local, "", "", {}}, 0);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->blocks_by_tier[kTierG3], 0u) << "invalidated while pinned: never offered";
  EXPECT_EQ(again->num_tokens, 0u);
  // The engine recomputed the blocks for another request and commits them now.
  const std::vector<uint32_t> c_blocks = eb.AllocBlocks(5);
  for (uint32_t blk : c_blocks) eb.FillBlock(blk, 0x3c);
  const ManagerStats before = b->Stats();
  ASSERT_TRUE(b->PrepareLoad("again", c_blocks, 0).ok());
  ASSERT_TRUE(b->Commit("again", local, c_blocks).ok());
  ASSERT_TRUE(b->StartSave().ok());
  // (StartSave again: a save deferred for a G2 slot starts once a demotion frees one.)
  ASSERT_TRUE(WaitFor([&] {
    EXPECT_TRUE(b->StartSave().ok());
    return b->Stats().saved_blocks >= before.saved_blocks + 4;
  })) << "saved "
      << b->Stats().saved_blocks - before.saved_blocks << " of 4; deduplicated "
      << b->Stats().dedup_blocks - before.dedup_blocks << "; dropped "
      << b->Stats().dropped_saves - before.dropped_saves;
  EXPECT_EQ(b->Stats().dedup_blocks, before.dedup_blocks);

  ASSERT_TRUE(WaitFor([&] {
    ReleaseFifoReaders(fifo);
    return !stall->stalled();
  }));
  EXPECT_EQ(b->LoadedTokens("q"), kTpb) << "the stalled G4 load landed once released";
  EXPECT_EQ(b->LoadedTokens("l"), 0u);
  for (const std::string id : {"q", "l", "again"}) (void)b->RequestFinished(id);
  b->WaitForSaves();
  eb.DrainFinished(false);
  eb.FreeBlocks(q_blocks);
  eb.FreeBlocks(l_blocks);
  EXPECT_EQ(b->Stats().pinned_blocks, 0u);
  auto served = b->Lookup({"served", local, "", "", {}}, 0);
  ASSERT_TRUE(served.ok());
  EXPECT_EQ(served->num_tokens, 4 * kTpb) << "the saved copy is offered";
  EXPECT_FALSE(b->RequestFinished("served"));
}

// An asynchronous load (vLLM's load_kv_async: the engine polls Finished().loads_done) never
// holds WaitLayer: a G4 load started in one step whose store call stalls (held 5 s by the
// test) does not delay the next step's synchronous G2 load, which WaitLayer returns for at
// once. The async load lands when the store answers, and loads_done lists it then.
TEST(G4Deadline, WaitLayerNeverWaitsForAnAsyncLoad) {
  TempDirectory dir;
  const std::string g4 = dir.path() + "/g4";
  const std::vector<TokenId> remote = Prompt(51, 1 * kTpb + 3);
  PublishToG4(FsConfig(g4), remote);
  Config config = FsConfig(g4, 32);
  ASSERT_TRUE(config.Set("g4.load_deadline_ms", "20000").ok());  // the stall, not the deadline
  ASSERT_TRUE(config.Set("g4.lookup_deadline_ms", "5000").ok());
  const std::string fifo = dir.path() + "/stall";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  StallingStore* stall = nullptr;
  auto b = StallingManager(config, fifo, &stall);
  ASSERT_NE(b, nullptr);
  ASSERT_NE(stall, nullptr);
  Unstall unstall{fifo, stall};
  MiniEngine eb(b.get(), kG1Blocks);
  const std::vector<TokenId> local = Prompt(52, 4 * kTpb + 1);
  eb.Run("warm", local);  // into G2
  b->WaitForSaves();

  // Step 1: an async G4 load; its store call stalls.
  stall->Arm();
  auto la = b->Lookup({"async", remote, "", "", {}}, 0);
  ASSERT_TRUE(la.ok());
  ASSERT_EQ(la->blocks_by_tier[kTierG4], 1u);
  const std::vector<uint32_t> a_blocks = eb.AllocBlocks(2);
  ASSERT_EQ(*b->PrepareLoad("async", a_blocks, la->num_tokens, /*async_load=*/true), kTpb);
  ASSERT_TRUE(b->StartLoad().ok());
  ASSERT_TRUE(WaitFor([&] { return stall->stalled(); }));
  const auto stalled_at = std::chrono::steady_clock::now();
  std::jthread releaser([&] {  // joined on any exit
    std::this_thread::sleep_until(stalled_at + std::chrono::seconds(5));
    (void)WaitFor([&] {
      ReleaseFifoReaders(fifo);
      return !stall->stalled();
    });
  });

  // Step 2: a synchronous G2 load, waited for layer by layer.
  auto ls = b->Lookup({"sync", local, "", "", {}}, 0);
  ASSERT_TRUE(ls.ok());
  ASSERT_EQ(ls->blocks_by_tier[kTierG2], 4u);
  const std::vector<uint32_t> s_blocks = eb.AllocBlocks(5);
  ASSERT_EQ(*b->PrepareLoad("sync", s_blocks, ls->num_tokens), 4 * kTpb);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(b->StartLoad().ok());
  const Status waited = WaitAllLayers(b.get());
  const auto took = std::chrono::steady_clock::now() - t0;
  const bool still_stalled = stall->stalled();
  EXPECT_TRUE(waited.ok()) << waited.ToString();
  EXPECT_LT(took, std::chrono::seconds(1))
      << "WaitLayer took " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
      << " ms: it waited for the async load";
  EXPECT_TRUE(still_stalled) << "the async load was still held when WaitLayer returned";
  EXPECT_EQ(b->LoadedTokens("sync"), 4 * kTpb) << "its own load only";
  const std::vector<BlockKey> keys = eb.Keys(local);
  std::vector<uint8_t> expect(TestLayout().BlockBytes());
  for (uint32_t i = 0; i < 4; ++i) {
    testing::KeyContent(keys[i], expect.data(), expect.size());
    EXPECT_EQ(eb.BlockBytes(s_blocks[i]), expect) << "block " << i;
  }

  // The async load lands once the store answers; the engine learns it from loads_done.
  bool listed = false;
  ASSERT_TRUE(WaitFor([&] {
    for (const std::string& id : b->Finished().loads_done) listed = listed || id == "async";
    return listed;
  }));
  EXPECT_EQ(b->LoadedTokens("async"), kTpb);
  testing::KeyContent(eb.Keys(remote)[0], expect.data(), expect.size());
  EXPECT_EQ(eb.BlockBytes(a_blocks[0]), expect);
  EXPECT_FALSE(b->RequestFinished("async"));
  EXPECT_FALSE(b->RequestFinished("sync"));
  eb.FreeBlocks(a_blocks);
  eb.FreeBlocks(s_blocks);
  EXPECT_EQ(b->Stats().pinned_blocks, 0u);
}

}  // namespace
}  // namespace kvtier

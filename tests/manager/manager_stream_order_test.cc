// StartSave(engine_stream) and StartLoad(engine_stream) (connector.h) through the real manager
// and transfer engine, on the CPU. The CUDA backend is replaced by HostDeviceBackend (a
// stand-in, because no GPU exists here), whose simulated engine streams hold an ordered batch
// back until the work the "engine" queued before the ordering is marked finished, as a CUDA
// stream waiting on an event would. Each test has the engine write G1 after the call returned
// and before its queued work finished: without the ordering, the save would read (the load
// would be overwritten by) the bytes from before. cuda_stream_order_test.cc runs the same
// races with real kernels on a GPU.
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "host_device_backend.h"
#include "manager/block_manager_impl.h"
#include "manager/embedded_manager.h"
#include "manager_test_util.h"

namespace kvtier {
namespace {

using testing::MiniEngine;
using testing::Prompt;

constexpr uintptr_t kStream = 0x5000;  // the engine's stream (any integer for the stand-in)
constexpr uint32_t kTpb = 16;          // TestLayout's tokens per block
constexpr uint32_t kBlocks = 4;        // full blocks of each test prompt

enum class G1Kind { kNone, kHost, kDevice };

struct Rig {
  HostDeviceBackend* device = nullptr;  // owned by the manager's transfer engine
  // Declared before the manager, so the manager (whose shutdown may still copy) goes first.
  std::unique_ptr<MiniEngine> engine;
  std::unique_ptr<BlockManager> manager;

  explicit Rig(G1Kind g1 = G1Kind::kDevice) {
    ManagerOptions options;
    options.layout = testing::TestLayout();
    options.model_id = "test-model";
    options.config = testing::SmallConfig("", 32, 0);
    auto impl = BlockManagerImpl::Create(
        options, {}, nullptr,
        [this](const DeviceCopyBackend::Config& c) -> Result<std::unique_ptr<DeviceCopyBackend>> {
          auto b = std::make_unique<HostDeviceBackend>(c);
          device = b.get();
          return std::unique_ptr<DeviceCopyBackend>(std::move(b));
        });
    EXPECT_TRUE(impl.ok()) << impl.status().ToString();
    manager = std::make_unique<EmbeddedManager>(std::move(impl).value());
    if (g1 != G1Kind::kNone) {
      engine = std::make_unique<MiniEngine>(manager.get(), 32, "test-model",
                                            /*on_device=*/g1 == G1Kind::kDevice);
    }
  }

  // Looks request `id` up (expecting `hit` tokens), takes G1 blocks for its prompt and plans
  // the load of the hit. Returns the blocks.
  std::vector<uint32_t> Begin(const std::string& id, const std::vector<TokenId>& prompt,
                              uint32_t hit) {
    auto lr = manager->Lookup({id, prompt, "", "", {}}, 0);
    EXPECT_TRUE(lr.ok()) << lr.status().ToString();
    EXPECT_EQ(lr->num_tokens, hit);
    std::vector<uint32_t> blocks = engine->AllocBlocks(kBlocks + 1);
    auto planned = manager->PrepareLoad(id, blocks, hit);
    EXPECT_TRUE(planned.ok()) << planned.status().ToString();
    EXPECT_EQ(*planned, hit);
    return blocks;
  }
  void End(const std::string& id, const std::vector<uint32_t>& blocks) {
    if (manager->RequestFinished(id)) manager->WaitForSaves();
    (void)manager->Finished();
    engine->FreeBlocks(blocks);
  }
  // Saves request `id`'s blocks filled with 0x40 + i, unordered (G1 written before the call).
  void SaveFilled(const std::string& id, const std::vector<TokenId>& prompt) {
    std::vector<uint32_t> blocks = Begin(id, prompt, 0);
    for (uint32_t i = 0; i < kBlocks; ++i) engine->FillBlock(blocks[i], 0x40 + i);
    ASSERT_TRUE(manager->Commit(id, prompt, blocks).ok());
    ASSERT_TRUE(manager->StartSave().ok());
    manager->WaitForSaves();
    End(id, blocks);
  }
  // Block i of `blocks` holds 0x40 + i in every byte.
  void ExpectFilled(const std::vector<uint32_t>& blocks) {
    for (uint32_t i = 0; i < kBlocks; ++i) {
      const std::vector<uint8_t> got = engine->BlockBytes(blocks[i]);
      uint64_t bad = 0;
      for (uint8_t b : got) bad += b != 0x40 + i;
      EXPECT_EQ(bad, 0u) << "block " << i << " (first byte 0x" << std::hex << int{got[0]} << ")";
    }
  }
  // Waits (5 s at most) until the device holds a batch back for the engine's stream.
  bool DeviceWaitsForTheEngine() {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!device->waiting_for_engine()) {
      if (std::chrono::steady_clock::now() > end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }
};

TEST(ManagerStreamOrder, SavesReadG1OnlyAfterTheEnginesQueuedWork) {
  Rig rig;
  ASSERT_NE(rig.device, nullptr);
  const auto prompt = Prompt(1, kBlocks * kTpb + 1);
  std::vector<uint32_t> blocks = rig.Begin("a", prompt, 0);
  // The forward pass that writes the blocks is queued on the engine's stream, not yet run.
  rig.device->QueueEngineWork(kStream);
  ASSERT_TRUE(rig.manager->Commit("a", prompt, blocks).ok());
  Status s = rig.manager->StartSave(kStream);
  ASSERT_TRUE(s.ok()) << s.ToString();
  const auto orders = rig.device->orders();
  ASSERT_EQ(orders.size(), 1u);
  EXPECT_EQ(orders[0].dir, CopyDirection::kDeviceToHost);
  EXPECT_EQ(orders[0].stream, kStream);
  EXPECT_EQ(orders[0].batches_before, 0u) << "StartSave submitted the saves before ordering them";
  EXPECT_EQ(rig.device->submitted(CopyDirection::kDeviceToHost), 1u);
  ASSERT_TRUE(rig.DeviceWaitsForTheEngine()) << "the save did not wait for the engine's stream";
  EXPECT_EQ(rig.manager->Stats().saved_blocks, 0u);
  for (uint32_t i = 0; i < kBlocks; ++i) rig.engine->FillBlock(blocks[i], 0x40 + i);  // the kernel
  rig.device->FinishEngineWork(kStream);
  rig.manager->WaitForSaves();
  EXPECT_EQ(rig.manager->Stats().saved_blocks, kBlocks);
  rig.End("a", blocks);  // poisons the blocks (0xee)
  // What was saved is what the kernel wrote: loaded back into other blocks.
  std::vector<uint32_t> again = rig.Begin("b", prompt, kBlocks * kTpb);
  ASSERT_TRUE(rig.manager->StartLoad().ok());
  for (uint32_t l = 0; l < rig.manager->layout().num_layers; ++l) {
    ASSERT_TRUE(rig.manager->WaitLayer(l).ok());
  }
  EXPECT_EQ(rig.manager->LoadedTokens("b"), kBlocks * kTpb);
  rig.ExpectFilled(again);
  rig.End("b", again);
}

TEST(ManagerStreamOrder, LoadsWriteG1OnlyAfterTheEnginesQueuedWork) {
  Rig rig;
  ASSERT_NE(rig.device, nullptr);
  const auto prompt = Prompt(2, kBlocks * kTpb + 1);
  rig.SaveFilled("a", prompt);
  std::vector<uint32_t> blocks = rig.Begin("b", prompt, kBlocks * kTpb);
  // vLLM zeroes new blocks on its stream just before it starts loads into them.
  rig.device->QueueEngineWork(kStream);
  Status s = rig.manager->StartLoad(kStream);
  ASSERT_TRUE(s.ok()) << s.ToString();
  const auto orders = rig.device->orders();
  ASSERT_EQ(orders.size(), 1u);
  EXPECT_EQ(orders[0].dir, CopyDirection::kHostToDevice);
  EXPECT_EQ(orders[0].batches_before, 0u) << "StartLoad submitted the loads before ordering them";
  EXPECT_EQ(rig.device->submitted(CopyDirection::kHostToDevice), 1u);
  ASSERT_TRUE(rig.DeviceWaitsForTheEngine()) << "the load did not wait for the engine's stream";
  for (uint32_t i = 0; i < kBlocks; ++i) rig.engine->FillBlock(blocks[i], 0);  // the zeroing
  rig.device->FinishEngineWork(kStream);
  for (uint32_t l = 0; l < rig.manager->layout().num_layers; ++l) {
    ASSERT_TRUE(rig.manager->WaitLayer(l).ok());
  }
  EXPECT_EQ(rig.manager->LoadedTokens("b"), kBlocks * kTpb);
  rig.ExpectFilled(blocks);
  rig.End("b", blocks);
}

// A failed ordering is returned, and the saves it should have ordered are dropped (never read
// out of order) until an ordering of saves succeeds; loads keep working meanwhile.
TEST(ManagerStreamOrder, AFailedSaveOrderingDropsTheSavesUntilOneSucceeds) {
  Rig rig;
  ASSERT_NE(rig.device, nullptr);
  const auto first = Prompt(3, kBlocks * kTpb + 1);
  std::vector<uint32_t> blocks = rig.Begin("a", first, 0);
  ASSERT_TRUE(rig.manager->Commit("a", first, blocks).ok());
  rig.device->FailNextOrder();
  Status s = rig.manager->StartSave(kStream);
  EXPECT_EQ(s.code(), StatusCode::kIOError) << s.ToString();
  EXPECT_NE(s.message().find("injected failure ordering"), std::string::npos) << s.ToString();
  rig.manager->WaitForSaves();
  EXPECT_EQ(rig.manager->Stats().saved_blocks, 0u);
  EXPECT_EQ(rig.manager->Stats().dropped_saves, kBlocks);
  EXPECT_EQ(rig.device->submitted(CopyDirection::kDeviceToHost), 0u) << "a save reached G1";
  rig.End("a", blocks);
  // The next ordering succeeds: saves run again.
  const auto second = Prompt(4, kBlocks * kTpb + 1);
  blocks = rig.Begin("b", second, 0);
  for (uint32_t i = 0; i < kBlocks; ++i) rig.engine->FillBlock(blocks[i], 0x40 + i);
  ASSERT_TRUE(rig.manager->Commit("b", second, blocks).ok());
  s = rig.manager->StartSave(kStream);
  EXPECT_TRUE(s.ok()) << s.ToString();
  rig.manager->WaitForSaves();
  EXPECT_EQ(rig.manager->Stats().saved_blocks, kBlocks);
  rig.End("b", blocks);
  // The failed request's blocks were never stored: nothing of it is offered.
  blocks = rig.Begin("c", first, 0);
  rig.End("c", blocks);
}

TEST(ManagerStreamOrder, AFailedLoadOrderingFailsTheLoadsUntilOneSucceeds) {
  Rig rig;
  ASSERT_NE(rig.device, nullptr);
  const auto prompt = Prompt(5, kBlocks * kTpb + 1);
  rig.SaveFilled("a", prompt);
  std::vector<uint32_t> blocks = rig.Begin("b", prompt, kBlocks * kTpb);
  rig.device->FailNextOrder();
  Status s = rig.manager->StartLoad(kStream);
  EXPECT_EQ(s.code(), StatusCode::kIOError) << s.ToString();
  EXPECT_FALSE(rig.manager->WaitLayer(0).ok()) << "a load whose ordering failed landed";
  EXPECT_EQ(rig.manager->LoadedTokens("b"), 0u);  // the engine recomputes them
  EXPECT_EQ(rig.device->submitted(CopyDirection::kHostToDevice), 0u) << "a load reached G1";
  EXPECT_GT(rig.manager->Stats().load_failures, 0u);
  rig.End("b", blocks);
  blocks = rig.Begin("c", prompt, kBlocks * kTpb);
  s = rig.manager->StartLoad(kStream);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (uint32_t l = 0; l < rig.manager->layout().num_layers; ++l) {
    ASSERT_TRUE(rig.manager->WaitLayer(l).ok());
  }
  EXPECT_EQ(rig.manager->LoadedTokens("c"), kBlocks * kTpb);
  rig.ExpectFilled(blocks);
  rig.End("c", blocks);
}

TEST(ManagerStreamOrder, OrderingNeedsARegisteredDeviceG1) {
  {
    Rig rig(G1Kind::kNone);
    Status s = rig.manager->StartSave(kStream);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
    s = rig.manager->StartLoad(kStream);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
    EXPECT_NE(s.message().find("no G1 is registered"), std::string::npos) << s.ToString();
  }
  Rig rig(G1Kind::kHost);
  EXPECT_EQ(rig.device, nullptr);  // a host G1 has no device backend
  Status s = rig.manager->StartSave(0);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("G1 is host memory"), std::string::npos) << s.ToString();
  s = rig.manager->StartLoad(kStream);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  // The host G1's saves still run (started all the same, nothing to order).
  const auto prompt = Prompt(6, kBlocks * kTpb + 1);
  std::vector<uint32_t> blocks = rig.Begin("a", prompt, 0);
  ASSERT_TRUE(rig.manager->Commit("a", prompt, blocks).ok());
  EXPECT_EQ(rig.manager->StartSave(kStream).code(), StatusCode::kInvalidArgument);
  rig.manager->WaitForSaves();
  EXPECT_EQ(rig.manager->Stats().saved_blocks, kBlocks);
  rig.End("a", blocks);
}

}  // namespace
}  // namespace kvtier

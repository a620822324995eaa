// Helpers shared by the BlockManager tests (tests/manager/block_manager_test.cc and
// tests/manager/block_manager_g3_test.cc): the repeated lookup/commit/save sequences, G3 filled
// by filler prompts, and an event log that a manager's subscriber writes.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "faulty_g3_manager.h"
#include "kvtier/connector.h"
#include "manager_test_util.h"
#include "tier/fault_injecting_io.h"

namespace kvtier::testing {

// `n` prompts of 65 tokens with the seeds after `seed` (requests "f1".."fn"), then every save
// and demotion ended: what G2 evicted meanwhile, the oldest blocks first, is in G3.
inline void RunFillers(MiniEngine& engine, BlockManager& manager, uint32_t seed, uint32_t n) {
  for (uint32_t i = 1; i <= n; ++i) {
    engine.Run("f" + std::to_string(i), Prompt(seed + i, 16 * 4 + 1));
  }
  manager.WaitForSaves();
}

// Runs prompt `seed` (65 tokens) as request `id`, then `fillers` filler prompts after it
// (RunFillers): with a G2 small enough, the prompt's blocks are pushed out of G2 into G3.
// Returns the prompt.
inline std::vector<TokenId> PushToG3(MiniEngine& engine, BlockManager& manager,
                                     const std::string& id, uint32_t seed, uint32_t fillers) {
  std::vector<TokenId> prompt = Prompt(seed, 16 * 4 + 1);
  engine.Run(id, prompt);
  RunFillers(engine, manager, seed, fillers);
  return prompt;
}

// A manager of G2 `g2_blocks` slots and G3 64 in a fresh directory (SmallConfig), and a
// MiniEngine of 64 G1 blocks on it; declared in the order a test declares them by hand.
struct G3Rig {
  explicit G3Rig(uint64_t g2_blocks)
      : mgr(MakeTestManager(SmallConfig(dir.path(), g2_blocks, 64))), engine(mgr.get(), 64) {}
  TempDirectory dir;
  std::unique_ptr<BlockManager> mgr;
  MiniEngine engine;
};

// A request that loads nothing: Lookup, then Commit of `g1` (computed by the engine), StartSave,
// every save ended, RequestFinished. Returns the tokens the Lookup offered (0 when it failed).
inline uint32_t CommitAndFinish(BlockManager& mgr, const RequestSpec& spec,
                                const std::vector<uint32_t>& g1) {
  Result<LookupResult> r = mgr.Lookup(spec, 0);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(mgr.Commit(spec.request_id, spec.prompt, g1).ok());
  EXPECT_TRUE(mgr.StartSave().ok());
  mgr.WaitForSaves();
  mgr.RequestFinished(spec.request_id);
  return r.ok() ? r->num_tokens : 0;
}

// Lookup of request `id`, PrepareLoad of nothing into `g1` (the engine computes the prompt),
// Commit: each must succeed (wrap in ASSERT_NO_FATAL_FAILURE).
inline void LookupNothingAndCommit(BlockManager& mgr, const std::string& id,
                                   const std::vector<TokenId>& prompt,
                                   const std::vector<uint32_t>& g1) {
  ASSERT_TRUE(mgr.Lookup({id, prompt, "", "", {}}, 0).ok());
  ASSERT_TRUE(mgr.PrepareLoad(id, g1, 0).ok());
  ASSERT_TRUE(mgr.Commit(id, prompt, g1).ok());
}

// A Lookup of `prompt` as request "probe" must offer `g3_blocks` blocks from G3 (`why` on
// failure; wrap in ASSERT_NO_FATAL_FAILURE); then the probe is finished, and what
// RequestFinished answered is left in `*finished` when it is not null.
inline void ProbeG3(BlockManager& mgr, const std::vector<TokenId>& prompt, uint32_t g3_blocks,
                    const std::string& why, bool* finished = nullptr) {
  auto probe = mgr.Lookup({"probe", prompt, "", "", {}}, 0);
  ASSERT_TRUE(probe.ok());
  ASSERT_EQ(probe->blocks_by_tier[kTierG3], g3_blocks) << why;
  const bool held = mgr.RequestFinished("probe");
  if (finished != nullptr) *finished = held;
}

// The events a manager emits, gathered by its subscriber (events arrive on the threads that
// made the changes, the transfer workers too: lock `mu`). Declare it before the manager, so it
// outlives the events the manager's shutdown may still emit.
struct EventSink {
  std::mutex mu;
  std::vector<KvEvent> events;

  void Attach(BlockManager& mgr) {
    mgr.SubscribeEvents([this](std::span<const KvEvent> e) {
      std::lock_guard<std::mutex> lock(mu);
      events.insert(events.end(), e.begin(), e.end());
    });
  }
};

// A FaultyG3Manager and a MiniEngine of 64 G1 blocks on it. Start must succeed (wrap it in
// ASSERT_NO_FATAL_FAILURE): the manager is created and its G3 I/O wrapped.
struct FaultyG3Rig {
  FaultInjectingIo* faults = nullptr;
  std::unique_ptr<BlockManager> mgr;
  std::unique_ptr<MiniEngine> engine;  // after mgr: destroyed before it

  void Start(const Config& config, const FaultPlan& plan = FaultPlan{}) {
    mgr = FaultyG3Manager(config, &faults, plan);
    ASSERT_NE(mgr, nullptr);
    ASSERT_NE(faults, nullptr);
    engine = std::make_unique<MiniEngine>(mgr.get(), 64);
  }
};

}  // namespace kvtier::testing

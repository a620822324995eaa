// The BlockManager contract (include/kvtier/connector.h), over both implementations
// (contract_fixture.h): SubscribeEvents and the Stats beside it, calls from many threads at
// once, and the destructor, which ends the saves in flight.
#include <chrono>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "contract_fixture.h"

namespace kvtier::contract {
namespace {

using testing::MiniEngine;
using testing::Prompt;

constexpr uint32_t kTpb = 16;  // testing::TestLayout()'s tokens per block

class EventsThreadsContract : public BlockManagerContract {};

// What a SubscribeEvents callback heard (on the manager's threads).
struct Heard {
  std::mutex mu;
  std::vector<KvEvent> events;

  KvEventCallback Callback() {
    return [this](std::span<const KvEvent> e) {
      std::lock_guard<std::mutex> lock(mu);
      events.insert(events.end(), e.begin(), e.end());
    };
  }
  std::vector<KvEvent> Copy() {
    std::lock_guard<std::mutex> lock(mu);
    return events;
  }
};

// Every store and removal is an event: each store names its tier, its block's own tokens and
// its lineage parent (the namespace root for a first block), a request's blocks in prefix
// order; a block G2 evicts is announced removed. Events are counted in Stats().events_emitted.
// (Attached, a subscriber hears the daemon's events from the moment its events connection
// opens, so the test first saves one-block prompts until it hears one.)
TEST_P(EventsThreadsContract, EventsReportStoresAndRemovalsWithLineage) {
  Heard heard;  // before the manager: its threads call into it until it is gone
  auto m = Make(Tiers(8));
  ASSERT_NE(m, nullptr);
  m->SubscribeEvents(heard.Callback());
  MiniEngine engine(m.get(), 64);
  uint32_t warm = 0;
  for (; warm < 8 && heard.Copy().empty(); ++warm) {
    engine.Run("warm" + std::to_string(warm), Prompt(900 + warm, kTpb + 1));
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
    while (heard.Copy().empty() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  ASSERT_FALSE(heard.Copy().empty()) << "no event heard after " << warm << " saves";
  m->WaitForSaves();
  const ManagerStats mark = m->Stats();
  ASSERT_EQ(mark.evicted_blocks_g2, 0u) << "the warm-up saves fit in G2";

  constexpr uint32_t kPrompts = 4;
  std::vector<std::vector<BlockKey>> keys;
  std::vector<std::vector<TokenId>> prompts;
  for (uint32_t p = 0; p < kPrompts; ++p) {
    prompts.push_back(Prompt(70 + p, kTpb * 3 + 1));
    keys.push_back(engine.Keys(prompts.back()));
    engine.Run("p" + std::to_string(p), prompts.back());
  }
  m->WaitForSaves();
  const ManagerStats end = m->Stats();
  const uint64_t emitted = end.events_emitted - mark.events_emitted;
  // 12 new blocks through 8 slots holding the warm-up's: some were evicted.
  const uint64_t removals = mark.g2_blocks + kPrompts * 3 - end.g2_blocks;
  EXPECT_GE(removals, 1u);
  EXPECT_EQ(emitted, kPrompts * 3 + removals) << "one event per store and per removal";

  // The events after the mark: stores of the prompts' blocks, and removals. (A subscriber may
  // hear the warm-up's stores late, attached; those are not counted.)
  auto is_prompt_key = [&](const BlockKey& k) {
    for (const auto& ks : keys) {
      for (const BlockKey& x : ks) {
        if (x == k) return true;
      }
    }
    return false;
  };
  std::vector<KvEvent> stores, removed;
  ASSERT_TRUE(testing::WaitFor([&] {
    stores.clear();
    removed.clear();
    for (const KvEvent& e : heard.Copy()) {
      if (e.kind == KvEvent::Kind::kRemoved) removed.push_back(e);
      if (e.kind == KvEvent::Kind::kStored && is_prompt_key(e.key)) stores.push_back(e);
    }
    return stores.size() >= kPrompts * 3 && removed.size() >= removals;
  })) << "heard "
      << stores.size() << " stores and " << removed.size() << " removals";
  EXPECT_EQ(stores.size(), kPrompts * 3u);
  EXPECT_EQ(removed.size(), removals);
  for (const KvEvent& e : removed) {
    EXPECT_EQ(e.tier, kTierG2);
    EXPECT_GT(e.time_ns, 0u);
  }
  // Each prompt's stores: in prefix order, its own tokens, lineage from the namespace root.
  for (uint32_t p = 0; p < kPrompts; ++p) {
    std::vector<KvEvent> mine;
    for (const KvEvent& e : stores) {
      for (const BlockKey& k : keys[p]) {
        if (e.key == k) mine.push_back(e);
      }
    }
    ASSERT_EQ(mine.size(), 3u) << "prompt " << p;
    for (uint32_t b = 0; b < 3; ++b) {
      const KvEvent& e = mine[b];
      EXPECT_EQ(e.key, keys[p][b]) << "prompt " << p << ": stores out of prefix order";
      EXPECT_EQ(e.tier, kTierG2);
      EXPECT_GT(e.time_ns, 0u);
      EXPECT_EQ(e.block_size, kTpb);
      EXPECT_EQ(e.token_ids, std::vector<TokenId>(prompts[p].begin() + b * kTpb,
                                                  prompts[p].begin() + (b + 1) * kTpb));
      EXPECT_EQ(e.parent_is_root, b == 0);
      if (b > 0) {
        EXPECT_EQ(e.parent, keys[p][b - 1]) << "prompt " << p << ", block " << b;
      }
    }
  }
}

// Each method is thread-safe: four threads run requests that share system prompts, at once;
// every block a load delivers is the bytes its key implies, and nothing stays pinned or held.
TEST_P(EventsThreadsContract, ConcurrentRequestsFromManyThreadsLoadOnlyExactBytes) {
  auto m = Make(Tiers(64));
  ASSERT_NE(m, nullptr);
  MiniEngine engine(m.get(), 128);
  constexpr uint32_t kThreads = 4, kRequests = 6;
  std::vector<MiniEngine::Outcome> outcomes(kThreads * kRequests);
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (uint32_t r = 0; r < kRequests; ++r) {
        // Two system prompts (3 blocks each) under every thread's own questions.
        const auto prompt = Prompt(1000 + t * 100 + r, kTpb * 5 + 7, kTpb * 3, 500 + r % 2);
        outcomes[t * kRequests + r] =
            engine.Run("t" + std::to_string(t) + "-r" + std::to_string(r), prompt);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  uint64_t loaded = 0;
  for (const MiniEngine::Outcome& o : outcomes) {
    EXPECT_EQ(o.mismatched_blocks, 0u);
    EXPECT_FALSE(o.load_error);
    EXPECT_EQ(o.loaded_tokens, o.planned_tokens);
    loaded += o.loaded_tokens;
  }
  EXPECT_GT(loaded, 0u) << "no request reused a system prompt";
  engine.DrainFinished(true);
  EXPECT_TRUE(testing::WaitFor([&] {
    engine.DrainFinished(true);
    return engine.held_requests() == 0;
  }));
  EXPECT_EQ(engine.free_blocks(), 128u) << "G1 blocks still held";
  EXPECT_EQ(m->Stats().pinned_blocks, 0u);
}

// The destructor finishes transfers in flight: saves started and not waited for still land,
// and a manager made again finds them (embedded: through the restart snapshot and the G3 flush;
// attached: in the daemon's G2; found by this suite: ~AttachedManager closed its data connection
// without waiting, so the daemon's saves from this engine's G1 failed and none was stored).
TEST_P(EventsThreadsContract, TheDestructorEndsTheSavesInFlight) {
  const Settings settings = Tiers(32, Dir("g3"), 64);
  const auto prompt = Prompt(33, kTpb * 6 + 1);
  {
    auto m = Make(settings);
    ASSERT_NE(m, nullptr);
    MiniEngine engine(m.get(), 64);
    ASSERT_TRUE(m->Lookup(Spec("a", prompt), 0).ok());
    const std::vector<uint32_t> blocks = engine.AllocBlocks(7);
    ASSERT_TRUE(m->PrepareLoad("a", blocks, 0).ok());
    for (uint32_t b = 0; b < 7; ++b) engine.FillBlock(blocks[b], static_cast<uint8_t>(0x60 + b));
    ASSERT_TRUE(m->Commit("a", prompt, blocks).ok());
    ASSERT_TRUE(m->StartSave().ok());
    // No WaitForSaves, no Finished: the manager goes with its saves in flight (the engine's
    // G1 outlives it).
    m.reset();
  }
  auto again = Make(settings, "engine-again");
  ASSERT_NE(again, nullptr);
  MiniEngine engine(again.get(), 64);
  Result<LookupResult> r = again->Lookup(Spec("b", prompt), 0);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->num_tokens, kTpb * 6) << "a save in flight at the destructor was lost";
  const std::vector<uint32_t> into = engine.AllocBlocks(7);
  ASSERT_TRUE(again->PrepareLoad("b", into, r->num_tokens).ok());
  ASSERT_TRUE(again->StartLoad().ok());
  const uint32_t loaded = again->LoadedTokens("b");
  EXPECT_EQ(loaded, r->num_tokens);
  for (uint32_t b = 0; b < loaded / kTpb; ++b) {
    EXPECT_EQ(engine.BlockBytes(into[b]),
              std::vector<uint8_t>(testing::TestLayout().BlockBytes(), 0x60 + b))
        << "block " << b;
  }
  EXPECT_FALSE(again->RequestFinished("b"));
}

INSTANTIATE_TEST_SUITE_P(BothModes, EventsThreadsContract,
                         ::testing::Values(Mode::kEmbedded, Mode::kAttached), ModeName);

}  // namespace
}  // namespace kvtier::contract

// kvtier serve as a host's one cache for several engines and models: the daemon's G2 budget
// split among its pools (service.max_pools), an idle pool giving its room to a new model, and
// the pool's KV events heard by every attached engine's SubscribeEvents. Real `kvtier serve`
// processes, killed with -9 where the test says so (docs/service.md).
#include <condition_variable>
#include <mutex>
#include <optional>

#include "service_test_util.h"

namespace kvtier {
namespace {

using namespace service_test;  // NOLINT: the helpers of every service test

// What an engine's SubscribeEvents callback heard.
struct Heard {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<KvEvent> events;

  KvEventCallback Callback() {
    return [this](std::span<const KvEvent> ev) {
      {
        std::lock_guard lock(mu);
        events.insert(events.end(), ev.begin(), ev.end());
      }
      cv.notify_all();
    };
  }
  // The G2 stores heard so far, once at least `n` arrived (or after `wait`).
  std::vector<KvEvent> WaitG2Stores(size_t n,
                                    std::chrono::milliseconds wait = std::chrono::seconds(10)) {
    std::unique_lock lock(mu);
    std::vector<KvEvent> stores;
    cv.wait_for(lock, wait, [&] {
      stores.clear();
      for (const KvEvent& e : events) {
        if (e.kind == KvEvent::Kind::kStored && e.tier == kTierG2) stores.push_back(e);
      }
      return stores.size() >= n;
    });
    return stores;
  }
  void Clear() {
    std::lock_guard lock(mu);
    events.clear();
  }
};

// Checks that `stores` are prompt `seed`'s `blocks` blocks, in order: each block's own tokens,
// a lineage from the namespace root.
void ExpectPromptStores(const std::vector<KvEvent>& stores, uint32_t seed, uint32_t blocks) {
  ASSERT_EQ(stores.size(), blocks);
  const uint32_t bs = TestLayout().tokens_per_block;
  const std::vector<TokenId> prompt = Prompt(seed, blocks * bs + 1);
  for (uint32_t b = 0; b < blocks; ++b) {
    const KvEvent& e = stores[b];
    EXPECT_EQ(e.block_size, bs);
    EXPECT_EQ(e.token_ids,
              std::vector<TokenId>(prompt.begin() + b * bs, prompt.begin() + (b + 1) * bs))
        << "block " << b;
    EXPECT_EQ(e.parent_is_root, b == 0) << "block " << b;
    if (b > 0) {
      EXPECT_EQ(e.parent, stores[b - 1].key) << "block " << b;
    }
    EXPECT_TRUE(e.namespace_known);
  }
}

// Engine A subscribes; engine B (another process's worth of connections) saves. A hears B's
// blocks enter the shared G2, with the tokens and lineage a router needs. After the daemon is
// killed with -9 and started again, A's events connection comes back by itself and A hears the
// new daemon's blocks.
TEST(ServicePools, AttachedSubscriberHearsEveryEnginesBlocks) {
  const std::string dir = TempDir("events");
  const std::string socket = dir + "/sock/kvtier.sock";
  Daemon daemon(socket);
  ASSERT_NO_FATAL_FAILURE(daemon.Start());
  Heard heard;  // outlives A: A's events thread calls into it until A's manager is gone
  Engine a = MakeEngine(socket, "engine-a");
  a.manager->SubscribeEvents(heard.Callback());
  Engine b = MakeEngine(socket, "engine-b");
  // The events connection opens on A's events thread: B's saves may start before it is open,
  // and after a daemon restart B's calls are misses until it has attached again. So B saves
  // prompts until A hears one (each prompt's 8 stores come in one batch, in order), for at
  // most 10 s. Returns the seed of the prompt whose 8 stores are `stores`'s first 8 (a late
  // batch may be an earlier save's).
  auto save_until_heard = [&](uint32_t first, std::vector<KvEvent>* stores) {
    uint32_t seed = first;
    for (const auto t0 = Clock::now(); Clock::now() - t0 < std::chrono::seconds(10); ++seed) {
      ComputeAndSave(b, "b-" + std::to_string(seed), seed, 8);
      *stores = heard.WaitG2Stores(8, std::chrono::milliseconds(500));
      if (stores->size() >= 8) break;
    }
    const uint32_t bs = TestLayout().tokens_per_block;
    for (uint32_t s = first; s <= seed && !stores->empty(); ++s) {
      const std::vector<TokenId> prompt = Prompt(s, bs + 1);
      if ((*stores)[0].token_ids == std::vector<TokenId>(prompt.begin(), prompt.begin() + bs)) {
        return s;
      }
    }
    return seed;
  };
  std::vector<KvEvent> stores;
  uint32_t seed = save_until_heard(40, &stores);
  ASSERT_GE(stores.size(), 8u) << "A heard none of B's saves within 10 s";
  ExpectPromptStores(std::vector<KvEvent>(stores.begin(), stores.begin() + 8), seed, 8);

  daemon.Kill(SIGKILL);
  heard.Clear();
  Daemon again(socket);
  ASSERT_NO_FATAL_FAILURE(again.Start());
  seed = save_until_heard(77, &stores);
  ASSERT_GE(stores.size(), 8u) << "A did not hear the restarted daemon's blocks within 10 s";
  // The new daemon's first batch that A hears is a whole prompt of B's, with its lineage.
  ExpectPromptStores(std::vector<KvEvent>(stores.begin(), stores.begin() + 8), seed, 8);
}

// service.max_pools = 2 over a daemon G2 of 8 MiB: each model's pool holds 4 MiB; a third
// model is refused while both pools have engines, with the key to raise in the message; once
// a pool has no engine, the third model takes its room (its blocks flushed to G3 first), and
// when it comes back, its blocks load from G3 byte for byte.
TEST(ServicePools, PoolsSplitTheDaemonsG2AndAnIdleOneGivesWay) {
  const std::string dir = TempDir("pools");
  const std::string socket = dir + "/sock/kvtier.sock";
  Daemon daemon(socket);
  ASSERT_NO_FATAL_FAILURE(daemon.Start(1000, dir + "/g3", "", {{"KVTIER_SERVICE_MAX_POOLS", "2"}}));
  const uint64_t block_bytes = TestLayout().BlockBytes();
  std::optional<Engine> a(MakeEngine(socket, "engine-a", 64, "model-a"));
  Engine b = MakeEngine(socket, "engine-b", 64, "model-b");
  for (BlockManager* m : {a->manager.get(), b.manager.get()}) {
    const ManagerStats s = m->Stats();
    const uint64_t held = (s.g2_slots + s.g2_staging_slots) * block_bytes;
    EXPECT_LE(held, uint64_t{4} << 20) << "a pool holds more than its half of the daemon's G2";
    EXPECT_GT(held, uint64_t{2} << 20);
  }
  ComputeAndSave(*a, "a-req", 51, 8);

  // Two pools, each with an engine: a third model has no room.
  Result<Engine> c = TryMakeEngine(socket, "engine-c", "model-c");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted) << c.status().ToString();
  EXPECT_NE(c.status().message().find("service.max_pools"), std::string::npos)
      << c.status().ToString();

  // A's engine goes: its pool is idle, and model C takes its room.
  a.reset();
  for (const auto t0 = Clock::now(); Clock::now() - t0 < std::chrono::seconds(10);) {
    c = TryMakeEngine(socket, "engine-c", "model-c");
    if (c.ok()) break;
    ASSERT_EQ(c.status().code(), StatusCode::kResourceExhausted) << c.status().ToString();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(c.ok()) << "model C found no room after A's engine left: " << c.status().ToString();
  ComputeAndSave(*c, "c-req", 52, 4);
  bool bytes_ok = false;
  EXPECT_EQ(LookupAndLoad(*c, "c-again", 52, 4, 20, &bytes_ok), 4u * 16);
  EXPECT_TRUE(bytes_ok);
  // B's pool was never touched.
  EXPECT_EQ(b.manager->Stats().saved_blocks, 0u);

  // C goes, A comes back: C's pool gives way, and A's blocks come from its G3 directory.
  c = Status::Unavailable("engine C stopped");
  Result<Engine> back = Status::Unavailable("not yet");
  for (const auto t0 = Clock::now(); Clock::now() - t0 < std::chrono::seconds(10);) {
    back = TryMakeEngine(socket, "engine-a2", "model-a");
    if (back.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  const std::vector<TokenId> prompt = Prompt(51, 8 * 16 + 1);
  RequestSpec spec;
  spec.request_id = "a-peek";
  spec.prompt = prompt;
  auto found = back->manager->Lookup(spec, 0);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(found->blocks_by_tier[kTierG3], 8u) << "A's closed pool did not reach G3";
  (void)back->manager->RequestFinished("a-peek");
  EXPECT_EQ(LookupAndLoad(*back, "a-again", 51, 8, 0, &bytes_ok), 8u * 16);
  EXPECT_TRUE(bytes_ok) << "A's blocks came back from G3 with other bytes";
}

}  // namespace
}  // namespace kvtier

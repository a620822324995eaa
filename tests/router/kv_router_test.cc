// KvRouter (include/kvtier/router.h): exact choices on hand-made indexes.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <thread>
#include <vector>

#include "kvtier/router.h"

namespace kvtier {
namespace {

// Block i of a request: distinct, non-zero keys.
BlockKey K(uint64_t i) { return BlockKey{0x1000 + i, i * 7 + 1}; }

std::vector<BlockKey> Keys(uint64_t first, uint64_t n) {
  std::vector<BlockKey> k;
  for (uint64_t i = 0; i < n; ++i) k.push_back(K(first + i));
  return k;
}

KvEvent Stored(const BlockKey& key, TierId tier) {
  KvEvent e;
  e.kind = KvEvent::Kind::kStored;
  e.key = key;
  e.tier = tier;
  return e;
}
KvEvent Removed(const BlockKey& key, TierId tier) {
  KvEvent e = Stored(key, tier);
  e.kind = KvEvent::Kind::kRemoved;
  return e;
}

// Round numbers: a block is 16 tokens and 1 GB, prefill runs at 10 tokens/s: one block
// computes in 1.6 s, loads from G2 in 0.1 s (10 GB/s), G3 in 0.5 s, G4 in 1.0 s.
RouterOptions Options() {
  RouterOptions o;
  o.tokens_per_block = 16;
  o.block_bytes = 1'000'000'000;
  o.prefill_tokens_per_s = 10;
  o.load_gbps = {0.0, 10.0, 2.0, 1.0};
  return o;
}

std::unique_ptr<KvRouter> Make(const RouterOptions& o, uint32_t workers) {
  auto r = KvRouter::Create(o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  for (WorkerId w = 0; w < workers; ++w) EXPECT_TRUE((*r)->AddWorker(w).ok());
  return std::move(*r);
}

void Store(KvRouter& r, WorkerId w, const std::vector<BlockKey>& keys, TierId tier) {
  std::vector<KvEvent> ev;
  for (const BlockKey& k : keys) ev.push_back(Stored(k, tier));
  ASSERT_TRUE(r.Apply(w, ev).ok());
}

TEST(KvRouterTest, LongestPrefixWinsAndEstimateIsExact) {
  auto r = Make(Options(), 3);
  Store(*r, 0, Keys(0, 2), kTierG2);
  Store(*r, 1, Keys(0, 4), kTierG2);
  Store(*r, 2, {K(1), K(2), K(3)}, kTierG1);  // no first block: no prefix at all
  auto d = r->Route(Keys(0, 4), 4 * 16 + 1);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->worker, 1u);
  ASSERT_EQ(d->candidates.size(), 3u);
  const RouteCandidate& c1 = d->candidates[1];
  EXPECT_EQ(c1.blocks_by_tier[kTierG2], 4u);
  EXPECT_EQ(c1.compute_tokens, 1u);
  EXPECT_DOUBLE_EQ(c1.load_s, 0.4);
  EXPECT_DOUBLE_EQ(c1.compute_s, 0.1);
  EXPECT_DOUBLE_EQ(c1.ttft_s, 0.5);
  EXPECT_EQ(d->candidates[0].blocks_by_tier[kTierG2], 2u);
  EXPECT_EQ(d->candidates[0].compute_tokens, 33u);
  EXPECT_EQ(d->candidates[2].compute_tokens, 65u);
  EXPECT_DOUBLE_EQ(d->candidates[2].ttft_s, 6.5);
}

TEST(KvRouterTest, TierCostsChangeTheWinner) {
  // Worker 0 holds 3 blocks in G3, worker 1 holds 2 in G2. With a fast SSD (G3 at 10 GB/s)
  // the longer prefix wins; with a slow one (0.1 GB/s: 10 s a block) the shorter G2 prefix does.
  for (double g3 : {10.0, 0.1}) {
    RouterOptions o = Options();
    o.load_gbps[kTierG3] = g3;
    auto r = Make(o, 2);
    Store(*r, 0, Keys(0, 3), kTierG3);
    Store(*r, 1, Keys(0, 2), kTierG2);
    auto d = r->Route(Keys(0, 3), 3 * 16 + 5);
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(d->worker, g3 == 10.0 ? 0u : 1u) << "g3 " << g3;
  }
}

TEST(KvRouterTest, EachBlockComesFromItsCheapestTier) {
  auto r = Make(Options(), 1);
  Store(*r, 0, Keys(0, 3), kTierG3);
  Store(*r, 0, {K(1)}, kTierG1);
  Store(*r, 0, {K(2)}, kTierG2);
  auto d = r->Route(Keys(0, 3), 100);
  ASSERT_TRUE(d.ok());
  const RouteCandidate& c = d->candidates[0];
  EXPECT_EQ(c.blocks_by_tier[kTierG1], 1u);
  EXPECT_EQ(c.blocks_by_tier[kTierG2], 1u);
  EXPECT_EQ(c.blocks_by_tier[kTierG3], 1u);
  EXPECT_DOUBLE_EQ(c.load_s, 0.0 + 0.1 + 0.5);
}

TEST(KvRouterTest, G4CountsForEveryWorkerAndQueueDecides) {
  auto r = Make(Options(), 3);
  Store(*r, 2, Keys(0, 3), kTierG4);  // reported by worker 2, shared by all
  for (WorkerId w = 0; w < 3; ++w) EXPECT_EQ(r->BlockCount(w, kTierG4), 3u);
  ASSERT_TRUE(r->SetWorkerQueue(0, 2.0).ok());
  ASSERT_TRUE(r->SetWorkerQueue(1, 0.5).ok());
  ASSERT_TRUE(r->SetWorkerQueue(2, 1.0).ok());
  auto d = r->Route(Keys(0, 3), 49);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->worker, 1u);  // all supply 3 blocks from G4; the shortest queue wins
  for (const RouteCandidate& c : d->candidates) EXPECT_EQ(c.blocks_by_tier[kTierG4], 3u);
  EXPECT_DOUBLE_EQ(d->candidates[1].ttft_s, 0.5 + 3.0 + 0.1);
  // Queue weight 0 ignores queues: all equal estimates, ties go to the shorter queue.
  RouterOptions o = Options();
  o.queue_weight = 0;
  auto r2 = Make(o, 2);
  ASSERT_TRUE(r2->SetWorkerQueue(0, 9.0).ok());
  auto d2 = r2->Route(Keys(0, 1), 20);
  ASSERT_TRUE(d2.ok());
  EXPECT_EQ(d2->worker, 1u);
  // A long queue outweighs a cached prefix: worker 0 holds 4 blocks (saves 6.4 s of compute)
  // but has 10 s queued.
  auto r3 = Make(Options(), 2);
  Store(*r3, 0, Keys(0, 4), kTierG2);
  ASSERT_TRUE(r3->SetWorkerQueue(0, 10.0).ok());
  EXPECT_EQ(r3->Route(Keys(0, 4), 65)->worker, 1u);
  ASSERT_TRUE(r3->SetWorkerQueue(0, 5.0).ok());
  EXPECT_EQ(r3->Route(Keys(0, 4), 65)->worker, 0u);
}

TEST(KvRouterTest, DownWorkerIsNeverChosen) {
  auto r = Make(Options(), 2);
  Store(*r, 0, Keys(0, 4), kTierG1);
  ASSERT_TRUE(r->SetWorkerUp(0, false).ok());
  auto d = r->Route(Keys(0, 4), 65);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->worker, 1u);
  EXPECT_FALSE(d->candidates[0].up);
  ASSERT_TRUE(r->SetWorkerUp(1, false).ok());
  auto none = r->Route(Keys(0, 4), 65);
  EXPECT_EQ(none.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(none.status().message().find("every worker is down"), std::string::npos);
  // Back up: its blocks were kept.
  ASSERT_TRUE(r->SetWorkerUp(0, true).ok());
  EXPECT_EQ(r->Route(Keys(0, 4), 65)->worker, 0u);
  EXPECT_EQ(r->BlockCount(0, kTierG1), 4u);
}

TEST(KvRouterTest, RemovalsAndClearWorker) {
  auto r = Make(Options(), 2);
  Store(*r, 0, Keys(0, 4), kTierG2);
  Store(*r, 0, Keys(0, 4), kTierG1);
  Store(*r, 1, Keys(0, 4), kTierG4);
  // Removing block 1 from G1 leaves it in G2: still 4 blocks, one more from G2.
  std::vector<KvEvent> ev = {Removed(K(1), kTierG1)};
  ASSERT_TRUE(r->Apply(0, ev).ok());
  auto d = r->Route(Keys(0, 4), 65);
  EXPECT_EQ(d->candidates[0].blocks_by_tier[kTierG1], 3u);  // blocks 0, 2, 3
  EXPECT_EQ(d->candidates[0].blocks_by_tier[kTierG2], 1u);  // block 1
  // A removal of an unknown block is ignored.
  ev = {Removed(K(99), kTierG2)};
  ASSERT_TRUE(r->Apply(0, ev).ok());
  EXPECT_EQ(r->BlockCount(0, kTierG2), 4u);
  // Clearing G1 and G2 of worker 0 keeps the shared G4.
  ASSERT_TRUE(r->ClearWorker(0, (1u << kTierG1) | (1u << kTierG2)).ok());
  EXPECT_EQ(r->BlockCount(0, kTierG1), 0u);
  EXPECT_EQ(r->BlockCount(0, kTierG2), 0u);
  EXPECT_EQ(r->BlockCount(0, kTierG4), 4u);
  d = r->Route(Keys(0, 4), 65);
  EXPECT_EQ(d->candidates[0].blocks_by_tier[kTierG4], 4u);
  ASSERT_TRUE(r->ClearWorker(1, kAllTiers).ok());
  EXPECT_EQ(r->BlockCount(0, kTierG4), 0u);
  // RemoveWorker forgets it.
  ASSERT_TRUE(r->RemoveWorker(1).ok());
  EXPECT_EQ(r->Route(Keys(0, 4), 65)->candidates.size(), 1u);
  EXPECT_EQ(r->RemoveWorker(1).code(), StatusCode::kNotFound);
}

TEST(KvRouterTest, BoundForgetsTheOldestStored) {
  RouterOptions o = Options();
  o.max_blocks_per_worker_tier = 3;
  auto r = Make(o, 1);
  Store(*r, 0, Keys(0, 3), kTierG2);
  Store(*r, 0, {K(0)}, kTierG2);  // refreshed: K(1) is now the oldest
  Store(*r, 0, {K(10)}, kTierG2);
  EXPECT_EQ(r->BlockCount(0, kTierG2), 3u);
  auto d = r->Route(Keys(0, 3), 49);
  EXPECT_EQ(d->candidates[0].blocks_by_tier[kTierG2], 1u);  // K(1) forgotten: walk stops there
}

// Block sizes that are not powers of two (vLLM's 528 and 784 for hybrid models, 96 on its CPU
// backend) route like any other: the estimate counts tokens in blocks of that size.
TEST(KvRouterTest, NonPowerOfTwoBlockSizesRoute) {
  for (uint32_t tpb : {3u, 96u, 528u, 784u, 4096u}) {
    RouterOptions o = Options();
    o.tokens_per_block = tpb;
    auto r = Make(o, 2);
    Store(*r, 0, Keys(0, 1), kTierG2);
    Store(*r, 1, Keys(0, 3), kTierG3);
    // Three full blocks and 5 more tokens: worker 1 loads 3 blocks (1.5 s from G3) and
    // computes 5 tokens (0.5 s); worker 0 loads 1 block (0.1 s) and computes 2 x tpb + 5.
    auto d = r->Route(Keys(0, 3), 3 * tpb + 5);
    ASSERT_TRUE(d.ok()) << tpb << ": " << d.status().ToString();
    ASSERT_EQ(d->candidates.size(), 2u);
    EXPECT_EQ(d->candidates[1].blocks_by_tier[kTierG3], 3u) << tpb;
    EXPECT_EQ(d->candidates[1].compute_tokens, 5u) << tpb;
    EXPECT_NEAR(d->candidates[1].ttft_s, 2.0, 1e-9) << tpb;
    EXPECT_EQ(d->candidates[0].compute_tokens, 2u * tpb + 5) << tpb;
    EXPECT_NEAR(d->candidates[0].ttft_s, 0.1 + (2.0 * tpb + 5) / 10, 1e-9) << tpb;
    EXPECT_EQ(d->worker, tpb == 3 ? 0u : 1u) << tpb;  // 3-token blocks: computing is cheaper
  }
}

TEST(KvRouterTest, BadInputIsRefused) {
  struct Case {
    const char* what;
    void (*change)(RouterOptions&);
    const char* says;
  };
  const Case cases[] = {
      {"tpb 0", [](RouterOptions& o) { o.tokens_per_block = 0; }, "tokens_per_block"},
      {"tpb 4097", [](RouterOptions& o) { o.tokens_per_block = 4097; }, "must be in 1..4096"},
      {"bytes 0", [](RouterOptions& o) { o.block_bytes = 0; }, "block_bytes"},
      {"prefill 0", [](RouterOptions& o) { o.prefill_tokens_per_s = 0; }, "prefill_tokens_per_s"},
      {"prefill nan", [](RouterOptions& o) { o.prefill_tokens_per_s = NAN; }, "prefill"},
      {"g2 0", [](RouterOptions& o) { o.load_gbps[kTierG2] = 0; }, "load_gbps[G2]"},
      {"g4 -1", [](RouterOptions& o) { o.load_gbps[kTierG4] = -1; }, "load_gbps[G4]"},
      {"g1 -1", [](RouterOptions& o) { o.load_gbps[kTierG1] = -1; }, "load_gbps[G1]"},
      {"queue -1", [](RouterOptions& o) { o.queue_weight = -1; }, "queue_weight"},
  };
  for (const Case& c : cases) {
    RouterOptions o = Options();
    c.change(o);
    auto r = KvRouter::Create(o);
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(r.status().message().find(c.says), std::string::npos)
        << c.what << ": " << r.status().ToString();
  }
  auto r = Make(Options(), 1);
  EXPECT_EQ(r->AddWorker(0).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(r->SetWorkerUp(7, true).code(), StatusCode::kNotFound);
  EXPECT_EQ(r->SetWorkerQueue(7, 1).code(), StatusCode::kNotFound);
  EXPECT_EQ(r->SetWorkerQueue(0, -1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r->SetWorkerQueue(0, INFINITY).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r->ClearWorker(7, kAllTiers).code(), StatusCode::kNotFound);
  EXPECT_EQ(r->ClearWorker(0, 0x10).code(), StatusCode::kInvalidArgument);
  std::vector<KvEvent> ev = {Stored(K(0), kTierG2)};
  EXPECT_EQ(r->Apply(7, ev).code(), StatusCode::kNotFound);
  // A bad event anywhere in the batch: nothing applied.
  ev = {Stored(K(0), kTierG2), Stored(K(1), 9)};
  Status s = r->Apply(0, ev);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tier 9"), std::string::npos) << s.ToString();
  EXPECT_EQ(r->BlockCount(0, kTierG2), 0u);
  // Too few prompt tokens for the keys; an empty prompt.
  auto d = r->Route(Keys(0, 3), 32);
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("too short"), std::string::npos);
  EXPECT_EQ(r->Route({}, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(r->Route(Keys(0, 3), 33).ok());  // the last key's block may be partial
  EXPECT_TRUE(r->Route({}, 5).ok());
  // No worker at all.
  auto empty = KvRouter::Create(Options());
  EXPECT_EQ((*empty)->Route(Keys(0, 1), 17).status().code(), StatusCode::kUnavailable);
}

// Writers apply events and flip workers up/down while readers route: no torn state (TSAN
// checks the locking in the sanitizer build), and every decision names an up worker.
TEST(KvRouterTest, ConcurrentApplyAndRoute) {
  auto r = Make(Options(), 4);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> routed{0}, bad{0};
  std::vector<std::thread> threads;
  for (WorkerId w = 0; w < 3; ++w) {
    threads.emplace_back([&, w] {
      for (uint64_t i = 0; i < 2000; ++i) {
        std::vector<KvEvent> ev = {Stored(K(i % 50), static_cast<TierId>(i % 4)),
                                   Removed(K((i + 25) % 50), static_cast<TierId>(i % 4))};
        ASSERT_TRUE(r->Apply(w, ev).ok());
        ASSERT_TRUE(r->SetWorkerQueue(w, static_cast<double>(i % 7)).ok());
        if (i % 100 == 0) {
          ASSERT_TRUE(r->ClearWorker(w, 1u << kTierG1).ok());
        }
      }
    });
  }
  threads.emplace_back([&] {  // worker 3 flaps; worker 0..2 stay up
    for (int i = 0; i < 2000; ++i) ASSERT_TRUE(r->SetWorkerUp(3, i % 2 == 0).ok());
  });
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&] {
      const auto keys = Keys(0, 50);
      // At least 200 routes each, even when the writers finish first on a loaded machine.
      for (uint64_t mine = 0; !stop.load() || mine < 200; ++mine) {
        auto d = r->Route(keys, 50 * 16 + 1);
        if (!d.ok()) {
          ++bad;
          continue;
        }
        const RouteCandidate& c = d->candidates[d->worker];
        if (!c.up) ++bad;
        uint32_t supplied = 0;
        for (uint32_t b : c.blocks_by_tier) supplied += b;
        if (c.compute_tokens != 50 * 16 + 1 - supplied * 16) ++bad;
        ++routed;
      }
    });
  }
  for (size_t i = 0; i < 4; ++i) threads[i].join();
  stop = true;
  for (size_t i = 4; i < threads.size(); ++i) threads[i].join();
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_GT(routed.load(), 0u);
}

}  // namespace
}  // namespace kvtier

// The anchors' policies (issue 17): ARC, W-TinyLFU and leaf-first LRU (the lab's since issue 42:
// lab/policies) on hand-made reference strings with their exact victims, and the adaptive
// default following its shadow caches.
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "index/adaptive_policy.h"
#include "index/arc_policy.h"
#include "index/eviction_policy.h"
#include "index/lru_policy.h"
#include "index/w_tinylfu_policy.h"
#include "policies/lab_policies.h"
#include "policies/lineage_lru_policy.h"
#include "policy_test_util.h"
#include "sim/policy_sim.h"

namespace kvtier {
namespace {

using policy_test::Mix;

// Block `c`: a spread key named by a letter for the reader.
BlockKey K(char c) { return BlockKey{Mix(2 * uint64_t(c)), Mix(2 * uint64_t(c) + 1)}; }
const BlockKey kRoot = BlockKey{1, 1};
bool Any(const BlockKey&) { return true; }

// Evicts the policy's victim (which must be tracked) and returns it.
BlockKey EvictOne(EvictionPolicy& p) {
  std::optional<BlockKey> v = p.Victim(Any);
  EXPECT_TRUE(v.has_value());
  if (!v) return BlockKey{};
  EXPECT_TRUE(p.Contains(*v));
  p.OnRemove(*v);
  return *v;
}

// ---- ARC -----------------------------------------------------------------------------------

// c = 3. A B C enter T1; A is used again (T2). B and C are evicted from T1 into B1 (|T1| > p = 0).
// B comes back as a B1 ghost: p grows to 1 and B enters T2, so now |T1| = 1 is not above p and
// T2's LRU block A goes (to B2). E enters T1; |T1| = 2 > 1: D goes. A comes back as a B2 ghost:
// p shrinks to 0 (by |B1| / |B2| = 2) and E, T1's only block, goes. LRU would have evicted B
// there instead (see the last lines).
TEST(ArcPolicyTest, ExactVictimsOnAReferenceString) {
  ArcPolicy arc(3);
  arc.OnInsert(K('A'), kRoot);
  arc.OnInsert(K('B'), kRoot);
  arc.OnInsert(K('C'), kRoot);
  arc.OnAccess(K('A'));
  EXPECT_EQ(arc.t1_size(), 2u);
  EXPECT_EQ(arc.t2_size(), 1u);
  EXPECT_EQ(EvictOne(arc), K('B'));
  arc.OnInsert(K('D'), kRoot);
  EXPECT_EQ(EvictOne(arc), K('C'));
  EXPECT_EQ(arc.b1_size(), 2u);
  arc.OnInsert(K('B'), kRoot);  // a B1 ghost
  EXPECT_DOUBLE_EQ(arc.target_t1(), 1.0);
  EXPECT_EQ(arc.t2_size(), 2u) << "a returning ghost enters T2";
  EXPECT_EQ(EvictOne(arc), K('A'));
  arc.OnInsert(K('E'), kRoot);
  EXPECT_EQ(EvictOne(arc), K('D'));
  arc.OnInsert(K('A'), kRoot);  // a B2 ghost
  EXPECT_DOUBLE_EQ(arc.target_t1(), 0.0);
  EXPECT_EQ(EvictOne(arc), K('E'));
  EXPECT_EQ(arc.size(), 2u);
  EXPECT_TRUE(arc.Contains(K('A')) && arc.Contains(K('B')));

  LruPolicy lru;  // the same string under LRU parts ways at the last victim
  for (char c : {'A', 'B', 'C'}) lru.OnInsert(K(c), kRoot);
  lru.OnAccess(K('A'));
  std::vector<BlockKey> victims;
  victims.push_back(EvictOne(lru));
  lru.OnInsert(K('D'), kRoot);
  victims.push_back(EvictOne(lru));
  lru.OnInsert(K('B'), kRoot);
  victims.push_back(EvictOne(lru));
  lru.OnInsert(K('E'), kRoot);
  victims.push_back(EvictOne(lru));
  lru.OnInsert(K('A'), kRoot);
  victims.push_back(EvictOne(lru));
  EXPECT_EQ(victims, (std::vector<BlockKey>{K('B'), K('C'), K('A'), K('D'), K('B')}));
}

// Ghost lists stay within the paper's bounds however long the string.
TEST(ArcPolicyTest, GhostsStayBounded) {
  ArcPolicy arc(4);
  for (uint64_t i = 0; i < 1000; ++i) {
    const BlockKey k{i % 37 + 10, i % 37};
    if (arc.Contains(k)) {
      arc.OnAccess(k);
      continue;
    }
    if (arc.size() >= 4) EvictOne(arc);
    arc.OnInsert(k, kRoot);
    ASSERT_LE(arc.t1_size() + arc.b1_size(), 4u);
    ASSERT_LE(arc.t1_size() + arc.t2_size() + arc.b1_size() + arc.b2_size(), 8u);
    ASSERT_GE(arc.target_t1(), 0.0);
    ASSERT_LE(arc.target_t1(), 4.0);
  }
}

// ---- W-TinyLFU -----------------------------------------------------------------------------

// c = 4: a window of 1, probation + protected = 3 (protected at most 2). A B C D enter; the
// window keeps only the newest (D), the others move to probation. A is used twice (protected).
// When E arrives the window's D (seen once) contests probation's LRU B (seen once): a tie goes
// against the candidate, D is evicted. E is used once more; when F arrives E (seen twice) beats
// B (once): E moves to probation and B is evicted. G arrives: F (once) loses to C (once).
// A, used most, was never a candidate. LRU would have evicted B first.
TEST(WTinyLfuPolicyTest, ExactVictimsOnAReferenceString) {
  WTinyLfuPolicy w(4);
  EXPECT_EQ(w.window_capacity(), 1u);
  for (char c : {'A', 'B', 'C', 'D'}) w.OnInsert(K(c), kRoot);
  EXPECT_EQ(w.window_size(), 1u);
  EXPECT_EQ(w.probation_size(), 3u);
  w.OnAccess(K('A'));
  w.OnAccess(K('A'));
  EXPECT_EQ(w.protected_size(), 1u);
  EXPECT_EQ(w.Frequency(K('A')), 3u);
  EXPECT_EQ(w.Frequency(K('D')), 1u) << "the doorkeeper holds a key seen once";
  EXPECT_EQ(EvictOne(w), K('D'));
  w.OnInsert(K('E'), kRoot);
  w.OnAccess(K('E'));
  EXPECT_EQ(EvictOne(w), K('B'));
  EXPECT_EQ(w.probation_size(), 2u) << "E won the contest and moved to probation";
  w.OnInsert(K('F'), kRoot);
  EXPECT_EQ(EvictOne(w), K('F'));
  w.OnInsert(K('G'), kRoot);
  EXPECT_TRUE(w.Contains(K('A')) && w.Contains(K('C')) && w.Contains(K('E')));
}

// A scan of keys seen once never displaces a block used often: every scanned key loses its
// contest. (LRU loses the hot block after `capacity` scanned keys.)
TEST(WTinyLfuPolicyTest, ScanDoesNotDisplaceAHotBlock) {
  WTinyLfuPolicy w(100);
  w.OnInsert(K('H'), kRoot);
  for (int i = 0; i < 5; ++i) w.OnAccess(K('H'));
  for (uint64_t i = 0; i < 2000; ++i) {
    if (w.size() >= 100) EvictOne(w);
    w.OnInsert(BlockKey{i + 1000, i}, kRoot);
    ASSERT_TRUE(w.Contains(K('H'))) << "after " << i << " scanned keys";
  }
}

// The sketch halves its counts every 10 x expected_keys sightings, so old popularity fades.
TEST(FrequencySketchTest, AgingHalvesCounts) {
  FrequencySketch sketch(16, /*sample_size=*/100);
  for (int i = 0; i < 9; ++i) sketch.Record(K('X'));
  EXPECT_EQ(sketch.Estimate(K('X')), 9u);  // 8 counted + the doorkeeper bit
  EXPECT_EQ(sketch.Estimate(K('Y')), 0u);
  for (uint64_t i = 0; i < 91; ++i) sketch.Record(BlockKey{i + 5000, i});
  EXPECT_EQ(sketch.records(), 0u) << "the 100th sighting aged the sketch";
  EXPECT_EQ(sketch.Estimate(K('X')), 4u) << "8 halved; the doorkeeper cleared";
}

// ---- Leaf-first LRU --------------------------------------------------------------------------

// A chain A <- B <- C and a lone D. A is used last, yet it goes last: only leaves are victims,
// oldest first (C, then B once it is a leaf, then D, then A).
TEST(LeafFirstLruPolicyTest, ExactVictimsEvictOnlyLeaves) {
  auto made = MakeLabEvictionPolicy(PolicyKind::kLeafFirstLru, 4);
  ASSERT_TRUE(made.ok());
  EvictionPolicy& p = **made;
  EXPECT_EQ(p.kind(), PolicyKind::kLeafFirstLru);
  p.OnInsert(K('A'), kRoot);
  p.OnInsert(K('B'), K('A'));
  p.OnInsert(K('C'), K('B'));
  p.OnInsert(K('D'), kRoot);
  p.OnAccess(K('A'));
  EXPECT_EQ(EvictOne(p), K('C'));
  EXPECT_EQ(EvictOne(p), K('B'));
  EXPECT_EQ(EvictOne(p), K('D'));
  EXPECT_EQ(EvictOne(p), K('A'));
}

// When every leaf is pinned, leaf-first refuses (nullopt: the tier refuses the insert) where
// lineage-lru falls back to an inner block.
TEST(LeafFirstLruPolicyTest, NeverEvictsAnInnerBlock) {
  LineageLruPolicy strict(/*leaf_only=*/true), lenient;
  for (LineageLruPolicy* p : {&strict, &lenient}) {
    p->OnInsert(K('A'), kRoot);
    p->OnInsert(K('B'), K('A'));
  }
  const auto leaf_pinned = [](const BlockKey& k) { return k != K('B'); };
  EXPECT_EQ(strict.Victim(leaf_pinned), std::nullopt);
  EXPECT_EQ(lenient.Victim(leaf_pinned), K('A'));
}

// ---- Adaptive ------------------------------------------------------------------------------

// A trace of single-block requests: a hot set of 40 blocks, each used every ~160 references,
// interleaved with a scan of never-repeated blocks. With 50 slots LRU keeps nothing hot (the scan
// flushes it); W-TinyLFU keeps the hot set. The adaptive policy must notice and follow it.
Trace ScanTrace() {
  Trace t;
  uint64_t scan = 1000;
  for (int round = 0; round < 200; ++round) {
    for (uint64_t h = 0; h < 40; ++h) {
      t.ids.push_back(h);
      t.request_ends.push_back(t.ids.size());
      for (int s = 0; s < 3; ++s) {
        t.ids.push_back(scan++);
        t.request_ends.push_back(t.ids.size());
      }
    }
  }
  t.input_lengths.assign(t.requests(), 0);
  t.distinct_blocks = scan - 1000 + 40;
  return t;
}

double HitRatio(const Trace& t, PolicyKind kind, uint64_t capacity,
                PolicyOptions options = PolicyOptions()) {
  auto p = MakeEvictionPolicy(kind, capacity, options);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  auto r = SimulatePolicy(t, **p, capacity);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r->hit_ratio();
}

TEST(AdaptivePolicyTest, FollowsTheCandidateThatHitsMost) {
  const Trace t = ScanTrace();
  const double lru = HitRatio(t, PolicyKind::kLru, 50);
  const double wtlfu = HitRatio(t, PolicyKind::kWTinyLfu, 50);
  const double credit = HitRatio(t, PolicyKind::kCreditLru, 50);
  ASSERT_GT(wtlfu, 2 * lru + 0.05) << "the trace must separate the candidates";
  auto made = AdaptivePolicy::Create(50, PolicyOptions());
  ASSERT_TRUE(made.ok());
  AdaptivePolicy& adaptive = **made;
  EXPECT_EQ(adaptive.leader(), PolicyKind::kCreditLru) << "the first candidate leads at start";
  auto r = SimulatePolicy(t, adaptive, 50);
  ASSERT_TRUE(r.ok());
  EXPECT_NE(adaptive.leader(), PolicyKind::kLru);
  EXPECT_GE(adaptive.switches(), 1u);
  EXPECT_GE(r->hit_ratio(), 0.9 * std::max(wtlfu, credit))
      << "adaptive " << r->hit_ratio() << " w-tinylfu " << wtlfu << " credit-lru " << credit;
}

// On a trace where recency is all (a loop that fits), it keeps the first candidate and loses
// nothing.
TEST(AdaptivePolicyTest, StaysPutWhenNothingIsBetter) {
  Trace t;
  for (int round = 0; round < 50; ++round) {
    for (uint64_t b = 0; b < 30; ++b) t.ids.push_back(b);
    t.request_ends.push_back(t.ids.size());
  }
  t.input_lengths.assign(t.requests(), 0);
  t.distinct_blocks = 30;
  auto made = AdaptivePolicy::Create(40, PolicyOptions());
  ASSERT_TRUE(made.ok());
  auto r = SimulatePolicy(t, **made, 40);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*made)->switches(), 0u);
  EXPECT_DOUBLE_EQ(r->hit_ratio(), 49.0 / 50);
}

TEST(AdaptivePolicyTest, RefusesBadSettingsNamingThem) {
  PolicyOptions o;
  o.adaptive.half_life = 0;
  auto made = MakeEvictionPolicy(PolicyKind::kAdaptive, 10, o);
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.status().message().find("adaptive.half_life = 0"), std::string::npos)
      << made.status().message();
  AdaptiveConfig c;
  EXPECT_FALSE(c.Set("hysteresis", -1).ok());
  EXPECT_FALSE(c.Set("half_lives", 1).ok());
  EXPECT_EQ(c, AdaptiveConfig()) << "a refused setting changes nothing";
  EXPECT_TRUE(c.Set("hysteresis", 0.5).ok());
  EXPECT_EQ(c.hysteresis, 0.5);
  o = PolicyOptions();
  o.credit_lru.stale_tail = 1e9;
  made = MakeEvictionPolicy(PolicyKind::kAdaptive, 10, o);
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.status().message().find("candidate credit-lru"), std::string::npos)
      << made.status().message();
}

}  // namespace
}  // namespace kvtier

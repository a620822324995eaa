// HitDensityPolicy: learned hit densities on a hand-made reference string with its exact
// victims, the lineage-aware fallback, the ghost-remembered use counts and the settings.
#include "index/hit_density_policy.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "index/adaptive_policy.h"
#include "index/eviction_policy.h"
#include "policy_test_util.h"

namespace kvtier {
namespace {

using policy_test::Mix;

// Block `c`, round `r`: a spread key named by a letter (and a round) for the reader.
BlockKey K(char c, uint64_t r = 0) {
  const uint64_t id = 1000 * r + uint64_t(c);
  return BlockKey{Mix(2 * id), Mix(2 * id + 1)};
}
const BlockKey kRoot = BlockKey{1, 1};
bool Any(const BlockKey&) { return true; }

std::unique_ptr<HitDensityPolicy> Make(size_t capacity, HitDensityConfig config) {
  auto made = HitDensityPolicy::Create(capacity, config);
  EXPECT_TRUE(made.ok()) << made.status().ToString();
  return std::move(made).value();
}

// Capacity 4: a refresh every 16 ticks, age buckets of one tick. Only the "ended its request"
// feature, so there are two classes: N (a block the next reference continued) and E (a block
// that ended its request). A block's age is the number of ticks since its last reference; a hit
// is counted at the age the block had just before it.
//
// Training, 5 rounds of 5 ticks: P (a prompt's first block), Q under it, R (another request), Q
// removed, S, P hit at age 3, then R, S and P removed. Per round N sees a hit at age 3 and an
// eviction at age 0; E evictions at ages 1, 2 and 1, and no hit. The refresh at tick 16 (round
// 3's first insert) has seen 3 rounds, so:
//   N: density(0) = 3 / (3 x 4 + 3 x 1) = 0.2, density(1) = 3/9, (2) = 3/6, (3) = 3/3 = 1,
//      and 0 from age 4 (no N block was ever hit that old);
//   E: 0 at every age.
// Then, at ticks 26-30: A, B under A, C: B (E, the oldest leaf) goes; D: C has just become E
// and goes before the older A, which lineage-aware LRU would evict; then D (N, age 0, 0.2) goes
// before A (N, age 3: the age at which its class is hit, density 1). Once A is older than any N
// hit seen (age 4), it goes first.
TEST(HitDensityPolicyTest, ExactVictimsOnAReferenceString) {
  HitDensityConfig config;
  config.features = HitDensityConfig::kEnded;
  auto p = Make(4, config);
  EXPECT_EQ(p->refresh_period(), 16u);
  EXPECT_EQ(p->age_width(), 1u);
  for (uint64_t r = 0; r < 5; ++r) {
    p->OnInsert(K('P', r), kRoot);
    p->OnInsert(K('Q', r), K('P', r));
    p->OnInsert(K('R', r), kRoot);
    p->OnRemove(K('Q', r));
    p->OnInsert(K('S', r), kRoot);
    p->OnAccess(K('P', r));
    p->OnRemove(K('R', r));
    p->OnRemove(K('S', r));
    p->OnRemove(K('P', r));
  }
  ASSERT_EQ(p->size(), 0u);

  p->OnInsert(K('A'), kRoot);  // tick 26
  p->OnInsert(K('B'), K('A'));
  p->OnInsert(K('C'), kRoot);  // B ended its request
  EXPECT_EQ(p->DensityOf(K('B')), 0.0);
  EXPECT_NEAR(p->DensityOf(K('C')), 0.2, 1e-12);
  EXPECT_EQ(p->Victim(Any), K('B'));
  p->OnRemove(K('B'));  // A is a leaf now, of class N

  p->OnInsert(K('D'), kRoot);  // tick 29: C ended its request
  EXPECT_NEAR(p->DensityOf(K('A')), 1.0, 1e-12);
  EXPECT_EQ(p->DensityOf(K('C')), 0.0);
  EXPECT_EQ(p->Victim(Any), K('C')) << "lineage-aware LRU would evict the older A";
  p->OnRemove(K('C'));
  EXPECT_EQ(p->Victim(Any), K('D')) << "A is at the age its class is hit";

  p->OnInsert(K('E'), kRoot);  // tick 30: A is 4 ticks old, older than any N hit
  EXPECT_EQ(p->DensityOf(K('A')), 0.0);
  EXPECT_EQ(p->DensityOf(K('D')), 0.0) << "D ended its request";
  EXPECT_EQ(p->Victim(Any), K('A')) << "a tie at 0: the older first";
}

// Before the first refresh every density is 0: the policy is LRU over leaves, and never names
// an inner block while a leaf may go.
TEST(HitDensityPolicyTest, StartsAsLineageAwareLru) {
  HitDensityPolicy p(100);
  p.OnInsert(K('A'), kRoot);
  p.OnInsert(K('B'), K('A'));
  p.OnInsert(K('C'), K('B'));
  p.OnInsert(K('X'), kRoot);
  p.OnAccess(K('A'));
  EXPECT_EQ(p.Victim(Any), K('C')) << "the oldest leaf; A and B are inner";
  p.OnRemove(K('C'));
  EXPECT_EQ(p.Victim(Any), K('B'));
  p.OnRemove(K('B'));
  EXPECT_EQ(p.Victim(Any), K('X')) << "A was used after X";
}

// When every leaf is pinned, the least recently used evictable inner block goes: the tier never
// jams. Removing it leaves its children tracked.
TEST(HitDensityPolicyTest, FallsBackToInnerBlocksWhenEveryLeafIsPinned) {
  HitDensityPolicy p(8);
  p.OnInsert(K('A'), kRoot);
  p.OnInsert(K('B'), K('A'));
  p.OnInsert(K('C'), K('B'));
  p.OnInsert(K('D'), kRoot);
  p.OnInsert(K('E'), K('D'));
  p.OnAccess(K('A'));
  const std::set<BlockKey> leaves = {K('C'), K('E')};
  int asked_leaves = 0;
  auto inner_only = [&](const BlockKey& k) {
    if (leaves.contains(k)) ++asked_leaves;
    return !leaves.contains(k);
  };
  EXPECT_EQ(p.Victim(inner_only), K('B')) << "B is the least recently used inner block";
  EXPECT_EQ(asked_leaves, 2);
  p.OnRemove(K('B'));
  EXPECT_TRUE(p.Contains(K('C')));
  EXPECT_EQ(p.Victim(inner_only), K('A')) << "A has no tracked child left: a leaf now";
  p.OnRemove(K('A'));
  EXPECT_EQ(p.Victim(inner_only), K('D'));
  auto none = [](const BlockKey&) { return false; };
  EXPECT_EQ(p.Victim(none), std::nullopt);
  EXPECT_EQ(p.size(), 3u);
}

// With more leaves than samples, a sampled victim is still never a refused block, and when every
// sample is refused the whole set is ranked.
TEST(HitDensityPolicyTest, SampledVictimIsAlwaysEvictable) {
  HitDensityConfig config;
  config.samples = 2;
  auto p = Make(64, config);
  for (uint64_t i = 0; i < 50; ++i) p->OnInsert(K('L', i), kRoot);
  const BlockKey only = K('L', 37);
  auto just_one = [&](const BlockKey& k) { return k == only; };
  for (int i = 0; i < 10; ++i) EXPECT_EQ(p->Victim(just_one), only);
  for (int i = 0; i < 20; ++i) {
    std::optional<BlockKey> v = p->Victim(Any);
    ASSERT_TRUE(v.has_value());
    EXPECT_TRUE(p->Contains(*v));
  }
}

// Use counts survive an eviction through the ghost table and select the class.
TEST(HitDensityPolicyTest, GhostRemembersUseCounts) {
  HitDensityPolicy p(4);
  p.OnInsert(K('A'), kRoot);
  p.OnAccess(K('A'));
  const size_t used_twice = p.ClassOf(K('A'));
  p.OnRemove(K('A'));
  EXPECT_EQ(p.Uses(K('A')), 2u);
  EXPECT_EQ(p.ghost_size(), 1u);
  p.OnInsert(K('A'), kRoot);
  EXPECT_EQ(p.Uses(K('A')), 3u);
  EXPECT_NE(p.ClassOf(K('A')), used_twice);
  EXPECT_EQ(p.ghost_size(), 0u);
  EXPECT_EQ(p.ClassOf(K('Z')), HitDensityPolicy::kClasses);

  HitDensityConfig no_ghost;
  no_ghost.ghost_factor = 0;
  auto q = Make(4, no_ghost);
  q->OnInsert(K('A'), kRoot);
  q->OnAccess(K('A'));
  q->OnRemove(K('A'));
  q->OnInsert(K('A'), kRoot);
  EXPECT_EQ(q->Uses(K('A')), 1u);
}

TEST(HitDensityConfigTest, ValidatesEveryField) {
  EXPECT_TRUE(HitDensityConfig().Validate().ok());
  HitDensityConfig c;
  EXPECT_TRUE(c.Set("decay", 0.5).ok());
  EXPECT_EQ(c.decay, 0.5);
  for (auto [name, value] : {std::pair{"decay", 1.0}, std::pair{"refresh", 0.0},
                             std::pair{"samples", 2.5}, std::pair{"features", 16.0},
                             std::pair{"ghost_factor", -1.0}, std::pair{"max_age", 2000.0}}) {
    Status s = c.Set(name, value);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << name;
    EXPECT_NE(s.message().find(std::string("hit_density.") + name), std::string::npos)
        << s.message();
  }
  EXPECT_EQ(c.decay, 0.5) << "a refused value leaves the config as it was";
  Status unknown = c.Set("half_life", 1);
  EXPECT_NE(unknown.message().find("samples"), std::string::npos) << unknown.message();

  PolicyOptions options;
  options.hit_density.samples = 0;
  auto refused = MakeEvictionPolicy(PolicyKind::kHitDensity, 8, options);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  auto made = MakeEvictionPolicy(PolicyKind::kHitDensity, 8);
  ASSERT_TRUE(made.ok());
  EXPECT_EQ((*made)->kind(), PolicyKind::kHitDensity);
}

// adaptive takes hit-density as a fifth candidate when asked, and keeps the contract with it.
TEST(HitDensityPolicyTest, IsACandidateOfAdaptiveWhenAsked) {
  PolicyOptions options;
  ASSERT_TRUE(options.adaptive.Set("with_hit_density", 1).ok());
  EXPECT_EQ(options.adaptive.Set("with_hit_density", 0.5).code(), StatusCode::kInvalidArgument);
  auto made = AdaptivePolicy::Create(8, options);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  AdaptivePolicy& adaptive = **made;
  ASSERT_EQ(adaptive.candidates().size(), AdaptivePolicy::kNumCandidates + 1);
  EXPECT_EQ(adaptive.candidates().back(), PolicyKind::kHitDensity);
  for (uint64_t i = 0; i < 200; ++i) {
    const BlockKey key = K('X', i % 23);
    if (adaptive.Contains(key)) {
      adaptive.OnAccess(key);
      continue;
    }
    if (adaptive.size() >= 8) {
      std::optional<BlockKey> v = adaptive.Victim(Any);
      ASSERT_TRUE(v.has_value());
      ASSERT_TRUE(adaptive.Contains(*v));
      adaptive.OnRemove(*v);
    }
    adaptive.OnInsert(key, kRoot);
  }
  EXPECT_EQ(adaptive.size(), 8u);
  auto plain = AdaptivePolicy::Create(8, PolicyOptions());
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)->candidates().size(), AdaptivePolicy::kNumCandidates);
}

}  // namespace
}  // namespace kvtier

#include "index/credit_lru_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

namespace kvtier {
namespace {

using Predicate = EvictionPolicy::EvictablePredicate;
using Config = CreditLruPolicy::Config;

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Block `i`, a uniformly spread key named by a small number.
BlockKey K(uint64_t i) { return BlockKey{SplitMix64(2 * i), SplitMix64(2 * i + 1)}; }
const BlockKey kRoot = K(999'999);

bool Any(const BlockKey&) { return true; }
bool None(const BlockKey&) { return false; }

// A configuration with every credit 0: plain lineage-aware LRU, so that a test can switch on
// the one credit it is about.
Config NoCredits() {
  Config c;
  c.used_twice = 0;
  c.used_thrice = 0;
  c.long_follow_up = 0;
  c.stale_tail = 0;
  return c;
}

std::unique_ptr<CreditLruPolicy> Make(size_t capacity, const Config& config) {
  auto policy = CreditLruPolicy::Create(capacity, config);
  EXPECT_TRUE(policy.ok()) << policy.status().ToString();
  return std::move(policy).value();
}

// Evicts until empty and returns the order.
std::vector<BlockKey> DrainOrder(EvictionPolicy& policy) {
  std::vector<BlockKey> order;
  while (auto v = policy.Victim(Any)) {
    order.push_back(*v);
    policy.OnRemove(*v);
  }
  return order;
}

TEST(CreditLruPolicyTest, IsBuiltByTheFactoryByName) {
  auto kind = ParsePolicyKind("credit-lru");
  ASSERT_TRUE(kind.ok());
  EXPECT_EQ(*kind, PolicyKind::kCreditLru);
  EXPECT_STREQ(PolicyKindName(PolicyKind::kCreditLru), "credit-lru");
  auto policy = MakeEvictionPolicy(PolicyKind::kCreditLru, 8);
  ASSERT_TRUE(policy.ok());
  EXPECT_EQ((*policy)->kind(), PolicyKind::kCreditLru);
}

TEST(CreditLruPolicyTest, DefaultsValidateAndBadValuesAreNamed) {
  EXPECT_TRUE(Config().Validate().ok());
  struct Case {
    double Config::*field;
    double value;
    const char* name;
  };
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Case cases[] = {
      {&Config::used_twice, nan, "used_twice"},         {&Config::used_thrice, inf, "used_thrice"},
      {&Config::long_follow_up, -65, "long_follow_up"}, {&Config::stale_tail, 65, "stale_tail"},
      {&Config::ghost_factor, -1, "ghost_factor"},      {&Config::ghost_factor, 65, "ghost_factor"},
      {&Config::ghost_factor, nan, "ghost_factor"},
  };
  for (const Case& c : cases) {
    Config config;
    config.*c.field = c.value;
    Status s = config.Validate();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(s.message().find(c.name), std::string::npos) << s.message();
    EXPECT_FALSE(CreditLruPolicy::Create(8, config).ok()) << c.name;
  }
}

// With no credits it is lineage-aware LRU: leaves first, oldest first, parents after children.
TEST(CreditLruPolicyTest, WithoutCreditsLeavesGoOldestFirstBeforeTheirParents) {
  auto p = Make(100, NoCredits());
  p->OnInsert(K(1), kRoot);
  p->OnInsert(K(2), K(1));
  p->OnInsert(K(3), K(2));
  p->OnInsert(K(4), kRoot);
  p->OnAccess(K(1));  // a parent's use does not make it go before its children
  EXPECT_EQ(DrainOrder(*p), (std::vector<BlockKey>{K(3), K(2), K(4), K(1)}));
}

// A block used twice ranks as if used used_twice x capacity ticks later: with 100 slots and a
// credit of 0.5, u (used at tick 2) ranks at 52, after the one-offs inserted at ticks 3..51 and
// before those inserted after tick 52 (the one inserted at 52 ties, broken by key).
TEST(CreditLruPolicyTest, AUsedBlockOutlivesNewerOneOffsByItsCredit) {
  Config c = NoCredits();
  c.used_twice = 0.5;
  auto p = Make(100, c);
  p->OnInsert(K(0), kRoot);                                     // tick 1
  p->OnAccess(K(0));                                            // tick 2: uses 2, score 2 + 50
  for (uint64_t i = 1; i <= 60; ++i) p->OnInsert(K(i), kRoot);  // K(i) at tick i + 2
  EXPECT_DOUBLE_EQ(p->CreditOf(K(0)), 0.5);
  EXPECT_DOUBLE_EQ(p->CreditOf(K(1)), 0.0);
  std::vector<BlockKey> order = DrainOrder(*p);
  ASSERT_EQ(order.size(), 61u);
  auto at = [&](uint64_t i) { return std::find(order.begin(), order.end(), K(i)) - order.begin(); };
  EXPECT_EQ(at(49), 48);
  EXPECT_GT(at(0), at(49));
  EXPECT_LT(at(0), at(51));
  EXPECT_EQ(at(51), 51);
}

TEST(CreditLruPolicyTest, ThreeUsesEarnTheLargerCredit) {
  Config c = NoCredits();
  c.used_twice = 0.25;
  c.used_thrice = 0.75;
  auto p = Make(100, c);
  p->OnInsert(K(1), kRoot);
  EXPECT_EQ(p->Uses(K(1)), 1u);
  p->OnAccess(K(1));
  EXPECT_EQ(p->Uses(K(1)), 2u);
  EXPECT_DOUBLE_EQ(p->CreditOf(K(1)), 0.25);
  p->OnAccess(K(1));
  p->OnAccess(K(1));
  EXPECT_EQ(p->Uses(K(1)), 4u);
  EXPECT_DOUBLE_EQ(p->CreditOf(K(1)), 0.75);
}

TEST(CreditLruPolicyTest, UsesSurviveAnEvictionInTheGhost) {
  Config c = NoCredits();
  c.used_twice = 0.25;
  c.used_thrice = 0.75;
  auto p = Make(10, c);
  p->OnInsert(K(1), kRoot);
  p->OnAccess(K(1));
  p->OnRemove(K(1));
  EXPECT_FALSE(p->Contains(K(1)));
  EXPECT_TRUE(p->InGhost(K(1)));
  EXPECT_EQ(p->Uses(K(1)), 2u);
  p->OnInsert(K(1), kRoot);  // it came back: a third use
  EXPECT_FALSE(p->InGhost(K(1)));
  EXPECT_EQ(p->Uses(K(1)), 3u);
  EXPECT_DOUBLE_EQ(p->CreditOf(K(1)), 0.75);
}

TEST(CreditLruPolicyTest, GhostForgetsTheOldestBeyondItsCapacity) {
  Config c = NoCredits();
  c.ghost_factor = 0.5;
  auto p = Make(10, c);  // ghost of 5 keys
  EXPECT_EQ(p->ghost_capacity(), 5u);
  for (uint64_t i = 1; i <= 8; ++i) {
    p->OnInsert(K(i), kRoot);
    p->OnRemove(K(i));
  }
  EXPECT_EQ(p->ghost_size(), 5u);
  for (uint64_t i = 1; i <= 3; ++i) EXPECT_FALSE(p->InGhost(K(i))) << i;
  for (uint64_t i = 4; i <= 8; ++i) EXPECT_TRUE(p->InGhost(K(i))) << i;
  // A key that comes back and leaves again is remembered once, at its new place.
  p->OnInsert(K(4), kRoot);
  p->OnRemove(K(4));
  for (uint64_t i = 9; i <= 12; ++i) {
    p->OnInsert(K(i), kRoot);
    p->OnRemove(K(i));
  }
  EXPECT_TRUE(p->InGhost(K(4)));
  EXPECT_FALSE(p->InGhost(K(5)));
  EXPECT_LE(p->ghost_size(), 5u);

  Config off = NoCredits();
  off.ghost_factor = 0;
  auto q = Make(10, off);
  q->OnInsert(K(1), kRoot);
  q->OnAccess(K(1));
  q->OnRemove(K(1));
  EXPECT_FALSE(q->InGhost(K(1)));
  q->OnInsert(K(1), kRoot);
  EXPECT_EQ(q->Uses(K(1)), 1u);
}

// The last block a run stored, never used since, goes before older blocks.
TEST(CreditLruPolicyTest, AStaleTailGoesFirst) {
  Config c = NoCredits();
  c.stale_tail = -1.0;
  auto p = Make(100, c);
  p->OnInsert(K(9), kRoot);  // an old one-block run...
  p->OnAccess(K(9));         // ...used again: not stale
  p->OnInsert(K(1), kRoot);  // a run 1 -> 2 -> 3: 3 is its stale tail
  p->OnInsert(K(2), K(1));
  p->OnInsert(K(3), K(2));
  EXPECT_DOUBLE_EQ(p->CreditOf(K(3)), -1.0);
  EXPECT_DOUBLE_EQ(p->CreditOf(K(2)), 0.0);
  EXPECT_DOUBLE_EQ(p->CreditOf(K(9)), 0.0);
  EXPECT_EQ(p->Victim(Any), K(3));
  // A follow-up turn (a new run under 2) supersedes 3, which stays stale.
  p->OnInsert(K(4), K(2));
  EXPECT_DOUBLE_EQ(p->CreditOf(K(3)), -1.0);
  EXPECT_EQ(p->Victim(Any), K(3));
  // Once used, a tail is no longer stale; the oldest leaf is 9 again.
  p->OnAccess(K(3));
  p->OnAccess(K(4));
  EXPECT_DOUBLE_EQ(p->CreditOf(K(3)), 0.0);
  EXPECT_EQ(p->Victim(Any), K(9));
}

// A run of kLongRun blocks stored behind a hit deeper than the first block (a follow-up turn)
// earns long_follow_up; the same run under a first block (a new conversation) does not.
TEST(CreditLruPolicyTest, LongFollowUpRunsEarnTheirCredit) {
  constexpr uint64_t n = CreditLruPolicy::kLongRun;
  Config c = NoCredits();
  c.long_follow_up = -0.5;
  auto p = Make(1000, c);
  // A first turn: 1 (the system prompt, depth 0) -> 2 -> 3 (its partial last block).
  p->OnInsert(K(1), kRoot);
  p->OnInsert(K(2), K(1));
  p->OnInsert(K(3), K(2));
  // A follow-up turn hits 1 and 2 and stores n blocks 100.. under 2.
  BlockKey parent = K(2);
  for (uint64_t i = 0; i < n; ++i) {
    p->OnInsert(K(100 + i), parent);
    parent = K(100 + i);
  }
  // A new conversation hits 1 and stores n blocks 200.. under it.
  parent = K(1);
  for (uint64_t i = 0; i < n; ++i) {
    p->OnInsert(K(200 + i), parent);
    parent = K(200 + i);
  }
  // Another follow-up, one block short of kLongRun.
  parent = K(2);
  for (uint64_t i = 0; i + 1 < n; ++i) {
    p->OnInsert(K(300 + i), parent);
    parent = K(300 + i);
  }
  EXPECT_DOUBLE_EQ(p->CreditOf(K(100)), -0.5);
  EXPECT_DOUBLE_EQ(p->CreditOf(K(100 + n - 2)), -0.5);
  EXPECT_DOUBLE_EQ(p->CreditOf(K(200)), 0.0);
  EXPECT_DOUBLE_EQ(p->CreditOf(K(300)), 0.0);
  // Without their tails, the long follow-up's last block goes first although it is older than
  // the new conversation's.
  p->OnRemove(K(100 + n - 1));
  p->OnRemove(K(200 + n - 1));
  EXPECT_EQ(p->Victim(Any), K(100 + n - 2));
}

TEST(CreditLruPolicyTest, VictimSkipsPinnedBlocksAskingOncePerBlock) {
  auto p = Make(100, Config());
  for (uint64_t i = 1; i <= 5; ++i) p->OnInsert(K(i), kRoot);  // leaves, oldest first
  std::map<BlockKey, int> asked;
  const BlockKey want = K(4);
  auto v = p->Victim([&](const BlockKey& k) {
    ++asked[k];
    return k == want;
  });
  EXPECT_EQ(v, want);
  for (const auto& [k, n] : asked) EXPECT_EQ(n, 1);
  EXPECT_EQ(asked.size(), 4u);  // 1, 2, 3 refused, then 4
}

TEST(CreditLruPolicyTest, NeverJamsWhenEveryLeafIsPinned) {
  auto p = Make(100, Config());
  p->OnInsert(K(1), kRoot);
  p->OnInsert(K(2), K(1));
  p->OnInsert(K(3), kRoot);
  p->OnInsert(K(4), K(3));
  // Leaves 2 and 4 pinned: the least recently used inner block goes.
  std::set<BlockKey> pinned = {K(2), K(4)};
  auto unpinned = [&](const BlockKey& k) { return !pinned.contains(k); };
  EXPECT_EQ(p->Victim(unpinned), K(1));
  p->OnAccess(K(1));
  EXPECT_EQ(p->Victim(unpinned), K(3));
  p->OnRemove(K(3));  // removing an inner block keeps its child
  EXPECT_TRUE(p->Contains(K(4)));
  EXPECT_EQ(p->size(), 3u);
  EXPECT_EQ(p->Victim(None), std::nullopt);
  // 3 comes back after its child: it is inner again, so the leaf 4 goes before it.
  p->OnInsert(K(3), kRoot);
  auto order = DrainOrder(*p);
  EXPECT_LT(std::find(order.begin(), order.end(), K(4)),
            std::find(order.begin(), order.end(), K(3)));
  EXPECT_EQ(p->size(), 0u);
  EXPECT_EQ(p->Victim(Any), std::nullopt);
}

TEST(CreditLruPolicyTest, IgnoresASelfParentAndUnknownKeys) {
  auto p = Make(10, Config());
  p->OnInsert(K(1), K(1));
  EXPECT_EQ(p->Victim(Any), K(1));
  p->OnAccess(K(2));
  p->OnRemove(K(2));
  EXPECT_EQ(p->size(), 1u);
  EXPECT_EQ(p->Uses(K(2)), 0u);
  EXPECT_DOUBLE_EQ(p->CreditOf(K(2)), 0.0);
}

// A reference model of the structure: which keys are tracked, their parents, their children,
// and their last-use tick.
struct Model {
  struct Entry {
    BlockKey parent;
    uint64_t tick;
  };
  std::map<BlockKey, Entry> tracked;
  uint64_t tick = 0;

  int Children(const BlockKey& k) const {
    int n = 0;
    for (const auto& [key, e] : tracked) n += (e.parent == k && key != k);
    return n;
  }
};

// Random operations against the model. Checks after each Victim: the victim is tracked and
// evictable; it is a leaf whenever an evictable leaf exists (else the least recently used
// evictable inner block); nullopt only when nothing is evictable; `evictable` is asked at most
// once per key. With `check_scores`, also that the victim has the lowest tick + credit x
// capacity among evictable leaves (run lengths then never change a placed leaf's credit,
// because long_follow_up is 0).
void RandomOperations(const Config& config, bool check_scores, uint64_t seed) {
  constexpr size_t kCapacity = 8;
  auto p = Make(kCapacity, config);
  Model m;
  std::mt19937_64 rng(seed);
  auto random_key = [&] { return K(rng() % 40); };
  for (int step = 0; step < 20000; ++step) {
    const int op = static_cast<int>(rng() % 10);
    const BlockKey k = random_key();
    if (op < 4) {  // insert under a tracked key, an untracked one, or the root
      if (m.tracked.contains(k)) continue;
      BlockKey parent = kRoot;
      if (rng() % 3 != 0) parent = random_key();
      p->OnInsert(k, parent);
      m.tracked[k] = {parent, ++m.tick};
    } else if (op < 6) {
      p->OnAccess(k);
      if (auto it = m.tracked.find(k); it != m.tracked.end()) it->second.tick = ++m.tick;
    } else if (op < 7) {
      p->OnRemove(k);
      m.tracked.erase(k);
    } else {
      std::set<BlockKey> pinned;
      for (const auto& [key, e] : m.tracked) {
        if (rng() % 3 == 0) pinned.insert(key);
      }
      std::map<BlockKey, int> asked;
      auto v = p->Victim([&](const BlockKey& key) {
        ++asked[key];
        return !pinned.contains(key);
      });
      for (const auto& [key, n] : asked) ASSERT_EQ(n, 1) << "asked twice, step " << step;
      std::optional<std::pair<double, BlockKey>> best_leaf;
      std::optional<std::pair<uint64_t, BlockKey>> best_inner;
      for (const auto& [key, e] : m.tracked) {
        if (pinned.contains(key)) continue;
        if (m.Children(key) == 0) {
          const double score = static_cast<double>(e.tick) +
                               std::llround(p->CreditOf(key) * static_cast<double>(kCapacity));
          if (!best_leaf || std::pair{score, key} < *best_leaf) best_leaf = {score, key};
        } else if (!best_inner || std::pair{e.tick, key} < *best_inner) {
          best_inner = {e.tick, key};
        }
      }
      if (!best_leaf && !best_inner) {
        ASSERT_EQ(v, std::nullopt) << "step " << step;
        continue;
      }
      ASSERT_TRUE(v.has_value()) << "jammed at step " << step;
      ASSERT_TRUE(m.tracked.contains(*v));
      ASSERT_FALSE(pinned.contains(*v));
      if (best_leaf) {
        ASSERT_EQ(m.Children(*v), 0) << "an inner block went before a leaf, step " << step;
        if (check_scores) {
          ASSERT_EQ(*v, best_leaf->second) << "step " << step;
        }
      } else {
        ASSERT_EQ(*v, best_inner->second) << "step " << step;
      }
      if (rng() % 2 == 0) {
        p->OnRemove(*v);
        m.tracked.erase(*v);
      }
    }
    ASSERT_EQ(p->size(), m.tracked.size()) << "step " << step;
    for (uint64_t i = 0; i < 40; ++i) ASSERT_EQ(p->Contains(K(i)), m.tracked.contains(K(i)));
    ASSERT_LE(p->ghost_size(), p->ghost_capacity());
  }
}

TEST(CreditLruPolicyTest, RandomOperationsKeepTheInvariantsAndTheOrder) {
  Config c = Config();
  c.long_follow_up = 0;
  for (uint64_t seed : {1, 2, 3}) RandomOperations(c, /*check_scores=*/true, seed);
}

TEST(CreditLruPolicyTest, RandomOperationsKeepTheInvariantsWithTheDefaults) {
  for (uint64_t seed : {4, 5}) RandomOperations(Config(), /*check_scores=*/false, seed);
}

}  // namespace
}  // namespace kvtier

// credit-lru's settings from the config down to the eviction decision: CreditLruConfig and the
// config schema agree, MakeEvictionPolicy and BlockIndex apply PolicyOptions, and a manager
// built from a Config with g2.credit_lru.stale_tail = 0 keeps the block that the default evicts
// (the last full block of a conversation turn, which the next turn reuses).
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "index/block_index.h"
#include "index/credit_lru_policy.h"
#include "index/policy_names.h"
#include "kvtier/config.h"
#include "kvtier/connector.h"
#include "manager_test_util.h"

namespace kvtier {
namespace {

using testing::MiniEngine;
using testing::Prompt;
using testing::SmallConfig;
using testing::TestLayout;

BlockKey K(uint64_t i) { return BlockKey{i * 0x9e3779b97f4a7c15ull + 1, i}; }
const BlockKey kRoot = K(1'000'000);

PolicyOptions StaleTailZero() {
  PolicyOptions o;
  o.credit_lru.stale_tail = 0;
  return o;
}

// The keys take CreditLruConfig's defaults and ranges (index/policy_config_keys.cc): they must
// agree, field for field, and every field must have a key in both tiers.
TEST(PolicyOptionsTest, ConfigSchemaAgreesWithCreditLruConfig) {
  const CreditLruConfig defaults;
  const Config config;
  size_t keys = 0;
  for (const ConfigFieldSpec& spec : Config::Schema()) {
    for (const char* tier : {"g2", "g3"}) {
      const std::string prefix = std::string(tier) + ".credit_lru.";
      if (spec.name.rfind(prefix, 0) != 0) continue;
      ++keys;
      const std::string field = spec.name.substr(prefix.size());
      auto value = defaults.Get(field);
      ASSERT_TRUE(value.ok()) << spec.name << " names no CreditLruConfig field";
      EXPECT_EQ(spec.type, ConfigType::kDouble) << spec.name;
      EXPECT_EQ(config.GetDouble(spec.name), *value) << spec.name;
      const bool ghost = field == "ghost_factor";
      EXPECT_EQ(spec.real_min, ghost ? 0 : -CreditLruConfig::kMaxCredit) << spec.name;
      EXPECT_EQ(spec.real_max,
                ghost ? CreditLruConfig::kMaxGhostFactor : CreditLruConfig::kMaxCredit)
          << spec.name;
    }
  }
  EXPECT_EQ(keys, 2 * std::size(CreditLruConfig::kFieldNames));
}

// The same for adaptive's settings: gN.adaptive.half_life and gN.adaptive.hysteresis.
TEST(PolicyOptionsTest, ConfigSchemaAgreesWithAdaptiveConfig) {
  const AdaptiveConfig defaults;
  const Config config;
  size_t keys = 0;
  for (const char* tier : {"g2", "g3"}) {
    const std::string t(tier);
    EXPECT_EQ(config.GetDouble(t + ".adaptive.half_life"), defaults.half_life);
    EXPECT_EQ(config.GetDouble(t + ".adaptive.hysteresis"), defaults.hysteresis);
    for (const ConfigFieldSpec& spec : Config::Schema()) {
      if (spec.name.rfind(t + ".adaptive.", 0) != 0) continue;
      ++keys;
      EXPECT_EQ(spec.type, ConfigType::kDouble) << spec.name;
      const bool half_life = spec.name == t + ".adaptive.half_life";
      const bool flag = spec.name == t + ".adaptive.with_hit_density";
      EXPECT_EQ(spec.real_max, half_life ? 1024 : flag ? 1 : 10) << spec.name;
      EXPECT_GE(spec.real_min, 0) << spec.name;
      AdaptiveConfig at_min;
      EXPECT_TRUE(at_min.Set(spec.name.substr(t.size() + 10), spec.real_min).ok())
          << spec.name << ": the schema's minimum must validate";
    }
  }
  EXPECT_EQ(keys, 2 * std::size(AdaptiveConfig::kFieldNames));
}

// A manager with g2.policy = adaptive takes its settings from the config; a value outside the
// range is refused by the config, naming the key.
TEST(PolicyOptionsTest, ManagerTakesAdaptiveSettingsFromItsConfig) {
  Config config = SmallConfig("", 8, 0);
  ASSERT_TRUE(config.Set("g2.policy", "adaptive").ok());
  ASSERT_TRUE(config.Set("g2.adaptive.half_life", "4").ok());
  ASSERT_TRUE(config.Set("g2.adaptive.hysteresis", "0.5").ok());
  ManagerOptions o = testing::TestManagerOptions(config);
  auto made = BlockManager::Create(o);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Status zero = config.Set("g2.adaptive.half_life", "0");
  EXPECT_EQ(zero.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(zero.message().find("g2.adaptive.half_life"), std::string::npos) << zero.message();
  Status big = config.Set("g3.adaptive.hysteresis", "11");
  EXPECT_EQ(big.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(big.message().find("g3.adaptive.hysteresis"), std::string::npos) << big.message();
  // In the schema's range but not a value AdaptiveConfig takes: Create names the key.
  ASSERT_TRUE(config.Set("g2.adaptive.with_hit_density", "0.5").ok());
  o.config = config;
  auto refused = BlockManager::Create(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("g2.adaptive.with_hit_density"), std::string::npos)
      << refused.status().message();
}

TEST(PolicyOptionsTest, CreditLruConfigGetAndSetByName) {
  CreditLruConfig c;
  for (const char* field : CreditLruConfig::kFieldNames) {
    ASSERT_TRUE(c.Set(field, 0.125).ok()) << field;
    EXPECT_EQ(*c.Get(field), 0.125) << field;
  }
  EXPECT_EQ(c.used_twice, 0.125);
  EXPECT_EQ(c.ghost_factor, 0.125);
  Status unknown = c.Set("stale_tails", 0);
  EXPECT_EQ(unknown.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.message().find("'stale_tails'"), std::string::npos) << unknown.message();
  EXPECT_NE(unknown.message().find("used_twice, used_thrice, long_follow_up, stale_tail, "
                                   "ghost_factor"),
            std::string::npos)
      << unknown.message();
  EXPECT_FALSE(c.Get("nope").ok());
  EXPECT_EQ(c.stale_tail, 0.125) << "a refused Set changes nothing";
}

TEST(PolicyOptionsTest, ValidateNamesFieldValueAndRange) {
  CreditLruConfig c;
  c.stale_tail = std::numeric_limits<double>::quiet_NaN();
  Status s = c.Validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "credit_lru.stale_tail = nan: must be a finite number in [-64, 64]");
  c = CreditLruConfig();
  c.ghost_factor = 64.5;
  EXPECT_EQ(c.Validate().message(),
            "credit_lru.ghost_factor = 64.5: must be a finite number in [0, 64]");
}

TEST(PolicyOptionsTest, MakeEvictionPolicyAppliesTheCreditLruOptions) {
  auto with_default = MakeEvictionPolicy(PolicyKind::kCreditLru, 8);
  auto with_zero = MakeEvictionPolicy(PolicyKind::kCreditLru, 8, StaleTailZero());
  ASSERT_TRUE(with_default.ok() && with_zero.ok());
  for (auto* p : {&*with_default, &*with_zero}) {
    (*p)->OnInsert(K(1), kRoot);
    (*p)->OnInsert(K(2), K(1));  // the run's last block, never used: a stale tail
  }
  auto* d = dynamic_cast<CreditLruPolicy*>(with_default->get());
  auto* z = dynamic_cast<CreditLruPolicy*>(with_zero->get());
  ASSERT_NE(d, nullptr);
  ASSERT_NE(z, nullptr);
  EXPECT_EQ(d->CreditOf(K(2)), -1.0);
  EXPECT_EQ(z->CreditOf(K(2)), 0.0);

  PolicyOptions bad;
  bad.credit_lru.used_thrice = std::numeric_limits<double>::infinity();
  auto refused = MakeEvictionPolicy(PolicyKind::kCreditLru, 8, bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("credit_lru.used_thrice = inf"), std::string::npos)
      << refused.status().message();
  // Other kinds ignore credit-lru's options, valid or not.
  for (PolicyKind kind :
       {PolicyKind::kLru, PolicyKind::kArc, PolicyKind::kWTinyLfu, PolicyKind::kHitDensity}) {
    EXPECT_TRUE(MakeEvictionPolicy(kind, 8, bad).ok()) << PolicyKindName(kind);
  }
}

TEST(PolicyOptionsTest, BlockIndexValidatesTheOptionsOfCreditLruTiersOnly) {
  BlockIndex::Config cfg;
  cfg.tiers[kTierG3].options.credit_lru.long_follow_up = -65;
  auto refused = BlockIndex::Create(cfg);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find(std::string("index tier ") + TierName(kTierG3)),
            std::string::npos)
      << refused.status().message();
  EXPECT_NE(refused.status().message().find("credit_lru.long_follow_up = -65"), std::string::npos)
      << refused.status().message();
  cfg.tiers[kTierG3].policy = PolicyKind::kLru;
  EXPECT_TRUE(BlockIndex::Create(cfg).ok()) << "an lru tier does not use them";
}

// The reference string, on an 8-block tier:
//   x (an unrelated block) is stored and used once more: uses 2, credit used_twice.
//   A conversation turn stores its 7 full blocks c1..c7; c7, its last, is a stale tail.
//   The tier is full; the next block needs a victim.
// Default (stale_tail = -1): c7 ranks 9 - 8 = 1, x ranks 2 + 0.75 x 8 = 8: c7 goes, and the next
// turn, which reuses all 7 blocks, matches 6. With stale_tail = 0, c7 ranks 9: x goes, and the
// next turn matches all 7.
struct Outcome {
  BlockKey victim;
  size_t next_turn_match = 0;
};

Outcome RunReferenceString(const PolicyOptions& options) {
  BlockIndex::Config cfg;
  cfg.num_shards = 8;
  cfg.tiers[kTierG2].capacity_blocks = 8;
  cfg.tiers[kTierG2].options = options;
  auto index = std::move(BlockIndex::Create(cfg)).value();
  const BlockKey x = K(100);
  EXPECT_TRUE(index->Insert(x, kRoot, kTierG2, 0).ok());
  index->Touch(std::vector<BlockKey>{x});
  std::vector<BlockKey> turn;
  BlockKey parent = kRoot;
  for (uint32_t i = 1; i <= 7; ++i) {
    turn.push_back(K(i));
    EXPECT_TRUE(index->Insert(turn.back(), parent, kTierG2, i).ok());
    parent = turn.back();
  }
  EXPECT_EQ(index->TierCount(kTierG2), 8u);
  std::optional<EvictedBlock> victim = index->EvictOne(kTierG2);
  EXPECT_TRUE(victim.has_value());
  turn.push_back(K(8));  // the next turn: the 7 blocks, then new text
  return Outcome{victim ? victim->key : BlockKey{}, index->Match(turn).num_blocks()};
}

TEST(PolicyOptionsTest, BlockIndexWithStaleTailZeroKeepsTheTailTheNextTurnReuses) {
  const Outcome by_default = RunReferenceString(PolicyOptions());
  EXPECT_EQ(by_default.victim, K(7)) << "the default evicts the turn's last block";
  EXPECT_EQ(by_default.next_turn_match, 6u);
  const Outcome zero = RunReferenceString(StaleTailZero());
  EXPECT_EQ(zero.victim, K(100)) << "stale_tail = 0 evicts the older block instead";
  EXPECT_EQ(zero.next_turn_match, 7u);
}

// The same reference string through a real BlockManager whose only difference is
// g2.credit_lru.stale_tail in its Config: 8 G2 slots, no G3, one copy thread (saves land in
// commit order, so the ticks are those of the index test).
struct ManagerOutcome {
  std::vector<BlockKey> removed;
  uint32_t next_turn_offered = 0;
};

ManagerOutcome RunManager(const std::string& stale_tail) {
  Config config = SmallConfig("", 8, 0);
  EXPECT_TRUE(config.Set("transfer.copy_threads", "1").ok());
  if (!stale_tail.empty()) {
    EXPECT_TRUE(config.Set("g2.credit_lru.stale_tail", stale_tail).ok());
  }
  std::unique_ptr<BlockManager> mgr = testing::MakeTestManager(config);
  if (mgr == nullptr) return {};
  ManagerOutcome out;
  std::mutex mu;
  mgr->SubscribeEvents([&](std::span<const KvEvent> events) {
    std::lock_guard<std::mutex> lock(mu);
    for (const KvEvent& e : events) {
      if (e.kind == KvEvent::Kind::kRemoved) out.removed.push_back(e.key);
    }
  });
  const uint32_t tpb = TestLayout().tokens_per_block;
  MiniEngine engine(mgr.get(), 64);
  const auto x = Prompt(1, tpb + 1);
  engine.Run("x", x);                                      // stores x
  EXPECT_EQ(engine.Run("x again", x).loaded_tokens, tpb);  // uses x once more
  engine.Run("turn 1", Prompt(2, 7 * tpb + 1));            // stores c1..c7: G2 is full
  engine.Run("other", Prompt(3, tpb + 1));                 // needs a slot: one block goes
  const auto next_turn = Prompt(2, 8 * tpb + 1);           // turn 2 repeats turn 1 and adds a block
  out.next_turn_offered = engine.Run("turn 2", next_turn).offered_tokens;
  mgr.reset();
  // Only the first removal is the reference string's eviction; turn 2's saves evict more.
  out.removed.resize(std::min<size_t>(out.removed.size(), 1));
  const auto turn_keys = engine.Keys(Prompt(2, 7 * tpb + 1));
  const auto x_keys = engine.Keys(x);
  for (BlockKey& k : out.removed) {
    if (k == turn_keys.back()) k = K(7);  // name the victim as the index test does
    if (k == x_keys.front()) k = K(100);
  }
  return out;
}

TEST(PolicyOptionsTest, ManagerTakesStaleTailFromItsConfig) {
  const uint32_t tpb = TestLayout().tokens_per_block;
  const ManagerOutcome by_default = RunManager("");
  ASSERT_EQ(by_default.removed.size(), 1u);
  EXPECT_EQ(by_default.removed[0], K(7)) << "default: the turn's last block was evicted";
  EXPECT_EQ(by_default.next_turn_offered, 6 * tpb);

  const ManagerOutcome zero = RunManager("0");
  ASSERT_EQ(zero.removed.size(), 1u);
  EXPECT_EQ(zero.removed[0], K(100)) << "stale_tail = 0: x was evicted instead";
  EXPECT_EQ(zero.next_turn_offered, 7 * tpb) << "turn 2 finds all of turn 1";
}

TEST(PolicyOptionsTest, ManagerWarnsWhenCreditLruSettingsCannotApply) {
  Config config = SmallConfig("", 8, 0);
  ASSERT_TRUE(config.Set("g2.policy", "lru").ok());
  ASSERT_TRUE(config.Set("g2.credit_lru.stale_tail", "0").ok());
  ManagerOptions o = testing::TestManagerOptions(config);
  ::testing::internal::CaptureStderr();
  auto made = BlockManager::Create(o);
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(made.ok()) << "a warning, not an error: " << made.status().ToString();
  EXPECT_NE(err.find("WARN"), std::string::npos) << err;
  EXPECT_NE(err.find("g2.credit_lru.stale_tail = 0 (from set) has no effect: g2.policy = "
                     "lru"),
            std::string::npos)
      << err;
}

// The manager refuses a lab policy (docs/policies.md) even in a config that holds one (a lab
// process accepts their names): without the lab linked and enabled, it cannot build one.
TEST(PolicyOptionsTest, ManagerRefusesALabPolicy) {
  Config config = SmallConfig("", 8, 0);
  SetLabPolicyNamesAccepted(true);  // as EnableLabPolicies does; this binary has no lab
  const Status set = config.Set("g3.policy", "s3fifo");
  SetLabPolicyNamesAccepted(false);
  ASSERT_TRUE(set.ok()) << set.ToString();
  ManagerOptions o = testing::TestManagerOptions(config);
  auto made = BlockManager::Create(o);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(made.status().message().find(
                "s3fifo is a lab policy (docs/policy-study.md): use it with kvtier sim / replay; "
                "the product offers: adaptive, credit-lru, lru, arc, w-tinylfu, hit-density"),
            std::string::npos)
      << made.status().ToString();
}

}  // namespace
}  // namespace kvtier

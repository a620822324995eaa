// EvictionPolicy: decides which block of one tier leaves when the tier needs room.
//
// One instance per tier. Not thread-safe: its owner (BlockIndex) serializes every call under
// that tier's lock. Policies know nothing of pins or slots; the owner passes a predicate that
// says which blocks may be evicted right now (e.g. not pinned), and removes the victim itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>

#include "kvtier/block_key.h"
#include "kvtier/status.h"

namespace kvtier {

// Every policy kvtier knows. The product builds the ones that earned it in the study (the
// default kAdaptive and the candidates it runs); the others (IsLabPolicy) are the lab's
// (lab/policies, lab/sim; docs/policies.md), built only where the lab is linked and enabled.
enum class PolicyKind : uint8_t {
  kLru = 0,           // least recently used
  kLineageLru = 1,    // lab: LRU over leaves only: a block outlives its cached children
  kS3Fifo = 2,        // lab: S3-FIFO (small/main/ghost FIFOs): frequency-aware, scan-resistant
  kBelady = 3,        // lab: offline oracle for replays: evicts the block used furthest ahead
  kCreditLru = 4,     // lineage-aware LRU with reuse credits (use count, run shape, stale tails)
  kArc = 5,           // Adaptive Replacement Cache (recency/frequency lists with ghost adaptation)
  kWTinyLfu = 6,      // W-TinyLFU: 1% LRU window, frequency-sketch admission, segmented LRU main
  kLeafFirstLru = 7,  // lab: LRU over leaves only; never evicts a block with a cached child
  kAdaptive = 8,      // follows, at run time, whichever candidate policy a shadow cache favours
  kHitDensity = 9,    // lineage-aware; evicts the lowest hit density learned per class and age
};

// "lru", "lineage-lru", "s3fifo", "belady", "credit-lru", "arc", "w-tinylfu", "leaf-first-lru",
// "adaptive", "hit-density".
const char* PolicyKindName(PolicyKind kind);
// Parses PolicyKindName's output, the lab's names included; InvalidArgument listing the accepted
// names otherwise.
Result<PolicyKind> ParsePolicyKind(std::string_view name);

// True for the policies the product does not offer: lineage-lru, leaf-first-lru, s3fifo, belady
// (index/policy_names.h lists them by name; docs/policies.md says why each is there).
bool IsLabPolicy(PolicyKind kind);
// InvalidArgument: "<name> is a lab policy (docs/policy-study.md): use it with kvtier sim /
// replay; the product offers: ...". REQUIRES: IsLabPolicy(kind).
Status LabPolicyRefused(PolicyKind kind);

// The settings of CreditLruPolicy (the class itself: credit_lru_policy.h). Defined here so that
// PolicyOptions, which every tier's config carries, needs no policy header. Deployments set them
// through the config keys g2.credit_lru.<field> and g3.credit_lru.<field> (docs/policies.md).
struct CreditLruConfig {
  static constexpr double kMaxCredit = 64.0;
  static constexpr double kMaxGhostFactor = 64.0;

  // Credit of a block used exactly twice, and three times or more (uses are counted across
  // evictions while the key is remembered in the ghost table).
  double used_twice = 0.75;
  double used_thrice = 1.5;
  // Credit of a block of a follow-up run of at least CreditLruPolicy::kLongRun blocks: stored
  // behind a hit deeper than the request's first block.
  double long_follow_up = -0.5;
  // Credit of a stale tail (it replaces all the others). 0 for engines that store only full
  // blocks and reuse a prompt's last full block on the next turn (docs/policy-study.md section 6).
  double stale_tail = -1.0;
  // Ghost table size, as a multiple of the capacity; 0 disables it (uses then start at 1 on
  // every insert).
  double ghost_factor = 4.0;

  // The field names, in declaration order: "used_twice", "used_thrice", "long_follow_up",
  // "stale_tail", "ghost_factor" (the config keys' and the CLI's names).
  static constexpr const char* kFieldNames[] = {"used_twice", "used_thrice", "long_follow_up",
                                                "stale_tail", "ghost_factor"};

  // Ok, or InvalidArgument naming the field, its value and the accepted range: credits must be
  // finite and within [-kMaxCredit, kMaxCredit], ghost_factor within [0, kMaxGhostFactor].
  Status Validate() const;
  // The value of field `name` (one of kFieldNames); InvalidArgument listing the names otherwise.
  Result<double> Get(std::string_view name) const;
  // Sets field `name` to `value` without validating it (call Validate after the last one).
  // InvalidArgument listing the names when `name` is not one of kFieldNames.
  Status Set(std::string_view name, double value);

  bool operator==(const CreditLruConfig&) const = default;
};

// The settings of AdaptivePolicy (adaptive_policy.h): how fast its shadow caches' scores forget,
// and how much better a challenger must score to take the lead. Defaults chosen by
// cross-validation (docs/policy-study.md, section 8).
struct AdaptiveConfig {
  // Score half-life, in references per capacity block: (0, 1024].
  double half_life = 16.0;
  // Relative lead a challenger needs over the leader's score: [0, 10].
  double hysteresis = 0.02;
  // 1: hit-density is a fifth candidate (after the four of AdaptivePolicy::kCandidates); 0: not.
  double with_hit_density = 0;

  static constexpr const char* kFieldNames[] = {"half_life", "hysteresis", "with_hit_density"};
  // Ok, or InvalidArgument naming the field, its value and the accepted range.
  Status Validate() const;
  // Sets field `name` (one of kFieldNames) to `value`, validated; InvalidArgument otherwise.
  Status Set(std::string_view name, double value);

  bool operator==(const AdaptiveConfig&) const = default;
};

// The settings of HitDensityPolicy (hit_density_policy.h). Defaults chosen by cross-validation
// (docs/policy-study.md, section 8.8).
struct HitDensityConfig {
  // Bits of `features`: which features make a block's class.
  static constexpr uint32_t kUses = 1, kEnded = 2, kLongFollowUp = 4, kDepth = 8;
  static constexpr uint32_t kAllFeatures = 15;

  // Ghost table size, as a multiple of the capacity: [0, 64]; 0 disables it.
  double ghost_factor = 4.0;
  // Weight the decayed histograms keep at each refresh: [0, 1).
  double decay = 0.9;
  // Ticks between refreshes, as a multiple of the capacity: (0, 64].
  double refresh = 1.0;
  // Oldest age told apart, as a multiple of the capacity (older ages share the last bucket):
  // (0, 1024].
  double max_age = 32.0;
  // Leaves sampled per Victim: [1, 1024] (integer).
  double samples = 32;
  // A subset of kAllFeatures (integer in [0, 15]).
  double features = kUses | kEnded;

  static constexpr const char* kFieldNames[] = {"ghost_factor", "decay",   "refresh",
                                                "max_age",      "samples", "features"};
  // Ok, or InvalidArgument naming the field, its value and the accepted range.
  Status Validate() const;
  // Sets field `name` (one of kFieldNames) to `value`, validated; InvalidArgument otherwise.
  Status Set(std::string_view name, double value);

  bool operator==(const HitDensityConfig&) const = default;
};

// Settings of the eviction policies, one member per policy that has any. A tier's config
// carries one; MakeEvictionPolicy uses the member of the kind it builds and ignores the rest.
struct PolicyOptions {
  CreditLruConfig credit_lru;
  AdaptiveConfig adaptive;  // adaptive passes credit_lru on to its credit-lru candidate
  HitDensityConfig hit_density;

  bool operator==(const PolicyOptions&) const = default;
};

class EvictionPolicy {
 public:
  using EvictablePredicate = std::function<bool(const BlockKey&)>;

  virtual ~EvictionPolicy() = default;

  virtual PolicyKind kind() const = 0;

  // `key` entered the tier; `parent` is its lineage parent (the hasher's root for a prompt's
  // first block). REQUIRES: key is not tracked already.
  virtual void OnInsert(const BlockKey& key, const BlockKey& parent) = 0;

  // `key` was used (a hit, or a load out of this tier). No-op when key is not tracked.
  virtual void OnAccess(const BlockKey& key) = 0;

  // `key` left the tier (evicted, removed or invalidated). No-op when key is not tracked.
  virtual void OnRemove(const BlockKey& key) = 0;

  // The tracked key this policy would evict next among those for which `evictable` returns
  // true, or nullopt when there is none. Does not stop tracking it: the caller evicts the block
  // and then calls OnRemove. May reorder internal state (S3-FIFO promotes re-used blocks while
  // it searches). Calls `evictable` at most a bounded number of times per tracked key.
  virtual std::optional<BlockKey> Victim(const EvictablePredicate& evictable) = 0;

  // Number of tracked keys.
  virtual size_t size() const = 0;
  virtual bool Contains(const BlockKey& key) const = 0;
};

// Builds a lab policy (IsLabPolicy(kind), not kBelady) for MakeEvictionPolicy, or refuses it.
using LabPolicyMaker = Result<std::unique_ptr<EvictionPolicy>> (*)(PolicyKind kind,
                                                                   size_t capacity_blocks,
                                                                   const PolicyOptions& options);
// Installs `maker` for this process (nullptr removes it). Only the lab calls it
// (EnableLabPolicies, lab/policies/lab_policies.h), in the processes that run its commands
// (`kvtier replay`, whose manager then builds a lab policy); the product never does. Thread-safe.
void SetLabPolicyMaker(LabPolicyMaker maker);

// A policy for a tier of `capacity_blocks` slots (credit-lru scales its credits by it,
// hit-density its histograms, ARC and W-TinyLFU size their lists and sketch, adaptive passes it
// on to its candidates; LRU ignores it), with `options` (credit-lru reads options.credit_lru,
// adaptive options.adaptive, hit-density options.hit_density; the other kinds ignore them).
// InvalidArgument for kBelady, which needs the future: the oracle is the lab's
// (MakeBeladyPolicy, lab/sim/belady_policy.h), never the product's; for another lab kind
// (IsLabPolicy) LabPolicyRefused's, unless the lab installed its maker in this process
// (SetLabPolicyMaker), which then builds it; and when the member the kind reads does not
// validate.
Result<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(PolicyKind kind, size_t capacity_blocks,
                                                           const PolicyOptions& options);
// MakeEvictionPolicy with the default options.
Result<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(PolicyKind kind, size_t capacity_blocks);

}  // namespace kvtier

// HitDensityPolicy: evicts the block with the lowest estimated hit density (expected hits per
// unit of cache space-time), learned at run time per feature class and per age. Online: it
// learns nothing of the future. In the spirit of LHD (Beckmann, Chen, Cidon, NSDI 2018).
//
// Each tracked block has a *class*, from what the policy sees:
//  - its use count (1, 2, 3+), remembered across evictions by a ghost table of recently
//    evicted keys (as credit-lru does);
//  - whether it ended its request at its last reference (the next reference did not continue
//    its chain): a request's last block is usually partial and rarely asked for again;
//  - whether it belongs to a long follow-up run (a run of at least kLongRun blocks stored behind
//    a hit deeper than the request's first block; a run is the chain of blocks one request
//    stored after its last hit);
//  - its depth in its chain (0-3, 4-15, 16-63, 64+ blocks below the first tracked ancestor).
// HitDensityConfig::features switches each feature on or off; by default only the use count
// and "ended its request" make the class (6 classes): the run and depth features split the
// estimates more than they inform them (cross-validation, docs/policy-study.md section 8.8).
//
// A block's *age* is the number of ticks (one per insert or access, so replays are
// deterministic) since its last reference, coarsened into kAgeBuckets buckets that cover
// HitDensityConfig::max_age x capacity ticks. A lifetime ends with a hit (OnAccess: a new one
// starts) or an eviction (OnRemove); each end is counted in its class's hit or eviction
// histogram at the age it ended. Every refresh period the counts are folded into
// exponentially decayed histograms (EWMA) and each class's hit density at age a is recomputed:
//   density(a) = sum_{x >= a} hits(x) / sum_{x >= a} (x - a + 1) (hits(x) + evictions(x)),
// i.e. hits it can still expect over the cache space-time it will still take. Before the first
// refresh every density is 0, and the policy is lineage-aware LRU.
//
// Eviction is lineage-aware: a block key names its whole prefix, so a block deeper in a chain is
// worthless once an ancestor is gone. Candidates are leaves (tracked keys with no tracked
// child); Victim samples HitDensityConfig::samples leaves (all of them when there are no more),
// deterministically, and names the evictable one with the lowest density (older first on a
// tie). When every sample is refused it ranks all leaves; when no leaf may be evicted, the least
// recently used evictable inner block goes, so the tier never jams.
//
// Invariants:
//  - nodes_ holds every tracked key; node.children counts the tracked keys whose parent it is;
//    orphan_children_ (OrphanChildren) counts, for each untracked key, the tracked keys whose
//    parent it is.
//  - every tracked node is in exactly one of leaves_ (children == 0) or inner_ (children > 0),
//    at index node.slot.
//  - runs_ holds every run some tracked key belongs to; run.members counts those keys.
//  - ghost_ remembers the use counts of at most ghost_factor x capacity untracked keys.
// Costs: O(1) expected per insert, access and remove (hash maps, vectors); Victim O(samples)
// when a sample is evictable, O(n log n) when the caller refuses them all; a refresh costs
// O(classes x kAgeBuckets) every refresh period.
#pragma once

#include <array>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "index/block_runs.h"
#include "index/eviction_policy.h"
#include "index/orphan_children.h"
#include "index/use_count_ghost.h"

namespace kvtier {

class HitDensityPolicy final : public EvictionPolicy {
 public:
  // The settings (defaults, ranges, Validate): HitDensityConfig in eviction_policy.h.
  using Config = HitDensityConfig;

  static constexpr uint32_t kLongRun = 16;
  static constexpr size_t kAgeBuckets = 128;
  static constexpr size_t kUseClasses = 3, kDepthClasses = 4;
  static constexpr size_t kClasses = kUseClasses * 2 * 2 * kDepthClasses;

  // InvalidArgument when config does not validate.
  static Result<std::unique_ptr<HitDensityPolicy>> Create(size_t capacity_blocks,
                                                          const Config& config);
  // The default configuration. REQUIRES nothing: the defaults validate.
  explicit HitDensityPolicy(size_t capacity_blocks);
  HitDensityPolicy(const HitDensityPolicy&) = delete;
  HitDensityPolicy& operator=(const HitDensityPolicy&) = delete;

  PolicyKind kind() const override { return PolicyKind::kHitDensity; }
  // A key remembered in the ghost table comes back with its use count + 1. The key joins its
  // parent's run when the parent is tracked and is that run's last block; it starts a new run
  // otherwise. A `parent` equal to `key` is ignored. REQUIRES: key is not tracked.
  void OnInsert(const BlockKey& key, const BlockKey& parent) override;
  // Counts a hit at the key's age in its class, then a use; the key's age restarts at 0.
  void OnAccess(const BlockKey& key) override;
  // Counts an eviction at the key's age in its class and remembers its use count in the ghost
  // table. Removing an inner block leaves its children tracked.
  void OnRemove(const BlockKey& key) override;
  // Among sampled evictable leaves, the lowest hit density (older first on a tie); failing that,
  // the lowest-density evictable leaf of all; failing that, the least recently used evictable
  // inner block; nullopt when nothing is evictable. Asks at most once per key.
  std::optional<BlockKey> Victim(const EvictablePredicate& evictable) override;
  size_t size() const override { return nodes_.size(); }
  bool Contains(const BlockKey& key) const override { return nodes_.contains(key); }

  // Introspection, for tests and statistics.
  // Uses of `key` so far (insert included); 0 when it is neither tracked nor remembered.
  uint32_t Uses(const BlockKey& key) const;
  // The hit density `key` is ranked with now (hits per block-tick); 0 for an untracked key.
  double DensityOf(const BlockKey& key) const;
  // The class `key` is counted in now (< kClasses); kClasses for an untracked key.
  size_t ClassOf(const BlockKey& key) const;
  // Ticks between refreshes, and the width of an age bucket in ticks.
  uint64_t refresh_period() const { return refresh_period_; }
  uint64_t age_width() const { return age_width_; }
  size_t ghost_size() const { return ghost_.size(); }

 private:
  struct Node {
    BlockKey key;
    BlockKey parent;
    uint64_t tick = 0;  // last reference
    uint64_t run = 0;
    uint32_t children = 0;
    uint32_t depth = 0;
    uint32_t uses = 1;
    uint32_t slot = 0;       // index into leaves_ (children == 0) or inner_
    bool ended = false;      // ended its request at its last reference
    uint64_t asked = 0;      // Victim's epoch in which the predicate was asked about it
    bool evictable = false;  // the answer, valid when asked == the current epoch
  };
  using Histogram = std::array<double, kAgeBuckets>;

  HitDensityPolicy(size_t capacity_blocks, const Config& config);

  size_t Class(const Node& node) const;
  size_t AgeBucket(const Node& node) const;
  double Density(const Node& node) const;
  // Notes a reference to `node` (tracked) whose parent is `parent`: settles whether the
  // previous reference ended its request, and refreshes when a period is over.
  void Reference(Node& node);
  void Refresh();
  void AddTo(std::vector<Node*>& set, Node& node);
  void RemoveFrom(std::vector<Node*>& set, Node& node);
  bool Ask(Node& node, const EvictablePredicate& evictable);

  const Config config_;
  const size_t capacity_;
  UseCountGhost ghost_;  // use counts of evicted keys (ghost_factor x capacity of them)
  const uint64_t refresh_period_;
  const uint64_t age_width_;
  const size_t samples_;
  uint64_t tick_ = 0;
  uint64_t next_refresh_;
  uint64_t epoch_ = 0;
  uint64_t rng_ = 0x9e3779b97f4a7c15ull;
  Node* last_ = nullptr;  // the node referenced last, while tracked

  std::unordered_map<BlockKey, Node, BlockKeyHash> nodes_;  // node addresses are stable
  OrphanChildren orphan_children_;
  BlockRuns runs_;
  std::vector<Node*> leaves_;
  std::vector<Node*> inner_;

  std::vector<Histogram> hits_now_, evictions_now_;  // since the last refresh, per class
  std::vector<Histogram> hits_, evictions_;          // decayed, per class
  std::vector<Histogram> density_;                   // per class, per age bucket
};

}  // namespace kvtier

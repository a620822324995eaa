// CreditLruPolicy: lineage-aware LRU in which each block's recency is shifted by a credit that
// says how likely a block of its kind is to be reused. Online: it learns nothing of the future.
//
// What a block's credit depends on (docs/policy-study.md shows the measurements behind each):
//  - its use count, remembered across evictions by a ghost table of recently evicted keys: in
//    conversation traces a block used twice is ~1.8x as likely to be used again as one used once,
//    one used three times or more ~2.6x;
//  - the run it was stored in. A run is the chain of blocks that one request stored after its
//    last hit (each block's parent is the previous one). A long run stored behind a deep hit (a
//    follow-up turn that pasted a lot of new text) is rarely asked about again;
//  - whether it is a stale tail: the last block a run stored, never used since. A request's last
//    block is usually partial, and the next turn of the conversation replaces it with a longer
//    one, so it is almost never reused. (This holds where the trace or engine stores a prompt's
//    partial last block, as the Mooncake traces do. Where only full blocks are stored and the
//    next turn reuses the last one, set stale_tail to 0.)
// Credits are in units of the tier's capacity: a credit of c ranks a block as if it had been
// used c x capacity_blocks ticks later than it was.
//
// Eviction is lineage-aware: candidates are leaves (tracked keys with no tracked child), lowest
// score = last-use tick + credit first; when no leaf may be evicted, the least recently used
// evictable inner block goes, so the tier never jams. Recency is a logical tick (one per insert
// or access), so replays are deterministic. A leaf's score is computed when it becomes a leaf
// or is used; it is not recomputed when its run grows later (which only a trimmed run can see).
//
// Invariants:
//  - nodes_ holds every tracked key; node.children counts the tracked keys whose parent it is;
//    orphan_children_ (OrphanChildren) counts, for each untracked key, the tracked keys whose
//    parent it is.
//  - every tracked key is in exactly one of leaves_ (children == 0, at (score, key)) or inner_
//    (children > 0, at (tick, key)), and node.pos points at that entry.
//  - runs_ holds every run that some tracked key belongs to; run.members counts those keys.
//  - ghost_ remembers the use counts of at most ghost_factor x capacity untracked keys.
// Costs: O(log n) per operation; Victim O(log n) plus one step per block the caller refuses.
#pragma once

#include <cstdint>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "index/block_runs.h"
#include "index/eviction_policy.h"
#include "index/orphan_children.h"
#include "index/use_count_ghost.h"

namespace kvtier {

class CreditLruPolicy final : public EvictionPolicy {
 public:
  // The settings (defaults, ranges, Validate): CreditLruConfig in eviction_policy.h.
  using Config = CreditLruConfig;

  static constexpr uint32_t kLongRun = 16;
  static constexpr double kMaxCredit = CreditLruConfig::kMaxCredit;
  static constexpr double kMaxGhostFactor = CreditLruConfig::kMaxGhostFactor;

  // InvalidArgument when config does not validate.
  static Result<std::unique_ptr<CreditLruPolicy>> Create(size_t capacity_blocks,
                                                         const Config& config);
  // The default configuration. REQUIRES nothing: the defaults validate.
  explicit CreditLruPolicy(size_t capacity_blocks);
  CreditLruPolicy(const CreditLruPolicy&) = delete;
  CreditLruPolicy& operator=(const CreditLruPolicy&) = delete;

  PolicyKind kind() const override { return PolicyKind::kCreditLru; }
  // A key remembered in the ghost table comes back with its use count + 1. The key joins its
  // parent's run when the parent is tracked and is that run's last block; it starts a new run
  // otherwise. A `parent` equal to `key` is ignored.
  void OnInsert(const BlockKey& key, const BlockKey& parent) override;
  // Counts a use and makes the key the most recently used.
  void OnAccess(const BlockKey& key) override;
  // Remembers the key's use count in the ghost table. Removing an inner block leaves its
  // children tracked.
  void OnRemove(const BlockKey& key) override;
  // The evictable leaf with the lowest score; failing that, the least recently used evictable
  // inner block; nullopt when nothing is evictable. Asks at most once per key.
  std::optional<BlockKey> Victim(const EvictablePredicate& evictable) override;
  size_t size() const override { return nodes_.size(); }
  bool Contains(const BlockKey& key) const override { return nodes_.contains(key); }

  // Introspection, for tests and statistics.
  // Uses of `key` so far (insert included); 0 when it is neither tracked nor remembered.
  uint32_t Uses(const BlockKey& key) const;
  // The credit `key` is ranked with now (0 for an untracked key), in units of capacity.
  double CreditOf(const BlockKey& key) const;
  // Whether `key` is remembered in the ghost table.
  bool InGhost(const BlockKey& key) const { return ghost_.Contains(key); }
  size_t ghost_size() const { return ghost_.size(); }
  size_t ghost_capacity() const { return ghost_.capacity(); }

 private:
  using Order = std::set<std::pair<int64_t, BlockKey>>;
  struct Node {
    BlockKey parent;
    uint64_t tick = 0;
    uint64_t run = 0;
    uint32_t children = 0;
    uint32_t depth = 0;  // 0 when the parent is not tracked at insertion
    uint32_t uses = 1;
    Order::iterator pos;  // into leaves_ when children == 0, else into inner_
  };

  CreditLruPolicy(size_t capacity_blocks, const Config& config);

  double Credit(const BlockKey& key, const Node& node) const;
  // Puts `node` (not in any set) into the set its children count says, with a fresh score.
  void Place(const BlockKey& key, Node& node);
  void Unplace(Node& node);

  const Config config_;
  const double capacity_;
  UseCountGhost ghost_;  // use counts of evicted keys (ghost_factor x capacity of them)
  uint64_t tick_ = 0;
  std::unordered_map<BlockKey, Node, BlockKeyHash> nodes_;
  OrphanChildren orphan_children_;
  BlockRuns runs_;
  Order leaves_;
  Order inner_;
};

}  // namespace kvtier

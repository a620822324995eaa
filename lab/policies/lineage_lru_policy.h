// LineageLruPolicy: LRU over the leaves of the block forest, so that a block outlives every
// descendant cached in the same tier.
//
// The lab's (`lineage-lru`, `leaf-first-lru`; not in libkvtier.so): it never beat the default by
// the study's 2% margin, and credit-lru with every credit 0 ranks the same way (docs/policies.md,
// "Which policies the product offers"). `kvtier sim` and `kvtier replay` still run it.
//
// A child is reachable by a prefix match only through its parent, so evicting a parent first
// would strand its whole subtree. Candidates are therefore leaves (tracked keys with no tracked
// child), oldest first; when no leaf may be evicted (all pinned), the oldest evictable inner
// block goes instead, so a tier can never jam.
//
// Recency is a logical tick (one per insert or access), never wall time, so that replays are
// deterministic. A block that becomes a leaf keeps its own tick: it does not look recent just
// because its last child left.
//
// Invariants:
//  - nodes_ holds every tracked key; node.children counts the tracked keys whose parent it is.
//  - orphan_children_ counts, for each *untracked* key, the tracked keys whose parent it is (the
//    hasher's root, or a parent kept only in another tier); a key moves its count between the two
//    maps when it enters or leaves the tier. Children may arrive before their parent (a lower
//    tier receives G2's leaves first).
//  - every tracked key is in exactly one of leaves_ (children == 0) or inner_ (children > 0), at
//    (tick, key), and node.pos points at that entry.
// Costs: OnInsert/OnAccess O(1) amortized for leaves (a new tick is the largest, so it goes in at
// the end), O(log n) otherwise; OnRemove O(log n); Victim O(log n) plus one step per block that
// the caller refuses.
#pragma once

#include <cstdint>
#include <set>
#include <unordered_map>
#include <utility>

#include "index/eviction_policy.h"
#include "index/orphan_children.h"

namespace kvtier {

class LineageLruPolicy final : public EvictionPolicy {
 public:
  // `leaf_only`: never evict an inner block, even when every leaf is refused (SGLang's radix
  // cache and TensorRT-LLM's block reuse evict leaves only); Victim then returns nullopt and the
  // tier refuses the insert. kind() is kLeafFirstLru then, kLineageLru otherwise. The two rank
  // identically whenever some leaf is evictable (always, in `kvtier sim`, where nothing is
  // pinned).
  explicit LineageLruPolicy(bool leaf_only = false) : leaf_only_(leaf_only) {}
  LineageLruPolicy(const LineageLruPolicy&) = delete;
  LineageLruPolicy& operator=(const LineageLruPolicy&) = delete;

  PolicyKind kind() const override {
    return leaf_only_ ? PolicyKind::kLeafFirstLru : PolicyKind::kLineageLru;
  }
  // A `parent` equal to `key` is ignored (a block cannot be its own child).
  void OnInsert(const BlockKey& key, const BlockKey& parent) override;
  void OnAccess(const BlockKey& key) override;
  // Removing an inner block (an invalidation, or the pinned-leaves fallback) leaves its children
  // tracked; they become leaves or stay inner by their own children only.
  void OnRemove(const BlockKey& key) override;
  // The least recently used evictable leaf; failing that (unless leaf_only), the least recently
  // used evictable inner block; nullopt when nothing is evictable. Asks at most once per key.
  std::optional<BlockKey> Victim(const EvictablePredicate& evictable) override;
  size_t size() const override { return nodes_.size(); }
  bool Contains(const BlockKey& key) const override { return nodes_.contains(key); }

  // The number of tracked keys whose parent is `key` (tracked or not).
  uint32_t ChildCount(const BlockKey& key) const;

 private:
  using Order = std::set<std::pair<uint64_t, BlockKey>>;
  struct Node {
    BlockKey parent;
    uint64_t tick = 0;
    uint32_t children = 0;
    Order::iterator pos;  // into leaves_ when children == 0, else into inner_
  };

  Order& SetOf(const Node& node) { return node.children == 0 ? leaves_ : inner_; }
  // Moves `node` (whose children count just crossed 0 <-> 1) from one set to the other, keeping
  // its tick. `was_leaf` tells which set it is in now.
  void Reclassify(Node& node, bool was_leaf);

  const bool leaf_only_;
  uint64_t tick_ = 0;
  std::unordered_map<BlockKey, Node, BlockKeyHash> nodes_;
  OrphanChildren orphan_children_;
  Order leaves_;
  Order inner_;
};

}  // namespace kvtier

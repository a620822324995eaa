// ArcPolicy: Adaptive Replacement Cache (Megiddo & Modha, FAST 2003) over one tier's blocks.
//
// Two resident LRU lists: T1 holds blocks used once since they entered, T2 blocks used again.
// Two ghost lists remember keys (no data) recently evicted from each: B1 from T1, B2 from T2.
// A target p for |T1| moves towards recency when a B1 ghost comes back (the tier was too small
// for blocks used once) and towards frequency when a B2 ghost comes back. Victim takes T1's
// least recently used block when |T1| > p (or T2 is empty), else T2's.
//
// Differences from the paper, forced by the EvictionPolicy interface:
//  - Victim is asked before the incoming key is known, so the paper's tie rule
//    ("x in B2 and |T1| == p") cannot apply; Victim uses |T1| > p, then p adapts at OnInsert.
//  - A block enters T1 on OnInsert unless its key is a ghost: a B1 or B2 ghost enters T2.
//  - OnRemove turns the block into a ghost of its list (also for invalidations: harmless).
// Ghost bounds as in the paper: |T1| + |B1| <= c and |T1| + |T2| + |B1| + |B2| <= 2c, trimmed
// from the ghosts' LRU ends after each change.
//
// Invariants: every tracked key is in exactly one of t1_, t2_ (MRU at the front); every ghost
// key in exactly one of b1_, b2_ and never tracked; where_ maps each key of the four lists to
// its list and node. 0 <= p_ <= c. Every operation is O(1) but Victim's walk past refused keys.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>

#include "index/eviction_policy.h"

namespace kvtier {

class ArcPolicy final : public EvictionPolicy {
 public:
  // A tier of `capacity_blocks` slots (at least 1 is used).
  explicit ArcPolicy(size_t capacity_blocks);
  ArcPolicy(const ArcPolicy&) = delete;
  ArcPolicy& operator=(const ArcPolicy&) = delete;

  PolicyKind kind() const override { return PolicyKind::kArc; }
  // `parent` is ignored. A ghost key adapts p and enters T2; any other key enters T1.
  void OnInsert(const BlockKey& key, const BlockKey& parent) override;
  // Moves a tracked key to T2's MRU end.
  void OnAccess(const BlockKey& key) override;
  // The key leaves T1/T2 and becomes a ghost of B1/B2.
  void OnRemove(const BlockKey& key) override;
  // T1's LRU evictable block when |T1| > p or T2 has none, else T2's; then the other list's.
  std::optional<BlockKey> Victim(const EvictablePredicate& evictable) override;
  size_t size() const override { return t1_.size() + t2_.size(); }
  bool Contains(const BlockKey& key) const override;

  // Introspection for tests and the study: the target size of T1, and the list sizes.
  double target_t1() const { return p_; }
  size_t t1_size() const { return t1_.size(); }
  size_t t2_size() const { return t2_.size(); }
  size_t b1_size() const { return b1_.size(); }
  size_t b2_size() const { return b2_.size(); }

 private:
  enum class Where : uint8_t { kT1, kT2, kB1, kB2 };
  struct Entry {
    Where where;
    std::list<BlockKey>::iterator pos;
  };

  std::list<BlockKey>& ListOf(Where w);
  // Moves `key` (whose entry is `e`) to the MRU end of list `to`.
  void MoveTo(Entry& e, const BlockKey& key, Where to);
  // Drops ghosts from the LRU ends until the paper's bounds hold.
  void TrimGhosts();

  const double c_;
  double p_ = 0;
  std::list<BlockKey> t1_, t2_, b1_, b2_;
  std::unordered_map<BlockKey, Entry, BlockKeyHash> where_;
};

}  // namespace kvtier

// LruPolicy: evicts the least recently inserted or accessed block.
//
// Invariant: order_ holds every tracked key exactly once, most recently used at the front;
// where_ maps each tracked key to its node in order_. Every operation is O(1) apart from
// Victim's walk past blocks the caller says it may not evict.
#pragma once

#include <list>
#include <unordered_map>

#include "index/eviction_policy.h"

namespace kvtier {

class LruPolicy final : public EvictionPolicy {
 public:
  LruPolicy() = default;
  LruPolicy(const LruPolicy&) = delete;
  LruPolicy& operator=(const LruPolicy&) = delete;

  PolicyKind kind() const override { return PolicyKind::kLru; }
  // `parent` is ignored: plain LRU knows nothing of lineage.
  void OnInsert(const BlockKey& key, const BlockKey& parent) override;
  void OnAccess(const BlockKey& key) override;
  void OnRemove(const BlockKey& key) override;
  // The least recently used key for which `evictable` holds; asks at most once per key.
  std::optional<BlockKey> Victim(const EvictablePredicate& evictable) override;
  size_t size() const override { return where_.size(); }
  bool Contains(const BlockKey& key) const override { return where_.contains(key); }

 private:
  std::list<BlockKey> order_;
  std::unordered_map<BlockKey, std::list<BlockKey>::iterator, BlockKeyHash> where_;
};

}  // namespace kvtier

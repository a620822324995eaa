// OrphanChildren: for each key a lineage-aware policy does not track, how many tracked keys name
// it as their parent (credit-lru, hit-density; the lab's lineage-lru). A child can be cached
// before its parent (the parent was evicted, or loads arrive out of order); when the parent comes
// back it adopts the count, so it is an inner block again at once.
// Not thread-safe: its owner (a policy) serializes calls. Every call is one hash-map operation.
#pragma once

#include <cstdint>
#include <unordered_map>

#include "kvtier/block_key.h"

namespace kvtier {

class OrphanChildren {
 public:
  // A tracked child of the untracked `parent` was inserted.
  void AddChild(const BlockKey& parent) { ++counts_[parent]; }

  // A tracked child of the untracked `parent` was removed. No-op when none was counted.
  void RemoveChild(const BlockKey& parent) {
    if (auto it = counts_.find(parent); it != counts_.end() && --it->second == 0) {
      counts_.erase(it);
    }
  }

  // `key` left its tier with `children` tracked children still cached: they wait for it.
  void Orphan(const BlockKey& key, uint32_t children) {
    if (children > 0) counts_[key] = children;
  }

  // `key` is tracked again: the children waiting for it, which are no longer counted here.
  uint32_t Adopt(const BlockKey& key) {
    auto it = counts_.find(key);
    if (it == counts_.end()) return 0;
    const uint32_t children = it->second;
    counts_.erase(it);
    return children;
  }

  // The tracked children waiting for the untracked `key`; 0 when none.
  uint32_t Count(const BlockKey& key) const {
    auto it = counts_.find(key);
    return it == counts_.end() ? 0 : it->second;
  }

 private:
  std::unordered_map<BlockKey, uint32_t, BlockKeyHash> counts_;
};

}  // namespace kvtier

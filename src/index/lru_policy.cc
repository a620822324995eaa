#include "index/lru_policy.h"

#include <cassert>

namespace kvtier {

void LruPolicy::OnInsert(const BlockKey& key, const BlockKey& /*parent*/) {
  auto [it, inserted] = where_.try_emplace(key);
  assert(inserted && "LruPolicy::OnInsert: key is tracked already");
  if (!inserted) {  // Release builds: treat a double insert as an access rather than corrupt.
    order_.splice(order_.begin(), order_, it->second);
    return;
  }
  order_.push_front(key);
  it->second = order_.begin();
}

void LruPolicy::OnAccess(const BlockKey& key) {
  auto it = where_.find(key);
  if (it == where_.end()) return;
  // splice relinks the node in place: no allocation on the hit path.
  order_.splice(order_.begin(), order_, it->second);
}

void LruPolicy::OnRemove(const BlockKey& key) {
  auto it = where_.find(key);
  if (it == where_.end()) return;
  order_.erase(it->second);
  where_.erase(it);
}

std::optional<BlockKey> LruPolicy::Victim(const EvictablePredicate& evictable) {
  for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
    if (evictable(*it)) return *it;
  }
  return std::nullopt;
}

}  // namespace kvtier

#include "sim/belady_policy.h"

#include <algorithm>
#include <cassert>

namespace kvtier {

BeladyPolicy::BeladyPolicy(std::span<const BlockKey> references) {
  for (uint64_t i = 0; i < references.size(); ++i) positions_[references[i]].push_back(i);
}

uint64_t BeladyPolicy::NextUse(const BlockKey& key) const {
  auto it = tracked_.find(key);
  return it == tracked_.end() ? kNever : it->second;
}

uint64_t BeladyPolicy::Advance(const BlockKey& key) {
  auto it = positions_.find(key);
  if (it == positions_.end()) return kNever;
  const std::vector<uint64_t>& uses = it->second;
  auto match = std::lower_bound(uses.begin(), uses.end(), cursor_);
  if (match == uses.end()) return kNever;
  cursor_ = *match + 1;
  auto next = match + 1;
  return next == uses.end() ? kNever : *next;
}

void BeladyPolicy::OnInsert(const BlockKey& key, const BlockKey& /*parent*/) {
  assert(!tracked_.contains(key) && "BeladyPolicy::OnInsert: key is tracked already");
  if (tracked_.contains(key)) {  // Release builds: treat a double insert as an access.
    OnAccess(key);
    return;
  }
  const uint64_t next = Advance(key);
  tracked_.emplace(key, next);
  by_next_use_.emplace(next, key);
}

void BeladyPolicy::OnAccess(const BlockKey& key) {
  auto it = tracked_.find(key);
  if (it == tracked_.end()) return;
  auto handle = by_next_use_.extract({it->second, key});
  it->second = Advance(key);
  handle.value().first = it->second;
  by_next_use_.insert(std::move(handle));
}

void BeladyPolicy::OnRemove(const BlockKey& key) {
  auto it = tracked_.find(key);
  if (it == tracked_.end()) return;
  by_next_use_.erase({it->second, key});
  tracked_.erase(it);
}

std::optional<BlockKey> BeladyPolicy::Victim(const EvictablePredicate& evictable) {
  for (auto it = by_next_use_.rbegin(); it != by_next_use_.rend(); ++it) {
    if (evictable(it->second)) return it->second;
  }
  return std::nullopt;
}

std::unique_ptr<EvictionPolicy> MakeBeladyPolicy(std::span<const BlockKey> references) {
  return std::make_unique<BeladyPolicy>(references);
}

}  // namespace kvtier

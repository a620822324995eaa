#include "manager/rejected_keys.h"

#include <algorithm>
#include <cassert>

namespace kvtier {

RejectedKeys::RejectedKeys(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {
  assert(capacity >= 1 && "RejectedKeys needs room for one key");
}

void RejectedKeys::Add(const BlockKey& key) {
  MutexLock lock(&mu_);
  const uint64_t seq = next_seq_++;
  seq_[key] = seq;
  order_.emplace_back(key, seq);
  while (seq_.size() > capacity_) {
    const auto [oldest, oldest_seq] = order_.front();
    order_.pop_front();
    auto it = seq_.find(oldest);
    if (it != seq_.end() && it->second == oldest_seq) seq_.erase(it);
  }
  if (order_.size() > 2 * capacity_) Compact();
  size_.store(seq_.size(), std::memory_order_relaxed);
}

void RejectedKeys::Forget(const BlockKey& key) {
  if (size() == 0) return;
  MutexLock lock(&mu_);
  seq_.erase(key);  // its order_ entry turns stale
  size_.store(seq_.size(), std::memory_order_relaxed);
}

bool RejectedKeys::Contains(const BlockKey& key) const {
  if (size() == 0) return false;
  MutexLock lock(&mu_);
  return seq_.count(key) != 0;
}

size_t RejectedKeys::FirstIn(std::span<const BlockKey> keys) const {
  if (size() == 0) return keys.size();
  MutexLock lock(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (seq_.count(keys[i]) != 0) return i;
  }
  return keys.size();
}

void RejectedKeys::Compact() {
  std::deque<std::pair<BlockKey, uint64_t>> live;
  for (const auto& [key, seq] : order_) {
    auto it = seq_.find(key);
    if (it != seq_.end() && it->second == seq) live.emplace_back(key, seq);
  }
  order_.swap(live);
}

}  // namespace kvtier

#include "manager/hasher_cache.h"

#include <cassert>
#include <functional>

namespace kvtier {

HasherCache::HasherCache(std::string model_id, uint64_t layout_fingerprint,
                         uint32_t tokens_per_block, HashAlgorithm algorithm, size_t capacity)
    : model_id_(std::move(model_id)),
      layout_fingerprint_(layout_fingerprint),
      tokens_per_block_(tokens_per_block),
      algorithm_(algorithm),
      capacity_(capacity) {
  assert(capacity_ >= 1 && "a hasher cache keeps at least one namespace");
}

size_t HasherCache::NameHash::operator()(const Name& n) const {
  const size_t s = std::hash<std::string_view>{}(n.salt);
  const size_t a = std::hash<std::string_view>{}(n.adapter);
  return s ^ (a + 0x9e3779b97f4a7c15ull + (s << 6) + (s >> 2));
}

Result<std::shared_ptr<const BlockHasher>> HasherCache::Get(const std::string& salt,
                                                            const std::string& adapter) {
  MutexLock lock(&mu_);
  if (auto it = by_name_.find(Name{salt, adapter}); it != by_name_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);  // most recently used
    return it->second->hasher;
  }
  KeyNamespace ns{model_id_, layout_fingerprint_, salt, adapter};
  KVTIER_ASSIGN_OR_RETURN(BlockHasher h, BlockHasher::Create(ns, tokens_per_block_, algorithm_));
  if (lru_.size() >= capacity_) {
    const Entry& victim = lru_.back();
    by_name_.erase(Name{victim.salt, victim.adapter});
    auto root = by_root_.find(victim.hasher->root().hi);
    if (root != by_root_.end() && root->second == std::prev(lru_.end())) by_root_.erase(root);
    lru_.pop_back();
    ++evictions_;
  }
  lru_.push_front(Entry{salt, adapter, std::make_shared<const BlockHasher>(std::move(h))});
  const Entry& e = lru_.front();
  by_name_.emplace(Name{e.salt, e.adapter}, lru_.begin());
  by_root_[e.hasher->root().hi] = lru_.begin();
  return e.hasher;
}

std::optional<std::pair<std::string, std::string>> HasherCache::Names(uint64_t namespace_id) const {
  MutexLock lock(&mu_);
  auto it = by_root_.find(namespace_id);
  if (it == by_root_.end()) return std::nullopt;
  return std::make_pair(it->second->adapter, it->second->salt);
}

size_t HasherCache::size() const {
  MutexLock lock(&mu_);
  return lru_.size();
}

uint64_t HasherCache::evictions() const {
  MutexLock lock(&mu_);
  return evictions_;
}

}  // namespace kvtier

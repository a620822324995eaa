// UseCountGhost: remembers the use counts of the last `capacity` keys that left a tier, so that
// a key coming back resumes its count instead of starting at one (credit-lru, hit-density).
//
// FIFO over remembering: once `capacity` keys have been remembered since, a key is forgotten.
// A key remembered again takes a new place; a key taken back (Take) is forgotten at once. Each
// call is O(1): a hash-map operation, and a ring of the keys in the order remembered whose
// slots are skipped when stale (the key came back, or was remembered again later).
// Not thread-safe: its owner (a policy) serializes calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "kvtier/block_key.h"

namespace kvtier {

class UseCountGhost {
 public:
  // Remembers at most `capacity` keys; 0 remembers none.
  explicit UseCountGhost(size_t capacity) : capacity_(capacity) {}

  // Remembers that `key` had been used `uses` times. No-op when the capacity is 0.
  void Remember(const BlockKey& key, uint32_t uses) {
    if (capacity_ == 0) return;
    const uint64_t seq = seq_++;
    if (ring_.size() < capacity_) {  // the ring grows to its capacity, then wraps
      ring_.push_back(key);
    } else {  // this slot's key was remembered `capacity_` keys ago: forget it, unless stale
      BlockKey& slot = ring_[seq % capacity_];
      if (auto old = map_.find(slot); old != map_.end() && old->second.seq + capacity_ == seq) {
        map_.erase(old);
      }
      slot = key;
    }
    map_[key] = Entry{uses, seq};
  }

  // The use count remembered for `key`, which is forgotten; 0 when it is not remembered.
  uint32_t Take(const BlockKey& key) {
    auto it = map_.find(key);
    if (it == map_.end()) return 0;
    const uint32_t uses = it->second.uses;
    map_.erase(it);
    return uses;
  }

  // The use count remembered for `key`; 0 when it is not remembered.
  uint32_t Peek(const BlockKey& key) const {
    auto it = map_.find(key);
    return it == map_.end() ? 0 : it->second.uses;
  }

  bool Contains(const BlockKey& key) const { return map_.contains(key); }
  size_t size() const { return map_.size(); }
  size_t capacity() const { return capacity_; }

 private:
  struct Entry {
    uint32_t uses;
    uint64_t seq;  // when it was remembered: its slot in ring_ is seq % capacity_
  };
  const size_t capacity_;
  std::unordered_map<BlockKey, Entry, BlockKeyHash> map_;
  std::vector<BlockKey> ring_;
  uint64_t seq_ = 0;
};

}  // namespace kvtier

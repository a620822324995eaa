// RejectedKeys: G4 blocks this manager found bad, so that Lookup never offers them again.
//
// A G4 load that fails verification (Corruption) or finds its object gone after Contains said
// it was there (NotFound) adds the block's key; MatchInG4 stops before the first key in the
// set. Without this, Contains (which cannot see corruption) would offer the same object to
// every later Lookup, and each load would fail again: a livelock of wasted loads.
//
// Bound: at most `capacity` keys (kDefaultCapacity = 65536: about 5 MiB at worst). Adding one
// more forgets the oldest (FIFO by insertion). A forgotten key may be offered once more: at
// worst one more failed load, and it is remembered again.
//
// Invariants (under mu_): seq_ holds exactly the remembered keys, each with the sequence
// number of its last Add; order_ lists (key, seq) by insertion, and an entry whose seq differs
// from seq_[key] (or whose key is absent) is stale and skipped. order_ holds at most
// 2 * capacity entries (compacted when it passes that), so every call is O(1) amortized.
//
// Thread-safe; no I/O.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <unordered_map>
#include <utility>

#include "core/mutex.h"
#include "kvtier/block_key.h"

namespace kvtier {

class RejectedKeys {
 public:
  static constexpr size_t kDefaultCapacity = 65536;

  // REQUIRES: capacity >= 1.
  explicit RejectedKeys(size_t capacity = kDefaultCapacity);
  RejectedKeys(const RejectedKeys&) = delete;
  RejectedKeys& operator=(const RejectedKeys&) = delete;

  // Remembers `key` (again: it becomes the newest). Forgets the oldest key when full.
  void Add(const BlockKey& key) EXCLUDES(mu_);
  // Forgets `key` (this manager wrote the block to G4 again). No-op when absent.
  void Forget(const BlockKey& key) EXCLUDES(mu_);
  bool Contains(const BlockKey& key) const EXCLUDES(mu_);
  // The index of the first of `keys` that is remembered; keys.size() when none is. No lock
  // when the set is empty (the common case: Lookup pays nothing).
  size_t FirstIn(std::span<const BlockKey> keys) const EXCLUDES(mu_);
  // Keys remembered now.
  size_t size() const { return size_.load(std::memory_order_relaxed); }
  size_t capacity() const { return capacity_; }

 private:
  void Compact() REQUIRES(mu_);

  const size_t capacity_;
  mutable Mutex mu_;
  std::unordered_map<BlockKey, uint64_t, BlockKeyHash> seq_ GUARDED_BY(mu_);
  std::deque<std::pair<BlockKey, uint64_t>> order_ GUARDED_BY(mu_);
  uint64_t next_seq_ GUARDED_BY(mu_) = 0;
  std::atomic<size_t> size_{0};  // seq_.size(), readable without the lock
};

}  // namespace kvtier

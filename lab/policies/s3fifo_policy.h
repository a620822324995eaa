// S3FifoPolicy: S3-FIFO (Yang et al., "FIFO queues are all you need for cache eviction",
// SOSP'23), adapted to a policy that names a victim and lets its owner remove it.
//
// The lab's (`s3fifo`; not in libkvtier.so): it never beat the default by the study's 2% margin
// (docs/policies.md, "Which policies the product offers"). `kvtier sim` and `kvtier replay`
// still run it.
//
// Three FIFO queues: `small` (new blocks, ~10% of the tier), `main` (blocks that proved reuse)
// and `ghost` (keys only, of blocks recently dropped from small). Each tracked block has a
// 2-bit use counter, capped at 3, bumped by OnAccess; a hit never reorders anything.
//
//  - OnInsert: a key found in ghost goes to main (it was dropped too early), any other to small.
//  - Victim, when small holds at least its target (or main is empty): the tail of small moves
//    to main if it was used since insertion (counter reset to 0, it must earn its stay again),
//    otherwise it is the victim; this goes on until small yields a victim or runs out. Otherwise
//    (or after that), from main: a tail with counter > 0 is reinserted at the head with
//    counter - 1, one with counter 0 is the victim.
//  - OnRemove of a block still in small records its key in ghost; ghost keeps the most recent
//    `capacity_blocks` keys.
//
// Blocks the caller may not evict are moved to the head of their queue, counter unchanged,
// and the search goes on; a block refused once is not asked again in the same Victim call.
// When small is under its target and main holds nothing evictable, the oldest evictable block
// of small goes whatever its counter (promoting it only to evict it from main would be the same
// outcome with more work). Victim therefore asks `evictable` at most once per tracked key, and
// stops after at most one pass over small and (kMaxFreq + 1) passes over main.
//
// Invariants: entries_ holds every tracked key once, with the queue it is in and its node there;
// small_ and main_ together hold exactly the tracked keys; ghost_ holds no tracked key.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <unordered_map>

#include "index/eviction_policy.h"

namespace kvtier {

class S3FifoPolicy final : public EvictionPolicy {
 public:
  enum class Queue : uint8_t { kNone = 0, kSmall = 1, kMain = 2 };

  static constexpr uint8_t kMaxFreq = 3;

  // Small's target is 10% of `capacity_blocks` (at least 1); ghost keeps up to
  // `capacity_blocks` keys (at least 1).
  explicit S3FifoPolicy(size_t capacity_blocks);
  S3FifoPolicy(const S3FifoPolicy&) = delete;
  S3FifoPolicy& operator=(const S3FifoPolicy&) = delete;

  PolicyKind kind() const override { return PolicyKind::kS3Fifo; }
  // A key remembered in ghost goes to main, any other to small. `parent` is ignored.
  void OnInsert(const BlockKey& key, const BlockKey& parent) override;
  // Bumps the use counter (saturating at kMaxFreq); moves nothing.
  void OnAccess(const BlockKey& key) override;
  // A key removed while in small is remembered in ghost.
  void OnRemove(const BlockKey& key) override;
  // See the file comment; asks at most once per key.
  std::optional<BlockKey> Victim(const EvictablePredicate& evictable) override;
  size_t size() const override { return entries_.size(); }
  bool Contains(const BlockKey& key) const override { return entries_.contains(key); }

  // Introspection, for tests and statistics.
  // The queue that holds `key`; kNone when it is not tracked.
  Queue QueueOf(const BlockKey& key) const;
  // Whether `key` is remembered in the ghost queue.
  bool InGhost(const BlockKey& key) const { return ghost_index_.contains(key); }
  // The use counter of `key` (0..kMaxFreq); 0 when it is not tracked.
  uint8_t Frequency(const BlockKey& key) const;
  size_t small_size() const { return small_.size(); }
  size_t main_size() const { return main_.size(); }
  size_t ghost_size() const { return ghost_.size(); }
  size_t small_target() const { return small_target_; }
  size_t ghost_capacity() const { return ghost_capacity_; }

 private:
  using KeyList = std::list<BlockKey>;
  struct Entry {
    KeyList::iterator pos;
    uint64_t refused_in = 0;  // the Victim call (search_) that last heard `evictable` say no
    Queue queue = Queue::kNone;
    uint8_t freq = 0;
  };

  KeyList& ListOf(Queue queue) { return queue == Queue::kSmall ? small_ : main_; }
  void MoveToHead(Entry& entry, Queue to);
  void RememberInGhost(const BlockKey& key);

  // The search steps of Victim; each returns a victim or nullopt when its queue has none.
  std::optional<BlockKey> SearchSmall(const EvictablePredicate& evictable);
  std::optional<BlockKey> SearchMain(const EvictablePredicate& evictable);

  const size_t small_target_;
  const size_t ghost_capacity_;
  uint64_t search_ = 0;  // counts Victim calls
  KeyList small_;        // head = front = newest
  KeyList main_;
  std::unordered_map<BlockKey, Entry, BlockKeyHash> entries_;
  KeyList ghost_;
  std::unordered_map<BlockKey, KeyList::iterator, BlockKeyHash> ghost_index_;
};

}  // namespace kvtier

// BeladyPolicy: Belady's MIN, the offline optimum, for replaying a recorded trace. It is the
// yardstick the online policies are measured against, never a policy for live traffic.
//
// The trace is the sequence of block references the replay will make. A cursor walks it: each
// OnInsert/OnAccess of key k is matched to k's first reference at or after the cursor, the
// cursor moves just past that reference, and k's next use becomes its following reference in
// the trace (never, if there is none). An event for a key that the trace does not reference at
// or after the cursor matches nothing: the cursor stays and the key's next use is never.
// The replay must therefore report each reference once, in trace order (one OnInsert for a miss
// or one OnAccess for a hit); an extra event for the same reference consumes the key's next one.
//
// Invariants: by_next_use_ holds (next use, key) for exactly the tracked keys, and
// tracked_[k] is k's next use. kNever sorts after every position.
// Costs: O(log r) per event (r = references of that key) plus O(log n) for the ordered set.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <set>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "index/eviction_policy.h"

namespace kvtier {

class BeladyPolicy final : public EvictionPolicy {
 public:
  static constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

  // Indexes `references` (copied; the span need not outlive the policy).
  explicit BeladyPolicy(std::span<const BlockKey> references);
  BeladyPolicy(const BeladyPolicy&) = delete;
  BeladyPolicy& operator=(const BeladyPolicy&) = delete;

  PolicyKind kind() const override { return PolicyKind::kBelady; }
  // `parent` is ignored.
  void OnInsert(const BlockKey& key, const BlockKey& parent) override;
  // Untracked keys are ignored and do not move the cursor.
  void OnAccess(const BlockKey& key) override;
  void OnRemove(const BlockKey& key) override;
  // The evictable tracked key whose next use is furthest away (ties broken by key order, so
  // the choice is deterministic); asks at most once per key.
  std::optional<BlockKey> Victim(const EvictablePredicate& evictable) override;
  size_t size() const override { return tracked_.size(); }
  bool Contains(const BlockKey& key) const override { return tracked_.contains(key); }

  // The position in the trace of `key`'s next use, kNever when none; kNever for an untracked
  // key too.
  uint64_t NextUse(const BlockKey& key) const;
  // The index of the first trace reference not yet matched by an event.
  uint64_t cursor() const { return cursor_; }

 private:
  // Matches one reference of `key` (see the file comment) and returns its next use.
  uint64_t Advance(const BlockKey& key);

  std::unordered_map<BlockKey, std::vector<uint64_t>, BlockKeyHash> positions_;  // ascending
  uint64_t cursor_ = 0;
  std::unordered_map<BlockKey, uint64_t, BlockKeyHash> tracked_;
  std::set<std::pair<uint64_t, BlockKey>> by_next_use_;
};

// Belady's offline optimum for a replay whose block references, in order, are `references`.
// Every OnInsert/OnAccess of a key is taken as that key's next reference at or after the last
// one seen; the victim is the tracked key whose next reference is furthest away (never = the
// furthest of all). The product's MakeEvictionPolicy refuses kBelady and points here.
std::unique_ptr<EvictionPolicy> MakeBeladyPolicy(std::span<const BlockKey> references);

}  // namespace kvtier

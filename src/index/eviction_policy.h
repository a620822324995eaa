// EvictionPolicy: decides which block of one tier leaves when the tier needs room.
//
// One instance per tier. Not thread-safe: its owner (BlockIndex) serializes every call under
// that tier's lock. Policies know nothing of pins or slots; the owner passes a predicate that
// says which blocks may be evicted right now (e.g. not pinned), and removes the victim itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>

#include "kvtier/block_key.h"
#include "kvtier/status.h"

namespace kvtier {

enum class PolicyKind : uint8_t {
  kLru = 0,         // least recently used
  kLineageLru = 1,  // LRU over leaves only: a block whose child is cached outlives the child
  kS3Fifo = 2,      // S3-FIFO (small/main/ghost FIFOs): frequency-aware, scan-resistant
  kBelady = 3,      // offline oracle for replays: evicts the block used furthest in the future
  kCreditLru = 4,   // lineage-aware LRU with reuse credits (use count, run shape, stale tails)
};

// "lru", "lineage-lru", "s3fifo", "belady", "credit-lru".
const char* PolicyKindName(PolicyKind kind);
// Parses PolicyKindName's output; InvalidArgument listing the accepted names otherwise.
Result<PolicyKind> ParsePolicyKind(std::string_view name);

class EvictionPolicy {
 public:
  using EvictablePredicate = std::function<bool(const BlockKey&)>;

  virtual ~EvictionPolicy() = default;

  virtual PolicyKind kind() const = 0;

  // `key` entered the tier; `parent` is its lineage parent (the hasher's root for a prompt's
  // first block). REQUIRES: key is not tracked already.
  virtual void OnInsert(const BlockKey& key, const BlockKey& parent) = 0;

  // `key` was used (a hit, or a load out of this tier). No-op when key is not tracked.
  virtual void OnAccess(const BlockKey& key) = 0;

  // `key` left the tier (evicted, removed or invalidated). No-op when key is not tracked.
  virtual void OnRemove(const BlockKey& key) = 0;

  // The tracked key this policy would evict next among those for which `evictable` returns
  // true, or nullopt when there is none. Does not stop tracking it: the caller evicts the block
  // and then calls OnRemove. May reorder internal state (S3-FIFO promotes re-used blocks while
  // it searches). Calls `evictable` at most a bounded number of times per tracked key.
  virtual std::optional<BlockKey> Victim(const EvictablePredicate& evictable) = 0;

  // Number of tracked keys.
  virtual size_t size() const = 0;
  virtual bool Contains(const BlockKey& key) const = 0;
};

// A policy for a tier of `capacity_blocks` slots (S3-FIFO sizes its queues from it; the others
// ignore it). InvalidArgument for kBelady, which needs the future: use MakeBeladyPolicy.
Result<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(PolicyKind kind, size_t capacity_blocks);

// Belady's offline optimum for a replay whose block references, in order, are `references`.
// Every OnInsert/OnAccess of a key is taken as that key's next reference at or after the last
// one seen; the victim is the tracked key whose next reference is furthest away (never = the
// furthest of all).
std::unique_ptr<EvictionPolicy> MakeBeladyPolicy(std::span<const BlockKey> references);

}  // namespace kvtier

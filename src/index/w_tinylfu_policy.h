// WTinyLfuPolicy: W-TinyLFU (Einziger, Friedman & Manes, "TinyLFU: A Highly Efficient Cache
// Admission Policy", 2017; the policy of Caffeine) over one tier's blocks.
//
// Three LRU segments: a window of 1% of the capacity that every new block enters, and a main
// area split 20/80 into probation and protected (segmented LRU). A block leaving the window is
// a *candidate* for the main area; it enters only if a frequency sketch estimates it more
// popular than main's victim (probation's LRU block); the loser is evicted. A block used in
// probation moves to protected; protected's overflow falls back to probation's MRU end.
//
// The sketch (FrequencySketch below) is a count-min sketch of 4 rows with 4-bit counters behind
// a doorkeeper bit set: a key's first sighting only sets its doorkeeper bits, later ones raise
// its counters. Every 10 x capacity sightings all counters are halved and the doorkeeper is
// cleared (aging), so old popularity fades. A key's estimate is its counters' minimum plus one
// if the doorkeeper holds it.
//
// Mapping to EvictionPolicy: OnInsert puts the key at the window's MRU end and, while the
// window is over its share, moves the window's LRU block to probation (no contest: the tier
// still has room). Victim runs the contest when the window is full: the window's LRU block
// against main's victim; the winner stays (a winning candidate moves to probation), the loser
// is returned. Ties go against the candidate. When the window is below its share (after
// removals) Victim returns main's victim without a contest. OnInsert and OnAccess each count
// one sighting.
//
// Invariants: every tracked key is in exactly one of window_, probation_, protected_ (MRU at
// the front) and where_ says which; protected_.size() <= protected_cap_ after every call.
// Costs O(1) per call but Victim's walk past refused keys.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "index/eviction_policy.h"

namespace kvtier {

// Count-min sketch with a doorkeeper and periodic halving (see above). Not thread-safe.
class FrequencySketch {
 public:
  // Sized for about `expected_keys` distinct keys (at least 16): 4 rows of 4 x expected_keys
  // one-byte counters, and a doorkeeper of 8 bits per sighting of a sample (two bits set per
  // key), so that neither saturates within a sample. Halves every `sample_size` sightings
  // (0 = 10 x expected_keys). Memory: about 26 bytes per expected key.
  explicit FrequencySketch(uint64_t expected_keys, uint64_t sample_size = 0);

  // Counts one sighting of `key`.
  void Record(const BlockKey& key);
  // The estimated sightings of `key` since about the last halving, 0..16.
  uint32_t Estimate(const BlockKey& key) const;
  // Sightings counted since the last halving.
  uint64_t records() const { return records_; }

 private:
  static constexpr int kRows = 4;
  static constexpr uint8_t kMaxCount = 15;

  uint64_t Hash(const BlockKey& key, int row) const;
  bool DoorkeeperHas(const BlockKey& key) const;
  void Age();

  const uint64_t mask_;            // counters per row - 1 (a power of two minus one)
  const uint64_t door_mask_;       // doorkeeper bits - 1
  const uint64_t sample_size_;     // sightings between halvings
  std::vector<uint8_t> counters_;  // kRows rows of (mask_ + 1) counters
  std::vector<uint64_t> door_;     // doorkeeper bit set
  uint64_t records_ = 0;
};

class WTinyLfuPolicy final : public EvictionPolicy {
 public:
  // The window's share of the capacity, and protected's share of the main area.
  static constexpr double kWindowShare = 0.01;
  static constexpr double kProtectedShare = 0.8;

  // A tier of `capacity_blocks` slots: window max(1, round(1%)), protected 80% of the rest.
  explicit WTinyLfuPolicy(size_t capacity_blocks);
  WTinyLfuPolicy(const WTinyLfuPolicy&) = delete;
  WTinyLfuPolicy& operator=(const WTinyLfuPolicy&) = delete;

  PolicyKind kind() const override { return PolicyKind::kWTinyLfu; }
  // `parent` is ignored.
  void OnInsert(const BlockKey& key, const BlockKey& parent) override;
  void OnAccess(const BlockKey& key) override;
  void OnRemove(const BlockKey& key) override;
  // The loser of the window/main contest (see above); skips keys `evictable` refuses, taking
  // the next one of the same segment order (window candidate, probation, protected, window).
  std::optional<BlockKey> Victim(const EvictablePredicate& evictable) override;
  size_t size() const override { return where_.size(); }
  bool Contains(const BlockKey& key) const override { return where_.contains(key); }

  // Introspection for tests.
  size_t window_size() const { return window_.size(); }
  size_t probation_size() const { return probation_.size(); }
  size_t protected_size() const { return protected_.size(); }
  size_t window_capacity() const { return window_cap_; }
  uint32_t Frequency(const BlockKey& key) const { return sketch_.Estimate(key); }

 private:
  enum class Segment : uint8_t { kWindow, kProbation, kProtected };
  struct Entry {
    Segment segment;
    std::list<BlockKey>::iterator pos;
  };

  std::list<BlockKey>& ListOf(Segment s);
  void MoveTo(Entry& e, Segment to);
  // The LRU evictable key of `list`, or nullopt.
  static std::optional<BlockKey> LruEvictable(const std::list<BlockKey>& list,
                                              const EvictablePredicate& evictable);

  const size_t window_cap_;
  const size_t protected_cap_;
  FrequencySketch sketch_;
  std::list<BlockKey> window_, probation_, protected_;
  std::unordered_map<BlockKey, Entry, BlockKeyHash> where_;
};

}  // namespace kvtier

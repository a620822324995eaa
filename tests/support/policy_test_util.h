// What the eviction-policy tests share (tests/index/eviction_policy_test.cc, the product's
// policies; tests/lab/lab_policies_test.cc, the lab's): readable block keys, pinning predicates,
// and TierSim, a tier of fixed capacity driving one policy as its owner would.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "index/eviction_policy.h"

namespace kvtier::policy_test {

using Predicate = EvictionPolicy::EvictablePredicate;

// A well-mixed 64-bit value of `x` (SplitMix64's finalizer): pseudo-random keys and draws.
inline uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Block `i`: a uniformly spread key, like the hasher's, named by a small number for the reader.
inline BlockKey K(uint64_t i) { return BlockKey{SplitMix64(2 * i), SplitMix64(2 * i + 1)}; }

// The hasher's root stand-in: the parent of every prompt's first block.
inline const BlockKey kRoot = K(999'999);

inline bool Any(const BlockKey&) { return true; }
inline bool None(const BlockKey&) { return false; }

inline Predicate AllBut(std::set<BlockKey> pinned) {
  return [pinned = std::move(pinned)](const BlockKey& k) { return !pinned.contains(k); };
}

// A tier of `capacity` slots in front of `policy`: a reference to a held block is a hit (an
// access); a miss evicts victims until there is room, then inserts. Nothing is pinned.
class TierSim {
 public:
  TierSim(EvictionPolicy* policy, size_t capacity) : policy_(policy), capacity_(capacity) {}

  // Returns whether the reference hit.
  bool Reference(const BlockKey& key, const BlockKey& parent = kRoot) {
    if (policy_->Contains(key)) {
      policy_->OnAccess(key);
      ++hits_;
      return true;
    }
    while (policy_->size() >= capacity_) {
      std::optional<BlockKey> victim = policy_->Victim(Any);
      EXPECT_TRUE(victim.has_value()) << "a full tier with nothing pinned must yield a victim";
      if (!victim) return false;
      EXPECT_TRUE(policy_->Contains(*victim));
      policy_->OnRemove(*victim);
      parents_.erase(*victim);
      evicted_.push_back(*victim);
    }
    policy_->OnInsert(key, parent);
    parents_[key] = parent;
    return false;
  }

  // References every block of a chain, parent first, as an engine touches a prompt's prefix.
  void Request(const std::vector<BlockKey>& chain, const BlockKey& parent = kRoot) {
    BlockKey prev = parent;
    for (const BlockKey& key : chain) {
      Reference(key, prev);
      prev = key;
    }
  }

  // How many leading blocks of `chain` a prefix match would find in the tier.
  size_t PrefixHit(const std::vector<BlockKey>& chain) const {
    size_t n = 0;
    while (n < chain.size() && policy_->Contains(chain[n])) ++n;
    return n;
  }

  // Held blocks that no prefix match can reach: some block between them and the root is gone.
  size_t Unreachable() const {
    size_t n = 0;
    for (const auto& [key, parent] : parents_) {
      BlockKey up = parent;
      while (up != kRoot && parents_.contains(up)) up = parents_.at(up);
      if (up != kRoot) ++n;
    }
    return n;
  }

  size_t hits() const { return hits_; }
  const std::vector<BlockKey>& evicted() const { return evicted_; }

 private:
  EvictionPolicy* policy_;
  size_t capacity_;
  size_t hits_ = 0;
  std::vector<BlockKey> evicted_;
  std::map<BlockKey, BlockKey> parents_;
};

}  // namespace kvtier::policy_test

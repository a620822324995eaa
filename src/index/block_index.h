// BlockIndex: which tiers hold which block, in which slot, and which blocks may not move.
//
// Invariants (kept under the locks named below):
//  - An entry exists for a key iff at least one tier holds it or it is pinned (Invalidate can
//    leave a pinned key in no tier); its tier_mask says which tiers, and slot[t] is meaningful
//    exactly for the tiers in the mask.
//  - A tier's eviction policy tracks exactly the keys whose mask has that tier.
//  - A pinned entry (pins > 0) is never removed from any tier.
//
// Concurrency: entries are sharded by key, one mutex per shard; each tier's policy has its own
// mutex. Lock order: a tier's mutex before a shard's mutex, never the reverse, and never two
// shards or two tiers at once. No I/O happens in here, so no lock is ever held across I/O.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/mutex.h"
#include "index/eviction_policy.h"
#include "kvtier/block_key.h"
#include "kvtier/status.h"
#include "kvtier/tier.h"

namespace kvtier {

constexpr uint32_t kNoSlot = 0xffffffffu;

// A snapshot of one entry.
struct BlockInfo {
  BlockKey key;
  BlockKey parent;
  uint8_t tier_mask = 0;
  std::array<uint32_t, kNumTiers> slot{kNoSlot, kNoSlot, kNoSlot, kNoSlot};
  uint32_t pins = 0;
  uint64_t last_access = 0;  // logical clock of the last Touch (0 = never touched)
  uint64_t hits = 0;         // Touch count

  bool InTier(TierId t) const { return (tier_mask >> t) & 1u; }
};

// The longest run of consecutive keys, from the first, that some allowed tier holds.
struct MatchResult {
  // tiers[i] is the fastest (lowest-numbered) allowed tier holding key i; size() = blocks matched.
  std::vector<TierId> tiers;
  // slots[i] is key i's slot in tiers[i].
  std::vector<uint32_t> slots;
  size_t num_blocks() const { return tiers.size(); }
};

struct EvictedBlock {
  BlockKey key;
  BlockKey parent;
  uint32_t slot;
  uint8_t remaining_tiers;  // the tiers that still hold the key after this eviction
};

class BlockIndex {
 public:
  struct TierConfig {
    // The config's default (g2.policy, g3.policy): adaptive, which follows whichever of
    // credit-lru, W-TinyLFU, ARC and LRU its shadow caches favour (docs/policy-study.md 8.7).
    // A lab policy (IsLabPolicy) makes Create fail with LabPolicyRefused's message unless the
    // lab installed its maker in this process (EnableLabPolicies); ReplacePolicy takes any.
    PolicyKind policy = PolicyKind::kAdaptive;
    // Sizes ARC's and W-TinyLFU's structures and hit-density's histograms, and scales
    // credit-lru's credits (0: no credits, i.e. lineage-aware LRU); the index never refuses it.
    uint64_t capacity_blocks = 0;
    // The policy's settings (credit-lru's credits); validated for the kind in `policy`.
    PolicyOptions options;
  };
  struct Config {
    uint32_t num_shards = 64;  // a power of two in 1..4096
    std::array<TierConfig, kNumTiers> tiers;

    // Ok, or InvalidArgument naming the field (for a tier's policy options: the tier and the
    // setting). kBelady is refused here: install it with ReplacePolicy, since it needs the
    // future.
    Status Validate() const;
  };

  static Result<std::unique_ptr<BlockIndex>> Create(const Config& config);
  BlockIndex(const BlockIndex&) = delete;
  BlockIndex& operator=(const BlockIndex&) = delete;

  // Swaps tier `tier`'s policy (e.g. for Belady's oracle in a replay). FailedPrecondition when
  // the tier holds any block.
  Status ReplacePolicy(TierId tier, std::unique_ptr<EvictionPolicy> policy) EXCLUDES(tiers_mu_);

  // Records that `tier` now holds `key` in `slot`. `parent` is the block's lineage parent (it
  // must be the same for every tier of a key; the first insert's wins). AlreadyExists when the
  // tier holds the key already; InvalidArgument for a bad tier or slot.
  Status Insert(const BlockKey& key, const BlockKey& parent, TierId tier, uint32_t slot);

  // Forgets that `tier` holds `key` and returns the slot it had. NotFound when it does not
  // hold it; FailedPrecondition when the key is pinned.
  Result<uint32_t> Remove(const BlockKey& key, TierId tier);

  // Removes `key` from `tier` even when pinned, and returns its slot: for blocks found corrupt
  // or lost. The pins stay with the key (a pinned key that is left in no tier is invisible to
  // Match and disappears at its last Unpin). NotFound when the tier does not hold it.
  Result<uint32_t> Invalidate(const BlockKey& key, TierId tier);

  // The longest run of `keys` (a prompt's keys, in order) that tiers in `tier_mask` hold.
  // Read-only: does not count hits or refresh recency, so a scheduler may ask again and again
  // for a request it cannot schedule yet. Cost: O(keys), no allocation beyond the result.
  MatchResult Match(std::span<const BlockKey> keys, uint8_t tier_mask = kAllTiers) const;

  // Match, and pins every matched block in the same pass so none can be evicted before the
  // caller loads it. The caller must Unpin exactly the matched keys later.
  MatchResult MatchAndPin(std::span<const BlockKey> keys, uint8_t tier_mask = kAllTiers);

  // Pins one present key. NotFound when no tier holds it.
  Status Pin(const BlockKey& key);
  // Drops one pin of each key. FailedPrecondition (after unpinning the others) when a key is
  // absent or not pinned: the caller's bookkeeping is wrong.
  Status Unpin(std::span<const BlockKey> keys);

  // Records a use of each present key: hit count, last access, and the policy of each tier
  // holding it (in the given order, so a prompt's later blocks end up more recent).
  void Touch(std::span<const BlockKey> keys);

  // Removes from `tier` the block its policy picks among the unpinned ones and returns it, or
  // nullopt when the tier holds nothing evictable. The caller frees the slot.
  std::optional<EvictedBlock> EvictOne(TierId tier);
  // EvictOne among the unpinned blocks whose slot in `tier` `allowed` accepts (the G2
  // namespace share: a namespace at or under its guaranteed share is not evicted for
  // another's block). Null `allowed`: as EvictOne(tier). `allowed` runs under the index's locks:
  // it must be quick and take no lock of the index.
  std::optional<EvictedBlock> EvictOne(TierId tier,
                                       const std::function<bool(uint32_t slot)>& allowed);

  // The entry for `key`, or nullopt.
  std::optional<BlockInfo> Get(const BlockKey& key) const;

  // Blocks held by `tier`.
  uint64_t TierCount(TierId tier) const;
  // Entries: keys held by some tier, plus pinned keys that Invalidate left in none.
  uint64_t KeyCount() const;
  // Sum of pins over all entries (0 when every load finished: a leak check). O(shards).
  uint64_t TotalPins() const;

 private:
  struct Entry {
    BlockKey parent;
    uint8_t tier_mask = 0;
    std::array<uint32_t, kNumTiers> slot{kNoSlot, kNoSlot, kNoSlot, kNoSlot};
    uint32_t pins = 0;
    uint64_t last_access = 0;
    uint64_t hits = 0;
  };
  struct alignas(64) Shard {
    mutable Mutex mu;
    std::unordered_map<BlockKey, Entry, BlockKeyHash> map GUARDED_BY(mu);
    // Sum of the entries' pins, so TotalPins (ManagerStats) costs O(shards), not O(blocks):
    // kvtier replay reads the stats after every request.
    uint64_t pins GUARDED_BY(mu) = 0;
  };
  struct alignas(64) TierState {
    mutable Mutex mu;
    std::unique_ptr<EvictionPolicy> policy GUARDED_BY(mu);
    uint64_t count GUARDED_BY(mu) = 0;
  };

  explicit BlockIndex(const Config& config);
  Shard& ShardFor(const BlockKey& key) const { return shards_[key.hi & shard_mask_]; }
  MatchResult MatchImpl(std::span<const BlockKey> keys, uint8_t tier_mask, bool pin) const;
  Result<uint32_t> RemoveImpl(const BlockKey& key, TierId tier, bool even_if_pinned);

  Config config_;
  uint64_t shard_mask_;
  std::unique_ptr<Shard[]> shards_;
  std::array<TierState, kNumTiers> tiers_;
  Mutex tiers_mu_;  // serializes ReplacePolicy
  std::atomic<uint64_t> clock_{0};
};

}  // namespace kvtier

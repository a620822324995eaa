#include "index/block_index.h"

#include <string>

namespace kvtier {

namespace {

// The fastest tier in `mask`; REQUIRES mask != 0.
TierId FastestTier(uint8_t mask) { return static_cast<TierId>(__builtin_ctz(mask)); }

Status BadTier(TierId tier) {
  return Status::InvalidArgument("tier " + std::to_string(tier) +
                                 " does not exist; tiers are 0 (G1) to 3 (G4)");
}

}  // namespace

Status BlockIndex::Config::Validate() const {
  if (num_shards < 1 || num_shards > 4096 || (num_shards & (num_shards - 1)) != 0) {
    return Status::InvalidArgument("index num_shards = " + std::to_string(num_shards) +
                                   " is out of range; allowed: a power of two in 1..4096");
  }
  for (TierId t = 0; t < kNumTiers; ++t) {
    if (tiers[t].policy == PolicyKind::kBelady) {
      return Status::InvalidArgument(std::string("index tier ") + TierName(t) +
                                     " policy = belady needs the future; install it with "
                                     "ReplacePolicy in a replay");
    }
    if (tiers[t].policy == PolicyKind::kCreditLru || tiers[t].policy == PolicyKind::kAdaptive) {
      Status s = tiers[t].options.credit_lru.Validate();
      if (s.ok() && tiers[t].policy == PolicyKind::kAdaptive)
        s = tiers[t].options.adaptive.Validate();
      if (!s.ok()) {
        return Status::InvalidArgument(std::string("index tier ") + TierName(t) + ": " +
                                       s.message());
      }
    }
  }
  return Status::Ok();
}

BlockIndex::BlockIndex(const Config& config)
    : config_(config), shard_mask_(config.num_shards - 1), shards_(new Shard[config.num_shards]) {}

Result<std::unique_ptr<BlockIndex>> BlockIndex::Create(const Config& config) {
  KVTIER_RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<BlockIndex> index(new BlockIndex(config));
  for (TierId t = 0; t < kNumTiers; ++t) {
    KVTIER_ASSIGN_OR_RETURN(
        auto policy, MakeEvictionPolicy(config.tiers[t].policy, config.tiers[t].capacity_blocks,
                                        config.tiers[t].options));
    MutexLock lock(&index->tiers_[t].mu);
    index->tiers_[t].policy = std::move(policy);
  }
  return index;
}

Status BlockIndex::ReplacePolicy(TierId tier, std::unique_ptr<EvictionPolicy> policy) {
  if (tier >= kNumTiers) return BadTier(tier);
  if (policy == nullptr) return Status::InvalidArgument("ReplacePolicy needs a policy, not null");
  MutexLock serial(&tiers_mu_);
  TierState& ts = tiers_[tier];
  MutexLock lock(&ts.mu);
  if (ts.count != 0) {
    return Status::FailedPrecondition(std::string("cannot replace the policy of ") +
                                      TierName(tier) + " while it holds " +
                                      std::to_string(ts.count) + " blocks");
  }
  ts.policy = std::move(policy);
  return Status::Ok();
}

Status BlockIndex::Insert(const BlockKey& key, const BlockKey& parent, TierId tier, uint32_t slot) {
  if (tier >= kNumTiers) return BadTier(tier);
  if (slot == kNoSlot) return Status::InvalidArgument("Insert with slot kNoSlot");
  TierState& ts = tiers_[tier];
  MutexLock tier_lock(&ts.mu);
  BlockKey lineage_parent = parent;
  {
    Shard& shard = ShardFor(key);
    MutexLock lock(&shard.mu);
    Entry& e = shard.map[key];
    if ((e.tier_mask >> tier) & 1u) {
      return Status::AlreadyExists("block " + key.ToHex() + " is already in " + TierName(tier));
    }
    if (e.tier_mask == 0) e.parent = parent;
    lineage_parent = e.parent;
    e.tier_mask |= static_cast<uint8_t>(1u << tier);
    e.slot[tier] = slot;
  }
  ts.policy->OnInsert(key, lineage_parent);
  ++ts.count;
  return Status::Ok();
}

Result<uint32_t> BlockIndex::RemoveImpl(const BlockKey& key, TierId tier, bool even_if_pinned) {
  if (tier >= kNumTiers) return BadTier(tier);
  TierState& ts = tiers_[tier];
  MutexLock tier_lock(&ts.mu);
  uint32_t slot;
  {
    Shard& shard = ShardFor(key);
    MutexLock lock(&shard.mu);
    auto it = shard.map.find(key);
    if (it == shard.map.end() || !((it->second.tier_mask >> tier) & 1u)) {
      return Status::NotFound("block " + key.ToHex() + " is not in " + TierName(tier));
    }
    Entry& e = it->second;
    if (e.pins != 0 && !even_if_pinned) {
      return Status::FailedPrecondition("block " + key.ToHex() + " is pinned (" +
                                        std::to_string(e.pins) + "); it cannot leave " +
                                        TierName(tier) + " until unpinned");
    }
    slot = e.slot[tier];
    e.tier_mask &= static_cast<uint8_t>(~(1u << tier));
    e.slot[tier] = kNoSlot;
    // A pinned entry outlives its last tier (invisible to Match) until its last Unpin.
    if (e.tier_mask == 0 && e.pins == 0) shard.map.erase(it);
  }
  ts.policy->OnRemove(key);
  --ts.count;
  return slot;
}

Result<uint32_t> BlockIndex::Remove(const BlockKey& key, TierId tier) {
  return RemoveImpl(key, tier, /*even_if_pinned=*/false);
}

Result<uint32_t> BlockIndex::Invalidate(const BlockKey& key, TierId tier) {
  return RemoveImpl(key, tier, /*even_if_pinned=*/true);
}

MatchResult BlockIndex::MatchImpl(std::span<const BlockKey> keys, uint8_t tier_mask,
                                  bool pin) const {
  MatchResult result;
  result.tiers.reserve(keys.size());
  result.slots.reserve(keys.size());
  for (const BlockKey& key : keys) {
    Shard& shard = ShardFor(key);
    MutexLock lock(&shard.mu);
    auto it = shard.map.find(key);
    if (it == shard.map.end()) break;
    const uint8_t held = it->second.tier_mask & tier_mask;
    if (held == 0) break;
    if (pin) {
      ++it->second.pins;
      ++shard.pins;
    }
    const TierId tier = FastestTier(held);
    result.tiers.push_back(tier);
    result.slots.push_back(it->second.slot[tier]);
  }
  return result;
}

MatchResult BlockIndex::Match(std::span<const BlockKey> keys, uint8_t tier_mask) const {
  return MatchImpl(keys, tier_mask, /*pin=*/false);
}

MatchResult BlockIndex::MatchAndPin(std::span<const BlockKey> keys, uint8_t tier_mask) {
  return MatchImpl(keys, tier_mask, /*pin=*/true);
}

Status BlockIndex::Pin(const BlockKey& key) {
  Shard& shard = ShardFor(key);
  MutexLock lock(&shard.mu);
  auto it = shard.map.find(key);
  if (it == shard.map.end())
    return Status::NotFound("cannot pin " + key.ToHex() + ": no tier holds it");
  ++it->second.pins;
  ++shard.pins;
  return Status::Ok();
}

Status BlockIndex::Unpin(std::span<const BlockKey> keys) {
  Status first_error;
  for (const BlockKey& key : keys) {
    Shard& shard = ShardFor(key);
    MutexLock lock(&shard.mu);
    auto it = shard.map.find(key);
    if (it == shard.map.end() || it->second.pins == 0) {
      if (first_error.ok()) {
        first_error = Status::FailedPrecondition("unpin of " + key.ToHex() +
                                                 ", which is not pinned (unbalanced Unpin)");
      }
      continue;
    }
    --shard.pins;
    if (--it->second.pins == 0 && it->second.tier_mask == 0) shard.map.erase(it);
  }
  return first_error;
}

void BlockIndex::Touch(std::span<const BlockKey> keys) {
  if (keys.empty()) return;
  uint64_t tick = clock_.fetch_add(keys.size(), std::memory_order_relaxed) + 1;
  std::array<std::vector<BlockKey>, kNumTiers> per_tier;
  for (const BlockKey& key : keys) {
    Shard& shard = ShardFor(key);
    MutexLock lock(&shard.mu);
    auto it = shard.map.find(key);
    if (it == shard.map.end()) continue;
    Entry& e = it->second;
    ++e.hits;
    e.last_access = tick++;
    for (TierId t = 0; t < kNumTiers; ++t) {
      if ((e.tier_mask >> t) & 1u) per_tier[t].push_back(key);
    }
  }
  for (TierId t = 0; t < kNumTiers; ++t) {
    if (per_tier[t].empty()) continue;
    TierState& ts = tiers_[t];
    MutexLock lock(&ts.mu);
    // A key removed since the shard pass is untracked by now; OnAccess ignores it.
    for (const BlockKey& key : per_tier[t]) ts.policy->OnAccess(key);
  }
}

std::optional<EvictedBlock> BlockIndex::EvictOne(TierId tier) { return EvictOne(tier, nullptr); }

std::optional<EvictedBlock> BlockIndex::EvictOne(
    TierId tier, const std::function<bool(uint32_t slot)>& allowed) {
  if (tier >= kNumTiers) return std::nullopt;
  TierState& ts = tiers_[tier];
  MutexLock tier_lock(&ts.mu);
  auto unpinned = [this, tier, &allowed](const BlockKey& key) {
    Shard& shard = ShardFor(key);
    MutexLock lock(&shard.mu);
    auto it = shard.map.find(key);
    return it != shard.map.end() && it->second.pins == 0 &&
           (!allowed || allowed(it->second.slot[tier]));
  };
  // A victim can be pinned between the policy's check and the removal (Pin takes no tier
  // lock); then ask again. Each retry sees one more pinned block, so this ends.
  for (int attempt = 0; attempt < 64; ++attempt) {
    std::optional<BlockKey> victim = ts.policy->Victim(unpinned);
    if (!victim) return std::nullopt;
    uint32_t slot = kNoSlot;
    BlockKey parent;
    uint8_t remaining = 0;
    {
      Shard& shard = ShardFor(*victim);
      MutexLock lock(&shard.mu);
      auto it = shard.map.find(*victim);
      if (it == shard.map.end() || !((it->second.tier_mask >> tier) & 1u)) {
        // The policy tracks a key the tier does not hold: an invariant is broken. Drop it from
        // the policy so eviction cannot spin on it.
        ts.policy->OnRemove(*victim);
        continue;
      }
      Entry& e = it->second;
      if (e.pins != 0) continue;
      if (allowed && !allowed(e.slot[tier])) continue;
      slot = e.slot[tier];
      parent = e.parent;
      e.tier_mask &= static_cast<uint8_t>(~(1u << tier));
      e.slot[tier] = kNoSlot;
      remaining = e.tier_mask;
      if (e.tier_mask == 0) shard.map.erase(it);
    }
    ts.policy->OnRemove(*victim);
    --ts.count;
    return EvictedBlock{*victim, parent, slot, remaining};
  }
  return std::nullopt;
}

std::optional<BlockInfo> BlockIndex::Get(const BlockKey& key) const {
  Shard& shard = ShardFor(key);
  MutexLock lock(&shard.mu);
  auto it = shard.map.find(key);
  if (it == shard.map.end()) return std::nullopt;
  const Entry& e = it->second;
  BlockInfo info;
  info.key = key;
  info.parent = e.parent;
  info.tier_mask = e.tier_mask;
  info.slot = e.slot;
  info.pins = e.pins;
  info.last_access = e.last_access;
  info.hits = e.hits;
  return info;
}

uint64_t BlockIndex::TierCount(TierId tier) const {
  if (tier >= kNumTiers) return 0;
  MutexLock lock(&tiers_[tier].mu);
  return tiers_[tier].count;
}

uint64_t BlockIndex::KeyCount() const {
  uint64_t n = 0;
  for (uint64_t s = 0; s <= shard_mask_; ++s) {
    MutexLock lock(&shards_[s].mu);
    n += shards_[s].map.size();
  }
  return n;
}

uint64_t BlockIndex::TotalPins() const {
  uint64_t n = 0;
  for (uint64_t s = 0; s <= shard_mask_; ++s) {
    MutexLock lock(&shards_[s].mu);
    n += shards_[s].pins;
  }
  return n;
}

}  // namespace kvtier

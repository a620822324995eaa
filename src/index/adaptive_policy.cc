#include "index/adaptive_policy.h"

#include <algorithm>
#include <cmath>

namespace kvtier {

AdaptivePolicy::AdaptivePolicy(size_t capacity_blocks, const PolicyOptions& options)
    : capacity_(std::max<size_t>(capacity_blocks, 1)),
      options_(options),
      hysteresis_(options.adaptive.hysteresis),
      decay_period_(std::max<uint64_t>(16, capacity_ / 16)),
      decay_factor_(std::exp2(-static_cast<double>(decay_period_) /
                              (options.adaptive.half_life * static_cast<double>(capacity_)))) {}

Result<std::unique_ptr<AdaptivePolicy>> AdaptivePolicy::Create(size_t capacity_blocks,
                                                               const PolicyOptions& options) {
  if (Status s = options.adaptive.Validate(); !s.ok()) return s;
  std::unique_ptr<AdaptivePolicy> policy(new AdaptivePolicy(capacity_blocks, options));
  policy->kinds_.assign(std::begin(kCandidates), std::end(kCandidates));
  if (options.adaptive.with_hit_density != 0) policy->kinds_.push_back(PolicyKind::kHitDensity);
  policy->candidates_.resize(policy->kinds_.size());
  for (size_t i = 0; i < policy->kinds_.size(); ++i) {
    auto made = MakeEvictionPolicy(policy->kinds_[i], policy->capacity_, options);
    if (!made.ok()) {
      return Status::InvalidArgument(std::string("adaptive policy, candidate ") +
                                     PolicyKindName(policy->kinds_[i]) + ": " +
                                     made.status().message());
    }
    policy->candidates_[i].shadow = std::move(*made);
  }
  // Every candidate was built with these options above, so the leader's mirror can be too.
  auto mirror = MakeEvictionPolicy(policy->kinds_[policy->leader_], policy->capacity_, options);
  if (!mirror.ok()) return mirror.status();
  policy->mirror_ = std::move(*mirror);
  return policy;
}

void AdaptivePolicy::Reference(const BlockKey& key, const BlockKey& parent) {
  const bool continues = have_last_ && parent == last_key_;
  const auto any = [](const BlockKey&) { return true; };
  for (Candidate& c : candidates_) {
    EvictionPolicy& shadow = *c.shadow;
    const bool held = shadow.Contains(key);
    if (held) {
      shadow.OnAccess(key);
    } else {
      if (shadow.size() >= capacity_) {
        if (std::optional<BlockKey> v = shadow.Victim(any)) shadow.OnRemove(*v);
      }
      shadow.OnInsert(key, parent);
    }
    c.last_counted = held && (!continues || c.last_counted);
    if (c.last_counted) c.score += 1.0;
  }
  last_key_ = key;
  have_last_ = true;
  if (++references_ % decay_period_ != 0) return;
  size_t best = leader_;
  for (size_t i = 0; i < candidates_.size(); ++i) {
    candidates_[i].score *= decay_factor_;
    if (candidates_[i].score > candidates_[best].score) best = i;
  }
  const double lead = candidates_[leader_].score;
  if (best != leader_ && candidates_[best].score > lead * (1 + hysteresis_) &&
      candidates_[best].score >= lead + 1) {
    SwitchTo(best);
  }
}

void AdaptivePolicy::SwitchTo(size_t next) {
  auto made = MakeEvictionPolicy(kinds_[next], capacity_, options_);
  if (!made.ok()) return;  // cannot happen: Create built this kind with these options
  for (const BlockKey& key : recency_) (*made)->OnInsert(key, tracked_.at(key).parent);
  mirror_ = std::move(*made);
  leader_ = next;
  ++switches_;
}

void AdaptivePolicy::OnInsert(const BlockKey& key, const BlockKey& parent) {
  if (tracked_.contains(key)) {
    OnAccess(key);  // a double insert is a programmer error; treat it as a use
    return;
  }
  recency_.push_back(key);
  tracked_.emplace(key, Tracked{parent, std::prev(recency_.end())});
  mirror_->OnInsert(key, parent);
  Reference(key, parent);
}

void AdaptivePolicy::OnAccess(const BlockKey& key) {
  auto it = tracked_.find(key);
  if (it == tracked_.end()) return;
  recency_.splice(recency_.end(), recency_, it->second.recency);
  mirror_->OnAccess(key);
  const BlockKey parent = it->second.parent;  // Reference may switch, which reads tracked_
  Reference(key, parent);
}

void AdaptivePolicy::OnRemove(const BlockKey& key) {
  auto it = tracked_.find(key);
  if (it == tracked_.end()) return;
  recency_.erase(it->second.recency);
  tracked_.erase(it);
  mirror_->OnRemove(key);
}

std::optional<BlockKey> AdaptivePolicy::Victim(const EvictablePredicate& evictable) {
  return mirror_->Victim(evictable);
}

}  // namespace kvtier

#include "index/adaptive_policy.h"

#include <algorithm>
#include <cmath>

namespace kvtier {

AdaptivePolicy::AdaptivePolicy(size_t capacity_blocks, const AdaptiveConfig& config)
    : capacity_(std::max<size_t>(capacity_blocks, 1)),
      hysteresis_(config.hysteresis),
      decay_period_(std::max<uint64_t>(16, capacity_ / 16)),
      decay_factor_(std::exp2(-static_cast<double>(decay_period_) /
                              (config.half_life * static_cast<double>(capacity_)))) {}

Result<std::unique_ptr<AdaptivePolicy>> AdaptivePolicy::Create(size_t capacity_blocks,
                                                               const PolicyOptions& options) {
  if (Status s = options.adaptive.Validate(); !s.ok()) return s;
  std::unique_ptr<AdaptivePolicy> policy(new AdaptivePolicy(capacity_blocks, options.adaptive));
  policy->kinds_.assign(std::begin(kCandidates), std::end(kCandidates));
  if (options.adaptive.with_hit_density != 0) policy->kinds_.push_back(PolicyKind::kHitDensity);
  policy->candidates_.resize(policy->kinds_.size());
  for (size_t i = 0; i < policy->kinds_.size(); ++i) {
    for (auto* slot : {&policy->candidates_[i].mirror, &policy->candidates_[i].shadow}) {
      auto made = MakeEvictionPolicy(policy->kinds_[i], policy->capacity_, options);
      if (!made.ok()) {
        return Status::InvalidArgument(std::string("adaptive policy, candidate ") +
                                       PolicyKindName(policy->kinds_[i]) + ": " +
                                       made.status().message());
      }
      *slot = std::move(*made);
    }
  }
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
    leader_ = best;
    ++switches_;
  }
}

void AdaptivePolicy::OnInsert(const BlockKey& key, const BlockKey& parent) {
  if (!parents_.try_emplace(key, parent).second) {
    OnAccess(key);  // a double insert is a programmer error; treat it as a use
    return;
  }
  for (Candidate& c : candidates_) c.mirror->OnInsert(key, parent);
  Reference(key, parent);
}

void AdaptivePolicy::OnAccess(const BlockKey& key) {
  auto it = parents_.find(key);
  if (it == parents_.end()) return;
  for (Candidate& c : candidates_) c.mirror->OnAccess(key);
  Reference(key, it->second);
}

void AdaptivePolicy::OnRemove(const BlockKey& key) {
  if (parents_.erase(key) == 0) return;
  for (Candidate& c : candidates_) c.mirror->OnRemove(key);
}

std::optional<BlockKey> AdaptivePolicy::Victim(const EvictablePredicate& evictable) {
  return candidates_[leader_].mirror->Victim(evictable);
}

}  // namespace kvtier

// AdaptivePolicy: follows, at run time, whichever of a few candidate policies would be hitting
// most on the recent references, judged by shadow caches. The default of g2/g3 (issue 17).
//
// No single policy wins on every workload (docs/policy-study.md, section 8): credit-lru wins on
// multi-turn chat, W-TinyLFU where one-off long prompts stream past hot prefixes, ARC or LRU
// where reuse is recent. So the tier keeps:
//  - for each candidate, a *shadow*: an instance of the candidate that runs a key-only cache of
//    the same capacity over the same reference string, as if it alone ran the tier. It says how
//    the candidate would do;
//  - for the leader only, a *mirror*: an instance that sees exactly the tier's real OnInsert,
//    OnAccess and OnRemove, so it can name a victim among the blocks really cached. When the
//    leader changes, the new leader's mirror is built from the blocks cached now, fed in
//    recency order (least recent first) with their parents; it starts without their use
//    history (credit-lru's use counts, W-TinyLFU's sketch), which it learns again as the
//    references go on. Switches are rare (the hysteresis, the decay period), and one mirror
//    instead of one per candidate halves the cost of every call.
// Victim asks the leader's mirror. Each shadow scores its *prefix hits* (a reference counts only
// when the shadow holds it and, if the reference continues the previous one's chain, i.e. its
// parent is the previous key, the previous one counted too; in `kvtier sim`, which serves one
// request at a time, that is exactly the simulator's hit rule). Scores decay with a half-life
// of AdaptiveConfig::half_life x capacity references; the leader changes when another
// candidate's score exceeds the leader's by more than AdaptiveConfig::hysteresis (relative) and
// by at least one hit.
//
// Both settings' defaults were chosen by cross-validation on a subset of the traces, never the ones
// reported (docs/policy-study.md, section 8).
//
// Every real reference is an OnInsert or an OnAccess of a tracked key; both feed the shadows. An
// OnAccess of an untracked key is ignored (contract of EvictionPolicy), and feeds nothing.
//
// Costs: each call costs the sum of the candidates' costs plus the leader's, and a recency-list
// step; a leader change costs one insert per cached block. Memory is about (number of
// candidates + 1) x a candidate's bookkeeping (keys only, never block data), plus a parent and a
// recency entry per tracked key.
#pragma once

#include <array>
#include <cstdint>
#include <list>
#include <memory>
#include <unordered_map>
#include <vector>

#include "index/eviction_policy.h"

namespace kvtier {

class AdaptivePolicy final : public EvictionPolicy {
 public:
  // The candidates, in order of preference on a tie; the first leads until scores say otherwise.
  static constexpr PolicyKind kCandidates[] = {PolicyKind::kCreditLru, PolicyKind::kWTinyLfu,
                                               PolicyKind::kArc, PolicyKind::kLru};
  static constexpr size_t kNumCandidates = std::size(kCandidates);

  // A tier of `capacity_blocks` slots; reads options.adaptive, and passes `options` to every
  // candidate (credit-lru reads its member). InvalidArgument when options.adaptive does not
  // validate or a candidate cannot be built with them.
  static Result<std::unique_ptr<AdaptivePolicy>> Create(size_t capacity_blocks,
                                                        const PolicyOptions& options);
  AdaptivePolicy(const AdaptivePolicy&) = delete;
  AdaptivePolicy& operator=(const AdaptivePolicy&) = delete;

  PolicyKind kind() const override { return PolicyKind::kAdaptive; }
  void OnInsert(const BlockKey& key, const BlockKey& parent) override;
  void OnAccess(const BlockKey& key) override;
  void OnRemove(const BlockKey& key) override;
  // The leader's mirror's victim.
  std::optional<BlockKey> Victim(const EvictablePredicate& evictable) override;
  size_t size() const override { return tracked_.size(); }
  bool Contains(const BlockKey& key) const override { return tracked_.contains(key); }

  // The candidate followed now.
  PolicyKind leader() const { return kinds_[leader_]; }
  // The candidates, in order: kCandidates, then hit-density when AdaptiveConfig says so.
  const std::vector<PolicyKind>& candidates() const { return kinds_; }
  // Times the leader changed.
  uint64_t switches() const { return switches_; }
  // Candidate i's decayed score (prefix hits of its shadow).
  double score(size_t i) const { return candidates_[i].score; }

 private:
  struct Candidate {
    std::unique_ptr<EvictionPolicy> shadow;
    double score = 0;
    bool last_counted = false;  // the previous reference counted as a prefix hit
  };
  struct Tracked {
    BlockKey parent;
    std::list<BlockKey>::iterator recency;  // in recency_
  };

  AdaptivePolicy(size_t capacity_blocks, const PolicyOptions& options);
  // Feeds one reference to every shadow and maybe changes the leader.
  void Reference(const BlockKey& key, const BlockKey& parent);
  // Makes candidate `next` the leader: builds its mirror from the tracked keys.
  void SwitchTo(size_t next);

  const size_t capacity_;
  const PolicyOptions options_;  // for the mirrors built at a switch
  const double hysteresis_;
  const uint64_t decay_period_;  // references between two decays
  const double decay_factor_;    // scores are multiplied by it every decay_period_ references
  std::vector<PolicyKind> kinds_;
  std::vector<Candidate> candidates_;       // one per kinds_ entry
  std::unique_ptr<EvictionPolicy> mirror_;  // the leader's, over the tracked keys
  std::unordered_map<BlockKey, Tracked, BlockKeyHash> tracked_;
  std::list<BlockKey> recency_;  // tracked keys, least recently inserted or used first
  BlockKey last_key_;
  bool have_last_ = false;
  uint64_t references_ = 0;
  size_t leader_ = 0;
  uint64_t switches_ = 0;
};

}  // namespace kvtier

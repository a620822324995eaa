// KvRouter's prefix index and cost model (include/kvtier/router.h, docs/router.md).
//
// Invariants (all under mu_):
//  - workers_ holds every known worker; each has one TierSet per local tier (G1, G2, G3);
//    its G4 set is unused: G4 is shared_g4_, one set for all workers.
//  - A TierSet's map and order list hold the same keys; order_ is oldest-stored first, so the
//    bound (max_blocks_per_worker_tier) forgets from its front. A key stored again moves to the
//    back.
#include <algorithm>
#include <cmath>
#include <list>
#include <map>
#include <string>
#include <unordered_map>

#include "core/mutex.h"
#include "core/thread_annotations.h"
#include "kvtier/layout.h"
#include "kvtier/router.h"

namespace kvtier {

namespace {

// The keys one worker holds in one tier, oldest stored first.
class TierSet {
 public:
  // Adds `key` (or refreshes it); forgets the oldest keys past `bound` (0 = none).
  void Store(const BlockKey& key, uint64_t bound) {
    auto it = map_.find(key);
    if (it != map_.end()) {
      order_.splice(order_.end(), order_, it->second);
    } else {
      order_.push_back(key);
      map_.emplace(key, std::prev(order_.end()));
    }
    while (bound > 0 && map_.size() > bound) {
      map_.erase(order_.front());
      order_.pop_front();
    }
  }
  void Remove(const BlockKey& key) {
    auto it = map_.find(key);
    if (it == map_.end()) return;
    order_.erase(it->second);
    map_.erase(it);
  }
  void Clear() {
    map_.clear();
    order_.clear();
  }
  bool Contains(const BlockKey& key) const { return map_.count(key) != 0; }
  uint64_t size() const { return map_.size(); }

 private:
  std::list<BlockKey> order_;
  std::unordered_map<BlockKey, std::list<BlockKey>::iterator, BlockKeyHash> map_;
};

bool PositiveFinite(double v) { return std::isfinite(v) && v > 0; }

class KvRouterImpl final : public KvRouter {
 public:
  explicit KvRouterImpl(const RouterOptions& o) : KvRouter(o) {}

  Status AddWorker(WorkerId worker) override {
    MutexLock l(&mu_);
    if (workers_.count(worker) != 0) {
      return Status::AlreadyExists("worker " + std::to_string(worker) + " is already known");
    }
    workers_.emplace(worker, Worker{});
    return Status::Ok();
  }

  Status RemoveWorker(WorkerId worker) override {
    MutexLock l(&mu_);
    if (workers_.erase(worker) == 0) return UnknownWorker(worker);
    return Status::Ok();
  }

  Status SetWorkerUp(WorkerId worker, bool up) override {
    MutexLock l(&mu_);
    Worker* w = Find(worker);
    if (w == nullptr) return UnknownWorker(worker);
    w->up = up;
    return Status::Ok();
  }

  Status SetWorkerQueue(WorkerId worker, double queue_s) override {
    if (!std::isfinite(queue_s) || queue_s < 0) {
      return Status::InvalidArgument("queue_s of worker " + std::to_string(worker) +
                                     " must be finite and >= 0, got " + std::to_string(queue_s));
    }
    MutexLock l(&mu_);
    Worker* w = Find(worker);
    if (w == nullptr) return UnknownWorker(worker);
    w->queue_s = queue_s;
    return Status::Ok();
  }

  Status Apply(WorkerId worker, std::span<const KvEvent> events) override {
    for (size_t i = 0; i < events.size(); ++i) {
      const KvEvent& e = events[i];
      if (e.tier >= kNumTiers ||
          (e.kind != KvEvent::Kind::kStored && e.kind != KvEvent::Kind::kRemoved)) {
        return Status::InvalidArgument(
            "event " + std::to_string(i) + " of worker " + std::to_string(worker) + " has tier " +
            std::to_string(e.tier) + " / kind " + std::to_string(static_cast<int>(e.kind)) +
            "; nothing applied");
      }
    }
    MutexLock l(&mu_);
    Worker* w = Find(worker);
    if (w == nullptr) return UnknownWorker(worker);
    const uint64_t bound = options_.max_blocks_per_worker_tier;
    for (const KvEvent& e : events) {
      TierSet& set = e.tier == kTierG4 ? shared_g4_ : w->tiers[e.tier];
      if (e.kind == KvEvent::Kind::kStored) {
        set.Store(e.key, bound);
      } else {
        set.Remove(e.key);
      }
    }
    return Status::Ok();
  }

  Status ClearWorker(WorkerId worker, uint8_t tiers) override {
    if ((tiers & ~kAllTiers) != 0) {
      return Status::InvalidArgument("tier mask " + std::to_string(tiers) +
                                     " names tiers past G4; use bits 1 << TierId");
    }
    MutexLock l(&mu_);
    Worker* w = Find(worker);
    if (w == nullptr) return UnknownWorker(worker);
    for (TierId t = 0; t < kTierG4; ++t) {
      if ((tiers & (1u << t)) != 0) w->tiers[t].Clear();
    }
    if ((tiers & (1u << kTierG4)) != 0) shared_g4_.Clear();
    return Status::Ok();
  }

  Result<RouteDecision> Route(std::span<const BlockKey> keys,
                              uint32_t prompt_tokens) const override {
    const uint64_t tpb = options_.tokens_per_block;
    // The last key may name a partial block (Mooncake's last hash id does), so the prompt must
    // reach into the last key's block, not past its end.
    if (prompt_tokens == 0 || (!keys.empty() && prompt_tokens <= (keys.size() - 1) * tpb)) {
      return Status::InvalidArgument(
          "prompt of " + std::to_string(prompt_tokens) + " tokens is too short for " +
          std::to_string(keys.size()) + " block keys of " + std::to_string(tpb) +
          " tokens (pass the prompt's token count, > (keys - 1) x tokens_per_block)");
    }
    // Seconds to bring one block to G1 from each tier (G1: free unless a bandwidth is given).
    std::array<double, kNumTiers> block_s{};
    for (TierId t = 0; t < kNumTiers; ++t) {
      block_s[t] = options_.load_gbps[t] > 0
                       ? static_cast<double>(options_.block_bytes) / (options_.load_gbps[t] * 1e9)
                       : 0.0;
    }
    MutexLock l(&mu_);
    RouteDecision d;
    d.candidates.reserve(workers_.size());
    bool any_up = false;
    size_t chosen = 0;  // index of the best candidate so far
    for (const auto& [id, w] : workers_) {
      RouteCandidate c;
      c.worker = id;
      c.up = w.up;
      c.queue_s = w.queue_s;
      uint64_t supplied = 0;
      for (const BlockKey& key : keys) {
        // The cheapest tier that holds the block (tiers are not assumed ordered by speed).
        int best = -1;
        for (TierId t = 0; t < kNumTiers; ++t) {
          const bool held = t == kTierG4 ? shared_g4_.Contains(key) : w.tiers[t].Contains(key);
          if (held && (best < 0 || block_s[t] < block_s[best])) best = t;
        }
        if (best < 0) break;
        ++c.blocks_by_tier[best];
        c.load_s += block_s[best];
        ++supplied;
      }
      c.compute_tokens = static_cast<uint32_t>(
          prompt_tokens - std::min<uint64_t>(supplied * tpb, uint64_t{prompt_tokens} - 1));
      c.compute_s = c.compute_tokens / options_.prefill_tokens_per_s;
      c.ttft_s = c.queue_s * options_.queue_weight + c.load_s + c.compute_s;
      if (c.up) {
        // Lowest estimate; equal estimates go to the shorter queue, then the lower id.
        const RouteCandidate* best = any_up ? &d.candidates[chosen] : nullptr;
        if (best == nullptr || c.ttft_s < best->ttft_s ||
            (c.ttft_s == best->ttft_s && c.queue_s < best->queue_s)) {
          chosen = d.candidates.size();
        }
        any_up = true;
      }
      d.candidates.push_back(c);
    }
    if (!any_up) {
      return Status::Unavailable(workers_.empty() ? "no worker is known; AddWorker first"
                                                  : "every worker is down");
    }
    d.worker = d.candidates[chosen].worker;
    return d;
  }

  uint64_t BlockCount(WorkerId worker, TierId tier) const override {
    MutexLock l(&mu_);
    auto it = workers_.find(worker);
    if (it == workers_.end() || tier >= kNumTiers) return 0;
    return tier == kTierG4 ? shared_g4_.size() : it->second.tiers[tier].size();
  }

 private:
  struct Worker {
    bool up = true;
    double queue_s = 0;
    std::array<TierSet, kNumTiers> tiers;  // G1..G3; G4 is shared_g4_
  };

  static Status UnknownWorker(WorkerId worker) {
    return Status::NotFound("worker " + std::to_string(worker) + " is unknown; AddWorker first");
  }
  Worker* Find(WorkerId worker) REQUIRES(mu_) {
    auto it = workers_.find(worker);
    return it == workers_.end() ? nullptr : &it->second;
  }

  mutable Mutex mu_;
  std::map<WorkerId, Worker> workers_ GUARDED_BY(mu_);  // ordered: candidates in id order
  TierSet shared_g4_ GUARDED_BY(mu_);
};

}  // namespace

Result<std::unique_ptr<KvRouter>> KvRouter::Create(const RouterOptions& o) {
  const uint32_t tpb = o.tokens_per_block;
  if (tpb == 0 || tpb > KvLayout::kMaxTokensPerBlock) {
    return Status::InvalidArgument(
        "router tokens_per_block " + std::to_string(tpb) + ": must be in 1.." +
        std::to_string(KvLayout::kMaxTokensPerBlock) + " (the engine's block size)");
  }
  if (o.block_bytes == 0) {
    return Status::InvalidArgument(
        "router block_bytes is 0: give the bytes of one block's KV, all layers");
  }
  if (!PositiveFinite(o.prefill_tokens_per_s)) {
    return Status::InvalidArgument("router prefill_tokens_per_s " +
                                   std::to_string(o.prefill_tokens_per_s) +
                                   ": must be finite and > 0 (the worker's prefill speed)");
  }
  for (TierId t = 0; t < kNumTiers; ++t) {
    const double g = o.load_gbps[t];
    const bool ok = t == kTierG1 ? std::isfinite(g) && g >= 0 : PositiveFinite(g);
    if (!ok) {
      return Status::InvalidArgument(std::string("router load_gbps[") + TierName(t) + "] " +
                                     std::to_string(g) +
                                     (t == kTierG1 ? ": must be finite and >= 0 (0 = free)"
                                                   : ": must be finite and > 0 (GB/s)"));
    }
  }
  if (!std::isfinite(o.queue_weight) || o.queue_weight < 0) {
    return Status::InvalidArgument("router queue_weight " + std::to_string(o.queue_weight) +
                                   ": must be finite and >= 0");
  }
  return std::unique_ptr<KvRouter>(new KvRouterImpl(o));
}

}  // namespace kvtier

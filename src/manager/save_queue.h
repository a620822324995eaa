// SaveQueue: the saves the manager has taken on and not ended. One job: the bookkeeping of
// a save from Commit to its end: the keys claimed (so a concurrent Commit of the same prefix
// does not save a block twice), the saves queued for StartSave (each with its G2 slot), the
// saves deferred until a G2 slot frees (bounded, each with a deadline), and how many saves
// the transfer engine is running. What to save, and when a slot is given, is the Impl's.
//
// Lock: none of its own. Like RequestTable it is guarded by BlockManagerImpl::mu_ (declared
// GUARDED_BY(mu_)): a save moves between the queue and a request's save holds in one
// critical section.
//
// Invariants:
//  - The key of every queued and deferred save is claimed; a key is claimed from Claim until
//    its save is dropped (Unclaim) or ends (End).
//  - deferred() <= max_deferred (Configure); CanDefer says whether one more fits.
//  - outstanding() counts the saves TakeQueued handed out whose End has not come.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <unordered_set>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/tier.h"

namespace kvtier {

// A save with its G2 slot, waiting for StartSave (G1 -> G2).
struct PendingSave {
  uint32_t instance = 0;
  std::string request_id;
  BlockKey key;
  BlockKey parent;
  uint32_t g1_block = 0;
  uint32_t g2_slot = 0;
};

// A save waiting for a G2 slot.
struct DeferredSave {
  uint32_t instance = 0;
  std::string request_id;
  BlockKey key;
  BlockKey parent;
  uint64_t namespace_id = 0;
  uint32_t g1_block = 0;
  std::vector<TokenId> tokens;
  std::chrono::steady_clock::time_point deadline;  // dropped when still waiting after it
  uint8_t store_tiers = kAllTiers;
};

class SaveQueue {
 public:
  SaveQueue() = default;
  SaveQueue(const SaveQueue&) = delete;
  SaveQueue& operator=(const SaveQueue&) = delete;

  // At most `max_deferred` saves wait for a slot, each at most `max_defer`. Set once, before
  // the first call.
  void Configure(size_t max_deferred, std::chrono::milliseconds max_defer);

  bool Claimed(const BlockKey& key) const { return claimed_.count(key) != 0; }
  // Claims `key`; false when it is claimed already (its save is under way).
  bool Claim(const BlockKey& key) { return claimed_.insert(key).second; }
  void Unclaim(const BlockKey& key) { claimed_.erase(key); }

  // Queues a save whose key is claimed, for TakeQueued.
  void Queue(PendingSave save) { queued_.push_back(std::move(save)); }
  bool HasQueued() const { return !queued_.empty(); }

  bool CanDefer() const { return deferred_.size() < max_deferred_; }
  // Defers a save whose key is claimed, until now + max_defer. REQUIRES: CanDefer().
  void Defer(DeferredSave save);
  bool HasDeferred() const { return !deferred_.empty(); }
  size_t deferred() const { return deferred_.size(); }
  // Takes every deferred save, oldest first; those not given a slot come back by Return.
  std::deque<DeferredSave> TakeDeferred();
  // A save TakeDeferred took goes back to the front (call newest first to keep the order).
  void Return(DeferredSave save) { deferred_.push_front(std::move(save)); }

  // Takes the queued saves of `instance`, and those of the instances in `gone` (kAll: every
  // queued save). They are outstanding until their End.
  static constexpr uint32_t kAll = UINT32_MAX;
  std::vector<PendingSave> TakeQueued(uint32_t instance, const std::unordered_set<uint32_t>& gone);
  // A save TakeQueued took has ended, whatever its outcome: its key is unclaimed. True when
  // no save is outstanding any more.
  bool End(const BlockKey& key);
  uint64_t outstanding() const { return outstanding_; }

  // Nothing queued and nothing deferred.
  bool Empty() const { return queued_.empty() && deferred_.empty(); }
  // Queued and deferred saves of `instance`.
  size_t Waiting(uint32_t instance) const;

  // Takes out the deferred (or queued) saves `drop` chooses, unclaiming their keys, and returns
  // them (the caller releases what they held: their request's holds, a queued one's slot).
  std::vector<DeferredSave> DropDeferred(const std::function<bool(const DeferredSave&)>& drop);
  std::vector<PendingSave> DropQueued(const std::function<bool(const PendingSave&)>& drop);

 private:
  size_t max_deferred_ = 0;
  std::chrono::milliseconds max_defer_{500};
  std::unordered_set<BlockKey, BlockKeyHash> claimed_;
  std::vector<PendingSave> queued_;
  std::deque<DeferredSave> deferred_;
  uint64_t outstanding_ = 0;
};

}  // namespace kvtier

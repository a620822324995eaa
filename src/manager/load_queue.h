// LoadQueue: the loads the manager has planned and not yet reported. One job: the bookkeeping
// of a load from PrepareLoad to the engine's Finished(): the planned loads waiting for their
// engine's StartLoad, the synchronous batches started (what that engine's WaitLayer waits
// on), and the requests whose load ended and whose engine has not been told. What to load,
// from where and into which slot, is the Impl's (block_manager_lookup.cc).
//
// Lock: none of its own. Like RequestTable and SaveQueue it is guarded by
// BlockManagerImpl::mu_ (declared GUARDED_BY(mu_)): a planned load and its request's entry
// change in one critical section.
//
// Invariants:
//  - A planned load is handed out once: TakePlanned(instance) returns exactly the loads of that
//    instance planned since its last call, in plan order, and keeps every other instance's.
//  - Only synchronous batches are kept (Started with async = false); a finished batch is
//    dropped at the next Started, so the list holds at most the batches still running plus
//    those that ended since the last start.
//  - TakeDone(instance) reports each finished load once, in the order the loads ended.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/tier.h"

namespace kvtier {

class TransferJob;

// One block to move into G1.
struct PlannedLoad {
  uint32_t instance = 0;
  std::string request_id;
  uint32_t block_index = 0;  // in the request
  BlockKey key;
  BlockKey parent;
  uint64_t namespace_id = 0;
  TierId source = kTierG2;
  uint32_t g2_slot = 0;  // G2 source, or the staging slot of a G3/G4 load
  uint32_t g1_block = 0;
  std::vector<TokenId> tokens;  // G3/G4 loads: checked against the stored header
  bool async = false;           // PrepareLoad's async_load: a batch WaitLayer does not wait on
};

// Moves the request ids of `instance` (UINT32_MAX: every instance) from `from` to `to`, in
// order; the others stay. For the (instance, request id) lists of the reports Finished gives.
void TakeIdsOf(std::vector<std::pair<uint32_t, std::string>>* from, uint32_t instance,
               std::vector<std::string>* to);

class LoadQueue {
 public:
  // Every instance (TakePlanned, JobsOf, TakeDone).
  static constexpr uint32_t kAll = UINT32_MAX;

  LoadQueue() = default;
  LoadQueue(const LoadQueue&) = delete;
  LoadQueue& operator=(const LoadQueue&) = delete;

  // Queues `loads` for their instances' next StartLoad.
  void Plan(std::vector<PlannedLoad> loads);
  // Takes the planned loads of `instance` (kAll: all of them), in plan order.
  std::vector<PlannedLoad> TakePlanned(uint32_t instance);
  size_t planned() const { return planned_.size(); }

  // A batch was started for `instance`. Synchronous batches are kept for JobsOf; batches
  // that have finished are dropped now.
  void Started(uint32_t instance, std::shared_ptr<TransferJob> job, bool async);
  // The synchronous batches of `instance` (kAll: every one) started and not yet dropped.
  std::vector<std::shared_ptr<TransferJob>> JobsOf(uint32_t instance) const;

  // The load of `request_id` (of `instance`) ended: reported by the next TakeDone(instance).
  void Done(uint32_t instance, std::string request_id);
  // Moves the ids of `instance`'s ended loads (kAll: every one) to `to`, in order.
  void TakeDone(uint32_t instance, std::vector<std::string>* to);

 private:
  static bool Matches(uint32_t instance, uint32_t want) { return want == kAll || instance == want; }

  std::vector<PlannedLoad> planned_;
  std::vector<std::pair<uint32_t, std::shared_ptr<TransferJob>>> jobs_;  // synchronous only
  std::vector<std::pair<uint32_t, std::string>> done_;                   // (instance, request)
};

}  // namespace kvtier

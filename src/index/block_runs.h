// BlockRuns: the runs of stored blocks that credit-lru and hit-density rank by. A run is the
// blocks stored one after another down a lineage: a block joins its parent's run when the parent
// is that run's last block, and starts a new run otherwise (a branch, or a parent not tracked).
// A run that starts two or more blocks deep follows a hit (the request loaded or reused what
// came before it).
// Invariants: every run kept has members > 0 (it is forgotten with its last member); run ids
// start at 1 and are never reused, so 0 names no run.
// Not thread-safe: its owner (a policy) serializes calls. Every call is one hash-map operation.
#pragma once

#include <cstdint>
#include <unordered_map>

#include "kvtier/block_key.h"

namespace kvtier {

class BlockRuns {
 public:
  struct Run {
    BlockKey last;           // the run's most recently stored block
    uint32_t length = 0;     // blocks stored by the run (evictions do not shorten it)
    uint32_t members = 0;    // tracked keys that belong to the run
    bool follow_up = false;  // stored behind a hit deeper than the first block
  };

  // `key`, inserted at `depth` below its tracked ancestors, joins run `parent_run` (its parent's;
  // 0 when the parent is not tracked) when `parent` is that run's last block, and a new run
  // otherwise. Returns the id of the run it joined.
  uint64_t Join(uint64_t parent_run, const BlockKey& parent, const BlockKey& key, uint32_t depth) {
    auto run = runs_.find(parent_run);
    if (run == runs_.end() || run->second.last != parent) {
      run = runs_.emplace(next_run_++, Run{}).first;
      run->second.follow_up = depth >= 2;
    }
    run->second.last = key;
    ++run->second.length;
    ++run->second.members;
    return run->first;
  }

  // A member of run `id` left; the run is forgotten with its last member. No-op for an unknown
  // id.
  void Leave(uint64_t id) {
    if (auto run = runs_.find(id); run != runs_.end() && --run->second.members == 0) {
      runs_.erase(run);
    }
  }

  // The run `id`. REQUIRES: a tracked key joined it (throws std::out_of_range otherwise).
  const Run& at(uint64_t id) const { return runs_.at(id); }

 private:
  uint64_t next_run_ = 1;
  std::unordered_map<uint64_t, Run> runs_;
};

}  // namespace kvtier

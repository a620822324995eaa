// CopyGate: what an attached engine's Barrier waits for (docs/service.md, "Leases"). Every
// write into G1 on the daemon's behalf (a kCopy load's layer, a save's block, a G4 fetch) runs
// inside a Pass; Barrier() returns once every pass that began before it has ended. Passes that
// begin later do not hold it up (a reader-preferring lock would let a stream of fetches starve
// it), and passes never wait for each other: they write disjoint G1 blocks, and a fetch that
// waits on the network must not stall the engine's G2 copies.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <set>

#include "core/mutex.h"
#include "core/thread_annotations.h"
#include "tier/cond_wait.h"

namespace kvtier::client {

class CopyGate {
 public:
  // One write into G1: begins at construction, ends at destruction.
  class Pass {
   public:
    explicit Pass(CopyGate& gate) EXCLUDES(gate.mu_) : gate_(gate) {
      MutexLock lock(&gate_.mu_);
      ticket_ = gate_.next_++;
      gate_.active_.insert(ticket_);
    }
    ~Pass() {
      {
        MutexLock lock(&gate_.mu_);
        gate_.active_.erase(ticket_);
      }
      gate_.cv_.notify_all();
    }
    Pass(const Pass&) = delete;
    Pass& operator=(const Pass&) = delete;

   private:
    CopyGate& gate_;
    uint64_t ticket_ = 0;
  };

  // Waits until every pass begun before this call has ended.
  void Barrier() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    const uint64_t upto = next_;
    while (!active_.empty() && *active_.begin() < upto) CondWait(&cv_, &mu_);
  }

 private:
  Mutex mu_;
  std::condition_variable cv_;
  uint64_t next_ GUARDED_BY(mu_) = 1;
  std::set<uint64_t> active_ GUARDED_BY(mu_);  // tickets of the passes in progress
};

}  // namespace kvtier::client

// G4Remover: deletes G4 objects that failed verification, off the engine's paths.
//
// A G4 load that ends Corruption queues its object's name from the transfer callback (Enqueue
// never waits and never does I/O); one thread of its own takes what is queued and deletes it
// with RemoteStore::Remove, a batch per call, each call bounded by `deadline`. So neither a
// Lookup nor a load ever waits on a removal, and a dead server delays nothing but the removals.
//
// Bounds: at most `max_queued` names wait; more are dropped and counted (dropped()). Dropping
// is harmless: the manager remembers the key as bad (RejectedKeys) whether or not the object
// is deleted; deleting it only spares the other workers the same failed load.
//
// A name is deleted only if `still_bad(key)` holds right before its call: once this manager
// has written the block to G4 again, the object is whole and stays. (A rewrite that lands
// while the call is running can still be deleted by it: a later miss, never a wrong block.)
//
// Thread-safe. The destructor drops what is still queued and waits for the call in progress
// (bounded by its deadline). REQUIRES: the store outlives the remover.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "core/mutex.h"
#include "kvtier/block_key.h"
#include "tier/remote_store.h"

namespace kvtier {

class G4Remover {
 public:
  struct Options {
    std::chrono::milliseconds deadline{2000};  // each Remove call ends by then
    size_t max_queued = 1024;                  // names waiting at most, >= 1
    size_t max_batch = 64;                     // names per Remove call at most, >= 1
  };

  G4Remover(RemoteStore* store, const Options& options,
            std::function<bool(const BlockKey&)> still_bad);
  ~G4Remover();
  G4Remover(const G4Remover&) = delete;
  G4Remover& operator=(const G4Remover&) = delete;

  // Queues the object `name` (block `key`) for deletion. Never waits.
  void Enqueue(std::string name, const BlockKey& key) EXCLUDES(mu_);

  // Objects deleted (Remove returned Ok for their batch), names dropped because the queue was
  // full, names whose call failed (server down, late; not retried).
  uint64_t removed() const { return removed_.load(std::memory_order_relaxed); }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  uint64_t failed() const { return failed_.load(std::memory_order_relaxed); }

 private:
  struct Item {
    std::string name;
    BlockKey key;
  };
  void Loop() EXCLUDES(mu_);

  RemoteStore* const store_;
  const Options options_;
  const std::function<bool(const BlockKey&)> still_bad_;
  Mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> removed_{0}, dropped_{0}, failed_{0};
  std::thread thread_;  // last: starts once everything above is built
};

}  // namespace kvtier

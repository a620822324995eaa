// ManagerEvents: the embedded manager's KV events (include/kvtier/events.h): the callbacks of
// SubscribeEvents, the wire publisher (events.endpoint, src/events), and the event structs the
// manager's paths hand to them. BlockManagerImpl owns one and emits through it.
//
// Invariants:
//  - Every Emit reaches every subscriber registered before it, then the publisher (when on),
//    in the order of the Emit calls of one thread; no lock is held while a callback runs or
//    while the publisher queues (a callback may call back into the manager).
//  - The blocks G3 recovered at start-up (SetRecovered) reach the publisher once, right after
//    its AllBlocksCleared, and the first subscriber once; later subscribers hear only what is
//    emitted after they subscribed.
//  - Once a subscriber or the publisher exists (wanted()), a kStored event carries its block's
//    tokens, size and namespace names; before that, only key, parent and tier (Stored's
//    `always` aside), so the save path pays nothing for events no one reads.
//
// Lock: mu_ guards the subscribers and the recovered events. A leaf: no callback runs and no
// other lock is taken while it is held.
//
// Shutdown: the publisher stops in the destructor, sending what is queued; destroy this last,
// after everything that emits events (the transfer engine's callbacks, the G3 flush) has
// stopped (~BlockManagerImpl).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/mutex.h"
#include "kvtier/block_key.h"
#include "kvtier/events.h"
#include "kvtier/manager_stats.h"
#include "kvtier/status.h"
#include "kvtier/tier.h"
#include "manager/hasher_cache.h"
#include "manager/manager_settings.h"

namespace kvtier {

class EventPublisher;  // events/event_publisher.h

class ManagerEvents {
 public:
  // `hashers`: the names of each namespace for kStored events; must outlive this.
  ManagerEvents(uint32_t tokens_per_block, const HasherCache* hashers);
  ~ManagerEvents();
  ManagerEvents(const ManagerEvents&) = delete;
  ManagerEvents& operator=(const ManagerEvents&) = delete;

  // Starts the wire publisher when options.endpoint is set (else nothing). InvalidArgument
  // for a bad address. Called once, before any Emit.
  Status StartPublisher(const EventOptions& options);

  // The blocks G3 recovered at start-up: published now, and kept for the first subscriber.
  // Called once, before any Subscribe.
  void SetRecovered(std::vector<KvEvent> events) EXCLUDES(mu_);

  // Hands `events` to every subscriber, then to the publisher (queued or dropped; never
  // waits). Thread-safe; takes no lock while calling out.
  void Emit(std::vector<KvEvent> events) EXCLUDES(mu_);

  // Adds a subscriber; the first one is also given the recovered blocks, on this thread.
  void Subscribe(KvEventCallback callback) EXCLUDES(mu_);

  // An event with the key, parent and tier only, stamped now (CLOCK_REALTIME).
  static KvEvent Event(KvEvent::Kind kind, const BlockKey& key, const BlockKey& parent,
                       TierId tier);
  // A kStored event with what a consumer needs to compute its own hashes: the block's tokens,
  // the block size, whether it is a first block, and its namespace's adapter and salt (when a
  // request of this process has used that namespace and it is still in the hasher cache).
  // Only the key, parent and tier when no one listens (!wanted()) unless `always`.
  KvEvent Stored(const BlockKey& key, const BlockKey& parent, TierId tier, uint64_t namespace_id,
                 std::span<const TokenId> tokens, bool always = false) const;

  // True once a subscriber or the publisher reads event details.
  bool wanted() const { return wanted_.load(std::memory_order_relaxed); }
  // Events emitted so far (ManagerStats::events_emitted).
  uint64_t emitted() const { return emitted_.load(std::memory_order_relaxed); }
  // Fills the publisher's fields of `stats` (events_published, ...); leaves them when off.
  void AddPublisherStats(ManagerStats* stats) const;

 private:
  const uint32_t tpb_;
  const HasherCache* const hashers_;
  // Set once by StartPublisher, before any Emit; reset by the destructor.
  std::unique_ptr<EventPublisher> publisher_;
  std::atomic<bool> wanted_{false};
  std::atomic<uint64_t> emitted_{0};

  Mutex mu_;
  std::vector<KvEventCallback> subscribers_ GUARDED_BY(mu_);
  std::vector<KvEvent> recovered_ GUARDED_BY(mu_);  // for the first subscriber
};

}  // namespace kvtier

// G4Path: the manager's side of the networked tier (docs/g4.md). One job: what the manager
// knows of G4 and asks of it, apart from the moves themselves (the transfer engine runs those).
//
// It owns the store (RemoteStore), the keys whose object failed a load of ours (RejectedKeys:
// never offered again until this manager writes the block again), the deletion of corrupt
// objects off the engine's paths (G4Remover), the count of G4 writes in flight, and the G4
// counters. BlockManagerImpl orchestrates: it registers the store with the transfer engine,
// decides what to write (write-through or eviction) and builds the moves.
//
// Locks: none of its own. Its parts lock themselves (RejectedKeys, G4Remover); the settings
// are set once by Open; the counters and the in-flight count are atomics. So any thread may
// call it, holding any of the Impl's locks (it takes none of them and calls nothing back).
//
// Invariants:
//  - writes_in_flight() counts the writes between BeginWrite and EndWrite; the Impl's
//    WaitForSaves waits for it to reach 0, so every BeginWrite is paired with one EndWrite,
//    whatever the write's outcome (written, failed, dropped by a full queue).
//  - Match never answers past a rejected key: a block whose load failed is a miss until it is
//    written again (Written forgets it).
//  - Shutdown order (the Impl's destructor): the transfer engine drains first (its callbacks
//    call Written/Failed/LoadFailed), then StopRemover (its thread calls the store), then the
//    G4Path goes, with the store.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "kvtier/block_key.h"
#include "kvtier/manager_stats.h"
#include "kvtier/status.h"
#include "manager/g4_remover.h"
#include "manager/manager_settings.h"
#include "manager/rejected_keys.h"
#include "tier/remote_store.h"
#include "transfer/transfer_engine.h"

namespace kvtier {

class G4Path {
 public:
  // Wraps the store Open opened (a seam for tests: e.g. a store whose calls stall).
  using WrapStore = std::function<std::unique_ptr<RemoteStore>(std::unique_ptr<RemoteStore>)>;

  // The G4 of `cfg` for blocks of `block_bytes` bytes and `tokens_per_block` tokens. Null
  // (with a warning logged) when cfg names no backend or the store cannot open: a worker runs
  // on without G4. An error (InvalidArgument) only for a malformed Redis endpoint, the
  // operator's mistake. REQUIRES: cfg.Validate() is Ok.
  static Result<std::unique_ptr<G4Path>> Open(const G4Options& cfg, uint64_t block_bytes,
                                              uint32_t tokens_per_block, const WrapStore& wrap);
  ~G4Path();
  G4Path(const G4Path&) = delete;
  G4Path& operator=(const G4Path&) = delete;

  RemoteStore* store() const { return store_.get(); }
  // How the transfer engine runs this store's moves (threads, queue, deadlines), with
  // `release_lent_slot` for the G2 slots lent to calls abandoned at their deadline.
  TransferEngine::RemoteConfig EngineConfig(std::function<void(uint32_t)> release_lent_slot) const;
  // Starts deleting corrupt objects (LoadFailed queues them). Once, after the store is
  // registered with the transfer engine.
  void StartRemover();
  // Stops the remover; what is still queued is dropped. Before the store goes.
  void StopRemover();

  // Every committed block is written once it is in G2 (true), or only blocks leaving the
  // local tiers (false).
  bool write_through() const { return write_through_; }
  // Loading a G4 block is expected to be slower than recomputing it (g4.load_gbps and
  // g4.recompute_tokens_per_s): G4 is not asked at all. Counts the skipped lookup.
  bool SkipLookup();

  // How many of `keys` (object names in namespace `namespace_id`), from the first, G4 holds,
  // asked within the lookup deadline; stops before a rejected key. A failed or late answer is
  // 0 (counted). Counts the blocks found.
  uint32_t Match(std::span<const BlockKey> keys, uint64_t namespace_id);
  // The index of the first of `keys` whose object failed a load of ours (keys.size(): none).
  size_t FirstRejected(std::span<const BlockKey> keys) const { return rejected_.FirstIn(keys); }
  bool Rejected(const BlockKey& key) const { return rejected_.Contains(key); }

  // A G4 load of `key` (namespace `namespace_id`) ended `st` (not Ok): counted; a Corruption
  // or a NotFound rejects the key; a Corruption also queues the object's deletion.
  void LoadFailed(const BlockKey& key, uint64_t namespace_id, const Status& st);

  // Writes: BeginWrite when a write is decided (before it is submitted), then exactly one of
  // Written / WriteFailed / Dropped per write, then EndWrite.
  void BeginWrite() { writes_in_flight_.fetch_add(1); }
  void Written(const BlockKey& key);  // the object is whole again: offerable
  void WriteFailed() { save_failures_.fetch_add(1, std::memory_order_relaxed); }
  void Dropped(uint64_t n) { dropped_.fetch_add(n, std::memory_order_relaxed); }
  void EndWrite() { writes_in_flight_.fetch_sub(1); }
  uint64_t writes_in_flight() const { return writes_in_flight_.load(); }

  // The g4_* fields of ManagerStats this part owns (not those of the transfer engine).
  void FillStats(ManagerStats* s) const;

 private:
  G4Path(std::unique_ptr<RemoteStore> store, const G4Options& cfg, uint64_t block_bytes,
         uint32_t tokens_per_block);

  std::unique_ptr<RemoteStore> store_;
  const G4Options cfg_;
  bool write_through_ = true;
  std::chrono::milliseconds lookup_deadline_{20};
  bool slower_than_recompute_ = false;
  std::atomic<uint64_t> writes_in_flight_{0};
  RejectedKeys rejected_;
  // Null until StartRemover, and after StopRemover (Init and the Impl's destructor: no other
  // call runs then).
  std::unique_ptr<G4Remover> remover_;
  std::atomic<uint64_t> removed_before_stop_{0};  // remover_->removed() when it stopped
  std::atomic<uint64_t> lookup_blocks_{0}, skipped_lookups_{0}, lookup_failures_{0},
      lookup_timeouts_{0}, saved_{0}, save_failures_{0}, dropped_{0}, load_failures_{0},
      corrupt_{0};
};

}  // namespace kvtier

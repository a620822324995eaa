// BlockManagerImpl (the Impl): the orchestration behind the embedded BlockManager
// (include/kvtier/connector.h; EmbeddedManager in embedded_manager.h is the interface over it, and
// SharedManager in shared_manager.h is kvtier serve's per-engine view of it).
//
// Ownership: the Impl owns the tiers (G2 arena, G3 disk tier), the block index, the transfer
// engine, and two parts with their own locks and invariants: slots_ (G2SlotTable,
// g2_slot_table.h: what each G2 slot holds, the namespace share) and events_ (ManagerEvents,
// manager_events.h: subscribers, the wire publisher). Transfer callbacks run on the engine's and
// the disk tier's threads and update the index, the slot table and the request table.
//
// Under mu_ (no locks of their own): requests_ (RequestTable, request_table.h), saves_
// (SaveQueue, save_queue.h: a save from Commit to its end) and loads_ (LoadQueue,
// load_queue.h: a load from PrepareLoad to the engine's report).
//
// Locks: start_load_mu_ before mu_; mu_ guards requests and the pending work lists. The parts'
// locks (the slot table's meta_mu_ and ns_mu_, the events' mu_) are leaves, taken last: ns_mu_
// under mu_ (a slot released with it held) and under the index's shard locks (EvictableFor);
// none is held while taking another lock. None of ours is held while calling into the transfer
// engine (its Submit can run callbacks on the calling thread) or while delivering events. The
// index has its own locks (always taken after ours, never before).
//
// Invariants:
//  - A G2 slot is in exactly one of: the arena's free list; the staging pool; the index (G2
//    holds a block there); a save or a staging load in flight (not yet in the index); a
//    demotion write in flight.
//  - The staging pool: slots kept out of the cache for good and lent to the transfer engine
//    (RegisterStagingSlots), so a G3 (or G4) load always has a slot to stage through, even when
//    every G2 victim is still being demoted; the engine reuses them as moves finish, so any
//    number of G3 blocks can load in one batch. A G3 load staged through a free cache slot
//    instead promotes the block into G2; one staged through the pool does not.
//  - Every key pinned by PrepareLoad is unpinned exactly once, when its load batch ends.
//  - The request table (requests_, a RequestTable under mu_) keeps its entries and their
//    activity order consistent (request_table.h).
//  - A request entry is erased when it is finished (RequestFinished) and idle (no load, no
//    save hold), unless a load ended after RequestFinished and the Finished() call after the
//    one that listed it in loads_done has not come yet (so LoadedTokens still answers); or
//    when it stayed idle past manager.idle_request_ttl_ms.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/mutex.h"
#include "index/admission_filter.h"
#include "index/block_index.h"
#include "index/first_sighting_gate.h"
#include "kvtier/connector.h"
#include "manager/g2_slot_table.h"
#include "manager/g4_path.h"
#include "manager/hasher_cache.h"
#include "manager/load_queue.h"
#include "manager/manager_events.h"
#include "manager/manager_metrics.h"
#include "manager/manager_settings.h"
#include "manager/request_table.h"
#include "manager/save_queue.h"
#include "tier/disk_tier.h"
#include "tier/host_arena.h"
#include "tier/remote_store.h"
#include "transfer/transfer_engine.h"

namespace kvtier {

class BlockManagerImpl {
 public:
  // Wraps the G4 store the manager opened (a seam for tests: e.g. a store whose calls stall).
  using WrapG4 = G4Path::WrapStore;
  // Makes the device copy backend when a device G1 is registered (TransferEngine::Config::
  // device_backend_factory); null = the CUDA backend.
  using DeviceBackendFactory =
      std::function<Result<std::unique_ptr<DeviceCopyBackend>>(const DeviceCopyBackend::Config&)>;
  // `g3_open`, `wrap_g4` and `device_backend` are the seams for tests: e.g. g3_open.wrap_io
  // injects faults under G3; device_backend puts a host stand-in where no GPU exists.
  // Engine instances. An in-process manager serves one engine: every request is instance 0.
  // kvtier serve (src/daemon) serves many through one Impl: each attached engine is an
  // instance, its requests carry its number, and the per-engine calls (StartLoad, WaitLayer,
  // StartSave, Finished) touch only that instance's work, so one engine never starts, waits for
  // or reports another's. kAllInstances (WaitForSaves, shutdown) means every instance.
  static constexpr uint32_t kAllInstances = UINT32_MAX;
  static bool Matches(uint32_t instance, uint32_t want) {
    return want == kAllInstances || instance == want;
  }

  static Result<std::unique_ptr<BlockManagerImpl>> Create(
      const ManagerOptions& options, const DiskTier::OpenOptions& g3_open = {},
      WrapG4 wrap_g4 = nullptr, DeviceBackendFactory device_backend = nullptr,
      bool shared_g2 = false);
  ~BlockManagerImpl();
  // The G2 arena. kvtier serve makes it shared (Create's shared_g2: a memfd that attached
  // engines map; HostArena::Config::shared) and hands out its descriptor.
  const HostArena* g2_arena() const { return g2_.get(); }
  bool g3_enabled() const { return g3_ != nullptr; }
  // True when G4 opened (a store that could not open leaves the manager without one).
  bool HasG4() const { return g4_ != nullptr; }

  // `instance`: the engine the request belongs to (see kAllInstances); set by the Lookup that
  // makes the request's entry.
  Result<LookupResult> Lookup(const RequestSpec& request, uint32_t num_computed_tokens,
                              uint32_t instance = 0) EXCLUDES(mu_);
  Result<uint32_t> PrepareLoad(const std::string& request_id,
                               std::span<const uint32_t> g1_block_ids, uint32_t num_external_tokens,
                               bool async_load) EXCLUDES(mu_);
  Status Commit(const std::string& request_id, std::span<const TokenId> tokens,
                std::span<const uint32_t> g1_block_ids) EXCLUDES(mu_);
  bool RequestFinished(const std::string& request_id) EXCLUDES(mu_);
  Status RegisterDeviceMemory(const G1Memory& g1);
  // The loads PrepareLoad bound for requests of `instance`.
  Status StartLoad(uint32_t instance = 0) EXCLUDES(mu_, start_load_mu_);
  // Waits for layer `layer` of `instance`'s synchronous loads.
  Status WaitLayer(uint32_t layer, uint32_t instance = 0) EXCLUDES(mu_);
  uint32_t LoadedTokens(const std::string& request_id) EXCLUDES(mu_);
  // The saves Commit queued for requests of `instance` (and deferred saves given a slot since).
  Status StartSave(uint32_t instance = 0) EXCLUDES(mu_);
  // StartLoad/StartSave(engine_stream) (connector.h): TransferEngine::OrderAfterEngineStream.
  Status OrderAfterEngineStream(CopyDirection dir, uintptr_t engine_stream) {
    return engine_->OrderAfterEngineStream(dir, engine_stream);
  }
  // `instance` (the daemon: the calling engine's) waits for that engine's saves only, and for
  // the pool's demotions and G4 writes, which no engine holds up: an engine that stopped
  // answering its copies never delays another's WaitForSaves. kAllInstances: every save.
  void WaitForSaves(uint32_t instance = kAllInstances) EXCLUDES(mu_);
  void WaitForRequestSaves(const std::string& request_id) EXCLUDES(mu_);
  // What ended for `instance`'s requests since its last call.
  FinishedRequests Finished(uint32_t instance = 0) EXCLUDES(mu_);
  // The engine of `instance` is gone (its process died or detached): its loads and saves that
  // were bound but not started are started (they fail at once when its copies cannot run, and
  // release their pins and slots as any failed move does), its deferred saves are dropped, and
  // each of its requests is finished as by RequestFinished. Later calls for it are answered as
  // for unknown requests. Returns the number of requests it had.
  size_t ForgetInstance(uint32_t instance) EXCLUDES(mu_);
  // `instance` serves an engine again (kvtier serve reuses a number only once
  // InstanceRequests(instance) is 0 after ForgetInstance).
  void AdoptInstance(uint32_t instance) EXCLUDES(mu_);
  // Requests tracked for `instance` now.
  size_t InstanceRequests(uint32_t instance) EXCLUDES(mu_);
  ManagerStats Stats();
  // Namespaces (cache_salt, adapter) whose hasher is kept now (manager.max_namespaces at most).
  size_t CachedNamespaces() const { return hashers_->size(); }
  void SubscribeEvents(KvEventCallback callback) { events_->Subscribe(std::move(callback)); }
  const KvLayout& layout() const { return layout_; }

 private:
  using Request = RequestState;  // request_table.h

  // One block to write to G4 from a G2 slot.
  struct G4Write {
    BlockKey key;
    BlockKey parent;
    uint64_t namespace_id = 0;
    uint32_t g2_slot = 0;
    uint64_t expected_checksum = 0;  // G2SlotTable::Meta::commit_checksum
    std::vector<TokenId> tokens;
    // Write-through: the key is pinned (its slot cannot be evicted) until the write ends.
    // Eviction (write_through off): the slot is the manager's until the write ends, then freed.
    bool evicted = false;
  };
  // A committed block that found no G2 slot while G2's victims were still being written to G3:
  // it waits (the engine keeps its G1 block, as for any save in flight) for a slot to free,
  // instead of being dropped. Retried on the engine's next StartSave/Finished/WaitForSaves.
  // A G3 or G4 load staged through a G2 slot of the manager's (not the transfer engine's pool).
  static bool HoldsCacheSlot(const PlannedLoad& p) {
    return (p.source == kTierG3 || p.source == kTierG4) &&
           p.g2_slot != BlockTransfer::kAnyStagingSlot;
  }

  explicit BlockManagerImpl(const ManagerOptions& options);
  Status Init(const DiskTier::OpenOptions& g3_open);
  Result<std::shared_ptr<const BlockHasher>> HasherFor(const std::string& salt,
                                                       const std::string& adapter) {
    return hashers_->Get(salt, adapter);
  }
  // What a G2 slot is for (AllocateG2Slot). A save can wait for one (deferred) while StartSave
  // or a demotion frees one; a load's staging slot is needed now, or the block is recomputed.
  enum class SlotUse { kSave, kStaging };
  // A free G2 slot, evicting (and demoting to G3 when admitted) as needed; nullopt when every
  // block is pinned or in flight, and for a save with G3 behind G2 whenever no slot is free
  // (it never evicts: the save is deferred, StartG2Reserve evicts for it).
  // `ns`: the namespace of the block that will take the slot (the G2 namespace share,
  // g2_slot_table.h); 0 = none (every victim allowed).
  std::optional<uint32_t> AllocateG2Slot(uint64_t ns, SlotUse use);
  // Demotions in flight at most, and G2's reserve of free (or soon free) slots with G3 behind.
  uint32_t MaxDemotions() const;
  uint32_t G2Reserve() const;
  // StartSave's first: when saves wait for a slot and no demotion is in flight, evicts for
  // them (and the reserve) until a demotion starts or enough slots are free.
  void StartG2Reserve() EXCLUDES(mu_);
  // How many more slots G2 wants: its reserve plus the deferred saves, less the free slots and
  // the demotions in flight; 0 at MaxDemotions in flight.
  int64_t G2SlotsShort() EXCLUDES(mu_);
  // Evicts G2's policy victim: demoted to G3 when admitted (its slot frees when the write
  // ends), else freed now. False when nothing in G2 is evictable (for `ns`:
  // G2SlotTable::EvictableFor).
  bool EvictFromG2(uint64_t ns = 0);
  // Frees `slot`: its namespace gives it back (slots_), the arena takes it.
  void ReleaseG2Slot(uint32_t slot);
  // Where to stage a G3 load: a free G2 slot (the block is then promoted), else the staging
  // pool (BlockTransfer::kAnyStagingSlot) when there is one; nullopt otherwise.
  std::optional<uint32_t> AllocateStagingSlot(uint64_t ns = 0);
  bool AdmitToG3(const BlockKey& key);
  void Demote(const EvictedBlock& victim);
  // After a save to G2 of `key`: drops G3's copy of it, unless a load is reading it (the fresh
  // copy replaces one that could not serve the engine; see the definition).
  void DropReplacedG3Copy(const BlockKey& key, const BlockKey& parent);
  // Clean shutdown (g3.flush_on_close): every G2 block not yet in G3 is written there, so a
  // warm restart finds what G2 held. Waits for the writes; at most `max_in_flight` at a time.
  void FlushG2ToG3() EXCLUDES(mu_);
  void EndDemotion() EXCLUDES(mu_);
  // Makes room in G3 for one more block (evicting its policy's victim) when it is full.
  void MakeRoomInG3();
  // The events (ManagerEvents, manager_events.h), by the names the paths use.
  void Emit(std::vector<KvEvent> events) { events_->Emit(std::move(events)); }
  static KvEvent Event(KvEvent::Kind kind, const BlockKey& key, const BlockKey& parent,
                       TierId tier) {
    return ManagerEvents::Event(kind, key, parent, tier);
  }
  KvEvent StoredEvent(const BlockKey& key, const BlockKey& parent, TierId tier,
                      uint64_t namespace_id, std::span<const TokenId> tokens) const {
    return events_->Stored(key, parent, tier, namespace_id, tokens);
  }
  // StoredEvent of the block the G2 slot holds (its namespace and tokens from slots_).
  KvEvent G2StoredEvent(uint32_t slot, const BlockKey& key, const BlockKey& parent) const;
  // Ends one save of `request_id` (its G1 block is no longer read).
  void EndSave(const std::string& request_id, const BlockKey& key) EXCLUDES(mu_);
  // Drops n of the request's save holds; erases a finished request left with none.
  void ReleaseSaveHolds(const std::string& request_id, uint32_t n) REQUIRES(mu_);
  // Gives deferred saves the G2 slots that freed since (in commit order) and queues them for
  // StartSave; drops them (counted) when no slot can free because nothing is being demoted.
  void RetryDeferredSaves() EXCLUDES(mu_);
  // Whether a G2 slot will free without another call: a demotion or a save is in flight.
  bool SlotComing() const REQUIRES(mu_) {
    return demotions_in_flight_.load() > 0 || saves_.outstanding() > 0 || saves_.HasQueued();
  }
  // A finished request that is idle: lists it in saves_done when RequestFinished kept it for
  // its saves, and erases it unless its load's report is pending (see the invariants). `r`
  // may be gone after.
  void RetireIfDone(Request& r) REQUIRES(mu_);
  // Drops entries idle past manager.idle_request_ttl_ms (at most kSweepBatch per call, from
  // the least recently active; counted): O(1) per call, and per Lookup no more entries are
  // made than dropped.
  void SweepIdleRequests(std::chrono::steady_clock::time_point now) REQUIRES(mu_);
  // True while a WaitForRequestSaves of `id` runs: its saves are dropped instead of started.
  bool DrainingSaves(const std::string& id) const REQUIRES(mu_);
  // Submits `loads` as one batch (a sync one: WaitLayer waits on it).
  Status SubmitLoads(std::vector<PlannedLoad> loads, bool async) REQUIRES(start_load_mu_)
      EXCLUDES(mu_);
  // `started`: when StartLoad submitted the batch (the load latency's start).
  void OnLoadBatchDone(const std::vector<PlannedLoad>& loads, const TransferJob& job,
                       std::chrono::steady_clock::time_point started) EXCLUDES(mu_);
  // Starts the /metrics endpoint when metrics.port is set (docs/metrics.md); the last step of
  // Init, once the tiers are final.
  Status InitMetrics();
  // The local tiers Lookup may offer and PrepareLoad may load from (a mask of tier bits): G2,
  // and G3 unless it is quarantined (its loads would fail fast: a miss, not a planned load).
  uint8_t LocalTiersToOffer() const {
    uint8_t tiers = 1u << kTierG2;
    if (g3_ && !g3_->quarantined()) tiers |= 1u << kTierG3;
    return tiers;
  }

  // ---- G4 (block_manager_g4.cc; what G4 holds and is asked: g4_, a G4Path) ----
  // Opens the configured G4 (G4Path::Open) and registers its store with the transfer engine.
  // A store that cannot open is logged and left out (g4_ stays null).
  Status InitG4();
  // Write-through for a block just saved to G2 in `slot`: pins it and returns the write, or
  // nullopt when G4 is off, write-through is off, or the block left G2 already.
  std::optional<G4Write> PrepareWriteThrough(const BlockKey& key, const BlockKey& parent,
                                             uint32_t slot);
  // Submits G4 writes (one save batch). Each one's pin is dropped, or its evicted slot freed,
  // when it ends; a refused batch is dropped and counted. REQUIRES: g4_->BeginWrite was
  // called for each.
  void SubmitG4Writes(std::vector<G4Write> writes);
  // A G2 victim leaving the local tiers goes to G4 (write_through off). False: not taken.
  bool DemoteToG4(const EvictedBlock& victim);
  // The second half of a demotion when G4 is fed by demotion (write_through off): writes the
  // G2 slot, just written to G3, to G4; frees the slot and ends the demotion when done.
  void WriteEvictedToG4(uint32_t slot, const BlockKey& key, const BlockKey& parent);
  void EndG4Write() EXCLUDES(mu_);
  uint64_t G4WritesInFlight() const { return g4_ ? g4_->writes_in_flight() : 0; }

  const ManagerOptions options_;  // options_.config is read once, by Create, into settings_
  ManagerSettings settings_;      // set once by Create, before Init
  const KvLayout layout_;
  const uint32_t tpb_;
  HashAlgorithm algorithm_ = HashAlgorithm::kSha256;

  std::unique_ptr<HostArena> g2_;
  std::unique_ptr<DiskTier> g3_;
  std::unique_ptr<BlockIndex> index_;
  std::unique_ptr<AdmissionFilter> g3_filter_;
  // Null when g3.admit_max_writes_per_hit is 0 or g3.admit_min_seen is 1 (nothing to gate).
  std::unique_ptr<FirstSightingGate> g3_gate_;
  std::unique_ptr<TransferEngine> engine_;
  bool g1_registered_ = false;
  // Null without G4. Its store outlives engine_ (~Impl resets engine_ first), and its remover
  // stops after engine_ (whose callbacks queue into it).
  std::unique_ptr<G4Path> g4_;
  WrapG4 wrap_g4_;                       // set once by Create, before Init
  DeviceBackendFactory device_backend_;  // set once by Create, before Init
  bool shared_g2_ = false;
  // What each G2 slot holds, and the namespace share. Set once in Init, right after g2_.
  std::unique_ptr<G2SlotTable> slots_;

  // The hashers of the namespaces (salt, adapter) requests named lately, and their names for
  // events; at most manager.max_namespaces. Set once, first in Init.
  std::unique_ptr<HasherCache> hashers_;

  uint32_t staging_slots_ = 0;  // the pool's size, set once in Init

  // Held across the whole of StartLoad (taking the pending loads, submitting them, recording
  // the job), and briefly by WaitLayer and LoadedTokens before they look for jobs: so no one
  // can miss a batch that another thread's StartLoad is submitting. Before mu_.
  Mutex start_load_mu_ ACQUIRED_BEFORE(mu_);
  Mutex mu_;
  std::condition_variable saves_cv_;
  // The request entries and their activity order (request_table.h; its idle TTL is set once
  // in Init).
  RequestTable requests_ GUARDED_BY(mu_);
  // Finished requests that the last Finished() listed in loads_done: erased at the next one.
  std::vector<std::pair<uint32_t, std::string>> retiring_ GUARDED_BY(mu_);  // (instance, id)
  std::condition_variable request_saves_cv_;  // some request's save holds reached 0
  // The loads planned and not yet reported: planned, sync batches started, ended
  // (load_queue.h).
  LoadQueue loads_ GUARDED_BY(mu_);
  // The saves taken on and not ended: claimed keys, queued, deferred, outstanding
  // (save_queue.h; configured once in Init).
  SaveQueue saves_ GUARDED_BY(mu_);
  // (instance, request id) for Finished(instance).
  std::vector<std::pair<uint32_t, std::string>> saves_done_ GUARDED_BY(mu_);
  // Instances ForgetInstance ended: their saves still queued are started by anyone's StartSave
  // (and fail), so none keeps a G2 slot.
  std::unordered_set<uint32_t> gone_instances_ GUARDED_BY(mu_);

  std::atomic<uint32_t> demotions_in_flight_{0};
  // The namespace of the last G2 allocation: StartG2Reserve's evictions follow the namespace
  // share as that allocation's would have.
  std::atomic<uint64_t> last_alloc_ns_{0};

  // The subscribers and the wire publisher (events.endpoint). Set once in Init, right after
  // hashers_ (its names for kStored events); reset last in ~Impl, after everything that emits
  // events has stopped.
  std::unique_ptr<ManagerEvents> events_;

  struct Counters {
    std::atomic<uint64_t> lookups{0}, lookup_blocks{0}, miss_blocks{0}, load_failures{0};
    std::array<std::atomic<uint64_t>, kNumTiers> hit_blocks{};
    std::atomic<uint64_t> saved{0}, dedup{0}, dropped_saves{0}, demoted{0}, not_admitted{0},
        first_sighting{0};
    std::atomic<uint64_t> demotion_failures{0}, evicted_g2{0}, evicted_g3{0}, promoted{0};
    // (events_emitted is counted by events_.)
    std::atomic<uint64_t> corrupt{0}, staged_via_pool{0}, deferred{0};
    std::atomic<uint64_t> expired_requests{0};
  };
  Counters c_;
  // Null when metrics are off. ~Impl stops its server first (scrapes read the tiers); the
  // histograms live until after engine_ is gone (its I/O threads record into them).
  std::unique_ptr<ManagerMetrics> metrics_;
};

}  // namespace kvtier

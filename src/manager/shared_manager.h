// SharedManager: the embedded manager as kvtier serve (src/daemon) runs it, one per pool: a
// G2 in shared memory that every attached engine maps, and many engines served at once. Each
// engine is an instance number; ForEngine(id) is that engine's view, whose calls keep
// BlockManager's contracts (include/kvtier/connector.h) for its own requests, loads and saves
// only: one engine never starts, waits for or reports another's (BlockManagerImpl's instances).
// The daemon's header into the manager: it names no private header of the manager's.
//
// Thread-safety: every method may be called from any thread. Views are small values and stay
// valid while the SharedManager lives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "kvtier/connector.h"
#include "transfer/device_backend.h"

namespace kvtier {

class BlockManagerImpl;  // manager/block_manager_impl.h
class HostArena;         // tier/host_arena.h

class SharedManager {
 public:
  // Makes the device copy backend when G1 is registered: the daemon's copies go to the engines.
  using DeviceBackendFactory =
      std::function<Result<std::unique_ptr<DeviceCopyBackend>>(const DeviceCopyBackend::Config&)>;

  // Builds the tiers as BlockManager::Create does for an embedded manager, with G2 shared (a
  // memfd: HostArena::Config::shared) and `device_backend` for G1 (the engines' G1s behind one
  // device G1). Errors as BlockManager::Create's embedded ones.
  static Result<std::unique_ptr<SharedManager>> Create(const ManagerOptions& options,
                                                       DeviceBackendFactory device_backend);
  // As ~BlockManager: transfers in flight end, G2 is flushed to G3 (g3.flush_on_close), the
  // tiers close.
  ~SharedManager();
  SharedManager(const SharedManager&) = delete;
  SharedManager& operator=(const SharedManager&) = delete;

  // One engine's calls. Request ids are the daemon's (unique across engines). Each call is
  // BlockManager's of the same name, scoped to the engine where the contract speaks of "every"
  // load or save: StartLoad/StartSave/WaitLayer/Finished touch only this engine's work;
  // WaitForSaves waits for this engine's saves and for the pool's demotions and G4 writes
  // (which no engine holds up), never for another engine's saves.
  class EngineView {
   public:
    // Lookup makes the request's entry and binds it to this engine.
    Result<LookupResult> Lookup(const RequestSpec& request, uint32_t num_computed_tokens);
    Result<uint32_t> PrepareLoad(const std::string& request_id,
                                 std::span<const uint32_t> g1_block_ids,
                                 uint32_t num_external_tokens, bool async_load);
    Status Commit(const std::string& request_id, std::span<const TokenId> tokens,
                  std::span<const uint32_t> g1_block_ids);
    bool RequestFinished(const std::string& request_id);
    Status StartLoad();
    Status StartSave();
    Status WaitLayer(uint32_t layer);
    uint32_t LoadedTokens(const std::string& request_id);
    void WaitForSaves();
    void WaitForRequestSaves(const std::string& request_id);
    FinishedRequests Finished();
    // The engine is gone (its process died or detached): its loads and saves bound but not
    // started are started (they fail at once when its copies cannot run, releasing their pins
    // and slots), its deferred saves are dropped, and each of its requests is finished as by
    // RequestFinished. Later calls for it are answered as for unknown requests. Returns the
    // number of requests it had.
    size_t Forget();
    // The number serves an engine again. REQUIRES: Requests() is 0 after Forget().
    void Adopt();
    // Requests tracked for this engine now.
    size_t Requests();

   private:
    friend class SharedManager;
    EngineView(BlockManagerImpl* impl, uint32_t instance) : impl_(impl), instance_(instance) {}
    BlockManagerImpl* impl_;
    uint32_t instance_;
  };
  // REQUIRES: `instance` is not UINT32_MAX (inside the manager, that number means every engine).
  EngineView ForEngine(uint32_t instance);

  // Where G1 lives: the engines' G1s, each engine's block ids in its own range (the daemon's
  // mapping). REQUIRES: once, before any call of a view.
  Status RegisterDeviceMemory(const G1Memory& g1);
  // The shared G2 arena (its descriptor is handed to attaching engines).
  const HostArena* g2_arena() const;
  bool g3_enabled() const;
  // True when G4 opened.
  bool HasG4() const;
  // The pool's counters and events: every engine's blocks (BlockManager::Stats, SubscribeEvents).
  ManagerStats Stats();
  void SubscribeEvents(KvEventCallback callback);

 private:
  explicit SharedManager(std::unique_ptr<BlockManagerImpl> impl);
  const std::unique_ptr<BlockManagerImpl> impl_;
};

}  // namespace kvtier

// AttachedManager: BlockManager's attached mode (service.socket = PATH; docs/service.md). The
// same calls as the in-process manager, answered by kvtier serve; the G1 <-> G2 copies run in
// this process, through its own mapping of the daemon's G2 (a memfd passed at attach): memcpy
// for a host G1, the CUDA backend over the registered mapping for a device G1.
//
// Faults: a daemon that is not there, dies, restarts or does not answer within
// service.call_timeout_ms turns every call into what an empty cache answers (Lookup 0 tokens,
// PrepareLoad 0, Commit Ok, RequestFinished false), never an error and never a wait past the
// timeout; requests that were loading or kept for saves when it went are listed by the next
// Finished(), so the engine frees their G1 blocks. Calls try to attach again, at most once per
// service.reattach_ms; requests from before (another daemon epoch) stay misses.
//
// Leases: every kCopy batch carries its deadline; a batch past it is refused, and a load
// checks it before each layer, inside a pass of copy_gate_. WaitLayer, LoadedTokens and Finished
// wait for the layer copy in progress before they return, so once the engine hears a load failed no
// copy of it writes G1 any more.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "client/copy_gate.h"
#include "core/mutex.h"
#include "core/thread_annotations.h"
#include "core/unique_fd.h"
#include "kvtier/connector.h"
#include "proto/protocol.h"
#include "proto/unix_socket.h"
#include "tier/host_arena.h"
#include "transfer/device_backend.h"

namespace kvtier::client {

class AttachedManager final : public BlockManager {
 public:
  using DeviceBackendFactory =
      std::function<Result<std::unique_ptr<DeviceCopyBackend>>(const DeviceCopyBackend::Config&)>;

  // Reads service.* from options.config (proto::ServiceClientOptions) and tries to attach once. A
  // daemon that is not there is no error (a warning; calls are misses until it is); a daemon that
  // refuses this engine (another uid, no G2 room for its model: service.max_pools) is its error,
  // with the reason. InvalidArgument for a bad layout, an empty model id, an empty
  // service.socket or a service.daemon_uid that is not a uid. `device_backend`: as the in-process
  // manager's seam (null = the CUDA backend), for a device G1.
  static Result<std::unique_ptr<AttachedManager>> Create(const ManagerOptions& options,
                                                         DeviceBackendFactory device_backend = {});
  // Whether `config` asks for the attached manager (service.socket set): BlockManager::Create's
  // choice. Reads that key alone (proto::ServiceSocketSet), so a bad value of another service.*
  // key is Create's error, never a reason to embed.
  static bool Requested(const Config& config);
  ~AttachedManager() override;

  Result<LookupResult> Lookup(const RequestSpec& request, uint32_t num_computed_tokens) override;
  Result<uint32_t> PrepareLoad(const std::string& request_id,
                               std::span<const uint32_t> g1_block_ids, uint32_t num_external_tokens,
                               bool async_load = false) override;
  Status Commit(const std::string& request_id, std::span<const TokenId> tokens,
                std::span<const uint32_t> g1_block_ids) override;
  bool RequestFinished(const std::string& request_id) override;
  Status RegisterDeviceMemory(const G1Memory& g1) override;
  Status StartLoad() override;
  Status StartLoad(uintptr_t engine_stream) override;
  Status WaitLayer(uint32_t layer) override;
  uint32_t LoadedTokens(const std::string& request_id) override;
  Status StartSave() override;
  Status StartSave(uintptr_t engine_stream) override;
  void WaitForSaves() override;
  void WaitForRequestSaves(const std::string& request_id) override;
  FinishedRequests Finished() override;
  // The daemon's pool's counters (all of zero while detached).
  ManagerStats Stats() override;
  // The daemon pool's events (every engine's blocks in the shared G2, G3 and G4), as the
  // in-process manager's: on this manager's events thread, over an events connection opened
  // on the first call and opened again after the daemon comes back (events made while it was
  // away, or dropped because a callback did not keep up, are counted in client_stats()).
  void SubscribeEvents(KvEventCallback callback) override;
  const KvLayout& layout() const override { return options_.layout; }
  bool attached() const override { return true; }

  struct ClientStats {
    bool attached = false;
    uint32_t instance = 0;
    uint64_t attaches = 0;        // successful attaches (the first included)
    uint64_t detaches = 0;        // times the daemon went away
    uint64_t data_lost = 0;       // of those: the data connection ended while attached
    uint64_t failed_calls = 0;    // calls answered as misses because the daemon was gone
    uint64_t copy_batches = 0;    // kCopy batches run
    uint64_t late_batches = 0;    // batches (or loads' layers) refused past their lease
    bool fetches_g4 = false;      // this engine gets G4 blocks straight into its G1
    uint64_t fetch_batches = 0;   // kFetch batches run
    uint64_t events = 0;          // events handed to SubscribeEvents callbacks
    uint64_t events_dropped = 0;  // events the daemon dropped for this subscriber
    uint64_t events_connects = 0;
  };
  ClientStats client_stats();

 private:
  explicit AttachedManager(const ManagerOptions& options);
  using Clock = std::chrono::steady_clock;

  // Attaches when detached and the last attempt is old enough. True when attached.
  bool EnsureAttached() EXCLUDES(attach_mu_, mu_);
  // Connects the call side (and the data side, with a G1).
  // `refused`: set when the daemon answered the Hello with an error (see OpenConnection).
  Status AttachLocked(bool* refused = nullptr) REQUIRES(attach_mu_) EXCLUDES(mu_);
  proto::Hello MakeHello(proto::Role role) const;
  Status OpenDataLocked() REQUIRES(attach_mu_) EXCLUDES(mu_);
  // The daemon went away (or stopped answering): miss mode, see the header. Returns once no
  // copy of this engine writes the daemon's G2 any more (FenceCopies), and only then ends the
  // data connection: the daemon gives a lent slot back when that connection ends.
  void Detach(const std::string& why) EXCLUDES(mu_);
  // Stops the copies: a copy in progress ends at its next block or layer, a device batch
  // submitted is waited for, and none starts until the next data connection opens.
  void FenceCopies() EXCLUDES(device_mu_);
  // One call: request frame, reply frame. Transport failures detach and return Unavailable;
  // `reply` is positioned after the reply's status, which is returned as the call's own.
  Status Call(proto::MsgType type, const proto::WireWriter& payload, Clock::duration timeout,
              std::vector<uint8_t>* reply_payload, size_t* status_end) EXCLUDES(mu_);
  // The request is not of an earlier daemon (looked up here in this epoch, or not here at all).
  bool Current(const std::string& request_id) EXCLUDES(mu_);
  void Barrier() { copy_gate_.Barrier(); }
  void DataLoop(int fd) EXCLUDES(mu_);
  void RunCopy(int fd, const proto::CopyCall& call) EXCLUDES(mu_, device_mu_);
  // kG4Config on the data connection: opens this engine's G4 fetcher (or says why not).
  std::unique_ptr<class G1Fetcher> OpenFetcher(int fd, const proto::G4Config& config);
  Status SendFrameLocked(int fd, proto::MsgType type, const proto::WireWriter& w)
      EXCLUDES(send_mu_);
  Status SendReport(int fd, proto::MsgType type, uint64_t batch, uint32_t layer,
                    const Status& status) EXCLUDES(send_mu_);
  void EventsLoop() EXCLUDES(events_mu_, mu_);

  // Set by Create before the manager is handed out; read-only after.
  const ManagerOptions options_;
  std::string socket_path_;
  std::string instance_name_;
  uid_t daemon_uid_ = 0;  // service.daemon_uid: who must answer on the socket
  Clock::duration call_timeout_;
  Clock::duration reattach_;
  DeviceBackendFactory device_factory_;

  Mutex attach_mu_ ACQUIRED_BEFORE(mu_);  // serializes attaching; held while connecting
  Mutex mu_;                              // the call side's state below
  bool attached_ GUARDED_BY(mu_) = false;
  uint64_t epoch_ GUARDED_BY(mu_) = 0;
  uint32_t instance_ GUARDED_BY(mu_) = 0;
  // Written under mu_ at attach; atomic because calls read it for their timeouts without mu_.
  std::atomic<uint32_t> lease_ms_{0};
  Clock::time_point last_attempt_ GUARDED_BY(mu_){};
  std::vector<UniqueFd> idle_ GUARDED_BY(mu_);  // call connections not in use
  std::unordered_map<std::string, uint64_t> request_epoch_ GUARDED_BY(mu_);
  std::set<std::string> kept_ GUARDED_BY(mu_), loading_ GUARDED_BY(mu_), finished_ GUARDED_BY(mu_);
  std::vector<std::string> orphan_saves_done_ GUARDED_BY(mu_), orphan_loads_done_ GUARDED_BY(mu_);
  bool pending_sync_ GUARDED_BY(mu_) = false, started_sync_ GUARDED_BY(mu_) = false;
  ClientStats stats_ GUARDED_BY(mu_);
  // Stats(): the last answer, the counters of earlier daemons, the current one's last answer.
  ManagerStats last_stats_ GUARDED_BY(mu_), base_stats_ GUARDED_BY(mu_),
      epoch_last_ GUARDED_BY(mu_);
  uint64_t stats_epoch_ GUARDED_BY(mu_) = 0;
  // Set once by RegisterDeviceMemory (under attach_mu_), before the data thread that reads it
  // starts; the engine registers G1 before it calls StartLoad/StartSave(engine_stream).
  std::optional<G1Memory> g1_;
  std::vector<KvEventCallback> callbacks_ GUARDED_BY(mu_);

  // Events: one connection, read by events_thread_ (started by the first SubscribeEvents).
  Mutex events_mu_;
  std::condition_variable events_cv_;
  bool events_stop_ GUARDED_BY(events_mu_) = false;
  // The open events connection (shut down to stop the thread).
  int events_fd_ GUARDED_BY(events_mu_) = -1;
  std::thread events_thread_ GUARDED_BY(events_mu_);

  // Data plane.
  // Every write into G1 (a layer or block copied, a G4 fetch) is a pass of it; Barrier waits
  // for those begun before it. See the header.
  CopyGate copy_gate_;
  Mutex send_mu_;  // one report at a time on the data connection (guards the socket, no member)
  // Replaced by OpenDataLocked (attach_mu_ held too); Detach and DataLoop read it.
  UniqueFd data_fd_ GUARDED_BY(mu_);
  std::thread data_thread_ GUARDED_BY(attach_mu_);
  // arena_ and device_ change only in OpenDataLocked (attach_mu_ held), after the previous
  // data thread was joined and before the next one starts: the data thread reads them unlocked.
  // StartLoad/StartSave(engine_stream) read device_ unlocked too, which races with an attach
  // that another thread runs meanwhile (known; left for its own change).
  std::unique_ptr<HostArena> arena_;           // this process's mapping of G2
  std::unique_ptr<DeviceCopyBackend> device_;  // device G1 only
  std::atomic<uint64_t> seq_{0};
  std::chrono::milliseconds copy_stall_{0};  // KVTIER_TEST_ATTACHED_COPY_STALL_MS (Create)
  // KVTIER_TEST_ATTACHED_G4_READY_DELAY_MS (Create): how late the engine answers kG4Config.
  std::chrono::milliseconds g4_ready_delay_{0};
  // A kCopy load of at least this many bytes is copied with non-temporal stores
  // (transfer.load_stores, block_copy.h). Set by Create, read-only after.
  uint64_t stream_load_bytes_ = UINT64_MAX;
  // Set by FenceCopies, cleared when a data connection opens: RunCopy checks it inside each
  // pass, before each block or layer.
  std::atomic<bool> copies_stopped_{false};
  Mutex device_mu_;
  std::condition_variable device_cv_;
  // Device batches submitted whose done callback has not run.
  int device_batches_ GUARDED_BY(device_mu_) = 0;
};

}  // namespace kvtier::client

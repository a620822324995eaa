// RemoteG1Backend: the daemon's "device": every G1 of every attached engine, reached through
// that engine's data connection. kvtier serve runs the same BlockManagerImpl as the
// in-process manager; its transfer engine sees one device G1 whose block ids carry the
// engine's instance in their top 8 bits (proto::kInstanceShift), and this backend turns each
// batch the transfer engine submits into kCopy frames, one per instance it touches. The engine
// copies between its G1 and its own mapping of G2 and reports each layer and the end.
//
// Leases (docs/service.md): a batch's slots are lent to the engine until its deadline
// (now + service.lease_ms at Submit). A load batch that has not ended by then fails TimedOut:
// the engine checks the same deadline (both processes share the host's steady clock) before
// each layer it copies, and its connector waits for the copy in progress before it reports the
// failure to its engine, so nothing lands in G1 after the engine was told to recompute. A save
// batch is never failed at its deadline while its engine lives: it ends when the engine
// answers (an engine past the deadline refuses to start it) or when the engine's data
// connection ends (FailInstance: the process is gone, so nothing writes the slots any more),
// because a slot given back while a live engine may still write it could corrupt the block
// stored there next.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "core/mutex.h"
#include "core/thread_annotations.h"
#include "proto/protocol.h"
#include "transfer/device_backend.h"

namespace kvtier::daemon {

class RemoteG1Backend final : public DeviceCopyBackend {
 public:
  // Queues a kCopy frame for the engine of `instance`; must not block. Unavailable when the
  // instance has no data connection (then that part of the batch fails at once).
  using SendCopy = std::function<Status(uint32_t instance, const proto::CopyCall& call)>;

  // Queues a kFetch frame for the engine of `instance`; must not block. As SendCopy.
  using SendFetch = std::function<Status(uint32_t instance, const proto::FetchCall& call)>;

  RemoteG1Backend(SendCopy send, std::chrono::milliseconds lease, uint32_t num_layers);
  // Where Fetch sends its frames. Called once, before the backend is used.
  void SetFetchSender(SendFetch send) { send_fetch_ = std::move(send); }
  // Fails every batch still open (Unavailable), waits for their callbacks, stops the watchdog.
  ~RemoteG1Backend() override;

  std::string Describe() const override;
  Method method() const override { return Method::kMemcpyPerChunk; }
  Status RegisterG1(const G1Memory& g1) override;
  // The G2 arena: host pointers of copies are turned into offsets in it.
  Status RegisterHost(uint8_t* base, uint64_t bytes) override;
  Status Submit(CopyDirection dir, std::span<const DeviceBlockCopy> copies, LayerCallback on_layer,
                DoneCallback on_done, bool wait_for_room) override;
  // The engine orders its own copies after its stream (its connector does so before it asks
  // the daemon to start them): nothing to do here.
  Status OrderAfterStream(CopyDirection, uintptr_t) override { return Status::Ok(); }
  Result<uint8_t*> AllocateDevice(uint64_t) override;
  void FreeDevice(uint8_t*) override {}
  Status CopyToDevice(uint8_t*, const uint8_t*, uint64_t) override;
  Status CopyFromDevice(uint8_t*, const uint8_t*, uint64_t) override;
  Result<PlainCopyTime> TimePlainCopy(CopyDirection, uint8_t*, uint8_t*, uint64_t,
                                      uint32_t) override;
  // True when the engine of the block's instance said it fetches G4 blocks itself (kG4Ready).
  // While an instance that was offered G4 (AwaitFetcherAnswer) has not answered, waits for the
  // answer, at most until kFetcherAnswerWait after the offer: an engine's first loads, planned
  // as it attaches, then fetch straight into its G1 too. Past that, false (through G2) until
  // it answers.
  bool CanFetch(uint32_t g1_block) const override EXCLUDES(mu_);
  // One kFetch frame per instance the items name. Items of an instance that no longer fetches,
  // or whose frame cannot be queued, end at once (Unavailable). An engine that never answers:
  // its items end TimedOut a lease after their deadline.
  Status Fetch(std::vector<G4Fetch> items, std::chrono::steady_clock::time_point deadline,
               FetchCallback on_item) override EXCLUDES(mu_);
  void StallNextLoadAfterLayerForTest(uint32_t) override {}
  void ReleaseStallForTest() override {}

  // From the engine's data connection: layer `layer` of its part of `batch` landed / the part
  // ended. Reports for unknown or ended batches, or out of order, are ignored (counted).
  void OnLayer(uint32_t instance, uint64_t batch, uint32_t layer) EXCLUDES(mu_);
  void OnDone(uint32_t instance, uint64_t batch, const Status& status) EXCLUDES(mu_);
  // The engine's data connection ended: every part of a batch it held fails with `why`.
  void FailInstance(uint32_t instance, const Status& why) EXCLUDES(mu_);
  // The daemon offered G4 to the instance's data connection (kG4Config): its answer is due.
  void AwaitFetcherAnswer(uint32_t instance) EXCLUDES(mu_);
  static constexpr std::chrono::milliseconds kFetcherAnswerWait{2000};
  // From the engine's data connection: whether it fetches G4 blocks itself (kG4Ready).
  void SetFetcher(uint32_t instance, bool fetches) EXCLUDES(mu_);
  // From the engine's data connection: a kFetch batch ended. A count that does not match the
  // batch fails every item of it (IOError); an unknown batch is ignored (counted).
  void OnFetchDone(uint32_t instance, const proto::FetchDone& done) EXCLUDES(mu_);

  struct Stats {
    uint64_t batches = 0;
    uint64_t lease_expired = 0;  // load batches failed at their deadline
    uint64_t stray_reports = 0;  // reports for no open batch (late, or from a confused engine)
    uint64_t failed_parts = 0;
    uint64_t fetch_batches = 0;  // kFetch frames sent
    uint64_t fetch_expired = 0;  // kFetch batches the engine never answered
  };
  Stats stats() const EXCLUDES(mu_);

 private:
  struct Part {
    uint32_t instance = 0;
    uint32_t layers_done = 0;
    bool ended = false;
  };
  // parts, status, reported and done_called are guarded by RemoteG1Backend::mu_ (an outer
  // class's mutex, which clang's annotations cannot name from a nested struct); the rest is set
  // in Submit before the batch is shared.
  struct Batch {
    uint64_t id = 0;
    CopyDirection dir = CopyDirection::kDeviceToHost;
    std::chrono::steady_clock::time_point deadline;
    std::vector<Part> parts;
    LayerCallback on_layer;
    DoneCallback on_done;
    Status status;             // the first failure
    uint32_t reported = 0;     // layers handed to on_layer
    bool done_called = false;  // on_done ran (or runs)
    Mutex callback_mu;         // one thread runs a batch's callbacks at a time, in order
  };
  // Runs the callbacks that `batch`'s state allows now, in order; forgets it once ended.
  void Deliver(const std::shared_ptr<Batch>& batch) EXCLUDES(mu_);
  // Marks `part` ended with `status`.
  void EndPart(Batch* batch, Part* part, const Status& status) REQUIRES(mu_);
  // The open batch `batch_id` and `instance`'s part of it; a null part when there is none
  // (the batch ended, or the engine never had a part in it). The batch stays open while mu_
  // is held.
  std::pair<std::shared_ptr<Batch>, Part*> FindPart(uint64_t batch_id, uint32_t instance)
      REQUIRES(mu_);
  // REQUIRES: mu_ held (static: the annotation cannot name it).
  static bool Ended(const Batch& b);
  uint32_t ReadyLayers(const Batch& b) const REQUIRES(mu_);
  void Watchdog() EXCLUDES(mu_);
  struct FetchBatch {
    uint32_t instance = 0;
    std::chrono::steady_clock::time_point deadline;
    std::vector<size_t> items;  // the caller's item indices, in the frame's order
    std::shared_ptr<FetchCallback> on_item;
  };
  // Ends every item of `b` with `status` (not under mu_).
  static void EndFetch(const FetchBatch& b, const Status& status);

  const SendCopy send_;
  const std::chrono::milliseconds lease_;
  const uint32_t num_layers_;
  // Set once by RegisterHost, before the transfer engine submits its first batch.
  uint8_t* host_base_ = nullptr;
  uint64_t host_bytes_ = 0;
  mutable Mutex mu_;
  std::condition_variable cv_;  // a batch ended (destructor), or stop_
  std::map<uint64_t, std::shared_ptr<Batch>> open_ GUARDED_BY(mu_);
  SendFetch send_fetch_;  // set once by SetFetchSender, before the backend is used
  std::set<uint32_t> fetchers_ GUARDED_BY(mu_);  // instances that fetch G4 blocks themselves
  // Instances offered G4 that have not answered yet, and until when CanFetch waits for them.
  std::map<uint32_t, std::chrono::steady_clock::time_point> awaited_ GUARDED_BY(mu_);
  mutable std::condition_variable answer_cv_;  // an awaited instance answered, or ended
  // By batch id (shared with open_'s ids).
  std::map<uint64_t, FetchBatch> open_fetches_ GUARDED_BY(mu_);
  uint64_t next_batch_ GUARDED_BY(mu_) = 1;
  Stats stats_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread watchdog_;  // started by the constructor, joined by the destructor
};

}  // namespace kvtier::daemon

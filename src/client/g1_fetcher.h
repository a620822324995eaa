// G1Fetcher: an attached engine's own G4 client (docs/service.md, "G4 loads straight into
// G1"). kvtier serve offers its Redis G4 on the data connection (kG4Config); an engine with a
// host G1 opens its own store with it, and the daemon then sends G4 loads into that G1 as kFetch
// batches instead of getting them into its G2 first. Each batch is one Get call: every object's
// header lands in a buffer of this class, its payload straight in the G1 block's chunks
// (RemoteGet::pieces), and the payload is verified in place (VerifyBlockPieces) before the
// batch is answered with one kFetchDone. One copy per byte (socket -> G1) where the G2 path
// makes two (socket -> G2 slot, G2 slot -> G1).
//
// Leases: a fetch runs inside a pass of `gate` (copy_gate.h), and never starts past its
// deadline; the Get call returns by the deadline. AttachedManager's Barrier waits for the passes
// begun before it, so once the engine hears that a load failed (the daemon ends a fetch's move
// at its deadline), no fetch of it writes G1 any more: the same rule as a kCopy load's layers.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "client/copy_gate.h"
#include "core/mutex.h"
#include "core/thread_annotations.h"
#include "kvtier/g1_memory.h"
#include "proto/protocol.h"
#include "tier/remote_store.h"

namespace kvtier::client {

class G1Fetcher {
 public:
  // Sends a batch's answer on the data connection. Called on a worker thread.
  using Report = std::function<void(const proto::FetchDone& done)>;

  // Opens a Redis store as `config` says (a server that is down is no error: the store probes)
  // and starts config.connections workers. InvalidArgument for a device G1 (only the CUDA
  // backend reaches it: its G4 loads go through G2) or a malformed endpoint. `g1` and `gate`
  // must outlive the fetcher.
  static Result<std::unique_ptr<G1Fetcher>> Create(const proto::G4Config& config,
                                                   const G1Memory& g1, CopyGate* gate,
                                                   Report report);
  // Stops the workers after the calls in progress (each ends by its deadline); batches still
  // queued are answered Unavailable.
  ~G1Fetcher();

  // Queues a batch; a worker fetches it and reports. Never blocks.
  void Enqueue(proto::FetchCall call) EXCLUDES(mu_);

  // Runs one batch on the calling thread and returns its answer (the workers' body; tests).
  proto::FetchDone Run(const proto::FetchCall& call);

 private:
  G1Fetcher(const G1Memory& g1, CopyGate* gate, Report report, std::unique_ptr<RemoteStore> store);
  void Worker() EXCLUDES(mu_);

  const G1Memory& g1_;
  CopyGate* const gate_;
  const Report report_;
  const std::unique_ptr<RemoteStore> store_;
  Mutex mu_;
  std::condition_variable cv_;
  std::deque<proto::FetchCall> queue_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  // Filled by Create before the fetcher is handed out, joined by the destructor: never shared.
  std::vector<std::thread> workers_;
};

}  // namespace kvtier::client

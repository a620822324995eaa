// kvtier serve: one kvtier per host (docs/service.md). Owns what the in-process manager owns
// except G1 (the index and policies, G2 on shared memory, G3, the G4 client, events), and serves
// every engine process on the host that attaches to its Unix socket.
//
// Threads: one accepting; per connection one reading it (a call connection runs its calls on
// that thread, so one engine's slow call never delays another engine's), and per data
// connection one more writing its kCopy frames from a queue, so a stuck engine never blocks the
// thread that submitted a copy.
//
// Pools: one SharedManager per (model id, layout fingerprint), made on the first Hello that
// names it, each with g2.capacity_bytes / service.max_pools of shared G2 (g2.capacity_bytes is
// the daemon's whole G2) and, with G3, its own directory under g3.dir (so a restart finds each
// model's blocks again). When service.max_pools pools exist, a new one takes the room of a
// pool that no engine uses (closed: its G2 flushed to G3 when on), or is refused
// (ResourceExhausted, naming the pools and the key to raise).
//
// Events: an events connection (Role::kEvents) hears its pool's KV events as kEvents frames,
// from one subscription per pool; a connection whose queue is full loses events (counted in
// the next frame's `dropped`), never holding the pool up.
//
// Instances: engine processes that say the same instance name in their Hello are one
// instance (vLLM's scheduler and its worker); it ends when its last connection closes. Its
// requests are then finished, its unstarted work dropped, its copies in flight failed, and
// its number reused only once no request of it remains.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvtier/config.h"
#include "kvtier/status.h"

namespace kvtier::daemon {

struct ServeOptions {
  // The manager's keys (each pool's manager reads them), and service.*, read once by Start
  // into proto::ServiceDaemonOptions.
  Config config;
  std::string socket_path;  // service.socket unless set here
};

struct ServerStats {
  uint64_t connections = 0;  // accepted since start
  uint64_t refused = 0;      // peers refused (credentials, bad Hello, no instance free)
  // Connections refused for want of room: service.max_connections open, or no thread.
  uint64_t refused_connections = 0;
  uint64_t bad_frames = 0;  // frames that failed to decode (the connection was closed)
  uint64_t instances_live = 0;
  uint64_t instances_ended = 0;
  uint64_t pools = 0;
  uint64_t pools_closed = 0;       // idle pools closed to make room (service.max_pools)
  uint64_t event_subscribers = 0;  // events connections open now
  uint64_t lease_expired = 0;
  uint64_t copy_batches = 0;
};

class Server {
 public:
  // Listens on the socket (ListenUnix: 0700 directory, stale socket replaced) and starts
  // accepting. InvalidArgument for a bad service.* key; the socket's errors otherwise.
  static Result<std::unique_ptr<Server>> Start(const ServeOptions& options);
  // Stop() then frees everything: G3 writes its restart snapshot.
  ~Server();
  // Stops accepting, closes every connection (engines see the daemon gone) and waits for the
  // connection threads. Idempotent.
  void Stop();
  ServerStats Stats() const;
  const std::string& socket_path() const;

  class State;

 private:
  explicit Server(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace kvtier::daemon

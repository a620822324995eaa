// kvtier serve's internals (src/daemon/server.cc, server_pools.cc, server_calls.cc): the
// daemon's state, its pools, instances and connections. Not a public header.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/mutex.h"
#include "core/thread_annotations.h"
#include "core/unique_fd.h"
#include "daemon/remote_g1_backend.h"
#include "daemon/server.h"
#include "manager/shared_manager.h"
#include "proto/protocol.h"
#include "proto/unix_socket.h"

namespace kvtier::daemon {
namespace server_internal {

using Clock = std::chrono::steady_clock;

struct Conn;

// Set by GetPool before the pool is shared, read-only after; subscribers and subscribed are
// guarded by sub_mu.
struct Pool {
  std::string key;
  std::string model_id;  // whole, as the first engine's Hello said it
  KvLayout layout;       // the first engine's
  // Events connections (Role::kEvents), fed by one subscription to the manager's events.
  // Declared before manager: its destructor may still emit events (the G3 flush).
  Mutex sub_mu;
  std::vector<std::shared_ptr<Conn>> subscribers GUARDED_BY(sub_mu);
  bool subscribed GUARDED_BY(sub_mu) = false;
  std::unique_ptr<SharedManager> manager;
  RemoteG1Backend* backend = nullptr;  // owned by the manager's transfer engine
  uint64_t g2_capacity = 0;
  uint64_t g2_slot_bytes = 0;
  int memfd = -1;  // owned by the manager's G2 arena
  // The Redis G4 offered to every data connection (kG4Config), so engines fetch G4 blocks
  // straight into their G1; unset without a Redis G4 or with g4.direct_to_g1 = false.
  std::optional<proto::G4Config> g4_offer;
};

struct Conn {
  UniqueFd fd;
  proto::PeerCred cred;  // the peer as the kernel saw it at connect (SO_PEERCRED), authorized
  // role, instance, instance_serial and pool are written by the connection's reader thread
  // (under State::mu where other threads read them: MakeRoomForPool, LookupPool), and read by
  // that thread without it. State::mu is another struct's: the annotations cannot name it.
  proto::Role role = proto::Role::kCall;
  uint32_t instance = 0;
  uint64_t instance_serial = 0;  // lookup connections: the Instance they joined (ids are reused)
  std::thread reader;            // started by AcceptLoop, joined by ReapDone or Stop
  std::thread writer;            // data connections; started and joined as reader
  std::atomic<bool> done{false};
  Mutex out_mu;
  std::condition_variable out_cv;
  // Frames to send: (type, payload). Data connections: kCopy, kFetch, kG4Config; events
  // connections: kEvents.
  std::deque<std::pair<proto::MsgType, std::vector<uint8_t>>> out GUARDED_BY(out_mu);
  bool closing GUARDED_BY(out_mu) = false;
  Pool* pool = nullptr;  // events connections: the pool they hear; lookup ones: they ask
  // Events connections: events dropped since the last frame queued.
  uint64_t dropped GUARDED_BY(out_mu) = 0;
};

// An events connection's queue holds at most this many frames; past it, events are dropped
// and counted (a subscriber that does not keep up never holds the pool up).
constexpr size_t kMaxQueuedEventFrames = 256;

// Every field is guarded by State::mu (another struct's mutex: not annotated), which guards
// State::instances.
struct Instance {
  uint32_t id = 0;
  uint64_t serial = 0;  // unique per daemon run (an id is reused once its requests are gone)
  std::string name;
  Pool* pool = nullptr;
  int connections = 0;
  std::shared_ptr<Conn> data;
  // RegisterG1's count bounds the block ids it may name.
  uint32_t g1_blocks = proto::kMaxG1Blocks - 1;
  // The process that attached it (SO_PEERCRED of its first call or data connection): only it
  // may open more call and data connections under this name, and only its uid may join the
  // instance's lookups.
  proto::PeerCred owner;
};

// A pool's name: a readable prefix of the model id, then a hash of the whole identity (the
// model id and every layout field that changes the stored bytes), then the layout's
// fingerprint. Names the pool's G3 directory too. The name is never trusted alone: GetPool
// compares the full model id and layout with the pool's (SameIdentity), and the G3 directory
// keeps the full identity in a file it checks at open.
std::string PoolKey(const std::string& model_id, const KvLayout& layout);

// The identity a pool serves, as its G3 directory records it: the whole model id and the
// layout's stored-bytes fields.
std::string PoolIdentityText(const std::string& model_id, const KvLayout& layout);

// True when an engine of `model_id` and `layout` may use `pool`: the same model id, byte for
// byte, and a layout that stores the same bytes (the G1 arrangement may differ).
bool SameIdentity(const Pool& pool, const std::string& model_id, const KvLayout& layout);

inline std::string Rid(uint32_t instance, const std::string& id) {
  return std::to_string(instance) + "/" + id;
}

// Strips "N/" from the ids of `instance`.
inline std::vector<std::string> StripRids(uint32_t instance, std::vector<std::string> ids) {
  const std::string prefix = std::to_string(instance) + "/";
  for (std::string& id : ids) {
    if (id.compare(0, prefix.size(), prefix) == 0) id.erase(0, prefix.size());
  }
  return ids;
}

}  // namespace server_internal

using namespace server_internal;  // NOLINT: the daemon's own files

class Server::State {
 public:
  // Set by Server::Start before the acceptor thread starts; read-only after.
  ServeOptions options;
  std::string socket_path;
  std::vector<gid_t> allowed_gids;
  std::chrono::milliseconds lease{5000};
  uint64_t epoch = 0;
  UniqueFd listen_fd;
  std::thread acceptor;  // joined by Stop
  std::atomic<bool> stopping{false};

  Mutex pool_create_mu ACQUIRED_BEFORE(mu);  // held while a pool is made
  mutable Mutex mu;
  // By PoolKey. Connections hold their pool too, so one closed (MakeRoomForPool) stays valid
  // until the last of them ends.
  std::map<std::string, std::shared_ptr<Pool>> pools GUARDED_BY(mu);
  std::map<uint32_t, std::unique_ptr<Instance>> instances GUARDED_BY(mu);  // live, by id
  std::map<std::string, uint32_t> by_name GUARDED_BY(mu);
  // Ended ids whose requests may still be tracked.
  std::map<uint32_t, Pool*> ended GUARDED_BY(mu);
  // Ids whose LeaveInstance is still failing their batches and forgetting their requests
  // (outside mu): not reused until it is done, or it would fail and forget the new engine's.
  std::set<uint32_t> leaving GUARDED_BY(mu);
  uint64_t next_serial GUARDED_BY(mu) = 0;
  std::list<std::shared_ptr<Conn>> conns GUARDED_BY(mu);
  ServerStats stats GUARDED_BY(mu);
  // Set by Server::Start before the acceptor thread starts; read-only after.
  uint32_t max_pools = 1;
  uint64_t max_connections = 256;  // service.max_connections
  uint64_t g2_total = 0;

  void AcceptLoop() EXCLUDES(mu);
  void Serve(const std::shared_ptr<Conn>& conn) EXCLUDES(mu);
  // Role::kEvents: registers the connection with its pool (subscribing the pool on the first).
  void Subscribe(Pool* pool, const std::shared_ptr<Conn>& conn);
  void Unsubscribe(const std::shared_ptr<Conn>& conn);
  // Makes room for one more pool within service.max_pools: closes a pool no engine uses
  // (nullptr) or says which pools hold the room (ResourceExhausted).
  Status MakeRoomForPool(const std::string& key, const std::string& model_id)
      REQUIRES(pool_create_mu) EXCLUDES(mu);
  // A pool with no live instance and no ended instance's requests left.
  bool PoolIdle(const Pool* pool) REQUIRES(mu);
  void WriterLoop(const std::shared_ptr<Conn>& conn);
  Result<std::shared_ptr<Pool>> GetPool(const proto::Hello& hello) EXCLUDES(pool_create_mu, mu);
  // The instance named in the Hello, made on its first connection and bound to `peer`'s
  // process. FailedPrecondition when the name is live in another process (two engines given
  // one service.instance) or with another pool.
  Result<Instance*> JoinInstance(const proto::Hello& hello, Pool* pool, const proto::PeerCred& peer)
      REQUIRES(mu);
  // Role::kLookup: the live instance named in the Hello; NotFound when there is none,
  // FailedPrecondition when `peer` runs as another uid than the instance's engine.
  Result<std::shared_ptr<Pool>> JoinLookup(Conn* conn, const proto::Hello& hello,
                                           const proto::PeerCred& peer) EXCLUDES(mu);
  // Role::kEvents: the pool of the Hello's identity, for a peer of the daemon's own uid or of
  // the uid of an engine attached to that pool (another uid would hear other engines' prompts).
  Result<std::shared_ptr<Pool>> JoinEvents(const proto::Hello& hello, const proto::PeerCred& peer)
      EXCLUDES(mu);
  // A lookup connection's instance, when it is still the live one it joined.
  Pool* LookupPool(const Conn& conn) REQUIRES(mu);
  void LeaveInstance(const std::shared_ptr<Conn>& conn) EXCLUDES(mu);
  Status SendCopy(uint32_t instance, const proto::CopyCall& call) EXCLUDES(mu);
  Status SendFetch(uint32_t instance, const proto::FetchCall& call) EXCLUDES(mu);
  // The instance's data connection, or null.
  std::shared_ptr<Conn> DataConn(uint32_t instance) EXCLUDES(mu);
  // Queues a frame on a data or events connection (its writer sends it). Unavailable for a null
  // connection or once it is closing.
  Status Queue(const std::shared_ptr<Conn>& conn, proto::MsgType type,
               std::vector<uint8_t> payload);
  Status HandleCall(uint32_t instance, Pool* pool, const proto::Frame& frame,
                    proto::WireWriter* out) EXCLUDES(mu);
  void ReapDone() EXCLUDES(mu);
};

}  // namespace kvtier::daemon

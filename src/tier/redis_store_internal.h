// The Redis / Redis Cluster backend of G4 (docs/g4-redis.md), private to src/tier/: the
// RedisStore class, its nodes and counters. redis_store.cc holds the operations (Put, Get,
// Contains, Remove, Stats), the routing loop they share (Run) and OpenRedisStore;
// redis_store_topology.cc holds the nodes, their connections and the cluster topology (Init,
// the CLUSTER SLOTS refresh, MOVED/ASK redirects). Callers use OpenRedisStore (remote_store.h).
//
// Invariants:
//   - nodes_ only grows; a Node is never destroyed before the store, so a Node* taken under
//     topo_mu_ stays valid without it.
//   - slots_[s] is the index in nodes_ of the master serving slot s, or -1 when unknown. In
//     standalone mode there is one node and no slot map.
//   - A connection handed out by a pool is used by one thread; it goes back to the pool only
//     after a lane that finished cleanly (every reply read), otherwise it is closed, so a
//     half-read reply is never seen by the next user.
//   - A call holds connections of several nodes at once only in increasing node index, so two
//     calls never wait on each other's pools in a cycle.
#pragma once

#include <atomic>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/mutex.h"
#include "tier/circuit_breaker.h"
#include "tier/redis_connection_pool.h"
#include "tier/redis_wire.h"
#include "tier/remote_store.h"

namespace kvtier {
namespace redis_store_internal {

struct Node {
  Node(RedisEndpoint ep, const RedisStoreOptions& o)
      : endpoint(std::move(ep)),
        name(endpoint.ToString()),
        breaker(o.breaker),
        pool(o.connections_per_node) {}
  const RedisEndpoint endpoint;
  const std::string name;
  CircuitBreaker breaker;
  RedisConnectionPool pool;
  std::atomic<uint64_t> connects{0};
  std::atomic<uint64_t> lost{0};  // connections discarded after an error

  void SetLastError(const Status& s) {
    MutexLock lock(&mu);
    last_error = s.ToString();
  }
  std::string LastError() {
    MutexLock lock(&mu);
    return last_error;
  }

 private:
  Mutex mu;
  std::string last_error GUARDED_BY(mu);  // why the breaker last counted a failure
};

struct Counters {
  std::atomic<uint64_t> puts{0}, put_bytes{0}, put_failures{0};
  std::atomic<uint64_t> gets{0}, get_hits{0}, get_misses{0}, get_bytes{0}, get_failures{0};
  std::atomic<uint64_t> timeouts{0}, breaker_rejections{0}, reconnects{0}, redirects{0};
};

// One item of a batch as the routing loop sees it.
struct Item {
  size_t index = 0;     // in the caller's span
  int node = -1;        // forced target after MOVED/ASK; -1: route by slot
  bool asking = false;  // ASK redirect: send ASKING first
};

inline bool StartsWith(const std::string& s, std::string_view prefix) {
  return s.size() >= prefix.size() && std::string_view(s).substr(0, prefix.size()) == prefix;
}

class RedisStore final : public RemoteStore {
 public:
  explicit RedisStore(RedisStoreOptions options) : options_(std::move(options)) {
    topology_breaker_ = std::make_unique<CircuitBreaker>(options_.breaker);
    slots_.assign(kRedisClusterSlots, -1);
  }

  // Registers the endpoints and connects once (cluster: asks for the topology). A server that
  // cannot be reached opens its breaker and is not an error.
  Status Init(const std::vector<RedisEndpoint>& endpoints);

  void Put(std::span<const RemotePut> items, RemoteDeadline deadline,
           std::span<Status> results) override;
  void Get(std::span<RemoteGet> items, RemoteDeadline deadline, std::span<Status> results) override;
  Status Contains(std::span<const std::string> names, RemoteDeadline deadline,
                  std::span<uint8_t> present) override;
  Status Remove(std::span<const std::string> names, RemoteDeadline deadline) override;
  std::string Describe() const override;
  RemoteStoreStats Stats() const override;

 private:
  static Status Unexpected(const char* verb, const std::string& name, const WireReply& r);

  // REQUIRES: topo_mu_ held. The index of the node at `ep`, added when new.
  int NodeIndexLocked(const RedisEndpoint& ep) REQUIRES(topo_mu_);
  Node* NodeAt(int i);
  std::vector<Node*> AllNodes() const;

  // Asks the nodes (seeds first, then every other known node whose breaker is closed) for
  // CLUSTER SLOTS until one answers, and installs its map. At most one refresh at a time and
  // one per kMinRefreshInterval unless `force`; gated by the topology breaker.
  Status RefreshTopology(RemoteDeadline deadline, bool force);
  Status RefreshTopologyLocked(RemoteDeadline deadline, bool force) REQUIRES(refresh_mu_);

  // A connection to `node` (pooled or new). On failure, *server_fault says whether the server
  // is to blame (it could not be reached) or the pool was busy until the deadline.
  Result<std::unique_ptr<RedisConnection>> Acquire(Node* node, RemoteDeadline deadline,
                                                   bool* server_fault);

  // The routing loop shared by every operation. `name(i)` is item i's object name, `encode`
  // fills its command, `decode` turns its reply into its result. results[i] ends as decode's
  // result, or the failure that kept item i from a reply.
  // Defined in redis_store.cc, the only file that calls it.
  template <typename NameFn, typename EncodeFn, typename DecodeFn>
  void Run(size_t count, NameFn name, EncodeFn encode, DecodeFn decode, RemoteDeadline deadline,
           std::span<Status> results);

  // Follows "MOVED <slot> <host:port>" or "ASK <slot> <host:port>": queues the item for that
  // node. False when `error` is neither.
  bool Redirect(const std::string& error, const Item& it, std::vector<Item>* again, Status* result);
  void MarkStale();
  void MaybeRefresh(RemoteDeadline deadline);

  const RedisStoreOptions options_;
  std::unique_ptr<CircuitBreaker> topology_breaker_;
  mutable Mutex topo_mu_;
  std::vector<std::unique_ptr<Node>> nodes_ GUARDED_BY(topo_mu_);
  std::vector<int> slots_ GUARDED_BY(topo_mu_);
  bool have_topology_ GUARDED_BY(topo_mu_) = false;
  // Why the last topology refresh failed (what every seed answered, or not), for the errors of
  // calls made while the topology is unknown.
  std::string last_topology_error_ GUARDED_BY(topo_mu_) = "no seed answered";
  bool topology_stale_ GUARDED_BY(topo_mu_) = false;
  RemoteClock::time_point last_refresh_ GUARDED_BY(topo_mu_){};
  Mutex refresh_mu_;  // held (TryLock) by the one caller refreshing the topology
  Counters counters_;
};

}  // namespace redis_store_internal
}  // namespace kvtier

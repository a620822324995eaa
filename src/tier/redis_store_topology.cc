// The Redis / Redis Cluster backend of G4 (docs/g4-redis.md), part 2 of 2: the nodes and the
// cluster topology: Init (the first connection, or the first CLUSTER SLOTS), the node table,
// the topology refresh, taking a connection from a node's pool (Acquire), and MOVED/ASK
// redirects. The class and its invariants are in redis_store_internal.h; the operations and the
// routing loop are in redis_store.cc.
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/log.h"
#include "core/mutex.h"
#include "tier/circuit_breaker.h"
#include "tier/redis_store_internal.h"
#include "tier/redis_wire.h"

namespace kvtier {
namespace redis_store_internal {
namespace {

constexpr auto kMinRefreshInterval = std::chrono::milliseconds(100);

}  // namespace

Status RedisStore::Init(const std::vector<RedisEndpoint>& endpoints) {
  {
    MutexLock lock(&topo_mu_);
    for (const RedisEndpoint& ep : endpoints) NodeIndexLocked(ep);
  }
  const RemoteDeadline deadline = RemoteClock::now() + options_.connect_timeout;
  if (options_.cluster) {
    if (Status s = RefreshTopology(deadline, /*force=*/true); !s.ok()) {
      KVTIER_LOG(kWarn) << "redis cluster: no topology at open (" << s.ToString()
                        << "); G4 calls fail fast until a seed answers";
      topology_breaker_->ForceOpen();
    }
    return Status::Ok();
  }
  Node* node = NodeAt(0);
  auto conn = RedisConnection::Connect(node->endpoint, options_.username, options_.password,
                                       options_.connect_timeout, deadline);
  if (!conn.ok()) {
    KVTIER_LOG(kWarn) << "redis: server not reachable at open (" << conn.status().ToString()
                      << "); breaker open, probing every " << options_.breaker.open_for.count()
                      << " ms";
    node->SetLastError(conn.status());
    node->breaker.ForceOpen();
    return Status::Ok();
  }
  node->connects++;
  if (node->pool.Take(deadline).ok()) node->pool.Release(std::move(conn).value());
  return Status::Ok();
}

int RedisStore::NodeIndexLocked(const RedisEndpoint& ep) {
  const std::string name = ep.ToString();
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i]->name == name) return static_cast<int>(i);
  }
  nodes_.push_back(std::make_unique<Node>(ep, options_));
  return static_cast<int>(nodes_.size() - 1);
}

Node* RedisStore::NodeAt(int i) {
  MutexLock lock(&topo_mu_);
  return nodes_[static_cast<size_t>(i)].get();
}

std::vector<Node*> RedisStore::AllNodes() const {
  MutexLock lock(&topo_mu_);
  std::vector<Node*> out;
  for (const auto& n : nodes_) out.push_back(n.get());
  return out;
}

Status RedisStore::RefreshTopology(RemoteDeadline deadline, bool force) {
  if (!refresh_mu_.TryLock()) return Status::Ok();  // another caller is refreshing
  Status s = RefreshTopologyLocked(deadline, force);
  refresh_mu_.Unlock();
  return s;
}

Status RedisStore::RefreshTopologyLocked(RemoteDeadline deadline, bool force) {
  const auto now = RemoteClock::now();
  {
    MutexLock lock(&topo_mu_);
    if (!force && now - last_refresh_ < kMinRefreshInterval) return Status::Ok();
    last_refresh_ = now;
  }
  const CircuitBreaker::Decision d = topology_breaker_->Admit();
  if (d == CircuitBreaker::Decision::kReject) {
    MutexLock lock(&topo_mu_);
    return Status::Unavailable("redis cluster: topology unknown (" + last_topology_error_ +
                               "); probing again later");
  }
  const bool probe = d == CircuitBreaker::Decision::kProbe;
  std::vector<Node*> nodes = AllNodes();
  Status last = Status::Unavailable("redis cluster: no node to ask for the topology");
  for (Node* node : nodes) {
    if (node->breaker.IsOpen() && nodes.size() > 1) continue;
    if (RemoteClock::now() >= deadline) {
      last = Status::TimedOut("redis cluster: deadline passed while refreshing the topology");
      break;
    }
    auto conn = RedisConnection::Connect(node->endpoint, options_.username, options_.password,
                                         options_.connect_timeout, deadline);
    if (!conn.ok()) {
      last = conn.status();
      continue;
    }
    auto ranges = (*conn)->ClusterSlots(deadline);
    if (!ranges.ok()) {
      last = ranges.status();
      continue;
    }
    MutexLock lock(&topo_mu_);
    std::vector<int> fresh(kRedisClusterSlots, -1);
    for (const auto& r : *ranges) {
      const int idx = NodeIndexLocked(r.master);
      for (uint32_t s = r.first; s <= r.last; ++s) fresh[s] = idx;
    }
    slots_.swap(fresh);
    have_topology_ = true;
    topology_stale_ = false;
    topology_breaker_->OnSuccess(probe);
    return Status::Ok();
  }
  topology_breaker_->OnFailure(probe);
  {
    MutexLock lock(&topo_mu_);
    last_topology_error_ = "last refresh: " + last.ToString();
  }
  return last;
}

Result<std::unique_ptr<RedisConnection>> RedisStore::Acquire(Node* node, RemoteDeadline deadline,
                                                             bool* server_fault) {
  *server_fault = false;
  for (;;) {
    auto taken = node->pool.Take(deadline);
    if (!taken.ok()) {
      return Status::TimedOut("redis " + node->name + ": " + taken.status().message());
    }
    if (*taken == nullptr) break;  // none idle: open one
    if ((*taken)->IdleHealthy()) return std::move(taken).value();
    // Closed by the server while idle (e.g. it restarted): discard it, try the next.
    taken->reset();
    node->pool.Forget();
    node->lost++;
  }
  auto conn = RedisConnection::Connect(node->endpoint, options_.username, options_.password,
                                       options_.connect_timeout, deadline);
  if (!conn.ok()) {
    node->pool.Forget();
    *server_fault = true;
    return conn.status();
  }
  if (node->connects++ > 0 && node->lost.load() > 0) counters_.reconnects++;
  return conn;
}

bool RedisStore::Redirect(const std::string& error, const Item& it, std::vector<Item>* again,
                          Status* result) {
  const bool moved = StartsWith(error, "MOVED ");
  const bool ask = StartsWith(error, "ASK ");
  if (!moved && !ask) return false;
  const size_t sp1 = error.find(' ');
  const size_t sp2 = error.find(' ', sp1 + 1);
  if (sp2 == std::string::npos) return false;
  const long slot = std::strtol(error.c_str() + sp1 + 1, nullptr, 10);
  auto target = ParseRedisEndpoint(error.substr(sp2 + 1));
  if (!target.ok() || slot < 0 || slot >= static_cast<long>(kRedisClusterSlots)) return false;
  counters_.redirects++;
  *result = Status::IOError("redis cluster: too many redirects (last: " + error + ")");
  MutexLock lock(&topo_mu_);
  const int node = NodeIndexLocked(*target);
  if (moved) {
    slots_[static_cast<size_t>(slot)] = node;
    topology_stale_ = true;  // a slot moved: the others may have too
  }
  again->push_back(Item{it.index, node, ask});
  return true;
}

void RedisStore::MarkStale() {
  MutexLock lock(&topo_mu_);
  topology_stale_ = true;
}

void RedisStore::MaybeRefresh(RemoteDeadline deadline) {
  bool stale;
  {
    MutexLock lock(&topo_mu_);
    stale = topology_stale_ || !have_topology_;
  }
  if (stale) (void)RefreshTopology(deadline, /*force=*/false);
}

}  // namespace redis_store_internal
}  // namespace kvtier

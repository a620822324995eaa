// The Redis / Redis Cluster backend of G4 (docs/g4-redis.md).
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
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <thread>

#include "core/log.h"
#include "core/mutex.h"
#include "tier/circuit_breaker.h"
#include "tier/cond_wait.h"
#include "tier/redis_connection_pool.h"
#include "tier/redis_wire.h"
#include "tier/remote_store.h"

namespace kvtier {
namespace {

constexpr int kMaxAttempts = 6;  // passes over the pending items (redirects, TRYAGAIN)
constexpr auto kRetryPause = std::chrono::milliseconds(20);
constexpr auto kMinRefreshInterval = std::chrono::milliseconds(100);

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

bool StartsWith(const std::string& s, std::string_view prefix) {
  return s.size() >= prefix.size() && std::string_view(s).substr(0, prefix.size()) == prefix;
}

class RedisStore final : public RemoteStore {
 public:
  explicit RedisStore(RedisStoreOptions options) : options_(std::move(options)) {
    topology_breaker_ = std::make_unique<CircuitBreaker>(options_.breaker);
    slots_.assign(kRedisClusterSlots, -1);
  }

  Status Init(const std::vector<RedisEndpoint>& endpoints) {
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

  void Put(std::span<const RemotePut> items, RemoteDeadline deadline,
           std::span<Status> results) override {
    Run(
        items.size(), [&](size_t i) -> const std::string& { return items[i].name; },
        [&](size_t i, WireCommand* c) {
          c->head = EncodeRedisCommandWithValue("SET", items[i].name, items[i].bytes.size());
          c->value = items[i].bytes;
          c->has_value = true;
        },
        [&](size_t i, const WireReply& r) -> Status {
          if (r.kind == WireReply::Kind::kStatus) return Status::Ok();
          return Unexpected("SET", items[i].name, r);
        },
        deadline, results);
    for (size_t i = 0; i < items.size(); ++i) {
      counters_.puts++;
      if (results[i].ok()) {
        counters_.put_bytes += items[i].bytes.size();
      } else {
        counters_.put_failures++;
      }
    }
  }

  void Get(std::span<RemoteGet> items, RemoteDeadline deadline,
           std::span<Status> results) override {
    for (RemoteGet& g : items) g.bytes_read = 0;
    Run(
        items.size(), [&](size_t i) -> const std::string& { return items[i].name; },
        [&](size_t i, WireCommand* c) {
          c->head = EncodeRedisCommand({"GET", items[i].name});
          if (items[i].pieces.empty()) {
            c->dest = items[i].dest;
          } else {
            c->ScatterInto(items[i].pieces);  // every attempt (redirects, retries) scatters too
          }
          if (items[i].on_landed) c->on_landed = &items[i].on_landed;
        },
        [&](size_t i, const WireReply& r) -> Status {
          switch (r.kind) {
            case WireReply::Kind::kBulk:
              items[i].bytes_read = r.length;
              return Status::Ok();
            case WireReply::Kind::kNil:
              return Status::NotFound(items[i].name);
            case WireReply::Kind::kBulkTooLarge:
              return Status::Corruption(
                  "redis object " + items[i].name + " is " + std::to_string(r.length) +
                  " bytes, more than its " + std::to_string(items[i].Capacity()) + "-byte " +
                  (items[i].pieces.empty() ? "destination" : "pieces") + "; not copied");
            default:
              return Unexpected("GET", items[i].name, r);
          }
        },
        deadline, results);
    for (size_t i = 0; i < items.size(); ++i) {
      counters_.gets++;
      if (results[i].ok()) {
        counters_.get_hits++;
        counters_.get_bytes += items[i].bytes_read;
      } else if (results[i].Is(StatusCode::kNotFound)) {
        counters_.get_misses++;
      } else {
        counters_.get_failures++;
      }
    }
  }

  Status Contains(std::span<const std::string> names, RemoteDeadline deadline,
                  std::span<uint8_t> present) override {
    std::fill(present.begin(), present.end(), 0);
    std::vector<Status> results(names.size());
    Run(
        names.size(), [&](size_t i) -> const std::string& { return names[i]; },
        [&](size_t i, WireCommand* c) {
          c->head = EncodeRedisCommand({"EXISTS", names[i]});
        },
        [&](size_t i, const WireReply& r) -> Status {
          if (r.kind != WireReply::Kind::kInteger) return Unexpected("EXISTS", names[i], r);
          present[i] = r.integer > 0 ? 1 : 0;
          return Status::Ok();
        },
        deadline, results);
    for (const Status& s : results) {
      if (!s.ok()) {
        std::fill(present.begin(), present.end(), 0);
        return s;
      }
    }
    return Status::Ok();
  }

  Status Remove(std::span<const std::string> names, RemoteDeadline deadline) override {
    std::vector<Status> results(names.size());
    Run(
        names.size(), [&](size_t i) -> const std::string& { return names[i]; },
        [&](size_t i, WireCommand* c) {
          c->head = EncodeRedisCommand({"DEL", names[i]});
        },
        [&](size_t i, const WireReply& r) -> Status {
          if (r.kind != WireReply::Kind::kInteger) return Unexpected("DEL", names[i], r);
          return Status::Ok();
        },
        deadline, results);
    for (const Status& s : results) {
      if (!s.ok()) return s;
    }
    return Status::Ok();
  }

  std::string Describe() const override {
    std::string out = options_.cluster ? "redis-cluster://" : "redis://";
    for (size_t i = 0; i < options_.endpoints.size(); ++i) {
      out += (i ? "," : "") + options_.endpoints[i];
    }
    return out;
  }

  RemoteStoreStats Stats() const override {
    RemoteStoreStats s;
    s.puts = counters_.puts;
    s.put_bytes = counters_.put_bytes;
    s.put_failures = counters_.put_failures;
    s.gets = counters_.gets;
    s.get_hits = counters_.get_hits;
    s.get_misses = counters_.get_misses;
    s.get_bytes = counters_.get_bytes;
    s.get_failures = counters_.get_failures;
    s.timeouts = counters_.timeouts;
    s.breaker_rejections = counters_.breaker_rejections;
    s.reconnects = counters_.reconnects;
    s.redirects = counters_.redirects;
    std::vector<Node*> nodes = AllNodes();
    for (Node* n : nodes) {
      s.breaker_opens += n->breaker.opens();
      if (n->breaker.IsOpen()) s.breaker_open = true;
    }
    if (options_.cluster) {
      // With no topology there is nothing to call: the topology breaker counts as the store's.
      s.breaker_opens += topology_breaker_->opens();
      MutexLock lock(&topo_mu_);
      if (!have_topology_ && topology_breaker_->IsOpen()) s.breaker_open = true;
    }
    return s;
  }

 private:
  static Status Unexpected(const char* verb, const std::string& name, const WireReply& r) {
    if (r.kind == WireReply::Kind::kError) {
      return Status::IOError(std::string("redis refused ") + verb + " " + name + ": " + r.text);
    }
    return Status::IOError(std::string("redis: unexpected reply to ") + verb + " " + name);
  }

  // REQUIRES: topo_mu_ held. The index of the node at `ep`, added when new.
  int NodeIndexLocked(const RedisEndpoint& ep) REQUIRES(topo_mu_) {
    const std::string name = ep.ToString();
    for (size_t i = 0; i < nodes_.size(); ++i) {
      if (nodes_[i]->name == name) return static_cast<int>(i);
    }
    nodes_.push_back(std::make_unique<Node>(ep, options_));
    return static_cast<int>(nodes_.size() - 1);
  }
  Node* NodeAt(int i) {
    MutexLock lock(&topo_mu_);
    return nodes_[static_cast<size_t>(i)].get();
  }
  std::vector<Node*> AllNodes() const {
    MutexLock lock(&topo_mu_);
    std::vector<Node*> out;
    for (const auto& n : nodes_) out.push_back(n.get());
    return out;
  }

  // Asks the nodes (seeds first, then every other known node whose breaker is closed) for
  // CLUSTER SLOTS until one answers, and installs its map. At most one refresh at a time and
  // one per kMinRefreshInterval unless `force`; gated by the topology breaker.
  Status RefreshTopology(RemoteDeadline deadline, bool force) {
    if (!refresh_mu_.TryLock()) return Status::Ok();  // another caller is refreshing
    Status s = RefreshTopologyLocked(deadline, force);
    refresh_mu_.Unlock();
    return s;
  }

  Status RefreshTopologyLocked(RemoteDeadline deadline, bool force) REQUIRES(refresh_mu_) {
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

  // A connection to `node` (pooled or new). On failure, *server_fault says whether the server
  // is to blame (it could not be reached) or the pool was busy until the deadline.
  Result<std::unique_ptr<RedisConnection>> Acquire(Node* node, RemoteDeadline deadline,
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

  // The routing loop shared by every operation. `name(i)` is item i's object name, `encode`
  // fills its command, `decode` turns its reply into its result. results[i] ends as decode's
  // result, or the failure that kept item i from a reply.
  template <typename NameFn, typename EncodeFn, typename DecodeFn>
  void Run(size_t count, NameFn name, EncodeFn encode, DecodeFn decode, RemoteDeadline deadline,
           std::span<Status> results) {
    for (size_t i = 0; i < count; ++i) {
      results[i] = Status::TimedOut("redis: deadline passed before " + name(i) + " was sent");
    }
    std::vector<Item> pending(count);
    for (size_t i = 0; i < count; ++i) pending[i].index = i;
    std::vector<Item> again;
    for (int attempt = 0; attempt < kMaxAttempts && !pending.empty(); ++attempt) {
      if (RemoteClock::now() >= deadline) break;
      bool pause = false;
      again.clear();
      if (options_.cluster) MaybeRefresh(deadline);
      // Route: node index -> items.
      std::map<int, std::vector<Item>> by_node;
      {
        MutexLock lock(&topo_mu_);
        for (const Item& it : pending) {
          int node = it.node;
          if (node < 0) node = options_.cluster ? slots_[RedisHashSlot(name(it.index))] : 0;
          if (node < 0) {
            results[it.index] = Status::Unavailable(
                "redis cluster: no known node serves the slot of " + name(it.index) +
                (have_topology_ ? "" : " (topology unknown: " + last_topology_error_ + ")"));
            topology_stale_ = true;
            continue;
          }
          by_node[node].push_back(it);
        }
      }
      struct Group {
        Node* node;
        bool probe;
        std::unique_ptr<RedisConnection> conn;
        std::vector<Item> items;
        std::vector<WireCommand> commands;
        std::vector<int> command_item;  // index into items, or -1 for ASKING
      };
      std::vector<Group> groups;
      for (auto& [index, items] : by_node) {  // increasing node index: see the invariants
        Node* node = NodeAt(index);
        const CircuitBreaker::Decision d = node->breaker.Admit();
        if (d == CircuitBreaker::Decision::kReject) {
          const Status rejected = Status::Unavailable(
              "redis " + node->name +
              ": circuit breaker open, not called (last failure: " + node->LastError() + ")");
          for (const Item& it : items) {
            results[it.index] = rejected;
          }
          counters_.breaker_rejections += items.size();
          continue;
        }
        const bool probe = d == CircuitBreaker::Decision::kProbe;
        bool server_fault = false;
        auto conn = Acquire(node, deadline, &server_fault);
        if (!conn.ok()) {
          for (const Item& it : items) results[it.index] = conn.status();
          // A busy pool says nothing about the server, but a probe must still report.
          if (server_fault || probe) node->breaker.OnFailure(probe);
          if (server_fault) node->SetLastError(conn.status());
          if (server_fault && options_.cluster) MarkStale();
          continue;
        }
        Group g{node, probe, std::move(conn).value(), std::move(items), {}, {}};
        g.commands.reserve(g.items.size() * 2);
        for (size_t k = 0; k < g.items.size(); ++k) {
          if (g.items[k].asking) {
            g.commands.push_back(WireCommand{EncodeRedisCommand({"ASKING"}), {}, false, {}});
            g.command_item.push_back(-1);
          }
          g.commands.emplace_back();
          encode(g.items[k].index, &g.commands.back());
          g.command_item.push_back(static_cast<int>(k));
        }
        groups.push_back(std::move(g));
      }
      if (groups.empty()) break;
      std::vector<RedisPipeline::Lane> lanes(groups.size());
      for (size_t g = 0; g < groups.size(); ++g) {
        lanes[g].conn = groups[g].conn.get();
        lanes[g].commands = groups[g].commands;
      }
      RedisPipeline::Run(lanes, PipelineWindow{options_.max_pipeline, options_.max_pipeline_bytes},
                         deadline);
      for (size_t g = 0; g < groups.size(); ++g) {
        Group& grp = groups[g];
        RedisPipeline::Lane& lane = lanes[g];
        for (size_t c = 0; c < lane.replies.size(); ++c) {
          const int k = grp.command_item[c];
          if (k < 0) continue;  // ASKING: its error, if any, shows in the command's reply
          const Item& it = grp.items[static_cast<size_t>(k)];
          const WireReply& r = lane.replies[c];
          if (r.kind == WireReply::Kind::kError && options_.cluster) {
            if (Redirect(r.text, it, &again, &results[it.index])) continue;
            if (StartsWith(r.text, "TRYAGAIN") || StartsWith(r.text, "CLUSTERDOWN") ||
                StartsWith(r.text, "LOADING")) {
              results[it.index] = Status::Unavailable("redis " + grp.node->name + ": " + r.text);
              again.push_back(Item{it.index, -1, false});
              pause = true;
              continue;
            }
          }
          results[it.index] = decode(it.index, r);
        }
        for (size_t c = lane.replies.size(); c < grp.commands.size(); ++c) {
          const int k = grp.command_item[c];
          if (k < 0) continue;
          const Item& it = grp.items[static_cast<size_t>(k)];
          results[it.index] = lane.failure;
          // A lost cluster node: its slots may have moved (failover); retry after a refresh.
          if (options_.cluster && lane.failure.Is(StatusCode::kUnavailable) && attempt == 0) {
            again.push_back(Item{it.index, -1, false});
          }
        }
        if (lane.failure.ok()) {
          grp.node->breaker.OnSuccess(grp.probe);
          grp.node->pool.Release(std::move(grp.conn));
        } else {
          grp.node->breaker.OnFailure(grp.probe);
          grp.node->SetLastError(lane.failure);
          grp.conn.reset();
          grp.node->pool.Forget();
          grp.node->lost++;
          if (!lane.failure.Is(StatusCode::kTimedOut)) grp.node->pool.DropIdle();
          if (options_.cluster) MarkStale();
        }
      }
      pending.swap(again);
      if (pause && !pending.empty()) {
        const auto left = deadline - RemoteClock::now();
        if (left > RemoteClock::duration::zero()) {
          std::this_thread::sleep_for(std::min<RemoteClock::duration>(kRetryPause, left));
        }
      }
    }
    for (size_t i = 0; i < count; ++i) {
      if (results[i].Is(StatusCode::kTimedOut)) counters_.timeouts++;
    }
  }

  // Follows "MOVED <slot> <host:port>" or "ASK <slot> <host:port>": queues the item for that
  // node. False when `error` is neither.
  bool Redirect(const std::string& error, const Item& it, std::vector<Item>* again,
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

  void MarkStale() {
    MutexLock lock(&topo_mu_);
    topology_stale_ = true;
  }

  void MaybeRefresh(RemoteDeadline deadline) {
    bool stale;
    {
      MutexLock lock(&topo_mu_);
      stale = topology_stale_ || !have_topology_;
    }
    if (stale) (void)RefreshTopology(deadline, /*force=*/false);
  }

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

}  // namespace

Result<std::unique_ptr<RemoteStore>> OpenRedisStore(const RedisStoreOptions& options) {
  if (options.endpoints.empty()) {
    return Status::InvalidArgument(
        "redis store: no endpoint given: give host:port (or seed nodes with --cluster)");
  }
  if (!options.cluster && options.endpoints.size() != 1) {
    return Status::InvalidArgument("redis store: " + std::to_string(options.endpoints.size()) +
                                   " endpoints given for a standalone server: give one, or "
                                   "set cluster for seed nodes");
  }
  if (options.connections_per_node < 1) {
    return Status::InvalidArgument("redis store: connections_per_node must be >= 1");
  }
  if (options.max_pipeline_bytes < 1) {
    return Status::InvalidArgument("redis store: max_pipeline_bytes must be >= 1");
  }
  if (options.max_pipeline < 1) {
    return Status::InvalidArgument("redis store: max_pipeline must be >= 1");
  }
  if (options.connect_timeout.count() < 1) {
    return Status::InvalidArgument("redis store: connect_timeout must be >= 1 ms");
  }
  KVTIER_RETURN_IF_ERROR(CircuitBreaker::Validate(options.breaker));
  std::vector<RedisEndpoint> endpoints;
  for (const std::string& e : options.endpoints) {
    KVTIER_ASSIGN_OR_RETURN(RedisEndpoint ep, ParseRedisEndpoint(e));
    endpoints.push_back(std::move(ep));
  }
  auto store = std::make_unique<RedisStore>(options);
  KVTIER_RETURN_IF_ERROR(store->Init(endpoints));
  return std::unique_ptr<RemoteStore>(std::move(store));
}

}  // namespace kvtier

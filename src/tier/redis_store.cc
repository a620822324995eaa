// The Redis / Redis Cluster backend of G4 (docs/g4-redis.md), part 1 of 2: the operations
// (Put, Get, Contains, Remove), the routing loop they share (Run: route by slot, admit through
// each node's breaker, pipeline, follow redirects and retries), the counters, and
// OpenRedisStore. The class and its invariants are in redis_store_internal.h; the nodes, their
// connections and the cluster topology are in redis_store_topology.cc.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <thread>

#include "core/log.h"
#include "core/mutex.h"
#include "tier/circuit_breaker.h"
#include "tier/redis_store_internal.h"
#include "tier/redis_wire.h"
#include "tier/remote_store.h"

namespace kvtier {
namespace redis_store_internal {
namespace {

constexpr int kMaxAttempts = 6;  // passes over the pending items (redirects, TRYAGAIN)
constexpr auto kRetryPause = std::chrono::milliseconds(20);

}  // namespace

template <typename NameFn, typename EncodeFn, typename DecodeFn>
void RedisStore::Run(size_t count, NameFn name, EncodeFn encode, DecodeFn decode,
                     RemoteDeadline deadline, std::span<Status> results) {
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

void RedisStore::Put(std::span<const RemotePut> items, RemoteDeadline deadline,
                     std::span<Status> results) {
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

void RedisStore::Get(std::span<RemoteGet> items, RemoteDeadline deadline,
                     std::span<Status> results) {
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

Status RedisStore::Contains(std::span<const std::string> names, RemoteDeadline deadline,
                            std::span<uint8_t> present) {
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

Status RedisStore::Remove(std::span<const std::string> names, RemoteDeadline deadline) {
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

std::string RedisStore::Describe() const {
  std::string out = options_.cluster ? "redis-cluster://" : "redis://";
  for (size_t i = 0; i < options_.endpoints.size(); ++i) {
    out += (i ? "," : "") + options_.endpoints[i];
  }
  return out;
}

RemoteStoreStats RedisStore::Stats() const {
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

Status RedisStore::Unexpected(const char* verb, const std::string& name, const WireReply& r) {
  if (r.kind == WireReply::Kind::kError) {
    return Status::IOError(std::string("redis refused ") + verb + " " + name + ": " + r.text);
  }
  return Status::IOError(std::string("redis: unexpected reply to ") + verb + " " + name);
}

}  // namespace redis_store_internal

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
  auto store = std::make_unique<redis_store_internal::RedisStore>(options);
  KVTIER_RETURN_IF_ERROR(store->Init(endpoints));
  return std::unique_ptr<RemoteStore>(std::move(store));
}

}  // namespace kvtier

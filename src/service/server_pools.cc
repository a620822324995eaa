// kvtier serve's pools (one per model and layout, within service.max_pools), the instances
// that join them, and the events connections that hear them (docs/service.md).
#include <sys/socket.h>

#include <algorithm>
#include <cstdio>

#include "core/log.h"
#include "service/server_state.h"

namespace kvtier::service {

Result<std::shared_ptr<Pool>> Server::State::GetPool(const Hello& hello) {
  const std::string key = PoolKey(hello.model_id, hello.layout);
  {
    std::lock_guard lock(mu);
    auto it = pools.find(key);
    if (it != pools.end()) return it->second;
  }
  // Made outside mu (pre-faulting G2 and recovering G3 take a while), one at a time (two
  // Hellos racing for one new pool must not both open its G3).
  std::lock_guard creating(pool_create_mu);
  {
    std::lock_guard lock(mu);
    auto it = pools.find(key);
    if (it != pools.end()) return it->second;
  }
  KVTIER_RETURN_IF_ERROR(MakeRoomForPool(key, hello.model_id));
  auto pool = std::make_shared<Pool>();
  pool->key = key;
  pool->model_id = hello.model_id;
  ManagerOptions mo;
  mo.layout = hello.layout;
  mo.model_id = hello.model_id;
  mo.config = options.config;
  // g2.capacity_bytes is the daemon's whole G2: each pool holds an even share of it.
  KVTIER_RETURN_IF_ERROR(mo.config.Set("g2.capacity_bytes", std::to_string(g2_total / max_pools),
                                       ConfigSource::kOverride));
  if (mo.config.GetBool("g3.enabled")) {
    const std::string dir = mo.config.GetString("g3.dir") + "/" + key;
    KVTIER_RETURN_IF_ERROR(mo.config.Set(
        "g3.dir", dir,
        mo.config.IsSet("g3.dir") ? ConfigSource::kOverride : ConfigSource::kDefault));
  }
  bool first;
  {
    std::lock_guard lock(mu);
    first = pools.empty();
  }
  if (!first && !mo.config.GetString("events.endpoint").empty()) {
    // Attached engines hear every pool's events over their events connections.
    KVTIER_LOG(kWarn) << "kvtier serve: events.endpoint serves the first model only; pool " << key
                      << " publishes no events";
    KVTIER_RETURN_IF_ERROR(mo.config.Set("events.endpoint", ""));
  }
  Pool* raw = pool.get();
  const uint32_t num_layers = hello.layout.num_layers;
  auto factory =
      [this, raw,
       num_layers](const DeviceCopyBackend::Config&) -> Result<std::unique_ptr<DeviceCopyBackend>> {
    auto backend = std::make_unique<RemoteG1Backend>(
        [this](uint32_t instance, const CopyCall& call) { return SendCopy(instance, call); }, lease,
        num_layers);
    backend->SetFetchSender(
        [this](uint32_t instance, const FetchCall& call) { return SendFetch(instance, call); });
    raw->backend = backend.get();
    return std::unique_ptr<DeviceCopyBackend>(std::move(backend));
  };
  KVTIER_ASSIGN_OR_RETURN(pool->impl,
                          BlockManager::Impl::Create(mo, {}, nullptr, factory, /*shared_g2=*/true));
  G1Memory g1;
  g1.layout = hello.layout;
  g1.num_blocks = UINT32_MAX;
  g1.on_device = true;
  const bool contiguous = hello.layout.g1_arrangement == G1Arrangement::kBlockContiguous;
  const size_t regions = contiguous ? 1 : size_t{hello.layout.num_layers} * hello.layout.num_planes;
  // Never dereferenced: the engines' own G1s stand behind these ids.
  g1.regions.assign(regions,
                    G1Region{reinterpret_cast<uint8_t*>(uintptr_t{1} << 44),
                             contiguous ? hello.layout.BlockBytes() : hello.layout.ChunkBytes()});
  KVTIER_RETURN_IF_ERROR(pool->impl->RegisterDeviceMemory(g1));
  const HostArena* arena = pool->impl->g2_arena();
  pool->memfd = arena->shared_fd();
  pool->g2_capacity = mo.config.GetBytes("g2.capacity_bytes");
  pool->g2_slot_bytes = arena->slot_bytes();
  if (mo.config.GetString("g4.backend") == "redis" && mo.config.GetBool("g4.direct_to_g1") &&
      pool->impl->HasG4()) {
    G4Config offer;
    offer.endpoints = mo.config.GetString("g4.endpoints");
    offer.cluster = mo.config.GetBool("g4.cluster");
    offer.username = mo.config.GetString("g4.username");
    offer.password = mo.config.GetString("g4.password");
    offer.connections = static_cast<uint32_t>(mo.config.GetUint("g4.threads"));
    offer.pipeline_bytes = mo.config.GetUint("g4.redis_pipeline_kib") << 10;
    pool->g4_offer = offer;
  }
  std::lock_guard lock(mu);
  auto [it, inserted] = pools.emplace(key, std::move(pool));
  if (inserted) {
    KVTIER_LOG(kInfo) << "kvtier serve: pool " << key << " (" << hello.layout.ToString() << ", "
                      << arena->num_slots() << " G2 slots)";
  }
  return it->second;
}

bool Server::State::PoolIdle(const Pool* pool) {
  for (const auto& [id, inst] : instances) {
    if (inst->pool == pool) return false;
  }
  for (const auto& [id, p] : ended) {
    if (p == pool && p->impl->InstanceRequests(id) != 0) return false;
  }
  return true;
}

Status Server::State::MakeRoomForPool(const std::string& key, const std::string& model_id) {
  std::shared_ptr<Pool> closing;
  std::vector<std::shared_ptr<Conn>> listeners;
  {
    std::lock_guard lock(mu);
    if (pools.size() < max_pools) return Status::Ok();
    // The pool no engine has used for longest would be best; any idle one frees the room.
    for (auto it = pools.begin(); it != pools.end(); ++it) {
      if (!PoolIdle(it->second.get())) continue;
      closing = std::move(it->second);
      pools.erase(it);
      for (auto e = ended.begin(); e != ended.end();) {
        e = e->second == closing.get() ? ended.erase(e) : std::next(e);
      }
      ++stats.pools_closed;
      break;
    }
    if (closing == nullptr) {
      std::string held;
      for (const auto& [k, p] : pools) held += (held.empty() ? "" : ", ") + k;
      return Status::ResourceExhausted(
          "kvtier serve holds service.max_pools=" + std::to_string(max_pools) + " G2 pools (" +
          held + "), each with an engine attached, so model '" + model_id + "' (pool " + key +
          ") has no G2 share: start kvtier serve with service.max_pools "
          "set to the number of models and layouts it serves (a tensor-parallel engine needs "
          "one per rank; g2.capacity_bytes is split evenly among them)");
    }
  }
  {
    std::lock_guard lock(closing->sub_mu);
    listeners = closing->subscribers;
  }
  // Its events connections end with it (their readers unsubscribe and finish).
  for (auto& c : listeners) ::shutdown(c->fd.get(), SHUT_RDWR);
  // Its memory goes before the new pool's is made: wait (bounded) for the connections that
  // still hold it to end.
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (closing.use_count() > 1 && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  KVTIER_LOG(kInfo) << "kvtier serve: pool " << closing->key
                    << " has no engine attached; closed to make room for " << key
                    << (closing->impl->g3_enabled() ? " (its G2 is flushed to G3)" : "");
  closing.reset();  // flushes G2 to G3 when configured, writes G3's snapshot
  return Status::Ok();
}

void Server::State::Subscribe(Pool* pool, const std::shared_ptr<Conn>& conn) {
  conn->pool = pool;
  bool first = false;
  {
    std::lock_guard lock(pool->sub_mu);
    pool->subscribers.push_back(conn);
    first = !pool->subscribed;
    pool->subscribed = true;
  }
  if (!first) return;
  // One subscription per pool, fanned out to every events connection. The first connection
  // also hears the blocks G3 recovered at start-up (SubscribeEvents gives them to the first).
  pool->impl->SubscribeEvents([pool](std::span<const KvEvent> events) {
    std::vector<std::shared_ptr<Conn>> subs;
    {
      std::lock_guard lock(pool->sub_mu);
      subs = pool->subscribers;
    }
    if (subs.empty() || events.empty()) return;
    for (size_t at = 0; at < events.size();) {
      std::span<const KvEvent> part = events.subspan(at, EventsInFrame(events.subspan(at)));
      at += part.size();
      for (auto& c : subs) {
        {
          std::lock_guard lock(c->out_mu);
          if (c->closing) continue;
          if (c->out.size() >= kMaxQueuedEventFrames) {
            c->dropped += part.size();
            continue;
          }
          WireWriter w;
          EncodeEvents(&w, c->dropped, part);
          c->dropped = 0;
          c->out.emplace_back(MsgType::kEvents, w.Take());
        }
        c->out_cv.notify_one();
      }
    }
  });
}

void Server::State::Unsubscribe(const std::shared_ptr<Conn>& conn) {
  if (conn->pool == nullptr) return;
  std::lock_guard lock(conn->pool->sub_mu);
  auto& subs = conn->pool->subscribers;
  subs.erase(std::remove(subs.begin(), subs.end(), conn), subs.end());
}

Result<Instance*> Server::State::JoinInstance(const Hello& hello, Pool* pool) {
  auto current = pools.find(pool->key);
  if (current == pools.end() || current->second.get() != pool) {
    // Closed (MakeRoomForPool) between GetPool and here: the engine attaches again.
    return Status::Unavailable("the pool for model '" + hello.model_id +
                               "' closed while this engine attached; attach again");
  }
  auto named = by_name.find(hello.instance_name);
  if (named != by_name.end()) {
    Instance* inst = instances.at(named->second).get();
    if (inst->pool != pool) {
      return Status::InvalidArgument("instance '" + hello.instance_name +
                                     "' is attached with another model or layout (" +
                                     inst->pool->key + "); give each engine its own name");
    }
    ++inst->connections;
    return inst;
  }
  // The lowest number neither live nor still holding requests from its last life.
  for (uint32_t id = 1; id <= kMaxInstances; ++id) {
    if (instances.count(id) != 0) continue;
    auto old = ended.find(id);
    if (old != ended.end()) {
      if (old->second->impl->InstanceRequests(id) != 0) continue;
      old->second->impl->AdoptInstance(id);
      ended.erase(old);
    }
    auto inst = std::make_unique<Instance>();
    inst->id = id;
    inst->serial = ++next_serial;
    inst->name = hello.instance_name;
    inst->pool = pool;
    inst->connections = 1;
    Instance* raw = inst.get();
    instances[id] = std::move(inst);
    by_name[hello.instance_name] = id;
    return raw;
  }
  return Status::ResourceExhausted("kvtier serve has " + std::to_string(kMaxInstances) +
                                   " engine instances attached; no more can attach");
}

Result<std::shared_ptr<Pool>> Server::State::JoinLookup(Conn* conn, const Hello& hello) {
  // A scheduler process joins an engine instance that is attached already, by its name.
  std::lock_guard lock(mu);
  auto named = by_name.find(hello.instance_name);
  if (named == by_name.end()) {
    return Status::NotFound("no engine instance named '" + hello.instance_name +
                            "' is attached to this kvtier serve; a lookup connection joins an "
                            "attached engine's instance (the engine attaches first)");
  }
  const Instance& joined = *instances.at(named->second);
  conn->instance = joined.id;
  conn->instance_serial = joined.serial;
  conn->role = Role::kLookup;
  auto it = pools.find(joined.pool->key);
  if (it == pools.end()) return Status::Unavailable("engine instance's pool is closing");
  return it->second;
}

Pool* Server::State::LookupPool(const Conn& conn) {
  auto it = instances.find(conn.instance);
  if (it == instances.end() || it->second->serial != conn.instance_serial) return nullptr;
  return it->second->pool;
}

void Server::State::LeaveInstance(const std::shared_ptr<Conn>& conn) {
  // A lookup or events connection never holds its instance up: the engine's own ones do.
  if (conn->role == Role::kLookup || conn->role == Role::kEvents) return;
  Pool* pool = nullptr;
  bool last = false;
  {
    std::lock_guard lock(mu);
    auto it = instances.find(conn->instance);
    if (it == instances.end()) return;
    Instance* inst = it->second.get();
    if (inst->data == conn) inst->data.reset();
    if (--inst->connections == 0) {
      last = true;
      pool = inst->pool;
      by_name.erase(inst->name);
      instances.erase(it);
      ended[conn->instance] = pool;
      ++stats.instances_ended;
    }
  }
  if (conn->role == Role::kData || last) {
    // Outside mu: failing batches runs the manager's callbacks, which may send copies.
    Pool* p = pool;
    if (p == nullptr) {
      std::lock_guard lock(mu);
      auto e = ended.find(conn->instance);
      if (e != ended.end()) p = e->second;
      auto i = instances.find(conn->instance);
      if (i != instances.end()) p = i->second->pool;
    }
    if (p != nullptr) {
      p->backend->FailInstance(conn->instance,
                               Status::Unavailable("the engine's data connection closed"));
    }
  }
  if (last) {
    size_t n = pool->impl->ForgetInstance(conn->instance);
    KVTIER_LOG(kInfo) << "kvtier serve: instance " << conn->instance << " ended (" << n
                      << " requests finished)";
  }
}

}  // namespace kvtier::service

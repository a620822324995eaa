// kvtier serve's pools (one per model and layout, within service.max_pools), the instances
// that join them, and the events connections that hear them (docs/service.md).
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>

#include "core/log.h"
#include "core/sha256.h"
#include "daemon/server_state.h"
#include "tier/host_arena.h"

namespace kvtier::daemon {
namespace server_internal {

std::string PoolIdentityText(const std::string& model_id, const KvLayout& layout) {
  char fields[160];
  std::snprintf(fields, sizeof(fields),
                "layers=%u planes=%u kv_heads=%u head_dim=%u tokens_per_block=%u dtype=%s",
                layout.num_layers, layout.num_planes, layout.num_kv_heads, layout.head_dim,
                layout.tokens_per_block, DTypeName(layout.dtype));
  // The id's length first: an id holding a newline cannot pass for another id and layout.
  return "kvtier pool identity 1\nmodel_id " + std::to_string(model_id.size()) + "\n" + model_id +
         "\n" + fields + "\n";
}

std::string PoolKey(const std::string& model_id, const KvLayout& layout) {
  const std::string identity = PoolIdentityText(model_id, layout);
  uint8_t digest[32];
  Sha256(identity.data(), identity.size(), digest);
  char hex[33];
  for (int i = 0; i < 16; ++i) std::snprintf(hex + 2 * i, 3, "%02x", digest[i]);
  // The tail of a path names the model better than its head (/srv/models/org/...).
  std::string safe;
  for (char c : model_id.substr(0, model_id.find('|'))) {
    safe += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.') ? c : '_';
  }
  if (safe.size() > 32) safe = safe.substr(safe.size() - 32);
  while (!safe.empty() && (safe[0] == '.' || safe[0] == '_')) safe.erase(0, 1);
  return (safe.empty() ? std::string("model") : safe) + "-" + hex;
}

bool SameIdentity(const Pool& pool, const std::string& model_id, const KvLayout& layout) {
  const KvLayout& l = pool.layout;
  return pool.model_id == model_id && l.num_layers == layout.num_layers &&
         l.num_planes == layout.num_planes && l.num_kv_heads == layout.num_kv_heads &&
         l.head_dim == layout.head_dim && l.tokens_per_block == layout.tokens_per_block &&
         l.dtype == layout.dtype;
}

}  // namespace server_internal

namespace {

// A pool's G3 directory records the whole identity it holds (IDENTITY, 0600): a directory
// that holds another identity's blocks (a name collision, a directory copied or renamed by
// hand) is refused, never read. Creates the directory (0700) and the file when missing.
Status CheckG3Identity(const std::string& dir, const std::string& identity) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IOError("cannot create G3 directory " + dir + ": " + ec.message());
  const std::string path = dir + "/IDENTITY";
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) {
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return Status::FromErrno(errno, "cannot create " + path);
    const ssize_t n = ::write(fd, identity.data(), identity.size());
    const int err = errno;
    ::fsync(fd);
    ::close(fd);
    if (n != static_cast<ssize_t>(identity.size())) {
      ::unlink(path.c_str());
      return Status::FromErrno(err, "cannot write " + path);
    }
    return Status::Ok();
  }
  if (fd < 0) return Status::FromErrno(errno, "cannot open " + path + " (a symlink is refused)");
  std::string have;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0 && have.size() <= identity.size()) {
    have.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  if (have != identity) {
    return Status::FailedPrecondition(
        "G3 directory " + dir +
        " holds the blocks of another model or layout (its IDENTITY "
        "file differs from this engine's); kvtier serve will not read them: move the directory "
        "away or point g3.dir elsewhere");
  }
  return Status::Ok();
}

}  // namespace

Result<std::shared_ptr<Pool>> Server::State::GetPool(const proto::Hello& hello) {
  const std::string key = PoolKey(hello.model_id, hello.layout);
  // The key names the pool; the whole identity decides (a key is a hash: never trusted alone).
  auto found = [&]() REQUIRES(mu) -> Result<std::shared_ptr<Pool>> {
    auto it = pools.find(key);
    if (it == pools.end()) return std::shared_ptr<Pool>();
    if (!SameIdentity(*it->second, hello.model_id, hello.layout)) {
      return Status::FailedPrecondition(
          "kvtier serve: model '" + hello.model_id + "' (" + hello.layout.ToString() +
          ") has the pool name " + key + " of model '" + it->second->model_id + "' (" +
          it->second->layout.ToString() + "); refused rather than mixed: rename the model");
    }
    return it->second;
  };
  {
    MutexLock lock(&mu);
    KVTIER_ASSIGN_OR_RETURN(std::shared_ptr<Pool> pool, found());
    if (pool != nullptr) return pool;
  }
  // Made outside mu (pre-faulting G2 and recovering G3 take a while), one at a time (two
  // Hellos racing for one new pool must not both open its G3).
  MutexLock creating(&pool_create_mu);
  {
    MutexLock lock(&mu);
    KVTIER_ASSIGN_OR_RETURN(std::shared_ptr<Pool> pool, found());
    if (pool != nullptr) return pool;
  }
  KVTIER_RETURN_IF_ERROR(MakeRoomForPool(key, hello.model_id));
  auto pool = std::make_shared<Pool>();
  pool->key = key;
  pool->model_id = hello.model_id;
  pool->layout = hello.layout;
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
    KVTIER_RETURN_IF_ERROR(CheckG3Identity(dir, PoolIdentityText(hello.model_id, hello.layout)));
  }
  bool first;
  {
    MutexLock lock(&mu);
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
        [this](uint32_t instance, const proto::CopyCall& call) { return SendCopy(instance, call); },
        lease, num_layers);
    backend->SetFetchSender([this](uint32_t instance, const proto::FetchCall& call) {
      return SendFetch(instance, call);
    });
    raw->backend = backend.get();
    return std::unique_ptr<DeviceCopyBackend>(std::move(backend));
  };
  KVTIER_ASSIGN_OR_RETURN(pool->manager, SharedManager::Create(mo, factory));
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
  KVTIER_RETURN_IF_ERROR(pool->manager->RegisterDeviceMemory(g1));
  const HostArena* arena = pool->manager->g2_arena();
  pool->memfd = arena->shared_fd();
  pool->g2_capacity = mo.config.GetBytes("g2.capacity_bytes");
  pool->g2_slot_bytes = arena->slot_bytes();
  if (mo.config.GetString("g4.backend") == "redis" && mo.config.GetBool("g4.direct_to_g1") &&
      pool->manager->HasG4()) {
    proto::G4Config offer;
    offer.endpoints = mo.config.GetString("g4.endpoints");
    offer.cluster = mo.config.GetBool("g4.cluster");
    offer.username = mo.config.GetString("g4.username");
    offer.password = mo.config.GetString("g4.password");
    offer.connections = static_cast<uint32_t>(mo.config.GetUint("g4.threads"));
    offer.pipeline_bytes = mo.config.GetUint("g4.redis_pipeline_kib") << 10;
    pool->g4_offer = offer;
  }
  MutexLock lock(&mu);
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
    if (p == pool && p->manager->ForEngine(id).Requests() != 0) return false;
  }
  return true;
}

Status Server::State::MakeRoomForPool(const std::string& key, const std::string& model_id) {
  std::shared_ptr<Pool> closing;
  std::vector<std::shared_ptr<Conn>> listeners;
  {
    MutexLock lock(&mu);
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
    MutexLock lock(&closing->sub_mu);
    listeners = closing->subscribers;
  }
  {
    // And the lookup connections of its ended instances, which would hold its G2 share and
    // its G3 directory's LOCK for as long as their scheduler keeps them open.
    MutexLock lock(&mu);
    for (const auto& c : conns) {
      if (c->role == proto::Role::kLookup && c->pool == closing.get()) listeners.push_back(c);
    }
  }
  // Its events and lookup connections end with it (their readers unsubscribe and finish).
  for (auto& c : listeners) ::shutdown(c->fd.get(), SHUT_RDWR);
  // Its memory goes before the new pool's is made: wait (bounded) for the connections that
  // still hold it to end.
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (closing.use_count() > 1 && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  KVTIER_LOG(kInfo) << "kvtier serve: pool " << closing->key
                    << " has no engine attached; closed to make room for " << key
                    << (closing->manager->g3_enabled() ? " (its G2 is flushed to G3)" : "");
  closing.reset();  // flushes G2 to G3 when configured, writes G3's snapshot
  return Status::Ok();
}

void Server::State::Subscribe(Pool* pool, const std::shared_ptr<Conn>& conn) {
  conn->pool = pool;
  bool first = false;
  {
    MutexLock lock(&pool->sub_mu);
    pool->subscribers.push_back(conn);
    first = !pool->subscribed;
    pool->subscribed = true;
  }
  if (!first) return;
  // One subscription per pool, fanned out to every events connection. The first connection
  // also hears the blocks G3 recovered at start-up (SubscribeEvents gives them to the first).
  pool->manager->SubscribeEvents([pool](std::span<const KvEvent> events) {
    std::vector<std::shared_ptr<Conn>> subs;
    {
      MutexLock lock(&pool->sub_mu);
      subs = pool->subscribers;
    }
    if (subs.empty() || events.empty()) return;
    for (size_t at = 0; at < events.size();) {
      std::span<const KvEvent> part = events.subspan(at, proto::EventsInFrame(events.subspan(at)));
      at += part.size();
      for (auto& c : subs) {
        {
          MutexLock lock(&c->out_mu);
          if (c->closing) continue;
          if (c->out.size() >= kMaxQueuedEventFrames) {
            c->dropped += part.size();
            continue;
          }
          proto::WireWriter w;
          proto::EncodeEvents(&w, c->dropped, part);
          c->dropped = 0;
          c->out.emplace_back(proto::MsgType::kEvents, w.Take());
        }
        c->out_cv.notify_one();
      }
    }
  });
}

void Server::State::Unsubscribe(const std::shared_ptr<Conn>& conn) {
  if (conn->pool == nullptr) return;
  MutexLock lock(&conn->pool->sub_mu);
  auto& subs = conn->pool->subscribers;
  subs.erase(std::remove(subs.begin(), subs.end(), conn), subs.end());
}

Result<Instance*> Server::State::JoinInstance(const proto::Hello& hello, Pool* pool,
                                              const proto::PeerCred& peer) {
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
    if ((inst->owner.pid != peer.pid || inst->owner.uid != peer.uid) && inst->owner.pid > 0 &&
        ::kill(inst->owner.pid, 0) != 0 && errno == ESRCH) {
      // The engine that held the name is gone (a restart under the same name); its
      // connections end in a moment, and with them its instance.
      return Status::Unavailable("instance '" + hello.instance_name +
                                 "' is still ending its last life (pid " +
                                 std::to_string(inst->owner.pid) + " exited); attach again");
    }
    if (inst->owner.pid != peer.pid || inst->owner.uid != peer.uid) {
      // Two engines under one name would share one instance: the second's loads would run
      // in the first one's G1, its saves would be refused (one data connection an instance).
      return Status::FailedPrecondition(
          "instance name '" + hello.instance_name + "' is in use by another engine process (pid " +
          std::to_string(inst->owner.pid) + ", uid " + std::to_string(inst->owner.uid) +
          ") attached to this kvtier serve; this process is pid " + std::to_string(peer.pid) +
          ": give each engine its own service.instance (a config copied to two replicas names "
          "both the same)");
    }
    ++inst->connections;
    return inst;
  }
  // The lowest number neither live nor still holding requests from its last life.
  for (uint32_t id = 1; id <= proto::kMaxInstances; ++id) {
    if (instances.count(id) != 0 || leaving.count(id) != 0) continue;
    auto old = ended.find(id);
    if (old != ended.end()) {
      if (old->second->manager->ForEngine(id).Requests() != 0) continue;
      old->second->manager->ForEngine(id).Adopt();
      ended.erase(old);
    }
    auto inst = std::make_unique<Instance>();
    inst->id = id;
    inst->serial = ++next_serial;
    inst->name = hello.instance_name;
    inst->pool = pool;
    inst->connections = 1;
    inst->owner = peer;
    Instance* raw = inst.get();
    instances[id] = std::move(inst);
    by_name[hello.instance_name] = id;
    return raw;
  }
  return Status::ResourceExhausted("kvtier serve has " + std::to_string(proto::kMaxInstances) +
                                   " engine instances attached; no more can attach");
}

Result<std::shared_ptr<Pool>> Server::State::JoinLookup(Conn* conn, const proto::Hello& hello,
                                                        const proto::PeerCred& peer) {
  // A scheduler process joins an engine instance that is attached already, by its name.
  MutexLock lock(&mu);
  auto named = by_name.find(hello.instance_name);
  if (named == by_name.end()) {
    return Status::NotFound("no engine instance named '" + hello.instance_name +
                            "' is attached to this kvtier serve; a lookup connection joins an "
                            "attached engine's instance (the engine attaches first)");
  }
  const Instance& joined = *instances.at(named->second);
  if (joined.owner.uid != peer.uid) {
    return Status::FailedPrecondition("engine instance '" + hello.instance_name + "' runs as uid " +
                                      std::to_string(joined.owner.uid) +
                                      "; a lookup connection of uid " + std::to_string(peer.uid) +
                                      " may not join it (run the scheduler as the engine's uid)");
  }
  conn->instance = joined.id;
  conn->instance_serial = joined.serial;
  conn->role = proto::Role::kLookup;
  conn->pool = joined.pool;  // so a pool closed to make room ends it (MakeRoomForPool)
  auto it = pools.find(joined.pool->key);
  if (it == pools.end()) return Status::Unavailable("engine instance's pool is closing");
  return it->second;
}

Result<std::shared_ptr<Pool>> Server::State::JoinEvents(const proto::Hello& hello,
                                                        const proto::PeerCred& peer) {
  KVTIER_ASSIGN_OR_RETURN(std::shared_ptr<Pool> pool, GetPool(hello));
  if (peer.uid == ::geteuid()) return pool;
  MutexLock lock(&mu);
  for (const auto& [id, inst] : instances) {
    if (inst->pool == pool.get() && inst->owner.uid == peer.uid) return pool;
  }
  return Status::FailedPrecondition("an events connection of uid " + std::to_string(peer.uid) +
                                    " hears the KV events of "
                                    "model '" +
                                    hello.model_id +
                                    "' only while an engine of that uid is attached with it");
}

Pool* Server::State::LookupPool(const Conn& conn) {
  auto it = instances.find(conn.instance);
  if (it == instances.end() || it->second->serial != conn.instance_serial) return nullptr;
  return it->second->pool;
}

void Server::State::LeaveInstance(const std::shared_ptr<Conn>& conn) {
  // A lookup or events connection never holds its instance up: the engine's own ones do.
  if (conn->role == proto::Role::kLookup || conn->role == proto::Role::kEvents) return;
  Pool* pool = nullptr;
  bool last = false;
  {
    MutexLock lock(&mu);
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
      leaving.insert(conn->instance);
      ++stats.instances_ended;
    }
  }
  if (conn->role == proto::Role::kData || last) {
    // Outside mu: failing batches runs the manager's callbacks, which may send copies.
    Pool* p = pool;
    if (p == nullptr) {
      MutexLock lock(&mu);
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
    size_t n = pool->manager->ForEngine(conn->instance).Forget();
    KVTIER_LOG(kInfo) << "kvtier serve: instance " << conn->instance << " ended (" << n
                      << " requests finished)";
    MutexLock lock(&mu);
    leaving.erase(conn->instance);  // its number may now be reused
  }
}

}  // namespace kvtier::daemon

#include "service/server.h"

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "core/log.h"
#include "core/unique_fd.h"
#include "manager/block_manager_impl.h"
#include "service/protocol.h"
#include "service/remote_g1_backend.h"
#include "service/unix_socket.h"

namespace kvtier::service {
namespace {

using Clock = std::chrono::steady_clock;

struct Pool {
  std::string key;
  std::unique_ptr<BlockManager::Impl> impl;
  RemoteG1Backend* backend = nullptr;  // owned by impl's transfer engine
  uint64_t g2_capacity = 0;
  uint64_t g2_slot_bytes = 0;
  int memfd = -1;  // owned by impl's arena
};

struct Conn {
  UniqueFd fd;
  Role role = Role::kCall;
  uint32_t instance = 0;
  uint64_t instance_serial = 0;  // lookup connections: the Instance they joined (ids are reused)
  std::thread reader;
  std::thread writer;  // data connections
  std::atomic<bool> done{false};
  std::mutex out_mu;
  std::condition_variable out_cv;
  std::deque<std::vector<uint8_t>> out;  // kCopy payloads to send
  bool closing = false;
};

struct Instance {
  uint32_t id = 0;
  uint64_t serial = 0;  // unique per daemon run (an id is reused once its requests are gone)
  std::string name;
  Pool* pool = nullptr;
  int connections = 0;
  std::shared_ptr<Conn> data;
  uint32_t g1_blocks = kMaxG1Blocks;  // RegisterG1's count bounds the block ids it may name
};

std::string PoolKey(const std::string& model_id, const KvLayout& layout) {
  char fp[17];
  std::snprintf(fp, sizeof(fp), "%016llx", static_cast<unsigned long long>(layout.Fingerprint()));
  std::string safe;
  for (char c : model_id)
    safe += (std::isalnum(static_cast<unsigned char>(c)) || c == '-') ? c : '_';
  return (safe.empty() ? std::string("model") : safe.substr(0, 64)) + "-" + fp;
}

std::string Rid(uint32_t instance, const std::string& id) {
  return std::to_string(instance) + "/" + id;
}

// Strips "N/" from the ids of `instance`.
std::vector<std::string> StripRids(uint32_t instance, std::vector<std::string> ids) {
  const std::string prefix = std::to_string(instance) + "/";
  for (std::string& id : ids) {
    if (id.compare(0, prefix.size(), prefix) == 0) id.erase(0, prefix.size());
  }
  return ids;
}

Result<std::vector<gid_t>> ParseGids(const std::string& text) {
  std::vector<gid_t> gids;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(pos, comma - pos);
    char* end = nullptr;
    unsigned long v = std::strtoul(item.c_str(), &end, 10);
    if (item.empty() || end == nullptr || *end != '\0' || v > 0xfffffffful) {
      return Status::InvalidArgument("service.allowed_gids: '" + item +
                                     "' is not a group id; give comma-separated numbers");
    }
    gids.push_back(static_cast<gid_t>(v));
    pos = comma + 1;
  }
  return gids;
}

}  // namespace

class Server::State {
 public:
  ServeOptions options;
  std::string socket_path;
  std::vector<gid_t> allowed_gids;
  std::chrono::milliseconds lease{5000};
  uint64_t epoch = 0;
  UniqueFd listen_fd;
  std::thread acceptor;
  std::atomic<bool> stopping{false};

  std::mutex pool_create_mu;  // held while a pool is made
  mutable std::mutex mu;
  std::map<std::string, std::unique_ptr<Pool>> pools;       // by PoolKey
  std::map<uint32_t, std::unique_ptr<Instance>> instances;  // live, by id
  std::map<std::string, uint32_t> by_name;
  std::map<uint32_t, Pool*> ended;  // ended ids whose requests may still be tracked
  uint64_t next_serial = 0;
  std::list<std::shared_ptr<Conn>> conns;
  ServerStats stats;

  void AcceptLoop();
  void Serve(const std::shared_ptr<Conn>& conn);
  void WriterLoop(const std::shared_ptr<Conn>& conn);
  Result<Pool*> GetPool(const Hello& hello);
  Result<Instance*> JoinInstance(const Hello& hello, Pool* pool);  // REQUIRES: mu held
  // Role::kLookup: the live instance named in the Hello; NotFound when there is none.
  Result<Pool*> JoinLookup(Conn* conn, const Hello& hello);
  // A lookup connection's instance, when it is still the live one it joined.
  Pool* LookupPool(const Conn& conn);  // REQUIRES: mu held
  void LeaveInstance(const std::shared_ptr<Conn>& conn);
  Status SendCopy(uint32_t instance, const CopyCall& call);
  Status HandleCall(uint32_t instance, Pool* pool, const Frame& frame, WireWriter* out);
  void ReapDone();
};

Result<std::unique_ptr<Server>> Server::Start(const ServeOptions& options) {
  auto state = std::make_unique<State>();
  state->options = options;
  state->socket_path = options.socket_path.empty() ? options.config.GetString("service.socket")
                                                   : options.socket_path;
  if (state->socket_path.empty()) {
    return Status::InvalidArgument(
        "kvtier serve needs a socket path: set service.socket (or pass --socket PATH)");
  }
  KVTIER_ASSIGN_OR_RETURN(state->allowed_gids,
                          ParseGids(options.config.GetString("service.allowed_gids")));
  state->lease = std::chrono::milliseconds(options.config.GetUint("service.lease_ms"));
  std::random_device rd;
  state->epoch = (uint64_t{rd()} << 32) ^ rd() ^ static_cast<uint64_t>(::getpid());
  KVTIER_ASSIGN_OR_RETURN(state->listen_fd, ListenUnix(state->socket_path));
  State* s = state.get();
  state->acceptor = std::thread([s] { s->AcceptLoop(); });
  KVTIER_LOG(kInfo) << "kvtier serve: listening on " << state->socket_path << " (lease "
                    << state->lease.count() << " ms)";
  return std::unique_ptr<Server>(new Server(std::move(state)));
}

Server::Server(std::unique_ptr<State> state) : state_(std::move(state)) {}

Server::~Server() {
  Stop();
  // Pools last: their managers finish their transfers (every engine is gone, so copies fail
  // at once) and G3 writes its snapshot.
  std::map<std::string, std::unique_ptr<Pool>> pools;
  {
    std::lock_guard lock(state_->mu);
    pools.swap(state_->pools);
  }
  pools.clear();
}

void Server::Stop() {
  State& s = *state_;
  if (s.stopping.exchange(true)) return;
  if (s.acceptor.joinable()) s.acceptor.join();
  std::list<std::shared_ptr<Conn>> conns;
  {
    std::lock_guard lock(s.mu);
    conns = s.conns;
  }
  for (auto& c : conns) {
    ::shutdown(c->fd.get(), SHUT_RDWR);
    {
      std::lock_guard lock(c->out_mu);
      c->closing = true;
    }
    c->out_cv.notify_all();
  }
  for (auto& c : conns) {
    if (c->reader.joinable()) c->reader.join();
    if (c->writer.joinable()) c->writer.join();
  }
  std::lock_guard lock(s.mu);
  s.conns.clear();
  ::unlink(s.socket_path.c_str());
}

ServerStats Server::Stats() const {
  std::lock_guard lock(state_->mu);
  ServerStats out = state_->stats;
  out.instances_live = state_->instances.size();
  out.pools = state_->pools.size();
  for (auto& [key, pool] : state_->pools) {
    RemoteG1Backend::Stats b = pool->backend->stats();
    out.lease_expired += b.lease_expired;
    out.copy_batches += b.batches;
  }
  return out;
}

const std::string& Server::socket_path() const { return state_->socket_path; }

void Server::State::ReapDone() {
  std::list<std::shared_ptr<Conn>> done;
  {
    std::lock_guard lock(mu);
    for (auto it = conns.begin(); it != conns.end();) {
      if ((*it)->done.load()) {
        done.push_back(*it);
        it = conns.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : done) {
    if (c->reader.joinable()) c->reader.join();
    if (c->writer.joinable()) c->writer.join();
  }
}

void Server::State::AcceptLoop() {
  while (!stopping.load()) {
    Result<UniqueFd> fd = AcceptUnix(listen_fd.get(), 100);
    ReapDone();
    if (!fd.ok()) {
      if (fd.status().code() != StatusCode::kTimedOut) {
        KVTIER_LOG(kWarn) << "kvtier serve: accept: " << fd.status().ToString();
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      continue;
    }
    auto conn = std::make_shared<Conn>();
    conn->fd = std::move(*fd);
    std::lock_guard lock(mu);
    ++stats.connections;
    conns.push_back(conn);
    conn->reader = std::thread([this, conn] { Serve(conn); });
  }
}

Result<Pool*> Server::State::GetPool(const Hello& hello) {
  const std::string key = PoolKey(hello.model_id, hello.layout);
  {
    std::lock_guard lock(mu);
    auto it = pools.find(key);
    if (it != pools.end()) return it->second.get();
  }
  // Made outside mu (pre-faulting G2 and recovering G3 take a while), one at a time (two
  // Hellos racing for one new pool must not both open its G3).
  std::lock_guard creating(pool_create_mu);
  {
    std::lock_guard lock(mu);
    auto it = pools.find(key);
    if (it != pools.end()) return it->second.get();
  }
  auto pool = std::make_unique<Pool>();
  pool->key = key;
  ManagerOptions mo;
  mo.layout = hello.layout;
  mo.model_id = hello.model_id;
  mo.config = options.config;
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
  std::lock_guard lock(mu);
  auto [it, inserted] = pools.emplace(key, std::move(pool));
  if (inserted) {
    KVTIER_LOG(kInfo) << "kvtier serve: pool " << key << " (" << hello.layout.ToString() << ", "
                      << arena->num_slots() << " G2 slots)";
  }
  return it->second.get();
}

Result<Instance*> Server::State::JoinInstance(const Hello& hello, Pool* pool) {
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

Result<Pool*> Server::State::JoinLookup(Conn* conn, const Hello& hello) {
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
  return joined.pool;
}

Pool* Server::State::LookupPool(const Conn& conn) {
  auto it = instances.find(conn.instance);
  if (it == instances.end() || it->second->serial != conn.instance_serial) return nullptr;
  return it->second->pool;
}

void Server::State::LeaveInstance(const std::shared_ptr<Conn>& conn) {
  // A lookup connection never holds its instance up: the engine's own connections do.
  if (conn->role == Role::kLookup) return;
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

Status Server::State::SendCopy(uint32_t instance, const CopyCall& call) {
  std::shared_ptr<Conn> data;
  {
    std::lock_guard lock(mu);
    auto it = instances.find(instance);
    if (it != instances.end()) data = it->second->data;
  }
  if (data == nullptr) {
    return Status::Unavailable("engine instance " + std::to_string(instance) +
                               " has no data connection");
  }
  WireWriter w;
  EncodeCopy(&w, call);
  {
    std::lock_guard lock(data->out_mu);
    if (data->closing) return Status::Unavailable("the engine's data connection is closing");
    data->out.push_back(w.Take());
  }
  data->out_cv.notify_one();
  return Status::Ok();
}

void Server::State::WriterLoop(const std::shared_ptr<Conn>& conn) {
  uint64_t seq = 0;
  for (;;) {
    std::vector<uint8_t> payload;
    {
      std::unique_lock lock(conn->out_mu);
      conn->out_cv.wait(lock, [&] { return conn->closing || !conn->out.empty(); });
      if (conn->closing) return;
      payload = std::move(conn->out.front());
      conn->out.pop_front();
    }
    Status sent = SendFrame(conn->fd.get(), static_cast<uint16_t>(MsgType::kCopy), ++seq, payload,
                            -1, Clock::now() + lease);
    if (!sent.ok()) {
      // A stuck or dead engine: end the connection; its reader fails what it held.
      KVTIER_LOG(kWarn) << "kvtier serve: instance " << conn->instance
                        << " data connection: " << sent.ToString();
      ::shutdown(conn->fd.get(), SHUT_RDWR);
      return;
    }
  }
}

void Server::State::Serve(const std::shared_ptr<Conn>& conn) {
  const int fd = conn->fd.get();
  auto finish = [&] { conn->done.store(true); };
  Result<PeerCred> cred = GetPeerCred(fd);
  Status allowed = cred.ok() ? AuthorizePeer(*cred, allowed_gids) : cred.status();
  Result<Frame> first = RecvFrame(fd, Clock::now() + std::chrono::seconds(5));
  auto refuse = [&](const Status& why, uint64_t seq) {
    WireWriter w;
    EncodeStatus(&w, why);
    (void)SendFrame(fd, static_cast<uint16_t>(MsgType::kReply), seq, w.data(), -1,
                    Clock::now() + std::chrono::seconds(1));
    std::lock_guard lock(mu);
    ++stats.refused;
  };
  if (!first.ok()) {
    finish();
    return;
  }
  if (!allowed.ok()) {
    KVTIER_LOG(kWarn) << "kvtier serve: refused a peer: " << allowed.ToString();
    refuse(allowed, first->header.seq);
    finish();
    return;
  }
  Hello hello;
  WireReader hr(first->payload);
  Status decoded = first->header.type == static_cast<uint16_t>(MsgType::kHello)
                       ? DecodeHello(&hr, &hello)
                       : Status::InvalidArgument(
                             "service protocol: the first frame must be "
                             "Hello, not " +
                             std::string(MsgTypeName(first->header.type)));
  if (decoded.ok() && hello.instance_name.empty()) {
    decoded = Status::InvalidArgument("service protocol: hello.instance_name is empty");
  }
  if (!decoded.ok()) {
    refuse(decoded, first->header.seq);
    finish();
    return;
  }
  Result<Pool*> pool = hello.role == Role::kLookup ? JoinLookup(conn.get(), hello) : GetPool(hello);
  if (!pool.ok()) {
    refuse(pool.status(), first->header.seq);
    finish();
    return;
  }
  Instance* inst = nullptr;
  if (hello.role != Role::kLookup) {
    std::lock_guard lock(mu);
    Result<Instance*> joined = JoinInstance(hello, *pool);
    if (joined.ok() && hello.role == Role::kData && (*joined)->data != nullptr) {
      --(*joined)->connections;
      joined = Status::FailedPrecondition("instance '" + hello.instance_name +
                                          "' has a data connection already (one G1 per instance)");
    }
    if (!joined.ok()) {
      ++stats.refused;
    } else {
      inst = *joined;
      conn->instance = inst->id;
      conn->role = hello.role;
      if (hello.role == Role::kData) inst->data = conn;
    }
    if (!joined.ok()) decoded = joined.status();
  }
  if (inst == nullptr && hello.role != Role::kLookup) {
    refuse(decoded, first->header.seq);
    finish();
    return;
  }
  {
    WireWriter w;
    EncodeStatus(&w, Status::Ok());
    HelloReply reply;
    reply.instance = conn->instance;
    reply.epoch = epoch;
    reply.lease_ms = static_cast<uint32_t>(lease.count());
    reply.g2_capacity_bytes = (*pool)->g2_capacity;
    reply.g2_slot_bytes = (*pool)->g2_slot_bytes;
    EncodeHelloReply(&w, reply);
    Status sent = SendFrame(fd, static_cast<uint16_t>(MsgType::kReply), first->header.seq, w.data(),
                            hello.role == Role::kData ? (*pool)->memfd : -1,
                            Clock::now() + std::chrono::seconds(5));
    if (!sent.ok()) {
      LeaveInstance(conn);
      finish();
      return;
    }
  }
  if (conn->role == Role::kData) {
    conn->writer = std::thread([this, conn] { WriterLoop(conn); });
  }
  const uint32_t instance = conn->instance;
  Pool* p = *pool;
  for (;;) {
    Result<Frame> frame = RecvFrame(fd, Clock::time_point::max());
    if (!frame.ok()) {
      if (frame.status().code() == StatusCode::kInvalidArgument) {
        KVTIER_LOG(kWarn) << "kvtier serve: instance " << instance
                          << " sent a bad frame: " << frame.status().ToString();
        std::lock_guard lock(mu);
        ++stats.bad_frames;
      }
      break;
    }
    if (conn->role == Role::kData) {
      WireReader r(frame->payload);
      uint64_t batch = 0;
      Status ok = r.U64("copy.batch", &batch);
      if (ok.ok() && frame->header.type == static_cast<uint16_t>(MsgType::kCopyLayer)) {
        uint32_t layer = 0;
        ok = r.U32("copy.layer", &layer);
        if (ok.ok()) ok = r.Done();
        if (ok.ok()) p->backend->OnLayer(instance, batch, layer);
      } else if (ok.ok() && frame->header.type == static_cast<uint16_t>(MsgType::kCopyDone)) {
        Status status;
        ok = DecodeStatus(&r, &status);
        if (ok.ok()) ok = r.Done();
        if (ok.ok()) p->backend->OnDone(instance, batch, status);
      } else if (ok.ok()) {
        ok = Status::InvalidArgument(std::string("service protocol: a data connection cannot "
                                                 "carry ") +
                                     MsgTypeName(frame->header.type));
      }
      if (!ok.ok()) {
        KVTIER_LOG(kWarn) << "kvtier serve: instance " << instance << ": " << ok.ToString();
        std::lock_guard lock(mu);
        ++stats.bad_frames;
        break;
      }
      continue;
    }
    WireWriter out;
    Status handled;
    if (conn->role == Role::kLookup) {
      const auto type = static_cast<MsgType>(frame->header.type);
      bool live;
      {
        std::lock_guard lock(mu);
        live = LookupPool(*conn) != nullptr;
      }
      if (type != MsgType::kLookup && type != MsgType::kStats) {
        handled = Status::InvalidArgument(std::string("service protocol: a lookup connection "
                                                      "carries Lookup and Stats only, not ") +
                                          MsgTypeName(frame->header.type));
      } else if (!live) {
        // The engine's instance ended (its process is gone): answer, then end; the client
        // joins again by name once the engine is back.
        EncodeStatus(
            &out, Status::Unavailable("engine instance '" + std::to_string(instance) + "' ended"));
        (void)SendFrame(fd, static_cast<uint16_t>(MsgType::kReply), frame->header.seq, out.data(),
                        -1, Clock::now() + std::chrono::seconds(1));
        break;
      } else {
        handled = HandleCall(instance, p, *frame, &out);
      }
    } else {
      handled = HandleCall(instance, p, *frame, &out);
    }
    if (handled.code() == StatusCode::kInvalidArgument &&
        handled.message().rfind("service protocol:", 0) == 0) {
      // A frame that does not decode: answer once, then end the connection (the stream may be
      // out of step).
      WireWriter w;
      EncodeStatus(&w, handled);
      (void)SendFrame(fd, static_cast<uint16_t>(MsgType::kReply), frame->header.seq, w.data(), -1,
                      Clock::now() + std::chrono::seconds(1));
      std::lock_guard lock(mu);
      ++stats.bad_frames;
      break;
    }
    Status sent = SendFrame(fd, static_cast<uint16_t>(MsgType::kReply), frame->header.seq,
                            out.data(), -1, Clock::now() + std::chrono::seconds(5));
    if (!sent.ok()) break;
  }
  if (conn->role == Role::kData) {
    {
      std::lock_guard lock(conn->out_mu);
      conn->closing = true;
    }
    conn->out_cv.notify_all();
  }
  LeaveInstance(conn);
  finish();
}

// Decodes and runs one call; writes the reply (status first). A decode error is returned (and
// nothing written); a call's own error is written into the reply and Ok returned.
Status Server::State::HandleCall(uint32_t instance, Pool* pool, const Frame& frame,
                                 WireWriter* out) {
  BlockManager::Impl& impl = *pool->impl;
  WireReader r(frame.payload);
  uint32_t g1_limit = kMaxG1Blocks;
  {
    std::lock_guard lock(mu);
    auto it = instances.find(instance);
    if (it != instances.end()) g1_limit = it->second->g1_blocks;
  }
  auto map_blocks = [&](std::vector<uint32_t>* ids) -> Status {
    for (uint32_t& id : *ids) {
      if (id >= g1_limit) {
        return Status::InvalidArgument("G1 block id " + std::to_string(id) +
                                       " is past the engine's " + std::to_string(g1_limit) +
                                       " blocks");
      }
      id |= instance << kInstanceShift;
    }
    return Status::Ok();
  };
  switch (static_cast<MsgType>(frame.header.type)) {
    case MsgType::kLookup: {
      LookupCall m;
      KVTIER_RETURN_IF_ERROR(DecodeLookup(&r, &m));
      RequestSpec spec;
      spec.request_id = m.request_id.empty() ? std::string() : Rid(instance, m.request_id);
      spec.prompt = m.prompt;
      spec.cache_salt = m.cache_salt;
      spec.adapter_id = m.adapter_id;
      spec.block_extra = std::move(m.block_extra);
      spec.load_tiers = m.load_tiers;
      spec.store_tiers = m.store_tiers;
      Result<LookupResult> res = impl.Lookup(spec, m.num_computed_tokens, instance);
      EncodeStatus(out, res.status());
      if (res.ok()) EncodeLookupResult(out, *res);
      return Status::Ok();
    }
    case MsgType::kPrepareLoad: {
      PrepareLoadCall m;
      KVTIER_RETURN_IF_ERROR(DecodePrepareLoad(&r, &m));
      Status mapped = map_blocks(&m.g1_block_ids);
      Result<uint32_t> res = mapped.ok()
                                 ? impl.PrepareLoad(Rid(instance, m.request_id), m.g1_block_ids,
                                                    m.num_external_tokens, m.async_load)
                                 : Result<uint32_t>(mapped);
      EncodeStatus(out, res.status());
      if (res.ok()) out->U32(*res);
      return Status::Ok();
    }
    case MsgType::kCommit: {
      CommitCall m;
      KVTIER_RETURN_IF_ERROR(DecodeCommit(&r, &m));
      Status mapped = map_blocks(&m.g1_block_ids);
      EncodeStatus(out, mapped.ok()
                            ? impl.Commit(Rid(instance, m.request_id), m.tokens, m.g1_block_ids)
                            : mapped);
      return Status::Ok();
    }
    case MsgType::kRequestFinished: {
      std::string id;
      KVTIER_RETURN_IF_ERROR(DecodeRequestId(&r, &id));
      const bool kept = impl.RequestFinished(Rid(instance, id));
      EncodeStatus(out, Status::Ok());
      out->U8(kept ? 1 : 0);
      return Status::Ok();
    }
    case MsgType::kRegisterG1: {
      uint32_t blocks = 0;
      KVTIER_RETURN_IF_ERROR(r.U32("register_g1.num_blocks", &blocks));
      KVTIER_RETURN_IF_ERROR(r.Done());
      if (blocks == 0 || blocks > kMaxG1Blocks) {
        EncodeStatus(out, Status::InvalidArgument("an attached engine's G1 holds 1 to " +
                                                  std::to_string(kMaxG1Blocks) + " blocks, not " +
                                                  std::to_string(blocks)));
        return Status::Ok();
      }
      {
        std::lock_guard lock(mu);
        auto it = instances.find(instance);
        if (it != instances.end()) it->second->g1_blocks = blocks;
      }
      EncodeStatus(out, Status::Ok());
      return Status::Ok();
    }
    case MsgType::kStartLoad:
      KVTIER_RETURN_IF_ERROR(r.Done());
      EncodeStatus(out, impl.StartLoad(instance));
      return Status::Ok();
    case MsgType::kStartSave:
      KVTIER_RETURN_IF_ERROR(r.Done());
      EncodeStatus(out, impl.StartSave(instance));
      return Status::Ok();
    case MsgType::kWaitLayer: {
      uint32_t layer = 0;
      KVTIER_RETURN_IF_ERROR(r.U32("wait_layer.layer", &layer));
      KVTIER_RETURN_IF_ERROR(r.Done());
      EncodeStatus(out, impl.WaitLayer(layer, instance));
      return Status::Ok();
    }
    case MsgType::kLoadedTokens: {
      std::string id;
      KVTIER_RETURN_IF_ERROR(DecodeRequestId(&r, &id));
      const uint32_t n = impl.LoadedTokens(Rid(instance, id));
      EncodeStatus(out, Status::Ok());
      out->U32(n);
      return Status::Ok();
    }
    case MsgType::kWaitForSaves:
      KVTIER_RETURN_IF_ERROR(r.Done());
      impl.WaitForSaves();
      EncodeStatus(out, Status::Ok());
      return Status::Ok();
    case MsgType::kWaitForRequestSaves: {
      std::string id;
      KVTIER_RETURN_IF_ERROR(DecodeRequestId(&r, &id));
      impl.WaitForRequestSaves(Rid(instance, id));
      EncodeStatus(out, Status::Ok());
      return Status::Ok();
    }
    case MsgType::kFinished: {
      KVTIER_RETURN_IF_ERROR(r.Done());
      FinishedRequests f = impl.Finished(instance);
      f.saves_done = StripRids(instance, std::move(f.saves_done));
      f.loads_done = StripRids(instance, std::move(f.loads_done));
      EncodeStatus(out, Status::Ok());
      EncodeFinished(out, f);
      return Status::Ok();
    }
    case MsgType::kStats: {
      KVTIER_RETURN_IF_ERROR(r.Done());
      EncodeStatus(out, Status::Ok());
      EncodeStats(out, impl.Stats());
      return Status::Ok();
    }
    default:
      return Status::InvalidArgument(
          std::string("service protocol: ") + MsgTypeName(frame.header.type) + " (type " +
          std::to_string(frame.header.type) + ") is not a call a call connection carries");
  }
}

}  // namespace kvtier::service

#include "daemon/server.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <random>
#include <system_error>

#include "core/log.h"
#include "daemon/server_state.h"
#include "proto/load_trace.h"
#include "proto/service_options.h"
#include "tier/cond_wait.h"

namespace kvtier::daemon {

// The protocol's names this file uses most.
using proto::LoadTrace;
using proto::MsgType;
using proto::Role;
using proto::WireWriter;

Result<std::unique_ptr<Server>> Server::Start(const ServeOptions& options) {
  auto state = std::make_unique<State>();
  state->options = options;
  if (options.socket_path.empty() && !proto::ServiceSocketSet(options.config)) {
    return Status::InvalidArgument(
        "kvtier serve needs a socket path: set service.socket (or pass --socket PATH)");
  }
  KVTIER_ASSIGN_OR_RETURN(const proto::ServiceDaemonOptions service,
                          proto::ServiceDaemonOptions::FromConfig(options.config));
  state->socket_path = options.socket_path.empty() ? service.socket : options.socket_path;
  state->allowed_gids = service.allowed_gids;
  state->lease = std::chrono::milliseconds(service.lease_ms);
  state->max_pools = service.max_pools;
  state->max_connections = service.max_connections;
  state->g2_total = options.config.GetBytes("g2.capacity_bytes");
  std::random_device rd;
  state->epoch = (uint64_t{rd()} << 32) ^ rd() ^ static_cast<uint64_t>(::getpid());
  // With service.allowed_gids the socket and its directory belong to the first group, so its
  // members can reach them; the daemon still checks each peer (AuthorizePeer).
  KVTIER_ASSIGN_OR_RETURN(
      state->listen_fd, proto::ListenUnix(state->socket_path,
                                          state->allowed_gids.empty()
                                              ? std::nullopt
                                              : std::optional<gid_t>(state->allowed_gids.front())));
  State* s = state.get();
  state->acceptor = std::thread([s] { s->AcceptLoop(); });
  KVTIER_LOG(kInfo) << "kvtier serve: listening on " << state->socket_path << " (lease "
                    << state->lease.count() << " ms, G2 " << (state->g2_total >> 20) << " MiB for "
                    << state->max_pools << (state->max_pools == 1 ? " pool" : " pools") << ")";
  return std::unique_ptr<Server>(new Server(std::move(state)));
}

Server::Server(std::unique_ptr<State> state) : state_(std::move(state)) {}

Server::~Server() {
  Stop();
  // Pools last: their managers finish their transfers (every engine is gone, so copies fail
  // at once) and G3 writes its snapshot.
  std::map<std::string, std::shared_ptr<Pool>> pools;
  {
    MutexLock lock(&state_->mu);
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
    MutexLock lock(&s.mu);
    conns = s.conns;
  }
  for (auto& c : conns) {
    ::shutdown(c->fd.get(), SHUT_RDWR);
    {
      MutexLock lock(&c->out_mu);
      c->closing = true;
    }
    c->out_cv.notify_all();
  }
  for (auto& c : conns) {
    if (c->reader.joinable()) c->reader.join();
    if (c->writer.joinable()) c->writer.join();
  }
  MutexLock lock(&s.mu);
  s.conns.clear();
  ::unlink(s.socket_path.c_str());
}

ServerStats Server::Stats() const {
  MutexLock lock(&state_->mu);
  ServerStats out = state_->stats;
  out.instances_live = state_->instances.size();
  out.pools = state_->pools.size();
  for (auto& [key, pool] : state_->pools) {
    RemoteG1Backend::Stats b = pool->backend->stats();
    out.lease_expired += b.lease_expired;
    out.copy_batches += b.batches;
    MutexLock sub(&pool->sub_mu);
    out.event_subscribers += pool->subscribers.size();
  }
  return out;
}

const std::string& Server::socket_path() const { return state_->socket_path; }

void Server::State::ReapDone() {
  std::list<std::shared_ptr<Conn>> done;
  {
    MutexLock lock(&mu);
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

namespace {
// Answers a peer the daemon will not serve with `why` (seq 0: nothing of it was read), waiting
// at most a few milliseconds for room in its socket buffer.
void RefuseUnread(int fd, const Status& why) {
  WireWriter w;
  proto::EncodeStatus(&w, why);
  (void)proto::SendFrame(fd, static_cast<uint16_t>(MsgType::kReply), 0, w.data(), -1,
                         Clock::now() + std::chrono::milliseconds(20));
}
}  // namespace

void Server::State::AcceptLoop() {
  while (!stopping.load()) {
    Result<UniqueFd> fd = proto::AcceptUnix(listen_fd.get(), 100);
    ReapDone();
    if (!fd.ok()) {
      if (fd.status().code() != StatusCode::kTimedOut) {
        // EMFILE, ENFILE, ENOMEM: the connections that end free room; never the daemon's end.
        KVTIER_LOG(kWarn) << "kvtier serve: accept: " << fd.status().ToString();
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      continue;
    }
    // Who it is is known at accept (SO_PEERCRED): a peer that may not attach is refused here,
    // before a thread or a byte of it is taken.
    Result<proto::PeerCred> cred = proto::GetPeerCred(fd->get());
    Status allowed = cred.ok() ? proto::AuthorizePeer(*cred, allowed_gids) : cred.status();
    if (!allowed.ok()) {
      KVTIER_LOG(kWarn) << "kvtier serve: refused a peer: " << allowed.ToString();
      RefuseUnread(fd->get(), allowed);
      MutexLock lock(&mu);
      ++stats.refused;
      continue;
    }
    auto conn = std::make_shared<Conn>();
    conn->fd = std::move(*fd);
    conn->cred = std::move(*cred);
    MutexLock lock(&mu);
    ++stats.connections;
    if (conns.size() >= max_connections) {
      ++stats.refused_connections;
      if (stats.refused_connections == 1 || stats.refused_connections % 1000 == 0) {
        KVTIER_LOG(kWarn) << "kvtier serve: " << conns.size()
                          << " connections are open (service.max_connections); refused pid "
                          << conn->cred.pid << " (" << stats.refused_connections
                          << " refused so far)";
      }
      RefuseUnread(
          conn->fd.get(),
          Status::ResourceExhausted(
              "kvtier serve has service.max_connections=" + std::to_string(max_connections) +
              " connections open; try again later, or raise service.max_connections"));
      continue;
    }
    try {
      conn->reader = std::thread([this, conn] { Serve(conn); });
    } catch (const std::system_error& e) {
      // No thread to be had (RLIMIT_NPROC, memory): this connection is refused, the daemon
      // and every engine it serves go on.
      ++stats.refused_connections;
      if (stats.refused_connections == 1 || stats.refused_connections % 1000 == 0) {
        KVTIER_LOG(kWarn) << "kvtier serve: no thread for a new connection (" << e.what()
                          << "); refused (" << stats.refused_connections << " refused so far)";
      }
      RefuseUnread(conn->fd.get(),
                   Status::ResourceExhausted("kvtier serve could not start a thread for this "
                                             "connection (" +
                                             std::string(e.what()) + "); try again later"));
      continue;
    }
    conns.push_back(conn);
  }
}

std::shared_ptr<Conn> Server::State::DataConn(uint32_t instance) {
  MutexLock lock(&mu);
  auto it = instances.find(instance);
  return it != instances.end() ? it->second->data : nullptr;
}

Status Server::State::SendCopy(uint32_t instance, const proto::CopyCall& call) {
  WireWriter w;
  proto::EncodeCopy(&w, call);
  if (LoadTrace* trace = proto::ActiveLoadTrace(); trace && call.dir == 1) {
    LoadTrace::SetFirst(trace->first_copy_queued_ns, LoadTrace::NowNs());
  }
  return Queue(DataConn(instance), MsgType::kCopy, w.Take());
}

Status Server::State::SendFetch(uint32_t instance, const proto::FetchCall& call) {
  WireWriter w;
  proto::EncodeFetch(&w, call);
  return Queue(DataConn(instance), MsgType::kFetch, w.Take());
}

Status Server::State::Queue(const std::shared_ptr<Conn>& conn, MsgType type,
                            std::vector<uint8_t> payload) {
  if (conn == nullptr) return Status::Unavailable("the engine instance has no data connection");
  {
    MutexLock lock(&conn->out_mu);
    if (conn->closing) return Status::Unavailable("the engine's data connection is closing");
    conn->out.emplace_back(type, std::move(payload));
  }
  conn->out_cv.notify_one();
  return Status::Ok();
}

void Server::State::WriterLoop(const std::shared_ptr<Conn>& conn) {
  uint64_t seq = 0;
  for (;;) {
    std::vector<uint8_t> payload;
    MsgType type;
    {
      MutexLock lock(&conn->out_mu);
      while (!conn->closing && conn->out.empty()) CondWait(&conn->out_cv, &conn->out_mu);
      if (conn->closing) return;
      type = conn->out.front().first;
      payload = std::move(conn->out.front().second);
      conn->out.pop_front();
    }
    Status sent = proto::SendFrame(conn->fd.get(), static_cast<uint16_t>(type), ++seq, payload, -1,
                                   Clock::now() + lease);
    if (!sent.ok()) {
      // A stuck or dead engine: end the connection; its reader fails what it held.
      KVTIER_LOG(kWarn) << "kvtier serve: instance " << conn->instance
                        << (conn->role == Role::kEvents ? " events" : " data")
                        << " connection: " << sent.ToString();
      ::shutdown(conn->fd.get(), SHUT_RDWR);
      return;
    }
  }
}

void Server::State::Serve(const std::shared_ptr<Conn>& conn) {
  const int fd = conn->fd.get();
  auto finish = [&] { conn->done.store(true); };
  const proto::PeerCred* cred = &conn->cred;  // authorized by AcceptLoop
  // A Hello is a few KiB (a model id, a name, a layout): a larger first frame is not read.
  Result<proto::Frame> first =
      proto::RecvFrame(fd, Clock::now() + std::chrono::seconds(5), proto::kMaxHelloPayloadBytes);
  auto refuse = [&](const Status& why, uint64_t seq) {
    WireWriter w;
    proto::EncodeStatus(&w, why);
    (void)proto::SendFrame(fd, static_cast<uint16_t>(MsgType::kReply), seq, w.data(), -1,
                           Clock::now() + std::chrono::seconds(1));
    MutexLock lock(&mu);
    ++stats.refused;
  };
  if (!first.ok()) {
    if (first.status().code() == StatusCode::kInvalidArgument) {
      refuse(Status::InvalidArgument("service protocol: a bad first frame: " +
                                     first.status().message()),
             0);
    }
    finish();
    return;
  }
  proto::Hello hello;
  proto::WireReader hr(first->payload);
  Status decoded = first->header.type == static_cast<uint16_t>(MsgType::kHello)
                       ? proto::DecodeHello(&hr, &hello)
                       : Status::InvalidArgument(
                             "service protocol: the first frame must be "
                             "Hello, not " +
                             std::string(proto::MsgTypeName(first->header.type)));
  if (decoded.ok() && hello.instance_name.empty()) {
    decoded = Status::InvalidArgument("service protocol: hello.instance_name is empty");
  }
  if (!decoded.ok()) {
    refuse(decoded, first->header.seq);
    finish();
    return;
  }
  Result<std::shared_ptr<Pool>> pool = hello.role == Role::kLookup
                                           ? JoinLookup(conn.get(), hello, *cred)
                                       : hello.role == Role::kEvents ? JoinEvents(hello, *cred)
                                                                     : GetPool(hello);
  if (!pool.ok()) {
    refuse(pool.status(), first->header.seq);
    finish();
    return;
  }
  Instance* inst = nullptr;
  const bool joins = hello.role == Role::kCall || hello.role == Role::kData;
  if (joins) {
    MutexLock lock(&mu);
    Result<Instance*> joined = JoinInstance(hello, pool->get(), *cred);
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
  if (inst == nullptr && joins) {
    refuse(decoded, first->header.seq);
    finish();
    return;
  }
  {
    WireWriter w;
    proto::EncodeStatus(&w, Status::Ok());
    proto::HelloReply reply;
    reply.instance = conn->instance;
    reply.epoch = epoch;
    reply.lease_ms = static_cast<uint32_t>(lease.count());
    reply.g2_capacity_bytes = (*pool)->g2_capacity;
    reply.g2_slot_bytes = (*pool)->g2_slot_bytes;
    proto::EncodeHelloReply(&w, reply);
    Status sent = proto::SendFrame(fd, static_cast<uint16_t>(MsgType::kReply), first->header.seq,
                                   w.data(), hello.role == Role::kData ? (*pool)->memfd : -1,
                                   Clock::now() + std::chrono::seconds(5));
    if (!sent.ok()) {
      LeaveInstance(conn);
      finish();
      return;
    }
  }
  if (hello.role == Role::kEvents) {
    {
      MutexLock lock(&mu);  // MakeRoomForPool reads the roles of every connection
      conn->role = Role::kEvents;
    }
    Subscribe(pool->get(), conn);
  }
  if (conn->role == Role::kData || conn->role == Role::kEvents) {
    try {
      conn->writer = std::thread([this, conn] { WriterLoop(conn); });
    } catch (const std::system_error& e) {
      // No thread for its writer: this connection ends (the engine sees the daemon gone and
      // attaches again later); the daemon goes on.
      KVTIER_LOG(kWarn) << "kvtier serve: no thread for a connection's writer (" << e.what()
                        << "); closing it";
      {
        MutexLock lock(&mu);
        ++stats.refused_connections;
      }
      Unsubscribe(conn);
      LeaveInstance(conn);
      finish();
      return;
    }
  }
  const uint32_t instance = conn->instance;
  Pool* p = pool->get();  // kept alive by `pool` until this connection ends
  if (conn->role == Role::kData && p->g4_offer) {
    // The engine may fetch G4 blocks itself, straight into its G1 (kG4Ready Ok).
    WireWriter w;
    proto::EncodeG4Config(&w, *p->g4_offer);
    p->backend->AwaitFetcherAnswer(instance);
    (void)Queue(conn, MsgType::kG4Config, w.Take());
  }
  for (;;) {
    Result<proto::Frame> frame = proto::RecvFrame(fd, Clock::time_point::max());
    if (!frame.ok()) {
      if (frame.status().code() == StatusCode::kInvalidArgument) {
        KVTIER_LOG(kWarn) << "kvtier serve: instance " << instance
                          << " sent a bad frame: " << frame.status().ToString();
        MutexLock lock(&mu);
        ++stats.bad_frames;
      }
      break;
    }
    if (conn->role == Role::kEvents) {
      KVTIER_LOG(kWarn) << "kvtier serve: an events connection sent "
                        << proto::MsgTypeName(frame->header.type) << "; it carries nothing back";
      MutexLock lock(&mu);
      ++stats.bad_frames;
      break;
    }
    if (conn->role == Role::kData) {
      proto::WireReader r(frame->payload);
      const auto type = static_cast<MsgType>(frame->header.type);
      Status ok;
      if (type == MsgType::kCopyLayer || type == MsgType::kCopyDone) {
        uint64_t batch = 0;
        uint32_t layer = 0;
        Status status;
        ok = r.U64("copy.batch", &batch);
        if (ok.ok()) {
          ok = type == MsgType::kCopyLayer ? r.U32("copy.layer", &layer)
                                           : proto::DecodeStatus(&r, &status);
        }
        if (ok.ok()) ok = r.Done();
        if (ok.ok() && type == MsgType::kCopyLayer) {
          if (LoadTrace* trace = proto::ActiveLoadTrace(); trace && layer < LoadTrace::kMaxLayers) {
            LoadTrace::SetMax(trace->layer_reported_ns[layer], LoadTrace::NowNs());
          }
          p->backend->OnLayer(instance, batch, layer);
        }
        if (ok.ok() && type == MsgType::kCopyDone) p->backend->OnDone(instance, batch, status);
      } else if (type == MsgType::kFetchDone) {
        proto::FetchDone done;
        ok = proto::DecodeFetchDone(&r, &done);
        if (ok.ok()) p->backend->OnFetchDone(instance, done);
      } else if (type == MsgType::kG4Ready) {
        Status ready;
        ok = proto::DecodeStatus(&r, &ready);
        if (ok.ok()) ok = r.Done();
        if (ok.ok()) {
          KVTIER_LOG(kInfo) << "kvtier serve: instance " << instance
                            << (ready.ok() ? " fetches G4 blocks straight into its G1"
                                           : " loads G4 blocks through G2: " + ready.ToString());
          p->backend->SetFetcher(instance, ready.ok());
        }
      } else {
        ok = Status::InvalidArgument(std::string("service protocol: a data connection cannot "
                                                 "carry ") +
                                     proto::MsgTypeName(frame->header.type));
      }
      if (!ok.ok()) {
        KVTIER_LOG(kWarn) << "kvtier serve: instance " << instance << ": " << ok.ToString();
        MutexLock lock(&mu);
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
        MutexLock lock(&mu);
        live = LookupPool(*conn) != nullptr;
      }
      if (type != MsgType::kLookup && type != MsgType::kStats) {
        handled = Status::InvalidArgument(std::string("service protocol: a lookup connection "
                                                      "carries Lookup and Stats only, not ") +
                                          proto::MsgTypeName(frame->header.type));
      } else if (!live) {
        // The engine's instance ended (its process is gone): answer, then end; the client
        // joins again by name once the engine is back.
        proto::EncodeStatus(
            &out, Status::Unavailable("engine instance '" + std::to_string(instance) + "' ended"));
        (void)proto::SendFrame(fd, static_cast<uint16_t>(MsgType::kReply), frame->header.seq,
                               out.data(), -1, Clock::now() + std::chrono::seconds(1));
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
      proto::EncodeStatus(&w, handled);
      (void)proto::SendFrame(fd, static_cast<uint16_t>(MsgType::kReply), frame->header.seq,
                             w.data(), -1, Clock::now() + std::chrono::seconds(1));
      MutexLock lock(&mu);
      ++stats.bad_frames;
      break;
    }
    Status sent = proto::SendFrame(fd, static_cast<uint16_t>(MsgType::kReply), frame->header.seq,
                                   out.data(), -1, Clock::now() + std::chrono::seconds(5));
    if (!sent.ok()) break;
  }
  if (conn->role == Role::kData || conn->role == Role::kEvents) {
    {
      MutexLock lock(&conn->out_mu);
      conn->closing = true;
    }
    conn->out_cv.notify_all();
  }
  Unsubscribe(conn);
  LeaveInstance(conn);
  finish();
}

}  // namespace kvtier::daemon

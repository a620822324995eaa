// AttachedManager, the call side: Create, and the BlockManager methods as calls to kvtier serve
// (docs/service.md). Attaching, detaching and the call itself are attached_session.cc; the
// background connections (data, events) are attached_connections.cc.
#include "client/attached_manager.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <type_traits>

#include "core/log.h"
#include "proto/handshake.h"
#include "proto/service_options.h"
#include "tier/cond_wait.h"
#include "transfer/block_copy.h"

namespace kvtier::client {

// The protocol's names this file uses most.
using proto::MsgType;
using proto::Role;
using proto::WireWriter;

AttachedManager::AttachedManager(const ManagerOptions& options) : options_(options) {}

Result<std::unique_ptr<AttachedManager>> AttachedManager::Create(
    const ManagerOptions& options, DeviceBackendFactory device_backend) {
  KVTIER_RETURN_IF_ERROR(options.layout.Validate());
  if (options.model_id.empty()) {
    return Status::InvalidArgument(
        "ManagerOptions.model_id is empty; name the model, so keys of different models never "
        "collide");
  }
  std::unique_ptr<AttachedManager> m(new AttachedManager(options));
  const Config& cfg = options.config;
  if (!proto::ServiceSocketSet(cfg)) {
    return Status::InvalidArgument("attached mode needs service.socket (the daemon's socket)");
  }
  KVTIER_ASSIGN_OR_RETURN(const proto::ServiceClientOptions service,
                          proto::ServiceClientOptions::FromConfig(cfg));
  m->socket_path_ = service.socket;
  m->instance_name_ = service.instance;
  if (m->instance_name_.empty()) {
    m->instance_name_ = "pid-" + std::to_string(::getpid()) + "-" +
                        std::to_string(reinterpret_cast<uintptr_t>(m.get()) & 0xffffff);
  }
  m->daemon_uid_ = service.daemon_uid;
  m->call_timeout_ = std::chrono::milliseconds(service.call_timeout_ms);
  m->reattach_ = std::chrono::milliseconds(service.reattach_ms);
  m->stream_load_bytes_ = StreamLoadBytes(cfg.GetString("transfer.load_stores"));
  m->device_factory_ = std::move(device_backend);
  // Test hook (tests/service/service_test.cc): each block a save copies waits this long first, so a
  // test can kill an engine in the middle of its saves.
  if (const char* stall = std::getenv("KVTIER_TEST_ATTACHED_COPY_STALL_MS"); stall != nullptr) {
    m->copy_stall_ = std::chrono::milliseconds(std::atoi(stall));
  }
  // Test hook (tests/service/service_g4_fetch_test.cc): the engine answers the daemon's G4 offer
  // late.
  if (const char* d = std::getenv("KVTIER_TEST_ATTACHED_G4_READY_DELAY_MS"); d != nullptr) {
    m->g4_ready_delay_ = std::chrono::milliseconds(std::atoi(d));
  }
  {
    MutexLock attach(&m->attach_mu_);
    bool refused = false;
    Status s = m->AttachLocked(&refused);
    if (refused) {
      // The daemon is there and said no (a peer it does not allow, no room for this model):
      // a setting to change, not a fault to ride out.
      return Status(s.code(),
                    "kvtier serve at " + m->socket_path_ + " refused this engine: " + s.message());
    }
    if (!s.ok()) {
      KVTIER_LOG(kWarn) << "kvtier: cannot attach to kvtier serve at " << m->socket_path_ << ": "
                        << s.message() << "; every lookup is a miss until it can (retried every "
                        << service.reattach_ms << " ms)";
    }
  }
  return m;
}

bool AttachedManager::Requested(const Config& config) { return proto::ServiceSocketSet(config); }

AttachedManager::~AttachedManager() {
  // connector.h: the destructor finishes transfers in flight. Attached, the saves this engine
  // started run in the daemon, copying from this engine's G1 over the data connection, so they
  // are waited for before that connection closes, bounded as WaitForSaves is. Call (not
  // KVTIER_CALL) never attaches again: a manager that is not attached has no save left (Detach
  // failed them), and one the daemon does not answer in time goes on to close.
  {
    std::vector<uint8_t> reply;
    (void)Call(MsgType::kWaitForSaves, WireWriter(),
               call_timeout_ + 4 * std::chrono::milliseconds(lease_ms_.load()), &reply, nullptr);
  }
  {
    MutexLock lock(&events_mu_);
    events_stop_ = true;
    if (events_fd_ >= 0) ::shutdown(events_fd_, SHUT_RDWR);
  }
  events_cv_.notify_all();
  if (events_thread_.joinable()) events_thread_.join();
  {
    MutexLock lock(&mu_);
    attached_ = false;
    idle_.clear();
  }
  if (data_fd_) ::shutdown(data_fd_.get(), SHUT_RDWR);
  if (data_thread_.joinable()) data_thread_.join();
  device_.reset();
}

namespace {
// Runs `call`, then decodes the reply's status into *status; false when the daemon was gone.
struct Reply {
  std::vector<uint8_t> bytes;
  std::unique_ptr<proto::WireReader> reader;
  Status status;  // the call's own status (from the daemon)
};
}  // namespace

bool AttachedManager::Current(const std::string& request_id) {
  MutexLock lock(&mu_);
  auto it = request_epoch_.find(request_id);
  // A request this manager never looked up (its scheduler asked the daemon directly, through
  // ServiceLookup) goes to the daemon, which knows it or answers as for an unknown one.
  return attached_ && (it == request_epoch_.end() || it->second == epoch_);
}

#define KVTIER_CALL(type, writer, timeout, reply)                                 \
  [&]() -> bool {                                                                 \
    if (!EnsureAttached()) return false;                                          \
    if (!Call(type, writer, timeout, &(reply).bytes, nullptr).ok()) return false; \
    (reply).reader = std::make_unique<proto::WireReader>((reply).bytes);          \
    Status decoded = proto::DecodeStatus((reply).reader.get(), &(reply).status);  \
    if (!decoded.ok()) {                                                          \
      Detach("a reply that does not decode: " + decoded.message());               \
      return false;                                                               \
    }                                                                             \
    return true;                                                                  \
  }()

Result<LookupResult> AttachedManager::Lookup(const RequestSpec& request,
                                             uint32_t num_computed_tokens) {
  if (request.request_id.empty()) {
    return Status::InvalidArgument("Lookup: the request id is empty");
  }
  if (num_computed_tokens % options_.layout.tokens_per_block != 0) {
    return Status::InvalidArgument(
        "Lookup: num_computed_tokens = " + std::to_string(num_computed_tokens) +
        " is not a multiple of the block size " + std::to_string(options_.layout.tokens_per_block));
  }
  WireWriter w;
  proto::EncodeLookup(&w, request, num_computed_tokens);
  Reply reply;
  if (!KVTIER_CALL(MsgType::kLookup, w, call_timeout_, reply)) return LookupResult{};
  KVTIER_RETURN_IF_ERROR(reply.status);
  LookupResult result;
  Status decoded = proto::DecodeLookupResult(reply.reader.get(), &result);
  if (!decoded.ok()) {
    Detach(decoded.message());
    return LookupResult{};
  }
  MutexLock lock(&mu_);
  if (attached_) request_epoch_[request.request_id] = epoch_;
  finished_.erase(request.request_id);
  return result;
}

Result<uint32_t> AttachedManager::PrepareLoad(const std::string& request_id,
                                              std::span<const uint32_t> g1_block_ids,
                                              uint32_t num_external_tokens, bool async_load) {
  {
    MutexLock lock(&mu_);
    if (!attached_) return 0u;
    // A request of a daemon that went away: nothing of it can load. (One this manager never
    // looked up goes to the daemon, which says NotFound, as the in-process manager does.)
    auto it = request_epoch_.find(request_id);
    if (it != request_epoch_.end() && it->second != epoch_) return 0u;
  }
  proto::PrepareLoadCall m;
  m.request_id = request_id;
  m.g1_block_ids.assign(g1_block_ids.begin(), g1_block_ids.end());
  m.num_external_tokens = num_external_tokens;
  m.async_load = async_load;
  WireWriter w;
  proto::EncodePrepareLoad(&w, m);
  Reply reply;
  if (!KVTIER_CALL(MsgType::kPrepareLoad, w, call_timeout_, reply)) return 0u;
  KVTIER_RETURN_IF_ERROR(reply.status);
  uint32_t n = 0;
  if (!reply.reader->U32("prepare_load.tokens", &n).ok()) {
    Detach("a PrepareLoad reply that does not decode");
    return 0u;
  }
  if (n > 0) {
    MutexLock lock(&mu_);
    loading_.insert(request_id);
    if (!async_load) pending_sync_ = true;
  }
  return n;
}

Status AttachedManager::Commit(const std::string& request_id, std::span<const TokenId> tokens,
                               std::span<const uint32_t> g1_block_ids) {
  {
    MutexLock lock(&mu_);
    auto it = request_epoch_.find(request_id);
    // Detached, or a request of an earlier daemon: nothing is saved (a miss, not an error).
    if (!attached_ || (it != request_epoch_.end() && it->second != epoch_)) return Status::Ok();
  }
  WireWriter w;
  proto::EncodeCommit(&w, request_id, tokens, g1_block_ids);
  Reply reply;
  if (!KVTIER_CALL(MsgType::kCommit, w, call_timeout_, reply)) return Status::Ok();
  return reply.status;
}

bool AttachedManager::RequestFinished(const std::string& request_id) {
  WireWriter w;
  w.String(request_id);
  Reply reply;
  bool kept = false;
  if (Current(request_id) && KVTIER_CALL(MsgType::kRequestFinished, w, call_timeout_, reply)) {
    uint8_t v = 0;
    kept = reply.status.ok() && reply.reader->U8("kept", &v).ok() && v != 0;
  }
  MutexLock lock(&mu_);
  if (kept) kept_.insert(request_id);
  auto known = request_epoch_.find(request_id);
  if (known != request_epoch_.end() && known->second != epoch_) {
    request_epoch_.erase(known);
    return false;
  }
  if (!kept && loading_.count(request_id) == 0) {
    request_epoch_.erase(request_id);
  } else {
    finished_.insert(request_id);
  }
  return kept;
}

Status AttachedManager::RegisterDeviceMemory(const G1Memory& g1) {
  KVTIER_RETURN_IF_ERROR(g1.Validate());
  if (g1.layout.Fingerprint() != options_.layout.Fingerprint()) {
    return Status::InvalidArgument("G1 layout " + g1.layout.ToString() +
                                   " differs from the manager's " + options_.layout.ToString());
  }
  if (g1.num_blocks >=
      proto::kMaxG1Blocks) {  // ids below kMaxG1Blocks - 1: never kNoG1Block mapped
    return Status::InvalidArgument("an attached engine's G1 holds at most " +
                                   std::to_string(proto::kMaxG1Blocks - 1) + " blocks, not " +
                                   std::to_string(g1.num_blocks));
  }
  if (g1.on_device && !device_factory_) {
    Status probe = ProbeCuda();
    if (!probe.ok()) {
      return Status(probe.code(), "G1 is device memory, which only the CUDA backend can reach: " +
                                      probe.message());
    }
  }
  MutexLock attach(&attach_mu_);
  if (g1_) return Status::FailedPrecondition("G1 is registered already; one per engine");
  g1_ = g1;
  bool attached;
  {
    MutexLock lock(&mu_);
    attached = attached_;
  }
  if (attached) {
    Status s = OpenDataLocked();
    if (!s.ok()) {
      KVTIER_LOG(kWarn) << "kvtier: data connection to kvtier serve: " << s.ToString();
      Detach(s.message());
    }
  }
  return Status::Ok();
}

Status AttachedManager::StartLoad() {
  {
    MutexLock lock(&mu_);
    started_sync_ = started_sync_ || pending_sync_;
    pending_sync_ = false;
    if (!attached_) return Status::Ok();
  }
  Reply reply;
  if (!KVTIER_CALL(MsgType::kStartLoad, WireWriter(), call_timeout_, reply)) return Status::Ok();
  return reply.status;
}

Status AttachedManager::StartLoad(uintptr_t engine_stream) {
  if (!g1_)
    return Status::FailedPrecondition("StartLoad(engine_stream) before RegisterDeviceMemory");
  if (!g1_->on_device) {
    return Status::InvalidArgument("StartLoad(engine_stream) is for a device G1; use StartLoad()");
  }
  Status ordered = device_ ? device_->OrderAfterStream(CopyDirection::kHostToDevice, engine_stream)
                           : Status::Ok();
  Status started = StartLoad();
  return ordered.ok() ? started : ordered;
}

Status AttachedManager::WaitLayer(uint32_t layer) {
  if (layer >= options_.layout.num_layers) {
    return Status::InvalidArgument("WaitLayer(" + std::to_string(layer) + "): the layout has " +
                                   std::to_string(options_.layout.num_layers) + " layers");
  }
  bool lost = false;
  {
    MutexLock lock(&mu_);
    lost = !orphan_loads_done_.empty();
    if (!started_sync_) {
      return lost ? Status::Unavailable("kvtier serve went away with loads in flight")
                  : Status::Ok();
    }
    if (layer + 1 == options_.layout.num_layers) started_sync_ = false;
  }
  WireWriter w;
  w.U32(layer);
  Reply reply;
  const auto timeout = call_timeout_ + std::chrono::milliseconds(lease_ms_.load());
  Status s = KVTIER_CALL(MsgType::kWaitLayer, w, timeout, reply)
                 ? reply.status
                 : Status::Unavailable("kvtier serve went away with loads in flight");
  Barrier();
  return s;
}

uint32_t AttachedManager::LoadedTokens(const std::string& request_id) {
  if (!Current(request_id)) return 0;
  WireWriter w;
  w.String(request_id);
  Reply reply;
  uint32_t n = 0;
  const auto timeout = call_timeout_ + std::chrono::milliseconds(lease_ms_.load());
  if (KVTIER_CALL(MsgType::kLoadedTokens, w, timeout, reply) && reply.status.ok()) {
    if (!reply.reader->U32("loaded_tokens", &n).ok()) n = 0;
  }
  Barrier();
  return n;
}

Status AttachedManager::StartSave() {
  Reply reply;
  if (!KVTIER_CALL(MsgType::kStartSave, WireWriter(), call_timeout_, reply)) return Status::Ok();
  return reply.status;
}

Status AttachedManager::StartSave(uintptr_t engine_stream) {
  if (!g1_)
    return Status::FailedPrecondition("StartSave(engine_stream) before RegisterDeviceMemory");
  if (!g1_->on_device) {
    return Status::InvalidArgument("StartSave(engine_stream) is for a device G1; use StartSave()");
  }
  Status ordered = device_ ? device_->OrderAfterStream(CopyDirection::kDeviceToHost, engine_stream)
                           : Status::Ok();
  Status started = StartSave();
  return ordered.ok() ? started : ordered;
}

void AttachedManager::WaitForSaves() {
  Reply reply;
  (void)KVTIER_CALL(MsgType::kWaitForSaves, WireWriter(),
                    call_timeout_ + 4 * std::chrono::milliseconds(lease_ms_.load()), reply);
}

void AttachedManager::WaitForRequestSaves(const std::string& request_id) {
  if (!Current(request_id)) return;
  WireWriter w;
  w.String(request_id);
  Reply reply;
  (void)KVTIER_CALL(MsgType::kWaitForRequestSaves, w,
                    call_timeout_ + 2 * std::chrono::milliseconds(lease_ms_.load()), reply);
}

FinishedRequests AttachedManager::Finished() {
  FinishedRequests out;
  Reply reply;
  bool have = false;
  {
    MutexLock lock(&mu_);
    have = attached_;
  }
  if (have && KVTIER_CALL(MsgType::kFinished, WireWriter(), call_timeout_, reply) &&
      reply.status.ok()) {
    if (!proto::DecodeFinished(reply.reader.get(), &out).ok()) {
      out = {};
      Detach("a Finished reply that does not decode");
    }
  } else {
    EnsureAttached();
  }
  Barrier();
  MutexLock lock(&mu_);
  for (const std::string& id : out.saves_done) kept_.erase(id);
  for (const std::string& id : out.loads_done) loading_.erase(id);
  for (auto* list : {&out.saves_done, &out.loads_done}) {
    for (const std::string& id : *list) {
      if (finished_.count(id) != 0 && kept_.count(id) == 0 && loading_.count(id) == 0) {
        finished_.erase(id);
        request_epoch_.erase(id);
      }
    }
  }
  out.saves_done.insert(out.saves_done.end(), orphan_saves_done_.begin(), orphan_saves_done_.end());
  out.loads_done.insert(out.loads_done.end(), orphan_loads_done_.begin(), orphan_loads_done_.end());
  orphan_saves_done_.clear();
  orphan_loads_done_.clear();
  return out;
}

namespace {
// `base` with `now`'s counters added to it (per-tier and per-path ones element by element), and
// `now`'s gauges (slots, blocks held, pins, requests tracked, flags) in place of its own.
ManagerStats AddCounters(const ManagerStats& base, const ManagerStats& now) {
  ManagerStats out = base;
  ForEachStatField(
      [](const StatField& f, auto& sum, const auto& v) {
        if constexpr (std::is_same_v<std::remove_cvref_t<decltype(sum)>, bool>) {
          sum = v;  // a flag is a gauge
        } else if (f.kind == StatKind::kGauge) {
          sum = v;
        } else if constexpr (std::is_same_v<std::remove_cvref_t<decltype(sum)>, uint64_t>) {
          sum += v;
        } else {
          for (size_t i = 0; i < sum.size(); ++i) sum[i] += v[i];
        }
      },
      out, now);
  return out;
}
}  // namespace

ManagerStats AttachedManager::Stats() {
  // Counters never go backwards (engines report deltas of them, vLLM's Prometheus counters
  // among them): while detached the last answer stands, and a daemon that restarted (its
  // counters from 0) is added to the total of the ones before it.
  Reply reply;
  ManagerStats fetched;
  bool ok = KVTIER_CALL(MsgType::kStats, WireWriter(), call_timeout_, reply) && reply.status.ok() &&
            proto::DecodeStats(reply.reader.get(), &fetched).ok();
  MutexLock lock(&mu_);
  if (!ok) return last_stats_;
  if (epoch_ != stats_epoch_) {
    // The gauges of a daemon that is gone mean nothing: base_stats_ keeps its counters only
    // (the gauges it holds are overwritten by the fetched ones below).
    if (stats_epoch_ != 0) base_stats_ = AddCounters(base_stats_, epoch_last_);
    stats_epoch_ = epoch_;
  }
  epoch_last_ = fetched;
  // The summed counters, with the current daemon's gauges.
  const ManagerStats out = AddCounters(base_stats_, fetched);
  last_stats_ = out;
  return out;
}

AttachedManager::ClientStats AttachedManager::client_stats() {
  MutexLock lock(&mu_);
  return stats_;
}

}  // namespace kvtier::client

// ServiceLookup (include/kvtier/service_lookup.h): a lookup connection (Role::kLookup) per
// concurrent caller, joined to an attached engine instance by name. Every failure of the
// daemon's side is a miss; only the daemon's verdict on the request itself is an error.
#include "kvtier/service_lookup.h"

#include <unistd.h>

#include <chrono>
#include <vector>

#include "core/log.h"
#include "core/mutex.h"
#include "core/thread_annotations.h"
#include "core/unique_fd.h"
#include "proto/handshake.h"
#include "proto/protocol.h"
#include "proto/service_options.h"
#include "proto/unix_socket.h"
#include "proto/wire.h"

namespace kvtier {

using proto::MsgType;
using Clock = std::chrono::steady_clock;

class ServiceLookup::Impl {
 public:
  // Set by Create before the Impl is handed out; read-only after.
  std::string socket_path;
  std::string instance_name;
  uid_t daemon_uid = 0;  // service.daemon_uid
  Clock::duration call_timeout{};
  Clock::duration reattach{};

  Result<LookupResult> Lookup(const RequestSpec& request, uint32_t num_computed_tokens)
      EXCLUDES(mu_);
  Stats stats() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return stats_;
  }

 private:
  // A connection joined to the instance, or none (a miss) while the daemon or the instance is
  // not there, at most one attempt per `reattach` after a failed one.
  UniqueFd Take() EXCLUDES(mu_);
  Status Join(UniqueFd* out) EXCLUDES(mu_);
  void Failed(const std::string& why) EXCLUDES(mu_);

  Mutex mu_;
  std::vector<UniqueFd> idle_ GUARDED_BY(mu_);
  bool last_failed_ GUARDED_BY(mu_) = false;
  Clock::time_point last_attempt_ GUARDED_BY(mu_){};
  uint64_t seq_ GUARDED_BY(mu_) = 0;
  Stats stats_ GUARDED_BY(mu_);
};

Status ServiceLookup::Impl::Join(UniqueFd* out) {
  proto::Hello hello;
  hello.role = proto::Role::kLookup;
  hello.instance_name = instance_name;
  hello.pid = static_cast<uint32_t>(::getpid());
  uint64_t seq;
  {
    MutexLock lock(&mu_);
    seq = ++seq_;
  }
  KVTIER_ASSIGN_OR_RETURN(
      proto::Handshake opened,
      proto::OpenConnection(socket_path, daemon_uid, hello, seq, Clock::now() + call_timeout));
  *out = std::move(opened.fd);
  return Status::Ok();
}

UniqueFd ServiceLookup::Impl::Take() {
  {
    MutexLock lock(&mu_);
    if (!idle_.empty()) {
      UniqueFd fd = std::move(idle_.back());
      idle_.pop_back();
      return fd;
    }
    if (last_failed_ && Clock::now() - last_attempt_ < reattach) return UniqueFd();
    last_attempt_ = Clock::now();
  }
  UniqueFd fd;
  Status joined = Join(&fd);
  MutexLock lock(&mu_);
  if (!joined.ok()) {
    if (!last_failed_) {
      KVTIER_LOG(kWarn) << "kvtier: lookups through kvtier serve at " << socket_path
                        << " for instance '" << instance_name
                        << "' are misses until it can: " << joined.message();
    }
    last_failed_ = true;
    stats_.connected = false;
    stats_.failed_calls++;
    return UniqueFd();
  }
  if (last_failed_) {
    KVTIER_LOG(kInfo) << "kvtier: lookups through kvtier serve at " << socket_path
                      << " for instance '" << instance_name << "' answered again";
  }
  last_failed_ = false;
  stats_.connected = true;
  stats_.connects++;
  return fd;
}

void ServiceLookup::Impl::Failed(const std::string& why) {
  MutexLock lock(&mu_);
  // The daemon went away or the instance ended: the other idle connections are as dead.
  idle_.clear();
  if (!last_failed_) {
    KVTIER_LOG(kWarn) << "kvtier: lookup through kvtier serve at " << socket_path << " ("
                      << instance_name << "): " << why << "; lookups are misses until it is back";
  }
  last_failed_ = true;
  last_attempt_ = Clock::now();
  stats_.connected = false;
  stats_.failed_calls++;
}

Result<LookupResult> ServiceLookup::Impl::Lookup(const RequestSpec& request,
                                                 uint32_t num_computed_tokens) {
  if (request.request_id.empty()) {
    return Status::InvalidArgument("Lookup: the request id is empty");
  }
  UniqueFd fd = Take();
  if (!fd) return LookupResult{};
  proto::WireWriter w;
  proto::EncodeLookup(&w, request, num_computed_tokens);
  uint64_t seq;
  {
    MutexLock lock(&mu_);
    seq = ++seq_;
  }
  const auto deadline = Clock::now() + call_timeout;
  Status sent = proto::SendFrame(fd.get(), static_cast<uint16_t>(MsgType::kLookup), seq, w.data(),
                                 -1, deadline);
  Result<proto::Frame> reply =
      sent.ok() ? proto::RecvFrame(fd.get(), deadline) : Result<proto::Frame>(sent);
  if (!reply.ok()) {
    Failed(reply.status().message());
    return LookupResult{};
  }
  if (reply->header.type != static_cast<uint16_t>(MsgType::kReply) || reply->header.seq != seq) {
    Failed("the daemon answered out of step");
    return LookupResult{};
  }
  proto::WireReader r(reply->payload);
  Status status;
  Status decoded = proto::DecodeStatus(&r, &status);
  LookupResult result;
  if (decoded.ok() && status.ok()) decoded = proto::DecodeLookupResult(&r, &result);
  if (!decoded.ok()) {
    Failed("a reply that does not decode: " + decoded.message());
    return LookupResult{};
  }
  if (status.code() == StatusCode::kUnavailable) {
    Failed(status.message());  // the instance ended; the daemon closes this connection
    return LookupResult{};
  }
  MutexLock lock(&mu_);
  idle_.push_back(std::move(fd));
  if (!status.ok()) return status;
  stats_.lookups++;
  return result;
}

Result<std::unique_ptr<ServiceLookup>> ServiceLookup::Create(const Config& config,
                                                             const std::string& instance_name) {
  auto impl = std::make_unique<Impl>();
  if (!proto::ServiceSocketSet(config)) {
    return Status::InvalidArgument(
        "ServiceLookup needs service.socket (the socket kvtier serve listens on)");
  }
  if (instance_name.empty()) {
    return Status::InvalidArgument(
        "ServiceLookup needs the engine instance's name (the worker's service.instance)");
  }
  if (instance_name.size() > proto::kMaxNameBytes) {
    return Status::InvalidArgument("ServiceLookup: the instance name is " +
                                   std::to_string(instance_name.size()) + " bytes; at most " +
                                   std::to_string(proto::kMaxNameBytes));
  }
  KVTIER_ASSIGN_OR_RETURN(const proto::ServiceClientOptions service,
                          proto::ServiceClientOptions::FromConfig(config));
  impl->socket_path = service.socket;
  impl->instance_name = instance_name;
  impl->daemon_uid = service.daemon_uid;
  impl->call_timeout = std::chrono::milliseconds(service.call_timeout_ms);
  impl->reattach = std::chrono::milliseconds(service.reattach_ms);
  return std::unique_ptr<ServiceLookup>(new ServiceLookup(std::move(impl)));
}

ServiceLookup::ServiceLookup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ServiceLookup::~ServiceLookup() = default;

Result<LookupResult> ServiceLookup::Lookup(const RequestSpec& request,
                                           uint32_t num_computed_tokens) {
  return impl_->Lookup(request, num_computed_tokens);
}

ServiceLookup::Stats ServiceLookup::stats() { return impl_->stats(); }

}  // namespace kvtier

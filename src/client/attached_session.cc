// AttachedManager's session with kvtier serve (docs/service.md): the Hello it sends, attaching
// (the control connection, then the data connection with its G2 mapping), noticing a daemon
// that went away and attaching again, detaching (every call and copy in flight fails), and one
// control call with its deadline. The BlockManager methods over it are attached_manager.cc.
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <type_traits>

#include "client/attached_manager.h"
#include "core/log.h"
#include "proto/handshake.h"
#include "proto/service_options.h"
#include "tier/cond_wait.h"
#include "transfer/block_copy.h"

namespace kvtier::client {

using proto::MsgType;
using proto::Role;
using proto::WireWriter;

proto::Hello AttachedManager::MakeHello(Role role) const {
  proto::Hello hello;
  hello.role = role;
  hello.instance_name = instance_name_;
  hello.model_id = options_.model_id;
  hello.layout = options_.layout;
  hello.pid = static_cast<uint32_t>(::getpid());
  return hello;
}

Status AttachedManager::AttachLocked(bool* refused) {
  {
    MutexLock lock(&mu_);
    last_attempt_ = Clock::now();
    if (attached_) return Status::Ok();
  }
  Result<proto::Handshake> opened =
      proto::OpenConnection(socket_path_, daemon_uid_, MakeHello(Role::kCall), ++seq_,
                            Clock::now() + call_timeout_, refused);
  if (!opened.ok()) return opened.status();
  UniqueFd fd = std::move(opened->fd);
  const proto::HelloReply& hr = opened->reply;
  {
    MutexLock lock(&mu_);
    epoch_ = hr.epoch;
    instance_ = hr.instance;
    lease_ms_ = hr.lease_ms;
    idle_.push_back(std::move(fd));
  }
  if (g1_) {
    Status data = OpenDataLocked();
    if (!data.ok()) {
      MutexLock lock(&mu_);
      idle_.clear();
      return data;
    }
  }
  MutexLock lock(&mu_);
  attached_ = true;
  stats_.attaches++;
  stats_.attached = true;
  stats_.instance = instance_;
  KVTIER_LOG(kInfo) << "kvtier: attached to kvtier serve at " << socket_path_ << " as instance "
                    << instance_ << " ('" << instance_name_ << "')";
  return Status::Ok();
}

Status AttachedManager::OpenDataLocked() {
  // The previous data connection (a daemon that went away) ends first: its thread may still
  // be copying through the old mapping.
  {
    MutexLock lock(&mu_);
    if (data_fd_) ::shutdown(data_fd_.get(), SHUT_RDWR);
  }
  if (data_thread_.joinable()) data_thread_.join();
  {
    MutexLock lock(&mu_);  // Detach reads it from other threads
    data_fd_.reset();
  }
  device_.reset();
  arena_.reset();

  const auto deadline = Clock::now() + call_timeout_;
  KVTIER_ASSIGN_OR_RETURN(
      proto::Handshake opened,
      proto::OpenConnection(socket_path_, daemon_uid_, MakeHello(Role::kData), ++seq_, deadline));
  UniqueFd fd = std::move(opened.fd);
  const proto::HelloReply& hr = opened.reply;
  if (!opened.passed) {
    return Status::InvalidArgument("kvtier serve sent no G2 descriptor with its data Hello reply");
  }
  HostArena::Config ac;
  ac.capacity_bytes = hr.g2_capacity_bytes;
  ac.slot_bytes = hr.g2_slot_bytes;
  ac.hugepages = options_.config.GetBool("g2.hugepages");
  ac.lock_memory = options_.config.GetBool("g2.lock_memory");
  KVTIER_ASSIGN_OR_RETURN(arena_, HostArena::Attach(opened.passed.get(), ac));
  if (g1_->on_device) {
    Result<std::unique_ptr<DeviceCopyBackend>> backend =
        device_factory_ ? device_factory_(DeviceCopyBackend::Config{})
                        : CreateCudaBackend(DeviceCopyBackend::Config{});
    KVTIER_RETURN_IF_ERROR(backend.status());
    KVTIER_RETURN_IF_ERROR((*backend)->RegisterG1(*g1_));
    KVTIER_RETURN_IF_ERROR((*backend)->RegisterHost(arena_->base(), arena_->mapped_bytes()));
    device_ = std::move(*backend);
  }
  // The daemon bounds the block ids this instance may name by its G1.
  WireWriter reg;
  reg.U32(g1_->num_blocks);
  UniqueFd call;
  {
    MutexLock lock(&mu_);
    if (!idle_.empty()) {
      call = std::move(idle_.back());
      idle_.pop_back();
    }
  }
  if (!call) return Status::Unavailable("no call connection to register G1 on");
  KVTIER_RETURN_IF_ERROR(proto::SendFrame(call.get(), static_cast<uint16_t>(MsgType::kRegisterG1),
                                          ++seq_, reg.data(), -1, deadline));
  KVTIER_ASSIGN_OR_RETURN(proto::Frame reg_reply, proto::RecvFrame(call.get(), deadline));
  proto::WireReader rr(reg_reply.payload);
  Status status;
  KVTIER_RETURN_IF_ERROR(proto::DecodeStatus(&rr, &status));
  KVTIER_RETURN_IF_ERROR(status);
  {
    MutexLock lock(&mu_);
    idle_.push_back(std::move(call));
  }
  int data;
  {
    MutexLock lock(&mu_);
    data_fd_ = std::move(fd);
    data = data_fd_.get();
  }
  copies_stopped_.store(false);
  data_thread_ = std::thread([this, data] { DataLoop(data); });
  return Status::Ok();
}

bool AttachedManager::EnsureAttached() {
  {
    MutexLock lock(&mu_);
    if (attached_) return true;
    if (Clock::now() - last_attempt_ < reattach_) return false;
  }
  MutexLock attach(&attach_mu_);
  {
    MutexLock lock(&mu_);
    if (attached_) return true;
    if (Clock::now() - last_attempt_ < reattach_) return false;
  }
  Status s = AttachLocked();
  if (!s.ok()) KVTIER_LOG(kDebug) << "kvtier: attach to " << socket_path_ << ": " << s.message();
  return s.ok();
}

void AttachedManager::Detach(const std::string& why) {
  int data = -1;
  {
    MutexLock lock(&mu_);
    if (!attached_) return;
    attached_ = false;
    stats_.attached = false;
    stats_.detaches++;
    last_attempt_ = Clock::now();
    idle_.clear();
    // What the engine waits for can no longer come from the daemon: report it as ended.
    for (const std::string& id : kept_) orphan_saves_done_.push_back(id);
    for (const std::string& id : loading_) orphan_loads_done_.push_back(id);
    kept_.clear();
    loading_.clear();
    finished_.clear();
    // request_epoch_ stays: those requests' later calls are misses (their epoch is gone).
    pending_sync_ = started_sync_ = false;
    data = data_fd_.get();
  }
  // The daemon takes back the slots lent to this engine when its data connection ends, and
  // lends them to the next engine: no copy of ours may write them after that.
  FenceCopies();
  if (data >= 0) ::shutdown(data, SHUT_RDWR);
  KVTIER_LOG(kWarn) << "kvtier: kvtier serve at " << socket_path_ << " went away (" << why
                    << "); lookups are misses until it is back";
}

void AttachedManager::FenceCopies() {
  copies_stopped_.store(true);
  Barrier();  // the block or layer being copied now ends; later ones see copies_stopped_
  MutexLock lock(&device_mu_);
  while (device_batches_ != 0) CondWait(&device_cv_, &device_mu_);
}

Status AttachedManager::Call(MsgType type, const WireWriter& payload, Clock::duration timeout,
                             std::vector<uint8_t>* reply_payload, size_t* status_end) {
  (void)status_end;
  UniqueFd fd;
  {
    MutexLock lock(&mu_);
    if (!attached_) return Status::Unavailable("not attached to kvtier serve");
    if (!idle_.empty()) {
      fd = std::move(idle_.back());
      idle_.pop_back();
    }
  }
  const uint64_t epoch = [&] {
    MutexLock lock(&mu_);
    return epoch_;
  }();
  if (!fd) {
    // One more call connection for this call in flight.
    Result<proto::Handshake> opened = proto::OpenConnection(
        socket_path_, daemon_uid_, MakeHello(Role::kCall), ++seq_, Clock::now() + call_timeout_);
    Status s = opened.status();
    if (s.ok() && opened->reply.epoch != epoch) s = Status::Unavailable("kvtier serve restarted");
    if (s.ok()) fd = std::move(opened->fd);
    if (!s.ok()) {
      Detach(s.message());
      MutexLock lock(&mu_);
      stats_.failed_calls++;
      return Status::Unavailable(s.message());
    }
  }
  const uint64_t seq = ++seq_;
  const auto deadline = Clock::now() + timeout;
  Status sent =
      proto::SendFrame(fd.get(), static_cast<uint16_t>(type), seq, payload.data(), -1, deadline);
  Result<proto::Frame> reply =
      sent.ok() ? proto::RecvFrame(fd.get(), deadline) : Result<proto::Frame>(sent);
  Status s = reply.status();
  if (s.ok() &&
      (reply->header.type != static_cast<uint16_t>(MsgType::kReply) || reply->header.seq != seq)) {
    s = Status::InvalidArgument("kvtier serve answered out of step (type " +
                                std::to_string(reply->header.type) + ", seq " +
                                std::to_string(reply->header.seq) + ")");
  }
  if (!s.ok()) {
    Detach(std::string(proto::MsgTypeName(static_cast<uint16_t>(type))) + ": " + s.message());
    MutexLock lock(&mu_);
    stats_.failed_calls++;
    return Status::Unavailable(s.message());
  }
  *reply_payload = std::move(reply->payload);
  MutexLock lock(&mu_);
  if (attached_ && epoch_ == epoch) idle_.push_back(std::move(fd));
  return Status::Ok();
}

}  // namespace kvtier::client

#include "events/event_publisher.h"

#include <time.h>

#include <chrono>
#include <zmq.hpp>

#include "core/log.h"

namespace kvtier {

namespace {

constexpr int64_t kEndSeq = -1;

std::string SeqBytes(int64_t seq) {
  std::string b(8, '\0');
  const uint64_t u = static_cast<uint64_t>(seq);
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(u >> (56 - 8 * i));
  return b;
}

double NowSeconds() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// vLLM's rule (ZmqEventPublisher._is_bind_endpoint), plus port 0: bind.
bool IsBindEndpoint(const std::string& endpoint) {
  if (endpoint.find('*') != std::string::npos || endpoint.find("::") != std::string::npos ||
      endpoint.starts_with("ipc://") || endpoint.starts_with("inproc://")) {
    return true;
  }
  return endpoint.size() > 2 && endpoint.ends_with(":0");
}

std::string LastEndpoint(zmq::socket_t& s) { return s.get(zmq::sockopt::last_endpoint); }

}  // namespace

struct EventPublisher::Sockets {
  zmq::context_t ctx{1};
  zmq::socket_t pub{ctx, zmq::socket_type::pub};
  std::unique_ptr<zmq::socket_t> replay;
};

Status EventPublisher::Config::Validate() const {
  if (endpoint.empty()) {
    return Status::InvalidArgument(
        "events.endpoint is empty; give a ZMQ address such as tcp://*:5557 (bind) or "
        "tcp://router-host:5557 (connect), or leave events off");
  }
  if (queue_events == 0) return Status::InvalidArgument("events.queue_events must be at least 1");
  if (max_batch_events == 0) return Status::InvalidArgument("max_batch_events must be at least 1");
  if (flush_interval_ms == 0) {
    return Status::InvalidArgument("flush_interval_ms must be at least 1");
  }
  if (data_parallel_rank < 0) {
    return Status::InvalidArgument("data_parallel_rank must be 0 or more");
  }
  if (send_hwm < 0) return Status::InvalidArgument("send_hwm must be 0 (none) or more");
  return Status::Ok();
}

EventPublisher::EventPublisher(const Config& config) : config_(config) {}

Result<std::unique_ptr<EventPublisher>> EventPublisher::Start(const Config& config) {
  KVTIER_RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<EventPublisher> p(new EventPublisher(config));
  auto sockets = std::make_unique<Sockets>();
  try {
    sockets->pub.set(zmq::sockopt::sndhwm, config.send_hwm);
    sockets->pub.set(zmq::sockopt::linger, 200);
    if (IsBindEndpoint(config.endpoint)) {
      sockets->pub.bind(config.endpoint);
      p->endpoint_ = LastEndpoint(sockets->pub);
    } else {
      sockets->pub.connect(config.endpoint);
      p->endpoint_ = config.endpoint;
    }
  } catch (const zmq::error_t& e) {
    return Status::InvalidArgument(
        "events.endpoint = '" + config.endpoint + "' cannot be " +
        (IsBindEndpoint(config.endpoint) ? "bound" : "connected to") + ": " + e.what() +
        "; give tcp://*:PORT or tcp://HOST:0 to bind, tcp://HOST:PORT to connect to a "
        "subscriber that binds, or ipc://PATH");
  }
  if (!config.replay_endpoint.empty()) {
    try {
      sockets->replay = std::make_unique<zmq::socket_t>(sockets->ctx, zmq::socket_type::router);
      sockets->replay->set(zmq::sockopt::linger, 0);
      sockets->replay->bind(config.replay_endpoint);
      p->replay_endpoint_ = LastEndpoint(*sockets->replay);
    } catch (const zmq::error_t& e) {
      return Status::InvalidArgument("events.replay_endpoint = '" + config.replay_endpoint +
                                     "' cannot be bound: " + e.what() +
                                     "; give a free tcp://HOST:PORT (port 0: any) or ipc://PATH");
    }
  }
  p->sockets_ = std::move(sockets);
  {
    MutexLock lock(&p->mu_);
    p->queue_.push_back(WireEvent{WireEvent::Type::kAllBlocksCleared, {}});
  }
  p->thread_ = std::thread([raw = p.get()] { raw->Run(); });
  return p;
}

EventPublisher::~EventPublisher() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  // The sockets close with their linger (PUB: 200 ms to hand queued messages to the kernel).
  sockets_.reset();
}

void EventPublisher::Publish(std::span<const KvEvent> events) {
  if (events.empty()) return;
  size_t taken = 0;
  {
    MutexLock lock(&mu_);
    const size_t room =
        queue_.size() >= config_.queue_events ? 0 : config_.queue_events - queue_.size();
    taken = std::min(room, events.size());
    for (size_t i = 0; i < taken; ++i) {
      queue_.push_back(WireEvent{WireEvent::Type::kBlock, events[i]});
    }
  }
  if (taken < events.size()) {
    dropped_.fetch_add(events.size() - taken, std::memory_order_relaxed);
  }
}

void EventPublisher::PublishAllBlocksCleared() {
  MutexLock lock(&mu_);
  if (queue_.size() >= config_.queue_events) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  queue_.push_back(WireEvent{WireEvent::Type::kAllBlocksCleared, {}});
}

EventPublisher::Stats EventPublisher::stats() const {
  Stats s;
  s.published_events = published_.load();
  s.dropped_events = dropped_.load();
  s.batches = batches_.load();
  s.send_failures = send_failures_.load();
  s.replay_requests = replay_requests_.load();
  s.replayed_batches = replayed_.load();
  s.bad_replay_requests = bad_replays_.load();
  return s;
}

void EventPublisher::Run() {
  const auto interval = std::chrono::milliseconds(config_.flush_interval_ms);
  std::vector<WireEvent> taken;
  while (true) {
    if (sockets_->replay) {
      zmq::pollitem_t item{static_cast<void*>(*sockets_->replay), 0, ZMQ_POLLIN, 0};
      try {
        zmq::poll(&item, 1, interval);
      } catch (const zmq::error_t& e) {
        KVTIER_LOG(kWarn) << "events: replay poll: " << e.what();
      }
      if (item.revents & ZMQ_POLLIN) ServeReplay();
    } else {
      std::this_thread::sleep_for(interval);
    }
    bool stop = false;
    {
      MutexLock lock(&mu_);
      taken.swap(queue_);
      stop = stopping_;
    }
    if (!taken.empty()) SendBatches(taken);
    taken.clear();
    if (stop) {
      // Whatever was queued before stopping_ was seen is sent; Publish after that is a race
      // the owner must not run (the manager stops publishing before it destroys us).
      MutexLock lock(&mu_);
      taken.swap(queue_);
      if (taken.empty()) break;
    }
  }
}

void EventPublisher::SendBatches(std::vector<WireEvent>& events) {
  const std::span<const WireEvent> all(events);
  for (size_t i = 0; i < all.size(); i += config_.max_batch_events) {
    const auto part = all.subspan(i, std::min<size_t>(config_.max_batch_events, all.size() - i));
    std::string payload = EncodeEventBatch(NowSeconds(), part, config_.data_parallel_rank);
    const uint64_t seq = next_seq_++;
    const std::string seq_bytes = SeqBytes(static_cast<int64_t>(seq));
    try {
      // PUB never blocks: a subscriber at its high-water mark loses this message (libzmq).
      sockets_->pub.send(zmq::buffer(config_.topic), zmq::send_flags::sndmore);
      sockets_->pub.send(zmq::buffer(seq_bytes), zmq::send_flags::sndmore);
      sockets_->pub.send(zmq::buffer(payload), zmq::send_flags::dontwait);
    } catch (const zmq::error_t& e) {
      send_failures_.fetch_add(1, std::memory_order_relaxed);
      KVTIER_LOG(kWarn) << "events: send of batch " << seq << ": " << e.what();
    }
    size_t n = 0;
    for (const WireEvent& w : part) n += w.type == WireEvent::Type::kBlock ? 1 : 0;
    published_.fetch_add(n, std::memory_order_relaxed);
    batches_.fetch_add(1, std::memory_order_relaxed);
    if (config_.replay_batches > 0) {
      if (replay_.size() >= config_.replay_batches) replay_.pop_front();
      replay_.emplace_back(seq, std::move(payload));
    }
  }
}

void EventPublisher::ServeReplay() {
  zmq::socket_t& r = *sockets_->replay;
  // Every request waiting now; each is answered in full before the next.
  while (true) {
    std::vector<zmq::message_t> frames;
    try {
      zmq::message_t m;
      if (!r.recv(m, zmq::recv_flags::dontwait)) return;
      frames.push_back(std::move(m));
      while (frames.back().more()) {
        zmq::message_t more;
        (void)r.recv(more, zmq::recv_flags::none);  // the rest of a multipart message is there
        frames.push_back(std::move(more));
      }
    } catch (const zmq::error_t& e) {
      KVTIER_LOG(kWarn) << "events: replay receive: " << e.what();
      return;
    }
    replay_requests_.fetch_add(1, std::memory_order_relaxed);
    // (identity, empty delimiter, 8-byte start seq): what a REQ or a DEALER sends.
    const bool valid = frames.size() == 3 && frames[1].size() == 0 && frames[2].size() == 8;
    uint64_t start = 0;
    if (valid) {
      const auto* b = static_cast<const unsigned char*>(frames[2].data());
      for (int i = 0; i < 8; ++i) start = (start << 8) | b[i];
    } else {
      bad_replays_.fetch_add(1, std::memory_order_relaxed);
      KVTIER_LOG(kWarn) << "events: replay request of " << frames.size()
                        << " frames ignored; send (empty frame, 8-byte big-endian start seq)";
      if (frames.size() < 2) continue;  // no identity: nowhere to answer
    }
    const std::string identity(static_cast<const char*>(frames[0].data()), frames[0].size());
    try {
      if (valid) {
        for (const auto& [seq, payload] : replay_) {
          if (seq < start) continue;
          const std::string seq_bytes = SeqBytes(static_cast<int64_t>(seq));
          r.send(zmq::buffer(identity), zmq::send_flags::sndmore);
          r.send(zmq::str_buffer(""), zmq::send_flags::sndmore);
          r.send(zmq::buffer(config_.topic), zmq::send_flags::sndmore);
          r.send(zmq::buffer(seq_bytes), zmq::send_flags::sndmore);
          r.send(zmq::buffer(payload), zmq::send_flags::dontwait);
          replayed_.fetch_add(1, std::memory_order_relaxed);
        }
      }
      const std::string end = SeqBytes(kEndSeq);
      r.send(zmq::buffer(identity), zmq::send_flags::sndmore);
      r.send(zmq::str_buffer(""), zmq::send_flags::sndmore);
      r.send(zmq::str_buffer(""), zmq::send_flags::sndmore);
      r.send(zmq::buffer(end), zmq::send_flags::sndmore);
      r.send(zmq::str_buffer(""), zmq::send_flags::dontwait);
    } catch (const zmq::error_t& e) {
      KVTIER_LOG(kWarn) << "events: replay answer: " << e.what();
    }
  }
}

}  // namespace kvtier

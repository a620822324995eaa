// ManagerEvents: see manager_events.h.
#include "manager/manager_events.h"

#include <time.h>

#include <string>
#include <utility>

#include "core/log.h"
#include "events/event_publisher.h"

namespace kvtier {

namespace {

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace

const char* KvEventKindName(KvEvent::Kind kind) {
  return kind == KvEvent::Kind::kStored ? "stored" : "removed";
}

ManagerEvents::ManagerEvents(uint32_t tokens_per_block, const HasherCache* hashers)
    : tpb_(tokens_per_block), hashers_(hashers) {}

// The publisher sends what is queued and stops (nothing emits any more: see the header).
ManagerEvents::~ManagerEvents() = default;

Status ManagerEvents::StartPublisher(const EventOptions& ev) {
  // EventOptions::Validate refused a replay endpoint without a stream.
  if (ev.endpoint.empty()) return Status::Ok();
  EventPublisher::Config pc;
  pc.endpoint = ev.endpoint;
  pc.replay_endpoint = ev.replay_endpoint;
  pc.topic = ev.topic;
  pc.queue_events = ev.queue_events;
  pc.replay_batches = ev.replay_batches;
  pc.replay_bytes = ev.replay_bytes;
  pc.data_parallel_rank = static_cast<int64_t>(ev.data_parallel_rank);
  KVTIER_ASSIGN_OR_RETURN(publisher_, EventPublisher::Start(pc));
  wanted_.store(true);
  KVTIER_LOG(kInfo) << "events: publishing on " << publisher_->endpoint()
                    << (publisher_->replay_endpoint().empty()
                            ? std::string()
                            : ", replay on " + publisher_->replay_endpoint());
  return Status::Ok();
}

void ManagerEvents::SetRecovered(std::vector<KvEvent> events) {
  // The wire hears of them too, right after its AllBlocksCleared.
  if (publisher_) publisher_->Publish(std::span<const KvEvent>(events));
  MutexLock lock(&mu_);
  recovered_ = std::move(events);
}

KvEvent ManagerEvents::Event(KvEvent::Kind kind, const BlockKey& key, const BlockKey& parent,
                             TierId tier) {
  KvEvent e;
  e.kind = kind;
  e.key = key;
  e.parent = parent;
  e.tier = tier;
  e.time_ns = NowNs();
  return e;
}

KvEvent ManagerEvents::Stored(const BlockKey& key, const BlockKey& parent, TierId tier,
                              uint64_t namespace_id, std::span<const TokenId> tokens,
                              bool always) const {
  KvEvent e = Event(KvEvent::Kind::kStored, key, parent, tier);
  if (!always && !wanted()) return e;
  e.block_size = tpb_;
  // namespace_id is the root key's first half (a request's namespace id): a first block's parent.
  e.parent_is_root = parent.hi == namespace_id;
  e.token_ids.assign(tokens.begin(), tokens.end());
  if (auto names = hashers_->Names(namespace_id)) {
    e.lora_name = std::move(names->first);
    e.cache_salt = std::move(names->second);
  } else {
    e.namespace_known = false;
  }
  return e;
}

void ManagerEvents::Emit(std::vector<KvEvent> events) {
  if (events.empty()) return;
  emitted_.fetch_add(events.size(), std::memory_order_relaxed);
  std::vector<KvEventCallback> subs;
  {
    MutexLock lock(&mu_);
    subs = subscribers_;
  }
  for (const auto& cb : subs) cb(events);
  if (publisher_) publisher_->Publish(std::move(events));  // queued or dropped; never waits
}

void ManagerEvents::Subscribe(KvEventCallback callback) {
  std::vector<KvEvent> replay;
  wanted_.store(true);
  {
    MutexLock lock(&mu_);
    subscribers_.push_back(callback);
    // The first subscriber learns of the blocks G3 recovered at start-up.
    replay.swap(recovered_);
  }
  if (!replay.empty()) callback(replay);
}

void ManagerEvents::AddPublisherStats(ManagerStats* s) const {
  if (!publisher_) return;
  const EventPublisher::Stats ps = publisher_->stats();
  s->events_published = ps.published_events;
  s->events_publish_dropped = ps.dropped_events;
  s->event_batches_published = ps.batches;
  s->event_replay_requests = ps.replay_requests;
}

}  // namespace kvtier

// EventPublisher: kvtier's KV events on the wire, as vLLM's ZmqEventPublisher sends them, so
// that routers which read vLLM's stream (Dynamo, llm-d, kvtier's own) read kvtier's unchanged.
//
//  - PUB socket: one multipart message per batch: (topic, 8-byte big-endian seq, payload), the
//    payload a msgpack KVEventBatch (events/event_wire.h). seq starts at 0 and grows by one per
//    batch. The first batch holds AllBlocksCleared: a subscriber learns the worker (re)started.
//  - ROUTER replay socket (optional): a client sends (empty frame, 8-byte big-endian start
//    seq), as a DEALER or REQ does, and receives one (empty, topic, seq, payload) message per
//    buffered batch with seq >= start, then (empty, "", END_SEQ = -1 as 8 bytes, "").
//
// Invariants:
//  - Publish never blocks on I/O nor on a subscriber: it appends to a bounded queue under a
//    mutex, or drops the events (counted) when the queue is full. Only the publisher's thread
//    touches the sockets.
//  - The replay buffer holds the last `replay_batches` batches sent, in seq order.
//  - PUB drops a message for a subscriber whose own queue (ZMQ high-water mark) is full, inside
//    libzmq, without telling us (as vLLM's publisher): that subscriber sees a gap in seq and
//    fills it from the replay socket. Every other subscriber is unaffected.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/mutex.h"
#include "events/event_wire.h"
#include "kvtier/status.h"

namespace kvtier {

class EventPublisher {
 public:
  struct Config {
    // PUB address. Bound when it has a wildcard host ("*", "::"), is ipc:// or inproc://, or
    // has port 0 (the OS picks one; see endpoint()); connected to otherwise (a subscriber that
    // binds, as llm-d's does). vLLM's rule, plus port 0.
    std::string endpoint;
    std::string replay_endpoint;       // ROUTER address, always bound; empty: no replay socket
    std::string topic;                 // the first frame of every message; may be empty
    uint32_t queue_events = 100000;    // events waiting for the thread at most; beyond: dropped
    uint32_t replay_batches = 10000;   // batches kept for replay (0: replay answers END_SEQ only)
    uint32_t max_batch_events = 1024;  // events per batch at most
    uint32_t flush_interval_ms = 2;    // how long events wait to be batched at most
    int64_t data_parallel_rank = 0;    // written in every batch (vLLM's data_parallel_rank)
    int send_hwm = 100000;             // PUB high-water mark, messages per subscriber

    // InvalidArgument (naming the field and what is accepted) for an empty endpoint, a zero
    // queue, batch size or flush interval, or a negative data_parallel_rank.
    Status Validate() const;
  };

  struct Stats {
    uint64_t published_events = 0;  // events sent in a batch (a chain counts each block)
    uint64_t dropped_events = 0;    // events dropped because the queue was full
    uint64_t batches = 0;           // batches sent (the next seq)
    uint64_t send_failures = 0;     // batches libzmq refused (kept for replay all the same)
    uint64_t replay_requests = 0;
    uint64_t replayed_batches = 0;
    uint64_t bad_replay_requests = 0;  // not (identity, empty, 8-byte seq): answered END_SEQ
  };

  // Validates, opens the sockets, queues AllBlocksCleared as batch 0 and starts the thread.
  // InvalidArgument naming the endpoint and libzmq's reason when a socket cannot bind or
  // connect (bad syntax, port in use, unknown host).
  static Result<std::unique_ptr<EventPublisher>> Start(const Config& config);

  // Sends what is queued (waiting at most ~1 s), stops the thread, closes the sockets.
  ~EventPublisher();
  EventPublisher(const EventPublisher&) = delete;
  EventPublisher& operator=(const EventPublisher&) = delete;

  // Queues `events` for the next batch, in order. Thread-safe; never blocks on a subscriber.
  // When the queue cannot take them all, the ones that do not fit are dropped and counted.
  void Publish(std::span<const KvEvent> events) EXCLUDES(mu_);
  // Queues AllBlocksCleared (e.g. after the tiers were wiped). Dropped like an event when full.
  void PublishAllBlocksCleared() EXCLUDES(mu_);

  Stats stats() const;
  // The PUB and replay addresses as bound or connected (tcp://127.0.0.1:0 becomes the port the
  // OS chose).
  const std::string& endpoint() const { return endpoint_; }
  const std::string& replay_endpoint() const { return replay_endpoint_; }

 private:
  struct Sockets;
  explicit EventPublisher(const Config& config);
  void Run();
  // Sends `events` as batches of at most max_batch_events; appends each to the replay buffer.
  void SendBatches(std::vector<WireEvent>& events);
  void ServeReplay();

  const Config config_;
  std::string endpoint_, replay_endpoint_;
  std::unique_ptr<Sockets> sockets_;  // the thread's alone once it runs

  Mutex mu_;
  std::vector<WireEvent> queue_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;

  std::deque<std::pair<uint64_t, std::string>> replay_;  // the thread's: (seq, payload)
  uint64_t next_seq_ = 0;                                // the thread's

  std::atomic<uint64_t> published_{0}, dropped_{0}, batches_{0}, send_failures_{0};
  std::atomic<uint64_t> replay_requests_{0}, replayed_{0}, bad_replays_{0};
  std::thread thread_;
};

}  // namespace kvtier

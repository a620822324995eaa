// kvtier bench events: KV events through the EventPublisher (queue, batching, msgpack encoding,
// PUB over TCP on 127.0.0.1, a SUB that receives every batch) against the raw limit of the same
// machine in the same run: a plain ZMQ PUB loop sending already-encoded batches of the same size
// to the same kind of SUB.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "bench/bench_timer.h"
#include "cli/commands.h"
#include "cli/json_writer.h"
#include "events/event_publisher.h"
#include "events/event_wire.h"
#include "kvtier/layout.h"

namespace kvtier::cli {
namespace {

using std::chrono::milliseconds;

// Receives and counts messages on its own thread until stopped.
class Sink {
 public:
  Sink(zmq::context_t& ctx, const std::string& endpoint) : sub_(ctx, zmq::socket_type::sub) {
    sub_.set(zmq::sockopt::subscribe, "");
    sub_.set(zmq::sockopt::rcvhwm, 0);
    sub_.connect(endpoint);
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        zmq::pollitem_t item{static_cast<void*>(sub_), 0, ZMQ_POLLIN, 0};
        if (zmq::poll(&item, 1, milliseconds(20)) <= 0) continue;
        zmq::message_t m;
        while (sub_.recv(m, zmq::recv_flags::dontwait)) {
          if (!m.more()) messages_.fetch_add(1);
        }
      }
    });
  }
  ~Sink() {
    stop_.store(true);
    thread_.join();
  }
  uint64_t messages() const { return messages_.load(); }

 private:
  zmq::socket_t sub_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> messages_{0};
  std::thread thread_;
};

// Waits until `sink` has `want` messages, or 3 s pass without progress. True when all came.
bool WaitFor(const Sink& sink, uint64_t want) {
  uint64_t last = sink.messages();
  auto idle_since = std::chrono::steady_clock::now();
  while (sink.messages() < want) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (sink.messages() != last) {
      last = sink.messages();
      idle_since = std::chrono::steady_clock::now();
    } else if (std::chrono::steady_clock::now() - idle_since > std::chrono::seconds(3)) {
      return false;
    }
  }
  return true;
}

KvEvent Store(uint64_t i, uint32_t tokens) {
  KvEvent e;
  e.kind = KvEvent::Kind::kStored;
  e.key = BlockKey{i, ~i};
  e.parent = BlockKey{i - 1, ~(i - 1)};
  e.tier = kTierG2;
  e.block_size = tokens;
  e.token_ids.assign(tokens, static_cast<TokenId>(i));
  e.parent_is_root = i % 8 == 0;  // chains of 8 blocks, as a request commits them
  return e;
}

}  // namespace

int RunBenchEvents(const CliArgs& args) {
  if (args.Has("help")) {
    std::printf(
        "usage: kvtier bench events [--events N] [--tokens T] [--per-call C] [--json]\n"
        "  kvtier: N stores of T tokens each, C per Publish call, through the EventPublisher\n"
        "  (queue, batches, msgpack, PUB on tcp://127.0.0.1) until a SUB has every batch.\n"
        "  raw: a plain ZMQ PUB loop sending the same number of already-encoded batches of the\n"
        "  same size to a SUB. ratio = kvtier events/s / raw events/s. Also: msgpack encoding\n"
        "  alone of the same events (where the publisher's time goes).\n"
        "  --events (200000)  --tokens (16)  --per-call (8)\n");
    return 0;
  }
  if (Status s = args.CheckKnown({"json", "help", "events", "tokens", "per-call"}); !s.ok()) {
    return UsageError(s);
  }
  auto events = args.GetUint("events", 200000);
  auto tokens = args.GetUint("tokens", 16);
  auto per_call = args.GetUint("per-call", 8);
  if (!events.ok()) return UsageError(events.status());
  if (!tokens.ok()) return UsageError(tokens.status());
  if (!per_call.ok()) return UsageError(per_call.status());
  if (*events < 1000 || *events > 100000000) {
    return UsageError(Status::InvalidArgument("--events must be in 1000..100000000"));
  }
  if (*tokens < 1 || *tokens > KvLayout::kMaxTokensPerBlock) {
    return UsageError(Status::InvalidArgument("--tokens must be in 1.." +
                                              std::to_string(KvLayout::kMaxTokensPerBlock) +
                                              " (a block's tokens)"));
  }
  if (*per_call < 1 || *per_call > 4096) {
    return UsageError(Status::InvalidArgument("--per-call must be in 1..4096"));
  }
  const uint64_t n = *events;
  const uint32_t t = static_cast<uint32_t>(*tokens);
  std::vector<KvEvent> all;
  all.reserve(n);
  for (uint64_t i = 0; i < n; ++i) all.push_back(Store(i + 1, t));

  // ---- kvtier: EventPublisher ----
  EventPublisher::Config pc;
  pc.endpoint = "tcp://127.0.0.1:0";
  pc.queue_events = static_cast<uint32_t>(std::min<uint64_t>(n + 16, 1u << 24));
  pc.replay_batches = 1000;
  pc.send_hwm = 0;  // no limit: the bench measures throughput, not drops
  auto pub = EventPublisher::Start(pc);
  if (!pub.ok()) return Failure(pub.status());
  zmq::context_t ctx;
  uint64_t batches_before = 0;
  double kvtier_s = 0, publish_s = 0;
  bool kvtier_all = false;
  {
    Sink sink(ctx, (*pub)->endpoint());
    // Join: probes until the SUB hears one.
    while (sink.messages() == 0) {
      (*pub)->Publish(std::span<const KvEvent>(all.data(), 1));
      std::this_thread::sleep_for(milliseconds(10));
    }
    std::this_thread::sleep_for(milliseconds(50));
    batches_before = (*pub)->stats().batches;
    const uint64_t accounted_before =
        (*pub)->stats().published_events + (*pub)->stats().dropped_events;
    const uint64_t received_before = sink.messages();
    // The calls' vectors are made beforehand and handed over, as the manager hands its own.
    std::vector<std::vector<KvEvent>> calls;
    for (uint64_t i = 0; i < n; i += *per_call) {
      const size_t k = static_cast<size_t>(std::min<uint64_t>(*per_call, n - i));
      calls.emplace_back(all.begin() + static_cast<ptrdiff_t>(i),
                         all.begin() + static_cast<ptrdiff_t>(i + k));
    }
    Stopwatch w;
    for (auto& call : calls) (*pub)->Publish(std::move(call));
    publish_s = w.Seconds();
    // Every event is in a sent batch (or dropped) once the counters cover them.
    while ((*pub)->stats().published_events + (*pub)->stats().dropped_events <
               accounted_before + n &&
           w.Seconds() < 120) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    const uint64_t batches = (*pub)->stats().batches - batches_before;
    kvtier_all = WaitFor(sink, received_before + batches);
    kvtier_s = w.Seconds();
  }
  const EventPublisher::Stats ps = (*pub)->stats();
  const uint64_t kvtier_batches = ps.batches - batches_before;

  // ---- raw: a PUB loop of pre-encoded batches of the same size ----
  const uint64_t raw_batches = std::max<uint64_t>(kvtier_batches, 1);
  const uint64_t per_batch = (n + raw_batches - 1) / raw_batches;
  std::vector<WireEvent> sample;
  for (uint64_t i = 0; i < std::min<uint64_t>(per_batch, n); ++i) {
    sample.push_back(WireEvent{WireEvent::Type::kBlock, all[i]});
  }
  const std::string payload = EncodeEventBatch(1.0, sample, 0);
  double raw_s = 0;
  bool raw_all = false;
  {
    zmq::socket_t raw(ctx, zmq::socket_type::pub);
    raw.set(zmq::sockopt::sndhwm, 0);
    raw.set(zmq::sockopt::linger, 0);
    raw.bind("tcp://127.0.0.1:0");
    Sink sink(ctx, raw.get(zmq::sockopt::last_endpoint));
    const std::string seq(8, '\0');
    while (sink.messages() == 0) {
      raw.send(zmq::str_buffer(""), zmq::send_flags::sndmore);
      raw.send(zmq::buffer(seq), zmq::send_flags::sndmore);
      raw.send(zmq::buffer(payload));
      std::this_thread::sleep_for(milliseconds(10));
    }
    std::this_thread::sleep_for(milliseconds(50));
    const uint64_t before = sink.messages();
    Stopwatch w;
    for (uint64_t b = 0; b < raw_batches; ++b) {
      raw.send(zmq::str_buffer(""), zmq::send_flags::sndmore);
      raw.send(zmq::buffer(seq), zmq::send_flags::sndmore);
      raw.send(zmq::buffer(payload));
    }
    raw_all = WaitFor(sink, before + raw_batches);
    raw_s = w.Seconds();
  }
  // Where the time goes: msgpack encoding alone of the same events, in batches of the same size.
  double encode_s = 0;
  {
    std::vector<WireEvent> wire;
    wire.reserve(n);
    for (const KvEvent& e : all) wire.push_back(WireEvent{WireEvent::Type::kBlock, e});
    const std::span<const WireEvent> span(wire);
    size_t bytes = 0;
    Stopwatch w;
    for (uint64_t i = 0; i < n; i += per_batch) {
      bytes +=
          EncodeEventBatch(1.0, span.subspan(i, std::min<uint64_t>(per_batch, n - i)), 0).size();
    }
    encode_s = w.Seconds();
    if (bytes == 0) return Failure(Status::Internal("encoded nothing"));
  }
  const double encode_eps = static_cast<double>(n) / encode_s;
  const double kvtier_eps = static_cast<double>(n) / kvtier_s;
  const double raw_eps = static_cast<double>(raw_batches * per_batch) / raw_s;
  const double encode_bytes = static_cast<double>(payload.size());
  if (args.Has("json")) {
    JsonObject o;
    o.Add("events", n)
        .Add("tokens_per_event", static_cast<uint64_t>(t))
        .Add("batches", kvtier_batches)
        .Add("batch_bytes", encode_bytes)
        .Add("kvtier_events_per_s", kvtier_eps)
        .Add("publish_call_ns_per_event", publish_s * 1e9 / static_cast<double>(n))
        .Add("raw_zmq_events_per_s", raw_eps)
        .Add("encode_only_events_per_s", encode_eps)
        .Add("ratio", kvtier_eps / raw_eps)
        .Add("dropped_events", ps.dropped_events)
        .Add("all_received", kvtier_all && raw_all);
    std::printf("%s\n", o.Str().c_str());
  } else {
    std::printf("bench events: %llu stores of %u tokens, %llu per Publish call\n",
                static_cast<unsigned long long>(n), t, static_cast<unsigned long long>(*per_call));
    std::printf(
        "  kvtier publisher  %12.0f events/s  (%llu batches of ~%.0f bytes; Publish %.0f "
        "ns/event; %llu dropped)\n",
        kvtier_eps, static_cast<unsigned long long>(kvtier_batches), encode_bytes,
        publish_s * 1e9 / static_cast<double>(n),
        static_cast<unsigned long long>(ps.dropped_events));
    std::printf("  raw ZMQ PUB loop  %12.0f events/s  (same batches, pre-encoded)\n", raw_eps);
    std::printf("  msgpack encoding  %12.0f events/s  (encoding alone, one thread)\n", encode_eps);
    std::printf("  ratio             %12.3f%s\n", kvtier_eps / raw_eps,
                kvtier_all && raw_all ? "" : "  (a SUB missed batches: numbers are lower bounds)");
  }
  return 0;
}

}  // namespace kvtier::cli

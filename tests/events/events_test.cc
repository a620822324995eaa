// The KV event stream on the wire (src/events): vLLM's format byte for byte, real PUB/SUB and
// ROUTER/DEALER sockets on 127.0.0.1, replay, a late subscriber, a stalled one, drops, bad
// addresses; and the manager feeding it.
#include <msgpack.hpp>

#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include <gtest/gtest.h>

#include "events/event_publisher.h"
#include "events/event_wire.h"
#include "kvtier/connector.h"
#include "manager_test_util.h"

#if defined(__SANITIZE_THREAD__)
// libzmq (Debian's, not built with -fsanitize=thread) hands message buffers between its I/O
// thread and the socket's owner through lock-free pipes that TSan cannot see: every report with
// a libzmq frame is that (21 in a run of this file, all of them). Races between kvtier's own
// frames are still reported.
extern "C" const char* __tsan_default_suppressions() { return "race:libzmq.so\n"; }
#endif

namespace kvtier {
namespace {

using Clock = std::chrono::steady_clock;

BlockKey Key(uint8_t b) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | b;
  return BlockKey{v, v};
}

KvEvent Stored(BlockKey key, BlockKey parent, TierId tier, std::vector<TokenId> tokens,
               bool root = false, std::string lora = "", std::string salt = "") {
  KvEvent e;
  e.kind = KvEvent::Kind::kStored;
  e.key = key;
  e.parent = parent;
  e.tier = tier;
  e.block_size = static_cast<uint32_t>(tokens.size());
  e.token_ids = std::move(tokens);
  e.parent_is_root = root;
  e.lora_name = std::move(lora);
  e.cache_salt = std::move(salt);
  return e;
}

KvEvent Removed(BlockKey key, TierId tier) {
  KvEvent e;
  e.kind = KvEvent::Kind::kRemoved;
  e.key = key;
  e.tier = tier;
  return e;
}

std::string Hex(const std::string& bytes) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += d[c >> 4];
    out += d[c & 15];
  }
  return out;
}

uint64_t SeqOf(const std::string& b) {
  uint64_t v = 0;
  for (unsigned char c : b) v = (v << 8) | c;
  return v;
}

std::string SeqBytes(uint64_t seq) {
  std::string b(8, '\0');
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(seq >> (56 - 8 * i));
  return b;
}

// One wire message: (topic, seq, payload).
struct Message {
  std::string topic;
  uint64_t seq = 0;
  std::string payload;
};

std::string Str(const zmq::message_t& m) { return std::string(m.data<char>(), m.size()); }

class Subscriber {
 public:
  Subscriber(zmq::context_t& ctx, const std::string& endpoint, const std::string& topic = "")
      : sub_(ctx, zmq::socket_type::sub) {
    sub_.set(zmq::sockopt::subscribe, topic);
    sub_.connect(endpoint);
  }
  std::optional<Message> Recv(std::chrono::milliseconds timeout) {
    zmq::pollitem_t item{static_cast<void*>(sub_), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, timeout) <= 0) return std::nullopt;
    std::vector<zmq::message_t> frames;
    zmq::message_t m;
    (void)sub_.recv(m);
    frames.push_back(std::move(m));
    while (frames.back().more()) {
      zmq::message_t more;
      (void)sub_.recv(more);
      frames.push_back(std::move(more));
    }
    EXPECT_EQ(frames.size(), 3u);
    if (frames.size() != 3) return std::nullopt;
    EXPECT_EQ(frames[1].size(), 8u);
    return Message{Str(frames[0]), SeqOf(Str(frames[1])), Str(frames[2])};
  }
  zmq::socket_t& socket() { return sub_; }

 private:
  zmq::socket_t sub_;
};

// Asks the replay socket for every batch from `start`; the answers up to END_SEQ.
std::vector<Message> Replay(zmq::context_t& ctx, const std::string& endpoint, uint64_t start,
                            bool* saw_end) {
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(endpoint);
  dealer.send(zmq::str_buffer(""), zmq::send_flags::sndmore);
  dealer.send(zmq::buffer(SeqBytes(start)));
  std::vector<Message> out;
  *saw_end = false;
  while (true) {
    zmq::pollitem_t item{static_cast<void*>(dealer), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::milliseconds(5000)) <= 0) break;
    std::vector<zmq::message_t> frames;
    zmq::message_t m;
    (void)dealer.recv(m);
    frames.push_back(std::move(m));
    while (frames.back().more()) {
      zmq::message_t more;
      (void)dealer.recv(more);
      frames.push_back(std::move(more));
    }
    EXPECT_EQ(frames.size(), 4u);  // empty delimiter, topic, seq, payload
    if (frames.size() != 4) break;
    EXPECT_EQ(frames[0].size(), 0u);
    if (Str(frames[2]) == std::string(8, '\xff')) {
      EXPECT_EQ(frames[1].size(), 0u);
      EXPECT_EQ(frames[3].size(), 0u);
      *saw_end = true;
      break;
    }
    out.push_back(Message{Str(frames[1]), SeqOf(Str(frames[2])), Str(frames[3])});
  }
  return out;
}

const msgpack::object* Field(const msgpack::object& map, const std::string& name) {
  if (map.type != msgpack::type::MAP) return nullptr;
  for (uint32_t i = 0; i < map.via.map.size; ++i) {
    const auto& kv = map.via.map.ptr[i];
    if (kv.key.type == msgpack::type::STR && kv.key.as<std::string>() == name) return &kv.val;
  }
  return nullptr;
}

// One decoded event, flattened: type, tier-ish fields and one hash per block.
struct Decoded {
  std::string type;
  std::vector<std::string> hashes;
  std::optional<std::string> parent;  // BlockStored: nullopt = nil
  std::vector<uint32_t> tokens;
  std::string medium, locality, ownership;
};

std::vector<Decoded> Decode(const std::string& payload, double* ts = nullptr,
                            int64_t* rank = nullptr) {
  msgpack::object_handle oh = msgpack::unpack(payload.data(), payload.size());
  const msgpack::object& batch = oh.get();
  EXPECT_EQ(batch.type, msgpack::type::ARRAY);
  EXPECT_EQ(batch.via.array.size, 3u);
  if (ts) *ts = batch.via.array.ptr[0].as<double>();
  if (rank) *rank = batch.via.array.ptr[2].as<int64_t>();
  std::vector<Decoded> out;
  const msgpack::object& events = batch.via.array.ptr[1];
  for (uint32_t i = 0; i < events.via.array.size; ++i) {
    const msgpack::object& e = events.via.array.ptr[i];
    Decoded d;
    d.type = Field(e, "type")->as<std::string>();
    if (const auto* h = Field(e, "block_hashes")) {
      for (uint32_t j = 0; j < h->via.array.size; ++j) {
        const auto& b = h->via.array.ptr[j];
        EXPECT_EQ(b.type, msgpack::type::BIN);
        d.hashes.emplace_back(b.via.bin.ptr, b.via.bin.size);
      }
    }
    if (const auto* p = Field(e, "parent_block_hash"); p && p->type == msgpack::type::BIN) {
      d.parent = std::string(p->via.bin.ptr, p->via.bin.size);
    }
    if (const auto* t = Field(e, "token_ids")) d.tokens = t->as<std::vector<uint32_t>>();
    if (const auto* m = Field(e, "medium")) d.medium = m->as<std::string>();
    if (const auto* l = Field(e, "locality")) d.locality = l->as<std::string>();
    if (const auto* o = Field(e, "ownership")) d.ownership = o->as<std::string>();
    out.push_back(std::move(d));
  }
  return out;
}

EventPublisher::Config LocalConfig(bool replay = true) {
  EventPublisher::Config c;
  c.endpoint = "tcp://127.0.0.1:0";
  if (replay) c.replay_endpoint = "tcp://127.0.0.1:0";
  c.topic = "kv@test";
  return c;
}

std::unique_ptr<EventPublisher> Start(const EventPublisher::Config& c) {
  auto p = EventPublisher::Start(c);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? std::move(p).value() : nullptr;
}

// Waits until the publisher has sent `batches` batches.
void WaitBatches(const EventPublisher& p, uint64_t batches) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (p.stats().batches < batches && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_GE(p.stats().batches, batches);
}

// SUB connects asynchronously (ZMQ's slow joiner): publish probes until one arrives.
void WaitJoined(EventPublisher& p, Subscriber& sub) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < deadline) {
    p.Publish(std::vector<KvEvent>{Removed(Key(0xee), kTierG2)});
    if (sub.Recv(std::chrono::milliseconds(50))) {
      while (sub.Recv(std::chrono::milliseconds(50))) {
      }
      return;
    }
  }
  FAIL() << "the subscriber never joined";
}

TEST(EventWireTest, BytesEqualWhatMsgspecEncodesForVllmsClasses) {
  // The same batch built with vllm.distributed.kv_events classes and msgspec.msgpack.Encoder
  // (msgspec 0.23, vLLM 3a5c453687fe); see docs/events.md.
  const std::string golden =
      "93cb3ff8000000000000958aa474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391c41001"
      "0101"
      "01010101010101010101010101b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f69647393010203"
      "aa62"
      "6c6f636b5f73697a6503a76c6f72615f6964c0a66d656469756da3435055a96c6f72615f6e616d65c0a86c6f6361"
      "6c69"
      "7479a54c4f43414ca96f776e657273686970a96b76746965723a47328ba474797065ab426c6f636b53746f726564"
      "ac62"
      "6c6f636b5f68617368657391c41003030303030303030303030303030303b1706172656e745f626c6f636b5f6861"
      "7368"
      "c41002020202020202020202020202020202a9746f6b656e5f696473930102ce000493e0aa626c6f636b5f73697a"
      "6503"
      "a76c6f72615f6964c0a66d656469756da753544f52414745a96c6f72615f6e616d65a178aa65787472615f6b6579"
      "7391"
      "91a178a86c6f63616c697479a54c4f43414ca96f776e657273686970a96b76746965723a473385a474797065ac42"
      "6c6f"
      "636b52656d6f766564ac626c6f636b5f68617368657392c41001010101010101010101010101010101c410040404"
      "0404"
      "0404040404040404040404a66d656469756da753544f52414745a86c6f63616c697479a652454d4f5445a96f776e"
      "6572"
      "73686970a96b76746965723a473481a474797065b0416c6c426c6f636b73436c65617265648ba474797065ab426c"
      "6f63"
      "6b53746f726564ac626c6f636b5f68617368657392c41005050505050505050505050505050505c4100606060606"
      "0606"
      "060606060606060606b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f69647396010203040506aa"
      "626c"
      "6f636b5f73697a6503a76c6f72615f6964c0a66d656469756da3435055a96c6f72615f6e616d65c0aa6578747261"
      "5f6b"
      "6579739291a473616c74c0a86c6f63616c697479a54c4f43414ca96f776e657273686970a96b76746965723a4732"
      "02";
  std::vector<WireEvent> events;
  auto add = [&](KvEvent e) { events.push_back({WireEvent::Type::kBlock, std::move(e)}); };
  add(Stored(Key(1), Key(9), kTierG2, {1, 2, 3}, /*root=*/true));
  add(Stored(Key(3), Key(2), kTierG3, {1, 2, 300000}, false, "x", "ignored-past-block-0"));
  add(Removed(Key(1), kTierG4));
  add(Removed(Key(4), kTierG4));  // joins the previous removal
  events.push_back({WireEvent::Type::kAllBlocksCleared, {}});
  add(Stored(Key(5), Key(9), kTierG2, {1, 2, 3}, true, "", "salt"));
  add(Stored(Key(6), Key(5), kTierG2, {4, 5, 6}, false, "", "salt"));  // chains onto Key(5)
  EXPECT_EQ(Hex(EncodeEventBatch(1.5, events, 2)), golden);
}

TEST(EventWireTest, MediumAndLocalityFollowVllmsNaming) {
  EXPECT_STREQ(WireMedium(kTierG1), "GPU");
  EXPECT_STREQ(WireMedium(kTierG2), "CPU");
  EXPECT_STREQ(WireMedium(kTierG3), "STORAGE");
  EXPECT_STREQ(WireMedium(kTierG4), "STORAGE");
  EXPECT_STREQ(WireLocality(kTierG3), "LOCAL");
  EXPECT_STREQ(WireLocality(kTierG4), "REMOTE");
}

TEST(EventWireTest, StoresOfUnknownTokensAreNotMergedAndCarryAnEmptyList) {
  KvEvent a = Stored(Key(1), Key(9), kTierG3, {}, true);
  a.block_size = 16;
  KvEvent b = Stored(Key(2), Key(1), kTierG3, {}, false);
  b.block_size = 16;
  std::vector<WireEvent> events{{WireEvent::Type::kBlock, a}, {WireEvent::Type::kBlock, b}};
  auto d = Decode(EncodeEventBatch(1.0, events, 0));
  ASSERT_EQ(d.size(), 2u);
  EXPECT_TRUE(d[0].tokens.empty());
  EXPECT_FALSE(d[0].parent.has_value());
  ASSERT_TRUE(d[1].parent.has_value());
  EXPECT_EQ(*d[1].parent, WireKeyBytes(Key(1)));
}

TEST(EventPublisherTest, StoresAndRemovalsArriveInOrderWithIncreasingSeq) {
  zmq::context_t ctx;
  auto p = Start(LocalConfig(false));
  ASSERT_NE(p, nullptr);
  Subscriber sub(ctx, p->endpoint(), "kv@test");
  WaitJoined(*p, sub);
  const uint64_t first_seq = p->stats().batches;
  // 2000 events in 200 calls: G2 stores of one chain, each followed by a G3 removal.
  std::vector<std::string> sent;  // "S"/"R" + key hex, in order
  for (uint32_t call = 0; call < 200; ++call) {
    std::vector<KvEvent> ev;
    for (uint32_t i = 0; i < 10; ++i) {
      const uint32_t n = call * 10 + i;
      const BlockKey k{n + 1000, n};
      if (i % 2 == 0) {
        ev.push_back(Stored(k, BlockKey{n + 999, n - 1}, kTierG2, {n, n + 1}, n == 0));
        sent.push_back("S" + Hex(WireKeyBytes(k)));
      } else {
        ev.push_back(Removed(k, kTierG3));
        sent.push_back("R" + Hex(WireKeyBytes(k)));
      }
    }
    p->Publish(ev);
  }
  std::vector<std::string> got;
  uint64_t expect_seq = first_seq;
  while (got.size() < sent.size()) {
    auto m = sub.Recv(std::chrono::milliseconds(5000));
    ASSERT_TRUE(m.has_value()) << "got " << got.size() << " of " << sent.size();
    EXPECT_EQ(m->topic, "kv@test");
    EXPECT_EQ(m->seq, expect_seq++) << "seq grows by one per batch, no gap";
    for (const Decoded& d : Decode(m->payload)) {
      for (const std::string& h : d.hashes) {
        got.push_back((d.type == "BlockStored" ? "S" : "R") + Hex(h));
      }
      if (d.type == "BlockStored") {
        EXPECT_EQ(d.medium, "CPU");
        EXPECT_EQ(d.tokens.size(), 2 * d.hashes.size());
      } else {
        EXPECT_EQ(d.type, "BlockRemoved");
        EXPECT_EQ(d.medium, "STORAGE");
        EXPECT_EQ(d.locality, "LOCAL");
      }
    }
  }
  EXPECT_EQ(got, sent);
  EXPECT_EQ(p->stats().dropped_events, 0u);
}

TEST(EventPublisherTest, ReplayReturnsExactlyTheMissedBatchesThenEndSeq) {
  zmq::context_t ctx;
  auto c = LocalConfig();
  c.max_batch_events = 1;  // one event per batch: batch i + 1 holds event i
  auto p = Start(c);
  ASSERT_NE(p, nullptr);
  Subscriber sub(ctx, p->endpoint());
  std::vector<KvEvent> ev;
  for (uint8_t i = 0; i < 10; ++i) ev.push_back(Removed(Key(i + 1), kTierG2));
  p->Publish(ev);
  WaitBatches(*p, 11);  // AllBlocksCleared + 10

  bool end = false;
  auto replayed = Replay(ctx, p->replay_endpoint(), 4, &end);
  EXPECT_TRUE(end) << "END_SEQ closes every answer";
  ASSERT_EQ(replayed.size(), 7u) << "batches 4..10";
  for (size_t i = 0; i < replayed.size(); ++i) {
    EXPECT_EQ(replayed[i].seq, 4 + i);
    EXPECT_EQ(replayed[i].topic, "kv@test");
    auto d = Decode(replayed[i].payload);
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].hashes,
              std::vector<std::string>{WireKeyBytes(Key(static_cast<uint8_t>(4 + i)))});
  }
  // From 0: the whole history, AllBlocksCleared first (the worker's start).
  auto all = Replay(ctx, p->replay_endpoint(), 0, &end);
  ASSERT_EQ(all.size(), 11u);
  EXPECT_EQ(Decode(all[0].payload)[0].type, "AllBlocksCleared");
  // Past the end: END_SEQ alone.
  EXPECT_TRUE(Replay(ctx, p->replay_endpoint(), 11, &end).empty());
  EXPECT_TRUE(end);
  EXPECT_EQ(p->stats().replay_requests, 3u);
  EXPECT_EQ(p->stats().replayed_batches, 7u + 11u);
}

TEST(EventPublisherTest, ReplayBufferKeepsOnlyTheNewestBatches) {
  zmq::context_t ctx;
  auto c = LocalConfig();
  c.max_batch_events = 1;
  c.replay_batches = 5;
  auto p = Start(c);
  ASSERT_NE(p, nullptr);
  std::vector<KvEvent> ev;
  for (uint8_t i = 0; i < 20; ++i) ev.push_back(Removed(Key(i + 1), kTierG2));
  p->Publish(ev);
  WaitBatches(*p, 21);
  bool end = false;
  auto got = Replay(ctx, p->replay_endpoint(), 0, &end);
  EXPECT_TRUE(end);
  ASSERT_EQ(got.size(), 5u);
  EXPECT_EQ(got.front().seq, 16u);
  EXPECT_EQ(got.back().seq, 20u);
}

TEST(EventPublisherTest, ReplayBufferIsBoundedInBytesToo) {
  zmq::context_t ctx;
  auto c = LocalConfig();
  c.max_batch_events = 1;
  c.replay_bytes = 4096;
  auto p = Start(c);
  ASSERT_NE(p, nullptr);
  // Stores of 256 tokens: ~1.4 KB per batch, so 4 KiB holds two of them.
  std::vector<KvEvent> ev;
  for (uint32_t i = 0; i < 10; ++i) {
    ev.push_back(
        Stored(BlockKey{i, i}, BlockKey{i, i + 1}, kTierG3, std::vector<TokenId>(256, 100000 + i)));
  }
  p->Publish(ev);
  WaitBatches(*p, 11);
  bool end = false;
  auto got = Replay(ctx, p->replay_endpoint(), 0, &end);
  EXPECT_TRUE(end);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got.front().seq, 9u);
  EXPECT_EQ(got.back().seq, 10u);
  // A batch larger than the bound is still kept (the newest).
  c.replay_bytes = 16;
  auto q = Start(c);
  ASSERT_NE(q, nullptr);
  q->Publish(std::span<const KvEvent>(ev.data(), 1));
  WaitBatches(*q, 2);
  EXPECT_EQ(Replay(ctx, q->replay_endpoint(), 0, &end).size(), 1u);
}

TEST(EventPublisherTest, ALateSubscriberCatchesUpThroughReplay) {
  zmq::context_t ctx;
  auto c = LocalConfig();
  c.max_batch_events = 4;
  auto p = Start(c);
  ASSERT_NE(p, nullptr);
  // History nobody heard.
  std::vector<KvEvent> early;
  for (uint8_t i = 0; i < 30; ++i) early.push_back(Removed(Key(i + 1), kTierG3));
  p->Publish(early);
  WaitBatches(*p, 2);
  // The late subscriber: SUB first (so nothing falls between), then replay from 0, then the
  // live stream, deduplicated by seq, as Dynamo's and llm-d's listeners do.
  Subscriber sub(ctx, p->endpoint());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let SUB join
  std::vector<KvEvent> late;
  for (uint8_t i = 0; i < 30; ++i) late.push_back(Removed(Key(i + 101), kTierG3));
  p->Publish(late);
  WaitBatches(*p, p->stats().batches + 1);
  bool end = false;
  std::map<uint64_t, std::string> by_seq;
  for (auto& m : Replay(ctx, p->replay_endpoint(), 0, &end)) by_seq[m.seq] = m.payload;
  ASSERT_TRUE(end);
  while (auto m = sub.Recv(std::chrono::milliseconds(300))) by_seq[m->seq] = m->payload;
  ASSERT_FALSE(by_seq.empty());
  EXPECT_EQ(by_seq.begin()->first, 0u);
  EXPECT_EQ(by_seq.rbegin()->first + 1, by_seq.size()) << "no seq missing";
  std::vector<std::string> keys;
  for (const auto& [seq, payload] : by_seq) {
    for (const Decoded& d : Decode(payload)) {
      for (const auto& h : d.hashes) keys.push_back(h);
    }
  }
  std::vector<std::string> want;
  for (uint8_t i = 0; i < 30; ++i) want.push_back(WireKeyBytes(Key(i + 1)));
  for (uint8_t i = 0; i < 30; ++i) want.push_back(WireKeyBytes(Key(i + 101)));
  EXPECT_EQ(keys, want);
}

TEST(EventPublisherTest, AStalledSubscriberBlocksNeitherPublishNorOtherSubscribers) {
  zmq::context_t ctx;
  auto c = LocalConfig(false);
  c.send_hwm = 2;
  auto p = Start(c);
  ASSERT_NE(p, nullptr);
  // Connects with a tiny queue and never reads.
  zmq::socket_t stalled(ctx, zmq::socket_type::sub);
  stalled.set(zmq::sockopt::rcvhwm, 1);
  stalled.set(zmq::sockopt::rcvbuf, 4096);
  stalled.set(zmq::sockopt::subscribe, "");
  stalled.connect(p->endpoint());
  Subscriber healthy(ctx, p->endpoint());
  WaitJoined(*p, healthy);
  const uint64_t first = p->stats().batches;
  // 20000 stores with 64 tokens each (MBs on the wire): far beyond what the stalled socket
  // holds. Publish must stay a queue append.
  std::vector<KvEvent> ev;
  std::vector<TokenId> tokens(64, 7);
  double worst_ms = 0;
  uint64_t sent = 0;
  for (uint32_t call = 0; call < 200; ++call) {
    ev.clear();
    for (uint32_t i = 0; i < 100; ++i) {
      ev.push_back(Stored(BlockKey{call, i}, BlockKey{call, i + 1000}, kTierG2, tokens, true));
    }
    const auto t0 = Clock::now();
    p->Publish(ev);
    worst_ms =
        std::max(worst_ms, std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    sent += ev.size();
    // The healthy subscriber reads as it goes.
    while (auto m = healthy.Recv(std::chrono::milliseconds(0))) {
    }
  }
  // A Publish that waited on the stalled subscriber would never return; the bound only absorbs
  // the scheduling delays of a loaded CI machine (a queue append takes microseconds).
  std::printf("worst Publish of 100 events with a stalled subscriber: %.3f ms\n", worst_ms);
  EXPECT_LT(worst_ms, 500.0) << "Publish waited on a subscriber";
  // Everything was sent: the stalled subscriber lost messages inside libzmq, not the others.
  WaitBatches(*p, first + 1);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (p->stats().published_events < sent + 1 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_GE(p->stats().published_events, sent);
  EXPECT_EQ(p->stats().dropped_events, 0u);
}

TEST(EventPublisherTest, AFullQueueDropsAndCountsInsteadOfWaiting) {
  auto c = LocalConfig(false);
  c.queue_events = 8;
  auto p = Start(c);
  ASSERT_NE(p, nullptr);
  // Start queued AllBlocksCleared; it may still wait, taking one place.
  std::vector<KvEvent> ev;
  for (uint32_t i = 0; i < 1000; ++i) ev.push_back(Removed(BlockKey{i, i}, kTierG2));
  const auto t0 = Clock::now();
  p->Publish(ev);
  const double publish_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  EXPECT_LT(publish_ms, 500.0);
  const auto s = p->stats();
  EXPECT_GE(s.dropped_events, 992u);
  EXPECT_LE(s.dropped_events, 993u);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (p->stats().published_events + p->stats().dropped_events < 1000 &&
         Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(p->stats().published_events + p->stats().dropped_events, 1000u)
      << "every event is sent or counted as dropped";
}

TEST(EventPublisherTest, ABadReplayRequestGetsEndSeqAndIsCounted) {
  zmq::context_t ctx;
  auto p = Start(LocalConfig());
  ASSERT_NE(p, nullptr);
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(p->replay_endpoint());
  dealer.send(zmq::str_buffer(""), zmq::send_flags::sndmore);
  dealer.send(zmq::str_buffer("abc"));  // not 8 bytes
  zmq::pollitem_t item{static_cast<void*>(dealer), 0, ZMQ_POLLIN, 0};
  ASSERT_EQ(zmq::poll(&item, 1, std::chrono::milliseconds(5000)), 1);
  std::vector<std::string> frames;
  zmq::message_t m;
  do {
    (void)dealer.recv(m);
    frames.push_back(Str(m));
  } while (m.more());
  ASSERT_EQ(frames.size(), 4u);
  EXPECT_EQ(frames[2], std::string(8, '\xff'));
  EXPECT_EQ(p->stats().bad_replay_requests, 1u);
}

TEST(EventPublisherTest, BadAddressesAreRefusedAtStartWithTheFieldNamed) {
  auto c = LocalConfig(false);
  c.endpoint = "tcp://*:notaport";
  auto p = EventPublisher::Start(c);
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(p.status().Is(StatusCode::kInvalidArgument));
  EXPECT_NE(p.status().message().find("events.endpoint = 'tcp://*:notaport'"), std::string::npos)
      << p.status().ToString();

  // A port in use.
  auto first = Start(LocalConfig(false));
  ASSERT_NE(first, nullptr);
  c.endpoint = first->endpoint();  // tcp://127.0.0.1:PORT: connect per vLLM's rule: fine
  EXPECT_TRUE(EventPublisher::Start(c).ok());
  auto r = LocalConfig();
  r.replay_endpoint = "tcp://" + first->endpoint().substr(6);  // the PUB's port: taken
  auto taken = EventPublisher::Start(r);
  ASSERT_FALSE(taken.ok());
  EXPECT_NE(taken.status().message().find("events.replay_endpoint"), std::string::npos)
      << taken.status().ToString();

  c.endpoint = "";
  EXPECT_FALSE(EventPublisher::Start(c).ok());
  c = LocalConfig(false);
  c.queue_events = 0;
  EXPECT_FALSE(EventPublisher::Start(c).ok());
}

// ---- The manager feeding the publisher -------------------------------------------------------

uint16_t FreePort() {
  zmq::context_t ctx;
  zmq::socket_t s(ctx, zmq::socket_type::pub);
  s.bind("tcp://127.0.0.1:0");
  const std::string ep = s.get(zmq::sockopt::last_endpoint);
  return static_cast<uint16_t>(std::stoi(ep.substr(ep.rfind(':') + 1)));
}

TEST(ManagerEventsTest, ConfigRefusesABadEndpointAndCreateABoundOne) {
  Config c = testing::SmallConfig("", 32, 0);
  Status s = c.Set("events.endpoint", "localhost:5557");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("events.endpoint"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("tcp://"), std::string::npos) << s.ToString();

  // A port that another socket holds: Create fails, naming the field.
  zmq::context_t ctx;
  zmq::socket_t holder(ctx, zmq::socket_type::pub);
  holder.bind("tcp://*:0");
  const std::string ep = holder.get(zmq::sockopt::last_endpoint);
  ASSERT_TRUE(c.Set("events.endpoint", "tcp://*:" + ep.substr(ep.rfind(':') + 1)).ok());
  ManagerOptions o;
  o.layout = testing::TestLayout();
  o.model_id = "test-model";
  o.config = c;
  auto m = BlockManager::Create(o);
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(m.status().Is(StatusCode::kInvalidArgument));
  EXPECT_NE(m.status().message().find("events.endpoint"), std::string::npos)
      << m.status().ToString();

  Config r = testing::SmallConfig("", 32, 0);
  ASSERT_TRUE(r.Set("events.replay_endpoint", "tcp://127.0.0.1:0").ok());
  o.config = r;
  auto m2 = BlockManager::Create(o);
  ASSERT_FALSE(m2.ok());
  EXPECT_NE(m2.status().message().find("events.endpoint is empty"), std::string::npos);
}

TEST(ManagerEventsTest, CommitsAreOnTheWireWithTokensAndAStalledSubscriberDoesNotSlowThem) {
  const uint16_t port = FreePort();
  Config c = testing::SmallConfig("", 64, 0);
  ASSERT_TRUE(c.Set("events.endpoint", "tcp://*:" + std::to_string(port)).ok());
  ASSERT_TRUE(c.Set("events.topic", "w0").ok());
  auto mgr = testing::MakeTestManager(c);
  ASSERT_NE(mgr, nullptr);
  zmq::context_t ctx;
  zmq::socket_t stalled(ctx, zmq::socket_type::sub);
  stalled.set(zmq::sockopt::rcvhwm, 1);
  stalled.set(zmq::sockopt::subscribe, "");
  stalled.connect("tcp://127.0.0.1:" + std::to_string(port));
  Subscriber sub(ctx, "tcp://127.0.0.1:" + std::to_string(port), "w0");
  testing::MiniEngine engine(mgr.get(), 64);
  // Join: run requests until the subscriber hears one.
  bool joined = false;
  for (uint32_t i = 0; i < 100 && !joined; ++i) {
    engine.Run("join" + std::to_string(i), testing::Prompt(500 + i, 16 + 1));
    joined = sub.Recv(std::chrono::milliseconds(50)).has_value();
  }
  ASSERT_TRUE(joined);
  while (sub.Recv(std::chrono::milliseconds(100))) {
  }
  const auto prompt = testing::Prompt(7, 16 * 3 + 1);
  engine.Run("a", prompt, "tenant-7");
  const std::vector<BlockKey> keys = engine.Keys(prompt, "tenant-7");
  // The chain's three stores: one BlockStored, or more when a batch boundary fell between them.
  std::vector<Decoded> stored;
  std::vector<std::string> hashes;
  std::vector<uint32_t> tokens;
  while (hashes.size() < 3) {
    auto m = sub.Recv(std::chrono::milliseconds(5000));
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->topic, "w0");
    for (auto& d : Decode(m->payload)) {
      if (d.type != "BlockStored") continue;
      hashes.insert(hashes.end(), d.hashes.begin(), d.hashes.end());
      tokens.insert(tokens.end(), d.tokens.begin(), d.tokens.end());
      stored.push_back(d);
    }
  }
  ASSERT_EQ(hashes.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(hashes[i], WireKeyBytes(keys[i]));
  EXPECT_FALSE(stored[0].parent.has_value()) << "a first block has no parent";
  for (size_t i = 1; i < stored.size(); ++i) {
    ASSERT_TRUE(stored[i].parent.has_value());
    EXPECT_EQ(*stored[i].parent, hashes[stored[0].hashes.size() - 1]);
  }
  EXPECT_EQ(tokens, std::vector<uint32_t>(prompt.begin(), prompt.begin() + 48));
  EXPECT_EQ(stored[0].medium, "CPU");
  EXPECT_EQ(stored[0].locality, "LOCAL");
  EXPECT_EQ(stored[0].ownership, "kvtier:G2");

  // Many more commits while the stalled subscriber never reads: each stays quick.
  double worst_ms = 0;
  for (uint32_t i = 0; i < 300; ++i) {
    const auto t0 = Clock::now();
    engine.Run("s" + std::to_string(i), testing::Prompt(1000 + i, 16 * 4 + 1));
    worst_ms =
        std::max(worst_ms, std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::printf("worst request (lookup, commit, save) with a stalled subscriber: %.3f ms\n",
              worst_ms);
  EXPECT_LT(worst_ms, 1000.0) << "a Run (lookup, commit, save) waited on the stalled subscriber";
  // The publisher's thread sends on its own schedule (every flush interval), so the last
  // requests' events may still be queued here; under a sanitizer on a busy machine it can lag
  // the 300 requests by more than their whole run. Wait for it, bounded.
  ManagerStats s = mgr->Stats();
  const auto wait_start = Clock::now();
  const auto deadline = wait_start + std::chrono::seconds(20);
  while (s.events_published <= 1200u && s.events_publish_dropped == 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    s = mgr->Stats();
  }
  std::printf("the publisher caught up %.1f ms after the last request\n",
              std::chrono::duration<double, std::milli>(Clock::now() - wait_start).count());
  EXPECT_GT(s.events_published, 1200u);
  EXPECT_EQ(s.events_publish_dropped, 0u);
  EXPECT_GT(s.event_batches_published, 0u);
}

}  // namespace
}  // namespace kvtier

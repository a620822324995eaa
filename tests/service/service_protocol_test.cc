// kvtier serve's message decoders (src/proto/protocol.h), fuzzed: every message type encoded
// from random valid contents decodes back to them, and the same bytes damaged (bits flipped,
// lengths forged, truncated, extended, bytes inserted or erased) decode to Ok or to
// InvalidArgument "service protocol: ..." only, never allocating past what the bytes can hold.
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "proto/protocol.h"
#include "stats_test_util.h"

namespace kvtier::proto {
namespace {

using Rng = std::mt19937_64;

std::string RandomString(Rng& rng, size_t max) {
  std::string s(rng() % (max + 1), '\0');
  for (char& c : s) c = static_cast<char>('a' + rng() % 26);
  return s;
}

std::vector<uint32_t> RandomU32s(Rng& rng, size_t max) {
  std::vector<uint32_t> v(rng() % (max + 1));
  for (uint32_t& x : v) x = static_cast<uint32_t>(rng());
  return v;
}

KvLayout Layout(Rng& rng) {
  KvLayout l;
  l.num_layers = 1 + rng() % 8;
  l.num_planes = 1 + rng() % 2;
  l.num_kv_heads = 1 + rng() % 4;
  l.head_dim = 16u << (rng() % 3);
  l.tokens_per_block = 1 + rng() % KvLayout::kMaxTokensPerBlock;  // any size
  l.dtype = rng() % 2 ? DType::kFp16 : DType::kFp32;
  l.g1_arrangement = rng() % 2 ? G1Arrangement::kBlockContiguous : G1Arrangement::kLayerSeparate;
  return l;
}

std::vector<KvEvent> RandomEvents(Rng& rng) {
  std::vector<KvEvent> events(rng() % 6);
  for (KvEvent& e : events) {
    e.kind = rng() % 2 ? KvEvent::Kind::kStored : KvEvent::Kind::kRemoved;
    e.key = BlockKey{rng(), rng()};
    e.parent = BlockKey{rng(), rng()};
    e.tier = static_cast<TierId>(1 + rng() % 3);
    e.time_ns = rng();
    e.block_size = 16;
    e.parent_is_root = rng() % 2;
    e.token_ids = RandomU32s(rng, 16);
    e.lora_name = RandomString(rng, 8);
    e.cache_salt = RandomString(rng, 8);
    e.namespace_known = rng() % 2;
  }
  return events;
}

// One message type: encodes random valid contents; decodes bytes into a comparable string
// (equal contents, equal strings) and the largest container capacity it allocated.
struct Kind {
  const char* name;
  std::function<std::vector<uint8_t>(Rng&)> encode;
  std::function<Status(std::span<const uint8_t>, std::string* shape, size_t* capacity)> decode;
};

std::string Join(const std::vector<uint32_t>& v) {
  std::string s;
  for (uint32_t x : v) s += std::to_string(x) + ",";
  return s;
}

std::vector<Kind> Kinds() {
  std::vector<Kind> kinds;
  kinds.push_back({"Hello",
                   [](Rng& rng) {
                     Hello h;
                     h.role = static_cast<Role>(rng() % 4);
                     h.instance_name = RandomString(rng, 20);
                     h.model_id = RandomString(rng, 20);
                     if (h.role != Role::kLookup) h.layout = Layout(rng);
                     h.pid = static_cast<uint32_t>(rng());
                     WireWriter w;
                     EncodeHello(&w, h);
                     return w.Take();
                   },
                   [](std::span<const uint8_t> b, std::string* shape, size_t* cap) {
                     Hello h;
                     WireReader r(b);
                     Status s = DecodeHello(&r, &h);
                     *shape = std::to_string(static_cast<int>(h.role)) + h.instance_name + "|" +
                              h.model_id + "|" + h.layout.ToString() + std::to_string(h.pid);
                     *cap = h.instance_name.capacity() + h.model_id.capacity();
                     return s;
                   }});
  kinds.push_back({"Lookup",
                   [](Rng& rng) {
                     RequestSpec spec;
                     spec.request_id = RandomString(rng, 16);
                     const std::vector<uint32_t> prompt = RandomU32s(rng, 64);
                     spec.prompt = prompt;  // a span: the vector outlives the encoding
                     spec.cache_salt = RandomString(rng, 8);
                     spec.adapter_id = RandomString(rng, 8);
                     for (size_t i = rng() % 3; i > 0; --i)
                       spec.block_extra.push_back(RandomString(rng, 6));
                     WireWriter w;
                     EncodeLookup(&w, spec, static_cast<uint32_t>(rng() % 100));
                     return w.Take();
                   },
                   [](std::span<const uint8_t> b, std::string* shape, size_t* cap) {
                     LookupCall m;
                     WireReader r(b);
                     Status s = DecodeLookup(&r, &m);
                     *shape = m.request_id + "|" + Join(m.prompt) + "|" + m.cache_salt + "|" +
                              m.adapter_id + "|" + std::to_string(m.block_extra.size()) +
                              std::to_string(m.num_computed_tokens);
                     *cap = m.prompt.capacity() * 4 + m.block_extra.capacity() * 4;
                     return s;
                   }});
  kinds.push_back({"Commit",
                   [](Rng& rng) {
                     WireWriter w;
                     EncodeCommit(&w, RandomString(rng, 16), RandomU32s(rng, 64),
                                  RandomU32s(rng, 8));
                     return w.Take();
                   },
                   [](std::span<const uint8_t> b, std::string* shape, size_t* cap) {
                     CommitCall m;
                     WireReader r(b);
                     Status s = DecodeCommit(&r, &m);
                     *shape = m.request_id + "|" + Join(m.tokens) + "|" + Join(m.g1_block_ids);
                     *cap = (m.tokens.capacity() + m.g1_block_ids.capacity()) * 4;
                     return s;
                   }});
  kinds.push_back({"PrepareLoad",
                   [](Rng& rng) {
                     PrepareLoadCall m;
                     m.request_id = RandomString(rng, 16);
                     m.g1_block_ids = RandomU32s(rng, 16);
                     m.num_external_tokens = static_cast<uint32_t>(rng());
                     m.async_load = rng() % 2;
                     WireWriter w;
                     EncodePrepareLoad(&w, m);
                     return w.Take();
                   },
                   [](std::span<const uint8_t> b, std::string* shape, size_t* cap) {
                     PrepareLoadCall m;
                     WireReader r(b);
                     Status s = DecodePrepareLoad(&r, &m);
                     *shape = m.request_id + "|" + Join(m.g1_block_ids) +
                              std::to_string(m.num_external_tokens) + (m.async_load ? "a" : "s");
                     *cap = m.g1_block_ids.capacity() * 4;
                     return s;
                   }});
  kinds.push_back({"Finished",
                   [](Rng& rng) {
                     FinishedRequests f;
                     for (size_t i = rng() % 4; i > 0; --i)
                       f.saves_done.push_back(RandomString(rng, 10));
                     for (size_t i = rng() % 4; i > 0; --i)
                       f.loads_done.push_back(RandomString(rng, 10));
                     WireWriter w;
                     EncodeFinished(&w, f);
                     return w.Take();
                   },
                   [](std::span<const uint8_t> b, std::string* shape, size_t* cap) {
                     FinishedRequests f;
                     WireReader r(b);
                     Status s = DecodeFinished(&r, &f);
                     for (const auto& x : f.saves_done) *shape += x + ",";
                     *shape += "|";
                     for (const auto& x : f.loads_done) *shape += x + ",";
                     *cap = (f.saves_done.capacity() + f.loads_done.capacity()) * 4;
                     return s;
                   }});
  kinds.push_back({"Copy",
                   [](Rng& rng) {
                     CopyCall m;
                     m.batch = rng();
                     m.dir = rng() % 2;
                     m.deadline_ns = static_cast<int64_t>(rng() >> 1);
                     for (size_t i = rng() % 6; i > 0; --i)
                       m.copies.emplace_back(static_cast<uint32_t>(rng()), rng());
                     WireWriter w;
                     EncodeCopy(&w, m);
                     return w.Take();
                   },
                   [](std::span<const uint8_t> b, std::string* shape, size_t* cap) {
                     CopyCall m;
                     WireReader r(b);
                     Status s = DecodeCopy(&r, &m);
                     *shape = std::to_string(m.batch) + std::to_string(m.dir) +
                              std::to_string(m.deadline_ns) + "|";
                     for (auto [g1, off] : m.copies)
                       *shape += std::to_string(g1) + ":" + std::to_string(off) + ",";
                     *cap = m.copies.capacity() * 12;
                     return s;
                   }});
  kinds.push_back({"Fetch",
                   [](Rng& rng) {
                     FetchCall m;
                     m.batch = rng();
                     m.deadline_ns = static_cast<int64_t>(rng() >> 1);
                     for (size_t i = rng() % 5; i > 0; --i) {
                       G4Fetch f;
                       f.g1_block = static_cast<uint32_t>(rng());
                       f.name = RandomString(rng, 40);
                       f.namespace_id = rng();
                       f.key = BlockKey{rng(), rng()};
                       f.tokens = RandomU32s(rng, 20);
                       m.items.push_back(std::move(f));
                     }
                     WireWriter w;
                     EncodeFetch(&w, m);
                     return w.Take();
                   },
                   [](std::span<const uint8_t> b, std::string* shape, size_t* cap) {
                     FetchCall m;
                     WireReader r(b);
                     Status s = DecodeFetch(&r, &m);
                     *shape = std::to_string(m.batch) + std::to_string(m.deadline_ns) + "|";
                     for (const G4Fetch& f : m.items) {
                       *shape += std::to_string(f.g1_block) + f.name +
                                 std::to_string(f.namespace_id) + f.key.ToHex() + Join(f.tokens) +
                                 ";";
                       *cap = std::max(*cap, f.tokens.capacity() * 4);
                     }
                     // Items are taken one by one, each after its >= 32 bytes were read.
                     *cap = std::max(*cap, m.items.size() * 32);
                     return s;
                   }});
  kinds.push_back({"FetchDone",
                   [](Rng& rng) {
                     FetchDone m;
                     m.batch = rng();
                     for (size_t i = rng() % 6; i > 0; --i) {
                       m.statuses.push_back(rng() % 2 ? Status::Ok()
                                                      : Status::Corruption(RandomString(rng, 30)));
                     }
                     WireWriter w;
                     EncodeFetchDone(&w, m);
                     return w.Take();
                   },
                   [](std::span<const uint8_t> b, std::string* shape, size_t* cap) {
                     FetchDone m;
                     WireReader r(b);
                     Status s = DecodeFetchDone(&r, &m);
                     *shape = std::to_string(m.batch) + "|";
                     for (const Status& x : m.statuses) *shape += x.ToString() + ";";
                     *cap = m.statuses.size() * 5;
                     return s;
                   }});
  kinds.push_back({"G4Config",
                   [](Rng& rng) {
                     G4Config m;
                     m.endpoints = RandomString(rng, 30);
                     m.cluster = rng() % 2;
                     m.username = RandomString(rng, 10);
                     m.password = RandomString(rng, 10);
                     m.connections = 1 + static_cast<uint32_t>(rng() % 64);
                     m.pipeline_bytes = rng();
                     WireWriter w;
                     EncodeG4Config(&w, m);
                     return w.Take();
                   },
                   [](std::span<const uint8_t> b, std::string* shape, size_t* cap) {
                     G4Config m;
                     WireReader r(b);
                     Status s = DecodeG4Config(&r, &m);
                     *shape = m.endpoints + "|" + (m.cluster ? "c" : "s") + m.username + "|" +
                              m.password + "|" + std::to_string(m.connections) +
                              std::to_string(m.pipeline_bytes);
                     *cap = m.endpoints.capacity() + m.username.capacity() + m.password.capacity();
                     return s;
                   }});
  kinds.push_back({"Events",
                   [](Rng& rng) {
                     WireWriter w;
                     EncodeEvents(&w, rng() % 5, RandomEvents(rng));
                     return w.Take();
                   },
                   [](std::span<const uint8_t> b, std::string* shape, size_t* cap) {
                     EventsFrame m;
                     WireReader r(b);
                     Status s = DecodeEvents(&r, &m);
                     *shape = std::to_string(m.dropped) + "|";
                     *cap = m.events.capacity() * 60;
                     for (const KvEvent& e : m.events) {
                       *shape += std::to_string(static_cast<int>(e.kind)) + e.key.ToHex() +
                                 e.parent.ToHex() + std::to_string(e.tier) +
                                 std::to_string(e.time_ns) + std::to_string(e.block_size) +
                                 (e.parent_is_root ? "r" : "-") + Join(e.token_ids) + e.lora_name +
                                 "|" + e.cache_salt + (e.namespace_known ? "k" : "u") + ";";
                       *cap = std::max(*cap, e.token_ids.capacity() * 4);
                     }
                     return s;
                   }});
  return kinds;
}

void Mutate(Rng& rng, std::vector<uint8_t>* buf) {
  auto upto = [&](size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng() % n); };
  switch (rng() % 5) {
    case 0:  // a bit flipped
      if (!buf->empty()) (*buf)[upto(buf->size())] ^= static_cast<uint8_t>(1u << (rng() % 8));
      break;
    case 1: {  // a forged 32-bit length or count
      if (buf->size() < 4) break;
      const size_t at = upto(buf->size() - 3);
      const uint32_t v = rng() % 2 ? 0xffffffffu : static_cast<uint32_t>(rng() % 1000000);
      for (int i = 0; i < 4; ++i) (*buf)[at + i] = static_cast<uint8_t>(v >> (8 * i));
      break;
    }
    case 2:  // truncated
      buf->resize(upto(buf->size()));
      break;
    case 3:  // bytes appended or inserted
      buf->insert(buf->begin() + static_cast<ptrdiff_t>(upto(buf->size() + 1)), 1 + upto(8),
                  static_cast<uint8_t>(rng()));
      break;
    case 4:  // a range erased
      if (!buf->empty()) {
        const size_t at = upto(buf->size());
        buf->erase(buf->begin() + static_cast<ptrdiff_t>(at),
                   buf->begin() + static_cast<ptrdiff_t>(std::min(buf->size(), at + 1 + upto(8))));
      }
      break;
  }
}

TEST(ProtocolFuzzTest, EveryMessageRoundTripsAndDamageIsRefusedWithinItsSize) {
  Rng rng(20261203);
  for (const Kind& kind : Kinds()) {
    int ok = 0, refused = 0;
    for (int iter = 0; iter < 4000; ++iter) {
      Rng copy = rng;
      std::vector<uint8_t> bytes = kind.encode(rng);
      std::vector<uint8_t> again = kind.encode(copy);  // the same contents, encoded again
      ASSERT_EQ(bytes, again);
      std::string shape, shape2;
      size_t cap = 0;
      ASSERT_TRUE(kind.decode(bytes, &shape, &cap).ok()) << kind.name << " iteration " << iter;
      // Decoding is a function of the bytes: the same bytes, the same contents.
      ASSERT_TRUE(kind.decode(again, &shape2, &cap).ok());
      ASSERT_EQ(shape, shape2);

      for (int m = 1 + static_cast<int>(rng() % 3); m > 0; --m) Mutate(rng, &bytes);
      std::string damaged;
      cap = 0;
      Status s = kind.decode(bytes, &damaged, &cap);
      if (s.ok()) {
        ++ok;
      } else {
        ++refused;
        ASSERT_EQ(s.code(), StatusCode::kInvalidArgument) << kind.name << ": " << s.ToString();
        ASSERT_EQ(s.message().rfind("service protocol: ", 0), 0u)
            << kind.name << ": " << s.ToString();
      }
      ASSERT_LE(cap, bytes.size() + 64)
          << kind.name << " allocated past its bytes, iteration " << iter;
    }
    EXPECT_GT(refused, 2000) << kind.name << ": the damage hardly ever reached the decoder";
    std::printf("%s: %d damaged messages decoded, %d refused\n", kind.name, ok, refused);
  }
}

// What the events decoder refuses on purpose, each with the field in the message.
TEST(ProtocolFuzzTest, EventsOutOfRangeAreRefusedByName) {
  KvEvent e;
  e.block_size = 16;
  e.token_ids = {1, 2, 3};
  auto refuse = [](const KvEvent& ev, const char* field) {
    WireWriter w;
    EncodeEvents(&w, 0, std::vector<KvEvent>{ev});
    EventsFrame m;
    WireReader r(w.data());
    Status s = DecodeEvents(&r, &m);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << field;
    EXPECT_NE(s.message().find(field), std::string::npos) << s.ToString();
  };
  KvEvent bad = e;
  bad.tier = kNumTiers;
  refuse(bad, "event.tier");
  bad = e;
  bad.kind = static_cast<KvEvent::Kind>(7);
  refuse(bad, "event.kind");
  bad = e;
  bad.block_size = 2;
  refuse(bad, "event.token_ids");
  bad = e;
  bad.block_size = kMaxBlockTokens + 1;
  refuse(bad, "event.block_size");
}

// A model id may be long (a deep local path, a hybrid model's group tag): up to
// kMaxModelIdBytes it is taken whole, beyond it refused by name. The instance name keeps its
// own, shorter limit.
TEST(ProtocolFuzzTest, LongModelIdsAreTakenAndTooLongOnesRefusedByName) {
  auto decode = [](const Hello& h, Hello* out) {
    WireWriter w;
    EncodeHello(&w, h);
    WireReader r(w.data());
    return DecodeHello(&r, out);
  };
  Hello h;
  h.role = Role::kLookup;
  h.instance_name = "engine";
  h.model_id = std::string(600, 'm');  // over the old 256-byte limit
  Hello got;
  Status s = decode(h, &got);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(got.model_id, h.model_id);
  h.model_id = std::string(kMaxModelIdBytes, 'm');
  ASSERT_TRUE(decode(h, &got).ok());
  h.model_id = std::string(kMaxModelIdBytes + 1, 'm');
  s = decode(h, &got);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("hello.model_id"), std::string::npos) << s.ToString();
  h.model_id = "m";
  h.instance_name = std::string(kMaxNameBytes + 1, 'i');
  s = decode(h, &got);
  EXPECT_NE(s.message().find("hello.instance_name"), std::string::npos) << s.ToString();
}

// The daemon cuts a batch of events into frames that each fit kMaxPayloadBytes: by count for
// small blocks, by bytes for large ones (4096-token blocks: ~16 KiB per event, so the 65,536
// events a count allows would be a 1 GiB frame the engine could never receive).
TEST(ProtocolFuzzTest, EventFramesStayWithinThePayloadLimit) {
  struct Case {
    uint32_t tpb;
    size_t events;
    size_t frames;
  };
  // 16 tokens: 70,000 events of 130 B, two frames by count. 4096 tokens: 16,450 B each, 2,039
  // fit half of 64 MiB, so 4,200 take three frames.
  for (const Case& c : {Case{16, 70'000, 2}, Case{4096, 4'200, 3}}) {
    const uint32_t tpb = c.tpb;
    KvEvent e;
    e.block_size = tpb;
    e.token_ids.assign(tpb, 7);
    e.cache_salt = "tenant";
    const std::vector<KvEvent> events(c.events, e);
    size_t at = 0, frames = 0;
    while (at < events.size()) {
      const size_t n = EventsInFrame(std::span<const KvEvent>(events).subspan(at));
      ASSERT_GE(n, 1u);
      ASSERT_LE(n, kMaxEventsPerFrame);
      WireWriter w;
      EncodeEvents(&w, 0, std::span<const KvEvent>(events).subspan(at, n));
      ASSERT_LE(w.data().size(), kMaxPayloadBytes / 2) << tpb;
      EXPECT_EQ(w.data().size(), 12 + n * EventWireBytes(e)) << "the estimate is exact";
      at += n;
      ++frames;
    }
    EXPECT_EQ(at, events.size());
    EXPECT_EQ(frames, c.frames) << tpb;
  }
}

// The Stats reply carries every field of the stats table (kvtier/manager_stats_fields.h): each
// set to its own value comes back equal. Its first fields sit where engines of this protocol
// version read them, and a reply of another size (a daemon of another build, knowing other
// fields) is refused by name before anything is read.
TEST(ProtocolStats, EveryFieldRoundTripsAndAnotherBuildsReplyIsRefused) {
  const ManagerStats sent = testing::DistinctStats();
  WireWriter w;
  EncodeStats(&w, sent);
  ManagerStats got;
  {
    WireReader r(w.data());
    Status s = DecodeStats(&r, &got);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  ForEachStatField(
      [](const StatField& f, const auto& a, const auto& b) { EXPECT_EQ(a, b) << f.name; }, sent,
      got);
  // lookups, then lookup_blocks, then hit_blocks[G1..G4], little-endian.
  const std::vector<uint8_t>& bytes = w.data();
  auto u64_at = [&](size_t at) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = v << 8 | bytes[at + i];
    return v;
  };
  EXPECT_EQ(u64_at(0), sent.lookups);
  EXPECT_EQ(u64_at(8), sent.lookup_blocks);
  EXPECT_EQ(u64_at(16 + 8 * kTierG3), sent.hit_blocks[kTierG3]);

  for (const size_t size : {bytes.size() - 8, bytes.size() - 1, bytes.size() + 8, size_t{0}}) {
    std::vector<uint8_t> other = bytes;
    other.resize(size, 0);
    WireReader r(other);
    Status s = DecodeStats(&r, &got);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << size;
    EXPECT_NE(s.message().find("stats reply of " + std::to_string(size) + " bytes"),
              std::string::npos)
        << s.ToString();
    EXPECT_NE(s.message().find("different builds"), std::string::npos) << s.ToString();
  }
}

}  // namespace
}  // namespace kvtier::proto

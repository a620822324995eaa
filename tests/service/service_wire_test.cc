// kvtier serve's byte format (src/proto/wire.h): the frame header (golden bytes, each
// refusal), every payload field type and each bound of the reader, and a seeded fuzz of damaged
// messages. The socket transport is tested in service_socket_test.cc (the same binary).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "proto/wire.h"

namespace kvtier::proto {
namespace {

std::span<const uint8_t> AsBytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// ---- the frame header --------------------------------------------------------------------

TEST(WireHeaderTest, RoundTripsWithGoldenBytes) {
  FrameHeader h;
  h.type = 0x0203;
  h.seq = 0x0102030405060708ull;
  h.payload_bytes = 0x00a0b0c0;
  h.flags = 0xdeadbeef;
  uint8_t bytes[kFrameHeaderBytes];
  EncodeHeader(h, bytes);
  const uint8_t golden[kFrameHeaderBytes] = {
      'K',  'V',  'T',  'S',                           // magic
      0x02, 0x00,                                      // version 2
      0x03, 0x02,                                      // type
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // seq
      0xc0, 0xb0, 0xa0, 0x00,                          // payload_bytes
      0xef, 0xbe, 0xad, 0xde,                          // flags
  };
  EXPECT_EQ(std::vector<uint8_t>(bytes, bytes + kFrameHeaderBytes),
            std::vector<uint8_t>(golden, golden + kFrameHeaderBytes));

  Result<FrameHeader> back = DecodeHeader(bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->magic, kWireMagic);
  EXPECT_EQ(back->version, kWireVersion);
  EXPECT_EQ(back->type, h.type);
  EXPECT_EQ(back->seq, h.seq);
  EXPECT_EQ(back->payload_bytes, h.payload_bytes);
  EXPECT_EQ(back->flags, h.flags);
}

TEST(WireHeaderTest, RefusesFewerThan24Bytes) {
  uint8_t bytes[kFrameHeaderBytes];
  EncodeHeader(FrameHeader{}, bytes);
  for (size_t n : {size_t{0}, size_t{1}, kFrameHeaderBytes - 1}) {
    Result<FrameHeader> r = DecodeHeader(std::span<const uint8_t>(bytes, n));
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << n;
    EXPECT_NE(r.status().message().find("needs 24 bytes, " + std::to_string(n) + " given"),
              std::string::npos)
        << r.status().ToString();
  }
}

TEST(WireHeaderTest, RefusesWrongMagic) {
  FrameHeader h;
  h.magic = 0x50544847;  // "GHTP" as bytes
  uint8_t bytes[kFrameHeaderBytes];
  EncodeHeader(h, bytes);
  Result<FrameHeader> r = DecodeHeader(bytes);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("not a kvtier service frame (magic 0x50544847)"),
            std::string::npos)
      << r.status().ToString();
}

TEST(WireHeaderTest, RefusesOtherVersion) {
  FrameHeader h;
  h.version = 1;
  uint8_t bytes[kFrameHeaderBytes];
  EncodeHeader(h, bytes);
  Result<FrameHeader> r = DecodeHeader(bytes);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(
      r.status().message().find("protocol version 1, this build speaks 2: upgrade the older side"),
      std::string::npos)
      << r.status().ToString();
}

TEST(WireHeaderTest, RefusesPayloadOverTheLimit) {
  FrameHeader h;
  h.payload_bytes = kMaxPayloadBytes;
  uint8_t bytes[kFrameHeaderBytes];
  EncodeHeader(h, bytes);
  EXPECT_TRUE(DecodeHeader(bytes).ok()) << "the limit itself is allowed";
  h.payload_bytes = kMaxPayloadBytes + 1;
  EncodeHeader(h, bytes);
  Result<FrameHeader> r = DecodeHeader(bytes);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("67108865 bytes exceeds the limit 67108864"),
            std::string::npos)
      << r.status().ToString();
}

// ---- payload fields ----------------------------------------------------------------------

TEST(WireFieldsTest, EveryTypeRoundTrips) {
  const uint8_t raw[] = {9, 8, 7};
  const uint32_t u32s[] = {0, 1, 0xffffffffu};
  const uint64_t u64s[] = {0x1122334455667788ull};
  WireWriter w;
  w.U8(0xab);
  w.U16(0xbeef);
  w.U32(0x01020304);
  w.U64(0xfedcba9876543210ull);
  w.I64(-2);
  w.I64(std::numeric_limits<int64_t>::min());
  w.Bytes(raw);
  w.String(std::string_view("a\0b", 3));
  w.String("");
  w.U32Array(u32s);
  w.U64Array(u64s);
  w.U32Array({});
  EXPECT_EQ(w.size(), 1 + 2 + 4 + 8 + 8 + 8 + 3 + (4 + 3) + 4 + (4 + 12) + (4 + 8) + 4);
  // Little-endian, byte by byte: the u16 and u32 as the first fields after the u8.
  EXPECT_EQ(w.data()[1], 0xef);
  EXPECT_EQ(w.data()[2], 0xbe);
  EXPECT_EQ(w.data()[3], 0x04);
  EXPECT_EQ(w.data()[6], 0x01);
  const std::vector<uint8_t> buf = w.Take();
  EXPECT_EQ(w.size(), 0u) << "Take leaves the writer empty";

  WireReader r(buf);
  uint8_t u8 = 0;
  uint16_t u16 = 0;
  uint32_t u32 = 0;
  uint64_t u64 = 0;
  int64_t i64a = 0, i64b = 0;
  std::span<const uint8_t> view;
  std::string s1, s2 = "not cleared";
  std::vector<uint32_t> a32, empty32 = {5};
  std::vector<uint64_t> a64;
  ASSERT_TRUE(r.U8("u8", &u8).ok());
  ASSERT_TRUE(r.U16("u16", &u16).ok());
  ASSERT_TRUE(r.U32("u32", &u32).ok());
  ASSERT_TRUE(r.U64("u64", &u64).ok());
  ASSERT_TRUE(r.I64("i64a", &i64a).ok());
  ASSERT_TRUE(r.I64("i64b", &i64b).ok());
  ASSERT_TRUE(r.Bytes("raw", 3, &view).ok());
  ASSERT_TRUE(r.String("s1", 3, &s1).ok());
  ASSERT_TRUE(r.String("s2", 0, &s2).ok());
  ASSERT_TRUE(r.U32Array("a32", 3, &a32).ok());
  ASSERT_TRUE(r.U64Array("a64", 1, &a64).ok());
  ASSERT_TRUE(r.U32Array("empty32", 0, &empty32).ok());
  EXPECT_EQ(r.remaining(), 0u);
  EXPECT_TRUE(r.Done().ok()) << r.Done().ToString();

  EXPECT_EQ(u8, 0xab);
  EXPECT_EQ(u16, 0xbeef);
  EXPECT_EQ(u32, 0x01020304u);
  EXPECT_EQ(u64, 0xfedcba9876543210ull);
  EXPECT_EQ(i64a, -2);
  EXPECT_EQ(i64b, std::numeric_limits<int64_t>::min());
  EXPECT_EQ(std::vector<uint8_t>(view.begin(), view.end()), std::vector<uint8_t>({9, 8, 7}));
  EXPECT_EQ(view.data(), buf.data() + 31) << "Bytes is a view into the buffer";
  EXPECT_EQ(s1, std::string("a\0b", 3));
  EXPECT_EQ(s2, "");
  EXPECT_EQ(a32, std::vector<uint32_t>({0, 1, 0xffffffffu}));
  EXPECT_EQ(a64, std::vector<uint64_t>({0x1122334455667788ull}));
  EXPECT_TRUE(empty32.empty());
}

TEST(WireFieldsTest, CountReadsAnElementCountForTheCallersOwnElements) {
  WireWriter w;
  w.U32(2);
  w.String("x");
  w.String("yz");
  WireReader r(w.data());
  uint32_t n = 0;
  ASSERT_TRUE(r.Count("names", 2, 4, &n).ok());
  EXPECT_EQ(n, 2u);
  std::string a, b;
  ASSERT_TRUE(r.String("name", 8, &a).ok());
  ASSERT_TRUE(r.String("name", 8, &b).ok());
  EXPECT_EQ(a + b, "xyz");
  EXPECT_TRUE(r.Done().ok());
}

// Each read of a field that does not fit in what is left: InvalidArgument naming the field.
TEST(WireReaderTest, ShortBufferNamesTheField) {
  const std::vector<uint8_t> two = {1, 2};
  struct Case {
    const char* name;
    std::function<Status(WireReader&)> read;
    const char* expected;
  };
  uint8_t u8;
  uint16_t u16;
  uint32_t u32;
  uint64_t u64;
  int64_t i64;
  std::span<const uint8_t> view;
  const std::vector<Case> cases = {
      {"u32", [&](WireReader& r) { return r.U32("prompt", &u32); },
       "service protocol: field 'prompt' needs 4 bytes, 2 left"},
      {"u64", [&](WireReader& r) { return r.U64("seq", &u64); },
       "service protocol: field 'seq' needs 8 bytes, 2 left"},
      {"i64", [&](WireReader& r) { return r.I64("offset", &i64); },
       "service protocol: field 'offset' needs 8 bytes, 2 left"},
      {"bytes", [&](WireReader& r) { return r.Bytes("blob", 3, &view); },
       "service protocol: field 'blob' needs 3 bytes, 2 left"},
      {"u16 then u8",
       [&](WireReader& r) {
         Status s = r.U16("kind", &u16);
         if (!s.ok()) return Status::Internal("u16 should fit: " + s.ToString());
         return r.U8("flag", &u8);
       },
       "service protocol: field 'flag' needs 1 bytes, 0 left"},
  };
  for (const Case& c : cases) {
    WireReader r(two);
    Status s = c.read(r);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.name;
    EXPECT_EQ(s.message(), c.expected) << c.name;
  }
}

TEST(WireReaderTest, CountOverTheLimitIsRefused) {
  WireWriter w;
  w.U32(9000000);
  WireReader r(w.data());
  uint32_t n = 7;
  Status s = r.Count("prompt", 1048576, 0, &n);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "service protocol: field 'prompt' count 9000000 exceeds the limit 1048576");
  EXPECT_EQ(n, 7u) << "out is left alone on failure";

  // The arrays check the same limit, before looking at the bytes.
  WireWriter w2;
  w2.U32Array(std::vector<uint32_t>(5, 1));
  WireReader r2(w2.data());
  std::vector<uint32_t> out;
  s = r2.U32Array("tokens", 4, &out);
  EXPECT_EQ(s.message(), "service protocol: field 'tokens' count 5 exceeds the limit 4");
  EXPECT_TRUE(out.empty());
}

TEST(WireReaderTest, CountTimesMinBytesOverRemainingIsRefused) {
  // 10 elements of at least 4 bytes need 40; 39 are left.
  WireWriter w;
  w.U32(10);
  w.Bytes(std::vector<uint8_t>(39, 0));
  uint32_t n = 0;
  {
    WireReader r(w.data());
    Status s = r.Count("entries", 1000, 4, &n);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(),
              "service protocol: field 'entries' count 10 needs at least 40 bytes, 39 left");
  }
  w.U8(0);  // now 40 are left: allowed
  {
    WireReader r(w.data());
    EXPECT_TRUE(r.Count("entries", 1000, 4, &n).ok());
    EXPECT_EQ(n, 10u);
  }
  // A forged count at the limit with nothing behind it: refused before anything is allocated.
  WireWriter forged;
  forged.U32(1u << 20);
  WireReader r(forged.data());
  std::vector<uint64_t> keys;
  Status s = r.U64Array("keys", 1u << 20, &keys);
  EXPECT_EQ(s.message(),
            "service protocol: field 'keys' count 1048576 needs at least 8388608 bytes, 0 left");
  EXPECT_EQ(keys.capacity(), 0u);
}

TEST(WireReaderTest, StringOverTheLimitOrShortIsRefused) {
  WireWriter w;
  w.String(std::string(65, 'x'));
  std::string out = "unchanged";
  {
    WireReader r(w.data());
    Status s = r.String("name", 64, &out);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), "service protocol: field 'name' length 65 exceeds the limit 64");
    EXPECT_EQ(out, "unchanged");
  }
  {
    WireReader r(w.data());
    EXPECT_TRUE(r.String("name", 65, &out).ok());
    EXPECT_EQ(out, std::string(65, 'x'));
  }
  // A length within the limit whose bytes are not all there.
  WireWriter shorter;
  shorter.U32(10);
  shorter.Bytes(AsBytes("abc"));
  WireReader r(shorter.data());
  Status s = r.String("name", 64, &out);
  EXPECT_EQ(s.message(), "service protocol: field 'name' needs 10 bytes, 3 left");
}

TEST(WireReaderTest, TrailingBytesAreRefused) {
  WireWriter w;
  w.U32(1);
  w.U16(2);
  w.Bytes(AsBytes("xyz"));
  WireReader r(w.data());
  uint32_t a = 0;
  uint16_t b = 0;
  ASSERT_TRUE(r.U32("a", &a).ok());
  ASSERT_TRUE(r.U16("b", &b).ok());
  EXPECT_EQ(r.remaining(), 3u);
  Status s = r.Done();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "service protocol: 3 trailing bytes after field 'b'");

  WireReader untouched(w.data());
  s = untouched.Done();
  EXPECT_EQ(s.message(), "service protocol: 9 trailing bytes in a message with no fields read");
  EXPECT_TRUE(WireReader({}).Done().ok());
}

TEST(WireReaderTest, AFailedReadLeavesTheReaderUnusable) {
  WireWriter w;
  w.U32(100);  // a string length over the limit below
  w.U64(42);
  WireReader r(w.data());
  std::string name;
  Status first = r.String("name", 10, &name);
  ASSERT_EQ(first.code(), StatusCode::kInvalidArgument);
  // The u64 that follows would fit, but the reader refuses to go on.
  uint64_t v = 7;
  Status later = r.U64("seq", &v);
  EXPECT_EQ(later.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(later.message(), first.message());
  EXPECT_EQ(v, 7u);
  EXPECT_EQ(r.remaining(), 0u);
  EXPECT_EQ(r.Done().message(), first.message());
}

// ---- a seeded fuzz of damaged messages ---------------------------------------------------

// A small message with every kind of field, as a service message would have.
struct Sample {
  uint16_t kind = 0;
  std::string name;
  std::vector<uint32_t> tokens;
  std::vector<uint64_t> keys;
  int64_t offset = 0;
  std::vector<std::pair<std::string, uint8_t>> entries;
  std::vector<uint8_t> blob;
  bool operator==(const Sample&) const = default;
};

std::vector<uint8_t> EncodeSample(const Sample& m) {
  WireWriter w;
  w.U16(m.kind);
  w.String(m.name);
  w.U32Array(m.tokens);
  w.U64Array(m.keys);
  w.I64(m.offset);
  w.U32(static_cast<uint32_t>(m.entries.size()));
  for (const auto& [text, flag] : m.entries) {
    w.String(text);
    w.U8(flag);
  }
  w.U32(static_cast<uint32_t>(m.blob.size()));
  w.Bytes(m.blob);
  return w.Take();
}

// Limits far above what the samples use, so that only the remaining-bytes checks stand
// between a forged count and a large allocation.
Status DecodeSample(std::span<const uint8_t> bytes, Sample* m) {
  WireReader r(bytes);
  KVTIER_RETURN_IF_ERROR(r.U16("kind", &m->kind));
  KVTIER_RETURN_IF_ERROR(r.String("name", 1u << 24, &m->name));
  KVTIER_RETURN_IF_ERROR(r.U32Array("tokens", 1u << 24, &m->tokens));
  KVTIER_RETURN_IF_ERROR(r.U64Array("keys", 1u << 24, &m->keys));
  KVTIER_RETURN_IF_ERROR(r.I64("offset", &m->offset));
  uint32_t n = 0;
  KVTIER_RETURN_IF_ERROR(r.Count("entries", 1u << 24, 5, &n));
  m->entries.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    std::pair<std::string, uint8_t> e;
    KVTIER_RETURN_IF_ERROR(r.String("entry.text", 1u << 16, &e.first));
    KVTIER_RETURN_IF_ERROR(r.U8("entry.flag", &e.second));
    m->entries.push_back(std::move(e));
  }
  KVTIER_RETURN_IF_ERROR(r.Count("blob", 1u << 30, 1, &n));
  std::span<const uint8_t> blob;
  KVTIER_RETURN_IF_ERROR(r.Bytes("blob", n, &blob));
  m->blob.assign(blob.begin(), blob.end());
  return r.Done();
}

Sample RandomSample(std::mt19937_64& rng) {
  auto upto = [&](uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n)(rng); };
  Sample m;
  m.kind = static_cast<uint16_t>(upto(0xffff));
  m.name.resize(upto(40));
  for (char& c : m.name) c = static_cast<char>('a' + upto(25));
  m.tokens.resize(upto(64));
  for (uint32_t& t : m.tokens) t = static_cast<uint32_t>(rng());
  m.keys.resize(upto(32));
  for (uint64_t& k : m.keys) k = rng();
  m.offset = static_cast<int64_t>(rng());
  m.entries.resize(upto(8));
  for (auto& [text, flag] : m.entries) {
    text.assign(upto(12), 'e');
    flag = static_cast<uint8_t>(upto(255));
  }
  m.blob.resize(upto(64));
  for (uint8_t& b : m.blob) b = static_cast<uint8_t>(rng());
  return m;
}

void Mutate(std::mt19937_64& rng, std::vector<uint8_t>* buf) {
  auto upto = [&](uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n)(rng); };
  switch (upto(5)) {
    case 0:  // flip bits
      for (uint64_t i = 0, n = 1 + upto(7); i < n && !buf->empty(); ++i) {
        (*buf)[upto(buf->size() - 1)] ^= static_cast<uint8_t>(1u << upto(7));
      }
      break;
    case 1: {  // a forged length or count somewhere
      if (buf->size() < 4) break;
      const uint32_t values[] = {0xffffffffu,
                                 0x80000000u,
                                 1u << 24,
                                 1u << 20,
                                 static_cast<uint32_t>(buf->size()),
                                 static_cast<uint32_t>(rng())};
      const uint32_t v = values[upto(5)];
      const size_t at = upto(buf->size() - 4);
      for (int i = 0; i < 4; ++i) (*buf)[at + i] = static_cast<uint8_t>(v >> (8 * i));
      break;
    }
    case 2:  // truncated
      buf->resize(upto(buf->size()));
      break;
    case 3:  // extra bytes at the end
      for (uint64_t i = 0, n = 1 + upto(16); i < n; ++i)
        buf->push_back(static_cast<uint8_t>(rng()));
      break;
    case 4: {  // bytes inserted in the middle
      const size_t at = upto(buf->size());
      std::vector<uint8_t> junk(1 + upto(8));
      for (uint8_t& b : junk) b = static_cast<uint8_t>(rng());
      buf->insert(buf->begin() + static_cast<ptrdiff_t>(at), junk.begin(), junk.end());
      break;
    }
    case 5: {  // a range erased
      if (buf->empty()) break;
      const size_t at = upto(buf->size() - 1);
      const size_t n = std::min<size_t>(1 + upto(8), buf->size() - at);
      buf->erase(buf->begin() + static_cast<ptrdiff_t>(at),
                 buf->begin() + static_cast<ptrdiff_t>(at + n));
      break;
    }
  }
}

TEST(WireFuzzTest, DamagedMessagesDecodeToOkOrInvalidArgumentWithinTheirSize) {
  std::mt19937_64 rng(20240607);
  int ok = 0, refused = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    const Sample original = RandomSample(rng);
    std::vector<uint8_t> buf = EncodeSample(original);
    Sample clean;
    ASSERT_TRUE(DecodeSample(buf, &clean).ok()) << "iteration " << iter;
    ASSERT_EQ(clean, original) << "iteration " << iter;

    const int mutations = 1 + static_cast<int>(rng() % 3);
    for (int i = 0; i < mutations; ++i) Mutate(rng, &buf);
    Sample m;
    Status s = DecodeSample(buf, &m);
    if (s.ok()) {
      ++ok;
    } else if (s.code() == StatusCode::kInvalidArgument) {
      ++refused;
      ASSERT_EQ(s.message().rfind("service protocol: ", 0), 0u) << s.ToString();
    } else {
      FAIL() << "iteration " << iter << ": " << s.ToString();
    }
    // Whatever was decoded, nothing was allocated beyond what the bytes themselves can hold.
    const size_t n = buf.size();
    ASSERT_LE(m.tokens.capacity() * 4, n) << "iteration " << iter;
    ASSERT_LE(m.keys.capacity() * 8, n) << "iteration " << iter;
    ASSERT_LE(m.entries.capacity() * 5, n) << "iteration " << iter;
    ASSERT_LE(m.name.size(), n) << "iteration " << iter;
    ASSERT_LE(m.blob.capacity(), n) << "iteration " << iter;
  }
  // Both outcomes must be common, or the mutations do not test the decoder.
  EXPECT_GT(ok, 500);
  EXPECT_GT(refused, 10000);
  std::printf("fuzz: %d decoded, %d refused\n", ok, refused);
}

}  // namespace
}  // namespace kvtier::proto

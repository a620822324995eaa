#include "tier/block_format.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace kvtier {
namespace {

constexpr uint64_t kPayload = 8192;

struct Block {
  std::vector<uint8_t> bytes = std::vector<uint8_t>(kBlockHeaderBytes + kPayload);
  uint8_t* payload() { return bytes.data() + kBlockHeaderBytes; }
};

BlockHeaderFields Fields() {
  BlockHeaderFields f;
  f.layout_fingerprint = 0x1122334455667788ull;
  f.namespace_id = 42;
  f.key = BlockKey{0xaaaa, 0xbbbb};
  f.parent = BlockKey{0xcccc, 0xdddd};
  f.write_generation = 9;
  f.slot_index = 3;
  return f;
}

std::vector<TokenId> Tokens(size_t n, TokenId base = 100) {
  std::vector<TokenId> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = base + static_cast<TokenId>(i);
  return t;
}

Block MakeBlock(const std::vector<TokenId>& tokens, const BlockHeaderFields& f = Fields()) {
  Block b;
  for (uint64_t i = 0; i < kPayload; ++i) b.payload()[i] = static_cast<uint8_t>(i * 31 + 7);
  Status s = EncodeBlockHeader(f, tokens, kPayload, PayloadChecksum(b.payload(), kPayload),
                               b.bytes.data());
  EXPECT_TRUE(s.ok()) << s.ToString();
  return b;
}

ExpectedBlock Expect(const std::vector<TokenId>& tokens) {
  ExpectedBlock e;
  const BlockHeaderFields f = Fields();
  e.layout_fingerprint = f.layout_fingerprint;
  e.namespace_id = f.namespace_id;
  e.key = f.key;
  e.tokens = tokens;
  e.payload_bytes = kPayload;
  e.check_generation = true;
  e.write_generation = f.write_generation;
  e.check_slot = true;
  e.slot_index = f.slot_index;
  return e;
}

// Rewrites the header checksum so that a deliberately bad field gets past it: the decoder must
// still refuse out-of-range lengths.
void Reseal(Block* b) {
  const uint64_t sum = XXH3_64bits(b->bytes.data(), offsetof(BlockHeader, header_checksum));
  std::memcpy(b->bytes.data() + offsetof(BlockHeader, header_checksum), &sum, 8);
}

TEST(BlockFormat, LayoutIsPinned) {
  EXPECT_EQ(sizeof(BlockHeader), 4096u);
  EXPECT_EQ(offsetof(BlockHeader, layout_fingerprint), 16u);
  EXPECT_EQ(offsetof(BlockHeader, key_hi), 32u);
  EXPECT_EQ(offsetof(BlockHeader, parent_hi), 48u);
  EXPECT_EQ(offsetof(BlockHeader, write_generation), 64u);
  EXPECT_EQ(offsetof(BlockHeader, payload_bytes), 72u);
  EXPECT_EQ(offsetof(BlockHeader, payload_checksum), 80u);
  EXPECT_EQ(offsetof(BlockHeader, slot_index), 88u);
  EXPECT_EQ(offsetof(BlockHeader, token_count), 92u);
  EXPECT_EQ(offsetof(BlockHeader, token_width), 96u);
  EXPECT_EQ(offsetof(BlockHeader, tokens), 128u);
  EXPECT_EQ(offsetof(BlockHeader, header_checksum), 4088u);
  EXPECT_EQ(kBlockFormatVersion, 2u);
  EXPECT_EQ(kOldestReadableBlockFormatVersion, 1u);
  EXPECT_EQ(kMaxWideTokens, 990u);
  EXPECT_EQ(kMaxNarrowTokens, 1320u);
}

// The header grows with the block only past what 4 KiB holds, so every block size of version 1
// (at most 1024 tokens) keeps its 4 KiB header, and G3 slots keep their stride.
TEST(BlockFormat, HeaderSizeByBlockSize) {
  for (uint32_t n : {0u, 1u, 3u, 16u, 48u, 96u, 528u, 784u, 990u, 991u, 1024u, 1320u}) {
    EXPECT_EQ(BlockHeaderBytesFor(n), 4096u) << n;
  }
  EXPECT_EQ(BlockHeaderBytesFor(1321), 8192u);
  EXPECT_EQ(BlockHeaderBytesFor(2014), 8192u);  // 128 + 2014 x 4 + 8 = 8192
  EXPECT_EQ(BlockHeaderBytesFor(2015), 12288u);
  EXPECT_EQ(BlockHeaderBytesFor(4096), 20480u);
  EXPECT_EQ(kMaxBlockHeaderBytes, 20480u);
}

// Pins the exact bytes of version 2: if this changes, the format changed and
// kBlockFormatVersion must be bumped (and this constant updated with it).
TEST(BlockFormat, GoldenHeaderBytes) {
  const std::vector<TokenId> tokens = Tokens(16);
  std::vector<uint8_t> header(kBlockHeaderBytes);
  ASSERT_TRUE(
      EncodeBlockHeader(Fields(), tokens, kPayload, 0x0123456789abcdefull, header.data()).ok());
  EXPECT_EQ(XXH3_64bits(header.data(), header.size()), 0xeaaee5b6d40854f6ull)
      << std::hex << XXH3_64bits(header.data(), header.size());
}

// Stamps a header of this build as version 1 and reseals it: for 4 KiB headers, exactly the
// bytes the version 1 writer produced (GoldenHeaderBytes of version 1 checks that).
void StampVersion1(uint8_t* header) {
  const uint32_t v1 = 1;
  std::memcpy(header + offsetof(BlockHeader, format_version), &v1, 4);
  const uint64_t sum = XXH3_64bits(header, offsetof(BlockHeader, header_checksum));
  std::memcpy(header + offsetof(BlockHeader, header_checksum), &sum, 8);
}

// What kvtier wrote before any-size blocks (format version 1) is still read: the version 1
// golden header (its hash pinned before version 2 existed) decodes and verifies, as does a
// version 1 block of 1024 tokens (3-byte ids).
TEST(BlockFormat, Version1BlocksAreStillRead) {
  const std::vector<TokenId> tokens = Tokens(16);
  std::vector<uint8_t> header(kBlockHeaderBytes);
  ASSERT_TRUE(
      EncodeBlockHeader(Fields(), tokens, kPayload, 0x0123456789abcdefull, header.data()).ok());
  StampVersion1(header.data());
  ASSERT_EQ(XXH3_64bits(header.data(), header.size()), 0x3309cbc9c009253eull)
      << "not the version 1 golden bytes: " << std::hex
      << XXH3_64bits(header.data(), header.size());
  DecodedBlockHeader h;
  std::string why;
  ASSERT_EQ(DecodeBlockHeader(header, &h, &why), BlockCheck::kOk) << why;
  EXPECT_EQ(h.format_version, 1u);
  EXPECT_EQ(h.header_bytes, 4096u);
  EXPECT_TRUE(std::equal(tokens.begin(), tokens.end(), h.token_span().begin()));

  for (size_t n : {size_t{16}, size_t{1024}}) {
    const std::vector<TokenId> t = Tokens(n, n == 16 ? 4000000000u : 1000);
    Block b = MakeBlock(t);
    StampVersion1(b.bytes.data());
    ASSERT_EQ(DecodeBlockHeader(b.bytes, &h, &why), BlockCheck::kOk) << n << ": " << why;
    EXPECT_EQ(h.format_version, 1u);
    EXPECT_EQ(VerifyBlock(b.bytes, Expect(t)), BlockCheck::kOk) << n;
  }
}

// A header of a version this build does not read (a newer kvtier wrote it, or version 0) is
// refused, and the message names the version, what this build reads and what to do.
TEST(BlockFormat, UnknownVersionsAreRefusedByName) {
  for (uint32_t version : {0u, 3u, 77u}) {
    Block b = MakeBlock(Tokens(16));
    std::memcpy(b.bytes.data() + offsetof(BlockHeader, format_version), &version, 4);
    Reseal(&b);
    std::string why;
    EXPECT_EQ(DecodeBlockHeader(b.bytes, nullptr, &why), BlockCheck::kBadHeader) << version;
    EXPECT_NE(why.find("block format version " + std::to_string(version)), std::string::npos)
        << why;
    EXPECT_NE(why.find("this build reads versions 1..2"), std::string::npos) << why;
    if (version > 2) {
      EXPECT_NE(why.find("newer kvtier"), std::string::npos) << why;
      EXPECT_NE(why.find("empty the G3 directory"), std::string::npos) << why;
    }
  }
  // Version 1 never had a header larger than 4 KiB nor more than 1024 tokens.
  const std::vector<TokenId> t = Tokens(1500);
  std::vector<uint8_t> big(BlockHeaderBytesFor(t.size()) + kPayload);
  ASSERT_TRUE(EncodeBlockHeader(Fields(), t, kPayload, 0, big.data()).ok());
  const uint32_t v1 = 1;
  std::memcpy(big.data() + offsetof(BlockHeader, format_version), &v1, 4);
  std::string why;
  EXPECT_EQ(DecodeBlockHeader(big, nullptr, &why), BlockCheck::kBadHeader);
  EXPECT_NE(why.find("out of range for version 1"), std::string::npos) << why;
}

// Blocks longer than a 4 KiB header holds get a larger header (a multiple of 4 KiB) with full
// 32-bit ids; the payload follows it; every header bit is still covered by the checksum.
TEST(BlockFormat, LongBlocksGetLargerHeaders) {
  for (size_t n : {size_t{1321}, size_t{2048}, size_t{4096}}) {
    const std::vector<TokenId> tokens = Tokens(n, 0xfffff000u - static_cast<TokenId>(n));
    const uint64_t hb = BlockHeaderBytesFor(n);
    std::vector<uint8_t> bytes(hb + kPayload, 0xee);
    for (uint64_t i = 0; i < kPayload; ++i) bytes[hb + i] = static_cast<uint8_t>(i * 13 + n);
    ASSERT_TRUE(EncodeBlockHeader(Fields(), tokens, kPayload,
                                  PayloadChecksum(bytes.data() + hb, kPayload), bytes.data())
                    .ok());
    DecodedBlockHeader h;
    std::string why;
    ASSERT_EQ(DecodeBlockHeader(bytes, &h, &why), BlockCheck::kOk) << n << ": " << why;
    EXPECT_EQ(h.header_bytes, hb);
    EXPECT_EQ(h.format_version, 2u);
    ASSERT_EQ(h.token_count, n);
    EXPECT_TRUE(std::equal(tokens.begin(), tokens.end(), h.token_span().begin())) << n;
    ExpectedBlock e = Expect(tokens);
    e.header_bytes = hb;
    EXPECT_EQ(VerifyBlock(bytes, e), BlockCheck::kOk) << n;
    // A reader whose header area differs (another block size) is not served.
    e.header_bytes = kBlockHeaderBytes;
    EXPECT_EQ(VerifyBlock(bytes, e), BlockCheck::kWrongLayout) << n;
    e.header_bytes = hb;
    // The header cut short is refused without reading past it.
    EXPECT_EQ(DecodeBlockHeader({bytes.data(), hb - 1}, nullptr, &why), BlockCheck::kBadHeader);
    EXPECT_NE(why.find("truncated"), std::string::npos) << why;
    // Flips spread over the whole header (every 37th bit, and the last 64) are detected.
    for (size_t bit = 0; bit < hb * 8; bit += (bit < hb * 8 - 64 ? 37 : 1)) {
      bytes[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
      ASSERT_NE(VerifyBlock(bytes, e), BlockCheck::kOk) << n << " bit " << bit;
      bytes[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    }
    bytes[hb + 100] ^= 1;
    EXPECT_EQ(VerifyBlock(bytes, e), BlockCheck::kBadPayload) << "the payload starts at " << hb;
  }
}

TEST(BlockFormat, RoundTrip) {
  const std::vector<TokenId> tokens = Tokens(16, 4000000000u);
  Block b = MakeBlock(tokens);
  DecodedBlockHeader h;
  ASSERT_EQ(DecodeBlockHeader(b.bytes, &h), BlockCheck::kOk);
  EXPECT_EQ(h.fields.key, Fields().key);
  EXPECT_EQ(h.fields.parent, Fields().parent);
  EXPECT_EQ(h.fields.namespace_id, 42u);
  EXPECT_EQ(h.fields.layout_fingerprint, Fields().layout_fingerprint);
  EXPECT_EQ(h.fields.write_generation, 9u);
  EXPECT_EQ(h.fields.slot_index, 3u);
  EXPECT_EQ(h.payload_bytes, kPayload);
  ASSERT_EQ(h.token_count, 16u);
  EXPECT_TRUE(std::equal(tokens.begin(), tokens.end(), h.token_span().begin()));
  EXPECT_EQ(VerifyBlock(b.bytes, Expect(tokens)), BlockCheck::kOk);
}

TEST(BlockFormat, LongBlocksStoreNarrowIds) {
  // 512 tokens keep full 32-bit ids; 1024 tokens store 24-bit ids.
  const std::vector<TokenId> wide = Tokens(512, 0xfffff000u);
  Block w = MakeBlock(wide);
  EXPECT_EQ(VerifyBlock(w.bytes, Expect(wide)), BlockCheck::kOk);

  const std::vector<TokenId> narrow = Tokens(1024, kMaxNarrowTokenId - 1023);
  Block n = MakeBlock(narrow);
  DecodedBlockHeader h;
  ASSERT_EQ(DecodeBlockHeader(n.bytes, &h), BlockCheck::kOk);
  EXPECT_EQ(h.token_count, 1024u);
  EXPECT_EQ(h.tokens[1023], kMaxNarrowTokenId);
  EXPECT_EQ(VerifyBlock(n.bytes, Expect(narrow)), BlockCheck::kOk);

  std::vector<TokenId> too_big = narrow;
  too_big[500] = kMaxNarrowTokenId + 1;
  std::vector<uint8_t> out(kBlockHeaderBytes, 0xee);
  Status s = EncodeBlockHeader(Fields(), too_big, kPayload, 0, out.data());
  EXPECT_TRUE(s.Is(StatusCode::kInvalidArgument)) << s.ToString();
  EXPECT_NE(s.message().find("position 500"), std::string::npos) << s.message();
  EXPECT_EQ(out[0], 0xee) << "nothing written on failure";
}

TEST(BlockFormat, RefusesWhatCannotBeStored) {
  std::vector<uint8_t> out(kMaxBlockHeaderBytes + 4096);
  EXPECT_TRUE(
      EncodeBlockHeader(Fields(), Tokens(KvLayout::kMaxTokensPerBlock + 1), kPayload, 0, out.data())
          .Is(StatusCode::kInvalidArgument));
  EXPECT_TRUE(EncodeBlockHeader(Fields(), Tokens(1), KvLayout::kMaxBlockBytes + 1, 0, out.data())
                  .Is(StatusCode::kInvalidArgument));
}

TEST(BlockFormat, ZeroesAreEmptyNotCorrupt) {
  std::vector<uint8_t> zeros(kBlockHeaderBytes, 0);
  EXPECT_EQ(DecodeBlockHeader(zeros, nullptr), BlockCheck::kEmpty);
  std::vector<uint8_t> garbage(kBlockHeaderBytes, 0x5a);
  EXPECT_EQ(DecodeBlockHeader(garbage, nullptr), BlockCheck::kBadHeader);
}

TEST(BlockFormat, ShortInputIsRefusedWithoutReadingPastIt) {
  Block b = MakeBlock(Tokens(16));
  std::string why;
  EXPECT_EQ(DecodeBlockHeader({b.bytes.data(), 100}, nullptr, &why), BlockCheck::kBadHeader);
  EXPECT_NE(why.find("truncated"), std::string::npos);
  // A buffer holding the header but not the whole payload.
  EXPECT_EQ(VerifyBlock({b.bytes.data(), kBlockHeaderBytes + 10}, Expect(Tokens(16))),
            BlockCheck::kWrongPayloadLength);
}

TEST(BlockFormat, EveryHeaderBitFlipIsDetected) {
  const std::vector<TokenId> tokens = Tokens(16);
  Block b = MakeBlock(tokens);
  for (size_t bit = 0; bit < kBlockHeaderBytes * 8; ++bit) {
    b.bytes[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    ASSERT_NE(VerifyBlock(b.bytes, Expect(tokens)), BlockCheck::kOk) << "bit " << bit;
    b.bytes[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  }
  EXPECT_EQ(VerifyBlock(b.bytes, Expect(tokens)), BlockCheck::kOk);
}

TEST(BlockFormat, PayloadBitFlipsAreDetected) {
  const std::vector<TokenId> tokens = Tokens(16);
  Block b = MakeBlock(tokens);
  for (size_t bit = 0; bit < kPayload * 8; bit += 61) {
    b.payload()[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    ASSERT_EQ(VerifyBlock(b.bytes, Expect(tokens)), BlockCheck::kBadPayload) << "bit " << bit;
    b.payload()[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  }
}

TEST(BlockFormat, ForgedLengthsAreRefused) {
  const std::vector<TokenId> tokens = Tokens(16);
  struct Case {
    const char* what;
    size_t offset;
    uint64_t value;
    size_t width;
  };
  const Case cases[] = {
      {"token_count", offsetof(BlockHeader, token_count), 5000, 4},
      {"token_count", offsetof(BlockHeader, token_count), 0xffffffffu, 4},
      {"token_width", offsetof(BlockHeader, token_width), 7, 1},
      {"token_width", offsetof(BlockHeader, token_width), 3, 1},  // 3 is for > 990 tokens only
      {"payload_bytes", offsetof(BlockHeader, payload_bytes), ~0ull, 8},
      {"format_version", offsetof(BlockHeader, format_version), 3, 4},
      {"header_bytes", offsetof(BlockHeader, header_bytes), 8192, 4},
      {"header_bytes", offsetof(BlockHeader, header_bytes), 4097, 4},
      {"header_bytes", offsetof(BlockHeader, header_bytes), 0, 4},
  };
  for (const Case& c : cases) {
    Block b = MakeBlock(tokens);
    std::memcpy(b.bytes.data() + c.offset, &c.value, c.width);
    Reseal(&b);
    std::string why;
    DecodedBlockHeader h;
    EXPECT_EQ(DecodeBlockHeader(b.bytes, &h, &why), BlockCheck::kBadHeader) << c.what;
    EXPECT_FALSE(why.empty()) << c.what;
  }
  // A forged payload length that is in range but larger than the buffer.
  Block b = MakeBlock(tokens);
  const uint64_t big = kPayload * 4;
  std::memcpy(b.bytes.data() + offsetof(BlockHeader, payload_bytes), &big, 8);
  Reseal(&b);
  ExpectedBlock e = Expect(tokens);
  e.payload_bytes = big;
  EXPECT_EQ(VerifyBlock(b.bytes, e), BlockCheck::kWrongPayloadLength);
}

TEST(BlockFormat, EachIdentityMismatchIsNamed) {
  const std::vector<TokenId> tokens = Tokens(16);
  Block b = MakeBlock(tokens);
  {
    ExpectedBlock e = Expect(tokens);
    e.key.lo ^= 1;
    EXPECT_EQ(VerifyBlock(b.bytes, e), BlockCheck::kWrongKey);
  }
  {
    std::vector<TokenId> other = tokens;
    other[15] += 1;
    EXPECT_EQ(VerifyBlock(b.bytes, Expect(other)), BlockCheck::kWrongTokens);
    EXPECT_EQ(VerifyBlock(b.bytes, Expect(Tokens(15))), BlockCheck::kWrongTokens);
  }
  {
    ExpectedBlock e = Expect(tokens);
    e.namespace_id = 43;
    EXPECT_EQ(VerifyBlock(b.bytes, e), BlockCheck::kWrongNamespace);
  }
  {
    ExpectedBlock e = Expect(tokens);
    e.layout_fingerprint ^= 1;
    EXPECT_EQ(VerifyBlock(b.bytes, e), BlockCheck::kWrongLayout);
  }
  {
    ExpectedBlock e = Expect(tokens);
    e.write_generation = 10;
    EXPECT_EQ(VerifyBlock(b.bytes, e), BlockCheck::kWrongGeneration);
  }
  {
    ExpectedBlock e = Expect(tokens);
    e.slot_index = 4;
    EXPECT_EQ(VerifyBlock(b.bytes, e), BlockCheck::kWrongSlot);
  }
  {
    ExpectedBlock e = Expect(tokens);
    e.payload_bytes = kPayload - 4096;
    EXPECT_EQ(VerifyBlock(b.bytes, e), BlockCheck::kWrongPayloadLength);
  }
  {
    ExpectedBlock e = Expect({});
    e.tokens = {};
    EXPECT_EQ(VerifyBlock(b.bytes, e), BlockCheck::kOk) << "empty tokens skip the comparison";
  }
  EXPECT_STREQ(BlockCheckName(BlockCheck::kBadPayload), "bad-payload");
}

}  // namespace
}  // namespace kvtier

namespace kvtier {
namespace {

// `b`'s payload cut into pieces at `cuts` (copies: the pieces must not alias the block).
std::vector<std::vector<uint8_t>> Cut(Block& b, const std::vector<uint64_t>& cuts) {
  std::vector<std::vector<uint8_t>> out;
  uint64_t at = 0;
  for (uint64_t c : cuts) {
    out.emplace_back(b.payload() + at, b.payload() + c);
    at = c;
  }
  out.emplace_back(b.payload() + at, b.payload() + kPayload);
  return out;
}

std::vector<std::span<uint8_t>> Spans(std::vector<std::vector<uint8_t>>& pieces) {
  std::vector<std::span<uint8_t>> out;
  for (auto& p : pieces) out.emplace_back(p.data(), p.size());
  return out;
}

TEST(BlockFormatPieces, ChecksumOfPiecesEqualsTheContiguousOne) {
  const std::vector<TokenId> tokens = Tokens(16);
  Block b = MakeBlock(tokens);
  const uint64_t whole = PayloadChecksum(b.payload(), kPayload);
  for (const std::vector<uint64_t>& cuts :
       std::vector<std::vector<uint64_t>>{{}, {1}, {100, 101, 4096}, {239, 240, 241, 8000}}) {
    auto pieces = Cut(b, cuts);
    EXPECT_EQ(PayloadChecksumPieces(Spans(pieces), kPayload), whole) << cuts.size() << " cuts";
  }
  // Only the first `bytes` count.
  auto pieces = Cut(b, {4000});
  EXPECT_EQ(PayloadChecksumPieces(Spans(pieces), 5000), PayloadChecksum(b.payload(), 5000));
}

TEST(BlockFormatPieces, VerifiesLikeTheContiguousBlock) {
  const std::vector<TokenId> tokens = Tokens(16);
  Block b = MakeBlock(tokens);
  ExpectedBlock e = Expect(tokens);
  e.header_bytes = kBlockHeaderBytes;
  const std::span<const uint8_t> header(b.bytes.data(), kBlockHeaderBytes);
  const uint64_t size = b.bytes.size();
  auto pieces = Cut(b, {512, 513, 4096});
  EXPECT_EQ(VerifyBlockPieces(header, Spans(pieces), size, e), BlockCheck::kOk);
  // A flipped payload bit in any piece.
  for (size_t p = 0; p < pieces.size(); ++p) {
    pieces[p][pieces[p].size() / 2] ^= 0x10;
    EXPECT_EQ(VerifyBlockPieces(header, Spans(pieces), size, e), BlockCheck::kBadPayload)
        << "piece " << p;
    pieces[p][pieces[p].size() / 2] ^= 0x10;
  }
  // A short object (the payload did not all arrive), and pieces too small for the payload.
  EXPECT_EQ(VerifyBlockPieces(header, Spans(pieces), size - 1, e), BlockCheck::kWrongPayloadLength);
  auto fewer = Spans(pieces);
  fewer.pop_back();
  EXPECT_EQ(VerifyBlockPieces(header, fewer, size, e), BlockCheck::kWrongPayloadLength);
  // The identity checks, as VerifyBlock's.
  ExpectedBlock other = e;
  other.key = BlockKey{1, 2};
  EXPECT_EQ(VerifyBlockPieces(header, Spans(pieces), size, other), BlockCheck::kWrongKey);
  EXPECT_EQ(VerifyBlock(b.bytes, other), BlockCheck::kWrongKey);
  other = e;
  other.tokens = std::span<const TokenId>();
  const std::vector<TokenId> wrong = Tokens(16, 7);
  other.tokens = wrong;
  EXPECT_EQ(VerifyBlockPieces(header, Spans(pieces), size, other), BlockCheck::kWrongTokens);
  // A damaged header, or an object shorter than its header.
  std::vector<uint8_t> bad_header(header.begin(), header.end());
  bad_header[20] ^= 1;
  EXPECT_EQ(VerifyBlockPieces(bad_header, Spans(pieces), size, e), BlockCheck::kBadHeader);
  EXPECT_NE(VerifyBlockPieces(header, Spans(pieces), 100, e), BlockCheck::kOk);
  const std::vector<uint8_t> zeros(kBlockHeaderBytes, 0);
  EXPECT_EQ(VerifyBlockPieces(zeros, Spans(pieces), size, e), BlockCheck::kEmpty);
}

}  // namespace
}  // namespace kvtier

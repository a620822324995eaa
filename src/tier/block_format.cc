#include "tier/block_format.h"

// For XXH3_state_t on the stack (the streaming checksum of a payload received in pieces).
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <new>
#include <string>
#include <utility>
#include <vector>

namespace kvtier {

static_assert(std::endian::native == std::endian::little,
              "the at-rest format is little-endian; a big-endian port must byte-swap fields");

// libxxhash's x86 build may export XXH3_64bits_dispatch (xxh_x86dispatch.c: the same XXH3-64,
// with the widest vector unit the CPU has, picked at run time). Debian's plain XXH3_64bits is a
// generic SSE2 loop that hashes ~5 GB/s per core on an EPYC, against ~30 GB/s (cold) to ~50
// GB/s (cached) through the dispatcher: at 2-3 GB/s of 2 MiB reads that is ~half a core of the
// I/O thread saved. Weak, so that a libxxhash without it still links (the address is then
// null). The results are the same hash either way (XXH3 does not depend on the vector width),
// so nothing at rest changes; PickXxh3() still checks that before trusting it.
extern "C" XXH64_hash_t XXH3_64bits_dispatch(const void* input, size_t len) __attribute__((weak));
// Its streaming form, for a payload received in pieces.
extern "C" XXH_errorcode XXH3_64bits_update_dispatch(XXH3_state_t* state, const void* input,
                                                     size_t len) __attribute__((weak));

namespace {

using Xxh3Fn = XXH64_hash_t (*)(const void*, size_t);

// The dispatcher when the library has one and it agrees with XXH3_64bits on a buffer long
// enough to take the vectorised long-input path (and a tail); XXH3_64bits otherwise.
Xxh3Fn PickXxh3() {
  if (&XXH3_64bits_dispatch == nullptr) return &XXH3_64bits;
  uint8_t probe[5000];
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < sizeof(probe); ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    probe[i] = static_cast<uint8_t>(x);
  }
  for (size_t len :
       {size_t{0}, size_t{17}, size_t{240}, size_t{1024}, size_t{4088}, size_t{4999}}) {
    if (XXH3_64bits_dispatch(probe + 1, len) != XXH3_64bits(probe + 1, len)) return &XXH3_64bits;
  }
  return &XXH3_64bits_dispatch;
}

XXH64_hash_t Xxh3(const void* data, size_t len) {
  static const Xxh3Fn fn = PickXxh3();
  return fn(data, len);
}

uint64_t HeaderChecksum(const uint8_t* header, uint64_t header_bytes) {
  return Xxh3(header, header_bytes - 8);
}

// Bytes per stored id: 4 where they fit the header's token area, else 3.
uint8_t TokenWidthFor(uint64_t count, uint64_t header_bytes) {
  return 4 * count <= header_bytes - kBlockHeaderFixedBytes - 8 ? 4 : 3;
}

uint32_t GetLe32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

void SetWhy(std::string* why, std::string text) {
  if (why != nullptr) *why = std::move(text);
}

}  // namespace

const char* BlockCheckName(BlockCheck check) {
  switch (check) {
    case BlockCheck::kOk:
      return "ok";
    case BlockCheck::kEmpty:
      return "empty";
    case BlockCheck::kBadHeader:
      return "bad-header";
    case BlockCheck::kWrongSlot:
      return "wrong-slot";
    case BlockCheck::kWrongGeneration:
      return "wrong-generation";
    case BlockCheck::kWrongLayout:
      return "wrong-layout";
    case BlockCheck::kWrongKey:
      return "wrong-key";
    case BlockCheck::kWrongNamespace:
      return "wrong-namespace";
    case BlockCheck::kWrongTokens:
      return "wrong-tokens";
    case BlockCheck::kWrongPayloadLength:
      return "wrong-payload-length";
    case BlockCheck::kBadPayload:
      return "bad-payload";
  }
  return "unknown";
}

uint64_t PayloadChecksum(const uint8_t* payload, uint64_t bytes) { return Xxh3(payload, bytes); }

Status EncodeBlockHeader(const BlockHeaderFields& fields, std::span<const TokenId> tokens,
                         uint64_t payload_bytes, uint64_t payload_checksum, uint8_t* out) {
  if (tokens.size() > KvLayout::kMaxTokensPerBlock) {
    return Status::InvalidArgument("block has " + std::to_string(tokens.size()) +
                                   " tokens; at most " +
                                   std::to_string(KvLayout::kMaxTokensPerBlock) + " are stored");
  }
  if (payload_bytes > KvLayout::kMaxBlockBytes) {
    return Status::InvalidArgument("payload of " + std::to_string(payload_bytes) +
                                   " bytes exceeds the largest block, " +
                                   std::to_string(KvLayout::kMaxBlockBytes));
  }
  const uint64_t header_bytes = BlockHeaderBytesFor(tokens.size());
  const uint8_t width = TokenWidthFor(tokens.size(), header_bytes);
  if (width == 3) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] > kMaxNarrowTokenId) {
        return Status::InvalidArgument("token id " + std::to_string(tokens[i]) + " at position " +
                                       std::to_string(i) +
                                       " does not fit the 24-bit ids stored for blocks of " +
                                       std::to_string(kMaxWideTokens + 1) + ".." +
                                       std::to_string(kMaxNarrowTokens) + " tokens");
      }
    }
  }
  // The fixed fields, from a 4 KiB header image; the token area and checksum go in place.
  BlockHeader h;
  std::memset(&h, 0, kBlockHeaderFixedBytes);
  h.magic = kBlockMagic;
  h.format_version = kBlockFormatVersion;
  h.header_bytes = static_cast<uint32_t>(header_bytes);
  h.layout_fingerprint = fields.layout_fingerprint;
  h.namespace_id = fields.namespace_id;
  h.key_hi = fields.key.hi;
  h.key_lo = fields.key.lo;
  h.parent_hi = fields.parent.hi;
  h.parent_lo = fields.parent.lo;
  h.write_generation = fields.write_generation;
  h.payload_bytes = payload_bytes;
  h.payload_checksum = payload_checksum;
  h.slot_index = fields.slot_index;
  h.token_count = static_cast<uint32_t>(tokens.size());
  h.token_width = width;
  std::memcpy(out, &h, kBlockHeaderFixedBytes);
  uint8_t* area = out + kBlockHeaderFixedBytes;
  const uint64_t area_bytes = header_bytes - kBlockHeaderFixedBytes - 8;
  uint64_t used = 0;
  if (width == 4) {
    used = tokens.size() * 4;
    if (!tokens.empty()) std::memcpy(area, tokens.data(), used);
  } else {
    used = tokens.size() * 3;
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::memcpy(area + 3 * i, &tokens[i], 3);  // low 3 bytes, little-endian
    }
  }
  std::memset(area + used, 0, area_bytes - used);
  const uint64_t sum = HeaderChecksum(out, header_bytes);
  std::memcpy(out + header_bytes - 8, &sum, sizeof(sum));
  return Status::Ok();
}

BlockCheck DecodeBlockHeader(std::span<const uint8_t> bytes, DecodedBlockHeader* out,
                             std::string* why) {
  if (bytes.size() < kBlockHeaderBytes) {
    SetWhy(why, "header truncated: " + std::to_string(bytes.size()) + " of " +
                    std::to_string(kBlockHeaderBytes) + " bytes");
    return BlockCheck::kBadHeader;
  }
  BlockHeader h;
  std::memcpy(&h, bytes.data(), kBlockHeaderFixedBytes);
  if (h.magic != kBlockMagic) {
    if (h.magic == 0) {
      SetWhy(why, "no block header (zero magic)");
      return BlockCheck::kEmpty;
    }
    SetWhy(why, "bad magic");
    return BlockCheck::kBadHeader;
  }
  // The version first: it says where the checksum is. A kvtier block of a version this build
  // does not read (a newer kvtier wrote it) is refused by name, not as a checksum mismatch.
  if (h.format_version < kOldestReadableBlockFormatVersion ||
      h.format_version > kBlockFormatVersion) {
    SetWhy(why, "block format version " + std::to_string(h.format_version) +
                    "; this build reads versions " +
                    std::to_string(kOldestReadableBlockFormatVersion) + ".." +
                    std::to_string(kBlockFormatVersion) +
                    (h.format_version > kBlockFormatVersion
                         ? " (written by a newer kvtier: run that version, or empty the G3 "
                           "directory / G4 prefix to start cold)"
                         : ""));
    return BlockCheck::kBadHeader;
  }
  const uint64_t header_bytes = h.header_bytes;
  const uint64_t max_header = h.format_version == 1 ? kBlockHeaderBytes : kMaxBlockHeaderBytes;
  if (header_bytes < kBlockHeaderBytes || header_bytes > max_header || header_bytes % 4096 != 0) {
    SetWhy(why, "header_bytes " + std::to_string(header_bytes) + " out of range for version " +
                    std::to_string(h.format_version) + " (4096.." + std::to_string(max_header) +
                    ", a multiple of 4096)");
    return BlockCheck::kBadHeader;
  }
  if (bytes.size() < header_bytes) {
    SetWhy(why, "header truncated: " + std::to_string(bytes.size()) + " of " +
                    std::to_string(header_bytes) + " bytes");
    return BlockCheck::kBadHeader;
  }
  uint64_t stored_sum;
  std::memcpy(&stored_sum, bytes.data() + header_bytes - 8, sizeof(stored_sum));
  if (HeaderChecksum(bytes.data(), header_bytes) != stored_sum) {
    SetWhy(why, "header checksum mismatch");
    return BlockCheck::kBadHeader;
  }
  // Past the checksum the bytes are what some writer wrote; still check every length, since a
  // writer of another version (or a bug) may have put anything there. Version 1 stored at most
  // 1024 tokens, always in a 4 KiB header (BlockHeaderBytesFor agrees for those).
  const uint32_t max_tokens = h.format_version == 1 ? 1024 : KvLayout::kMaxTokensPerBlock;
  if (h.token_count > max_tokens) {
    SetWhy(why,
           "token_count " + std::to_string(h.token_count) + " > " + std::to_string(max_tokens));
    return BlockCheck::kBadHeader;
  }
  if (header_bytes != BlockHeaderBytesFor(h.token_count)) {
    SetWhy(why, "header_bytes " + std::to_string(header_bytes) + " for " +
                    std::to_string(h.token_count) + " tokens; their header is " +
                    std::to_string(BlockHeaderBytesFor(h.token_count)));
    return BlockCheck::kBadHeader;
  }
  if (h.token_width != TokenWidthFor(h.token_count, header_bytes)) {
    SetWhy(why, "token_width " + std::to_string(h.token_width) + " invalid for " +
                    std::to_string(h.token_count) + " tokens");
    return BlockCheck::kBadHeader;
  }
  if (h.payload_bytes > KvLayout::kMaxBlockBytes) {
    SetWhy(why, "payload_bytes " + std::to_string(h.payload_bytes) + " > " +
                    std::to_string(KvLayout::kMaxBlockBytes));
    return BlockCheck::kBadHeader;
  }
  if (out != nullptr) {
    out->fields.layout_fingerprint = h.layout_fingerprint;
    out->fields.namespace_id = h.namespace_id;
    out->fields.key = BlockKey{h.key_hi, h.key_lo};
    out->fields.parent = BlockKey{h.parent_hi, h.parent_lo};
    out->fields.write_generation = h.write_generation;
    out->fields.slot_index = h.slot_index;
    out->format_version = h.format_version;
    out->header_bytes = header_bytes;
    out->payload_bytes = h.payload_bytes;
    out->payload_checksum = h.payload_checksum;
    out->token_count = h.token_count;
    const uint8_t* area = bytes.data() + kBlockHeaderFixedBytes;
    if (h.token_width == 4) {
      for (uint32_t i = 0; i < h.token_count; ++i) out->tokens[i] = GetLe32(area + 4 * i);
    } else {
      for (uint32_t i = 0; i < h.token_count; ++i) {
        TokenId t = 0;
        std::memcpy(&t, area + 3 * i, 3);
        out->tokens[i] = t;
      }
    }
  }
  return BlockCheck::kOk;
}

namespace {

// The checks VerifyBlock and VerifyBlockPieces share, after the header decoded: everything but
// the payload's length and checksum.
BlockCheck CheckHeaderFields(const DecodedBlockHeader& h, const ExpectedBlock& expected) {
  if (expected.check_slot && h.fields.slot_index != expected.slot_index) {
    return BlockCheck::kWrongSlot;
  }
  if (expected.check_generation && h.fields.write_generation != expected.write_generation) {
    return BlockCheck::kWrongGeneration;
  }
  if (h.fields.layout_fingerprint != expected.layout_fingerprint ||
      (expected.header_bytes != 0 && h.header_bytes != expected.header_bytes)) {
    return BlockCheck::kWrongLayout;
  }
  if (h.fields.key != expected.key) return BlockCheck::kWrongKey;
  if (h.fields.namespace_id != expected.namespace_id) return BlockCheck::kWrongNamespace;
  if (!expected.tokens.empty()) {
    if (expected.tokens.size() != h.token_count ||
        std::memcmp(expected.tokens.data(), h.tokens.data(),
                    expected.tokens.size() * sizeof(TokenId)) != 0) {
      return BlockCheck::kWrongTokens;
    }
  }
  return BlockCheck::kOk;
}

using Xxh3UpdateFn = XXH_errorcode (*)(XXH3_state_t*, const void*, size_t);

// The dispatcher's update when the library has one and it agrees with XXH3_64bits_update.
Xxh3UpdateFn PickXxh3Update() {
  if (&XXH3_64bits_update_dispatch == nullptr) return &XXH3_64bits_update;
  std::vector<uint8_t> probe(9000);
  for (size_t i = 0; i < probe.size(); ++i) probe[i] = static_cast<uint8_t>(i * 131 + (i >> 7));
  XXH3_state_t a, b;
  XXH3_64bits_reset(&a);
  XXH3_64bits_reset(&b);
  for (size_t cut : {size_t{1}, size_t{300}, size_t{4100}, size_t{4599}}) {
    (void)XXH3_64bits_update_dispatch(&a, probe.data(), cut);
    (void)XXH3_64bits_update(&b, probe.data(), cut);
  }
  if (XXH3_64bits_digest(&a) != XXH3_64bits_digest(&b)) return &XXH3_64bits_update;
  return &XXH3_64bits_update_dispatch;
}

}  // namespace

PayloadHasher::PayloadHasher() : state_(XXH3_createState()) {
  if (state_ == nullptr) throw std::bad_alloc();
  Reset();
}

PayloadHasher::~PayloadHasher() {
  if (state_ != nullptr) XXH3_freeState(static_cast<XXH3_state_t*>(state_));
}

PayloadHasher::PayloadHasher(PayloadHasher&& other) noexcept : state_(other.state_) {
  other.state_ = nullptr;
}

PayloadHasher& PayloadHasher::operator=(PayloadHasher&& other) noexcept {
  std::swap(state_, other.state_);
  return *this;
}

void PayloadHasher::Reset() { XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_)); }

void PayloadHasher::Update(std::span<const uint8_t> bytes) {
  static const Xxh3UpdateFn update = PickXxh3Update();
  (void)update(static_cast<XXH3_state_t*>(state_), bytes.data(), bytes.size());
}

uint64_t PayloadHasher::Digest() const {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

uint64_t PayloadChecksumPieces(std::span<const std::span<uint8_t>> pieces, uint64_t bytes) {
  if (pieces.size() == 1 || (!pieces.empty() && pieces[0].size() >= bytes)) {
    return PayloadChecksum(pieces[0].data(), bytes);
  }
  PayloadHasher h;
  for (const std::span<uint8_t>& p : pieces) {
    if (bytes == 0) break;
    const uint64_t take = std::min<uint64_t>(bytes, p.size());
    h.Update({p.data(), take});
    bytes -= take;
  }
  return h.Digest();
}

BlockCheck VerifyBlock(std::span<const uint8_t> block, const ExpectedBlock& expected,
                       DecodedBlockHeader* header_out) {
  DecodedBlockHeader local;
  DecodedBlockHeader* h = header_out != nullptr ? header_out : &local;
  const BlockCheck header = DecodeBlockHeader(block, h);
  if (header != BlockCheck::kOk) return header;
  if (const BlockCheck fields = CheckHeaderFields(*h, expected); fields != BlockCheck::kOk) {
    return fields;
  }
  if (h->payload_bytes != expected.payload_bytes ||
      block.size() - h->header_bytes < h->payload_bytes) {
    return BlockCheck::kWrongPayloadLength;
  }
  if (PayloadChecksum(block.data() + h->header_bytes, h->payload_bytes) != h->payload_checksum) {
    return BlockCheck::kBadPayload;
  }
  return BlockCheck::kOk;
}

BlockCheck VerifyBlockPieces(std::span<const uint8_t> header,
                             std::span<const std::span<uint8_t>> payload, uint64_t object_bytes,
                             const ExpectedBlock& expected,
                             std::optional<uint64_t> landed_checksum) {
  // What landed in the header piece: the object's first bytes, as many as it had.
  const std::span<const uint8_t> head =
      header.first(std::min<uint64_t>(header.size(), object_bytes));
  DecodedBlockHeader h;
  const BlockCheck decoded = DecodeBlockHeader(head, &h);
  if (decoded != BlockCheck::kOk) return decoded;
  if (const BlockCheck fields = CheckHeaderFields(h, expected); fields != BlockCheck::kOk) {
    return fields;
  }
  // The header's own size equals header.size() here (checked as the layout above).
  uint64_t capacity = 0;
  for (const std::span<uint8_t>& p : payload) capacity += p.size();
  const uint64_t received = object_bytes - h.header_bytes;
  if (h.payload_bytes != expected.payload_bytes || received < h.payload_bytes ||
      capacity < h.payload_bytes || (landed_checksum && received != h.payload_bytes)) {
    return BlockCheck::kWrongPayloadLength;
  }
  const uint64_t checksum =
      landed_checksum ? *landed_checksum : PayloadChecksumPieces(payload, h.payload_bytes);
  if (checksum != h.payload_checksum) return BlockCheck::kBadPayload;
  return BlockCheck::kOk;
}

}  // namespace kvtier

// The at-rest format of one stored block, shared by the disk tier (G3) and remote storage (G4).
//
// A stored block is a fixed 4 KiB header followed by the payload (the block's KV bytes in the
// canonical layout order). The header names the block (key, parent, namespace, layout), carries
// the block's own token ids, and checksums itself and the payload, so a reader can prove that
// the bytes it got are exactly the block it asked for:
//
//   offset  size  field
//        0     8  magic               kBlockMagic
//        8     4  format_version      kBlockFormatVersion; any change to this table bumps it
//       12     4  header_bytes        kBlockHeaderBytes
//       16     8  layout_fingerprint  KvLayout::Fingerprint() of the writer
//       24     8  namespace_id        the writer's key namespace (model, tenant, adapter)
//       32    16  key                 BlockKey hi, lo
//       48    16  parent              BlockKey hi, lo of the previous block of the prompt
//       64     8  write_generation    tier-wide, strictly increasing per write
//       72     8  payload_bytes
//       80     8  payload_checksum    XXH3-64 of the payload
//       88     4  slot_index          where the writer put it (catches misdirected I/O)
//       92     4  token_count         <= KvLayout::kMaxTokensPerBlock
//       96     1  token_width         bytes per stored token id: 4, or 3 when 4 do not fit
//       97    31  reserved            zero
//      128  3960  tokens              token_count ids, token_width bytes each, little-endian
//     4088     8  header_checksum     XXH3-64 of bytes [0, 4088)
//
// All integers are little-endian. 1024 tokens x 4 bytes would fill the whole 4 KiB, so blocks of
// more than kMaxWideTokens tokens store each id in 3 bytes (ids < 2^24; the largest vocabularies
// in use are ~2^18); a block that needs more is refused at write time, never truncated.
//
// Checksum choice: XXH3-64 rather than CRC32C. Through libxxhash's run-time dispatcher
// (XXH3_64bits_dispatch: AVX2 / AVX-512 where the CPU has them; block_format.cc uses it when
// the library exports it) it hashes ~30 GB/s per core from memory on an EPYC, far above what
// one SSD delivers, so verification costs a few % of an I/O (Debian's plain XXH3_64bits, a
// generic SSE2 loop, manages only ~5 GB/s there: half a core at 2.5 GB/s); it is 64 bits (a random
// corruption passes with p = 2^-64 instead of 2^-32); it gives the same answer on every CPU, which
// G4 needs because blocks move between machines; and libxxhash is already a dependency. Hardware
// CRC32C would need per-ISA code to reach the same speed.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "kvtier/block_key.h"
#include "kvtier/layout.h"
#include "kvtier/status.h"

namespace kvtier {

inline constexpr uint64_t kBlockHeaderBytes = 4096;
inline constexpr uint32_t kBlockFormatVersion = 1;
// "KVTBLOCK" read as a little-endian integer.
inline constexpr uint64_t kBlockMagic = 0x4b434f4c4254564bull;
inline constexpr size_t kBlockHeaderFixedBytes = 128;
inline constexpr size_t kBlockTokenAreaBytes = kBlockHeaderBytes - kBlockHeaderFixedBytes - 8;
// Blocks of up to this many tokens store 4-byte ids; longer ones (up to 1024) store 3 bytes.
inline constexpr uint32_t kMaxWideTokens = kBlockTokenAreaBytes / 4;
inline constexpr uint32_t kMaxNarrowTokenId = (1u << 24) - 1;

// The header exactly as stored. Use EncodeBlockHeader / DecodeBlockHeader rather than reading
// fields of untrusted bytes directly.
struct BlockHeader {
  uint64_t magic;
  uint32_t format_version;
  uint32_t header_bytes;
  uint64_t layout_fingerprint;
  uint64_t namespace_id;
  uint64_t key_hi;
  uint64_t key_lo;
  uint64_t parent_hi;
  uint64_t parent_lo;
  uint64_t write_generation;
  uint64_t payload_bytes;
  uint64_t payload_checksum;
  uint32_t slot_index;
  uint32_t token_count;
  uint8_t token_width;
  uint8_t reserved[31];
  uint8_t tokens[kBlockTokenAreaBytes];
  uint64_t header_checksum;
};
static_assert(sizeof(BlockHeader) == kBlockHeaderBytes, "the header is exactly 4 KiB on disk");
static_assert(offsetof(BlockHeader, tokens) == kBlockHeaderFixedBytes, "token area at 128");
static_assert(offsetof(BlockHeader, header_checksum) == kBlockHeaderBytes - 8,
              "the header checksum is the last 8 bytes");
static_assert(KvLayout::kMaxTokensPerBlock * 3 <= kBlockTokenAreaBytes,
              "the longest block's tokens fit in 3-byte form");
static_assert(kMaxWideTokens >= 512, "blocks of <= 512 tokens keep full 32-bit token ids");

// What the writer knows about a block besides its tokens and payload.
struct BlockHeaderFields {
  uint64_t layout_fingerprint = 0;
  uint64_t namespace_id = 0;
  BlockKey key;
  BlockKey parent;
  uint64_t write_generation = 0;
  uint32_t slot_index = 0;
};

// A header that passed DecodeBlockHeader: every length in it has been checked.
struct DecodedBlockHeader {
  BlockHeaderFields fields;
  uint64_t payload_bytes = 0;
  uint64_t payload_checksum = 0;
  uint32_t token_count = 0;
  std::array<TokenId, KvLayout::kMaxTokensPerBlock> tokens{};

  std::span<const TokenId> token_span() const { return {tokens.data(), token_count}; }
};

// Why a stored block was not served. kOk is the only outcome that may be served.
enum class BlockCheck : uint8_t {
  kOk = 0,
  kEmpty,               // no header at all (zeroed or never written)
  kBadHeader,           // bad magic, version, checksum or an out-of-range length
  kWrongSlot,           // the header says it was written to another slot
  kWrongGeneration,     // an older or newer write than the one expected
  kWrongLayout,         // layout fingerprint differs
  kWrongKey,            // block key differs
  kWrongNamespace,      // namespace id differs
  kWrongTokens,         // token ids differ from the caller's
  kWrongPayloadLength,  // payload_bytes differs from what the reader expects
  kBadPayload,          // payload checksum mismatch
};
// "ok", "empty", "bad-header", ...
const char* BlockCheckName(BlockCheck check);

// XXH3-64 of the payload bytes.
uint64_t PayloadChecksum(const uint8_t* payload, uint64_t bytes);

// Writes the header of a block with `tokens` whose payload of `payload_bytes` has checksum
// `payload_checksum` into out[0, kBlockHeaderBytes). Returns InvalidArgument (and writes
// nothing) when there are more than KvLayout::kMaxTokensPerBlock tokens, when a block of more
// than kMaxWideTokens tokens has an id above kMaxNarrowTokenId, or payload_bytes exceeds
// KvLayout::kMaxBlockBytes.
Status EncodeBlockHeader(const BlockHeaderFields& fields, std::span<const TokenId> tokens,
                         uint64_t payload_bytes, uint64_t payload_checksum, uint8_t* out);

// Parses and checks untrusted header bytes: size, magic, version, header checksum, and every
// length (token count and width, payload bytes) before it is used. Never reads outside
// `bytes`. On failure returns kEmpty (all-zero magic) or kBadHeader and, when `why` is given,
// a message naming what was wrong.
BlockCheck DecodeBlockHeader(std::span<const uint8_t> bytes, DecodedBlockHeader* out,
                             std::string* why = nullptr);

// What a reader expects of a block. Empty `tokens` skips the token comparison (for tools that
// do not know them); the manager always passes them, which is what makes a key collision
// harmless.
struct ExpectedBlock {
  uint64_t layout_fingerprint = 0;
  uint64_t namespace_id = 0;
  BlockKey key;
  std::span<const TokenId> tokens;
  uint64_t payload_bytes = 0;
  bool check_generation = false;
  uint64_t write_generation = 0;
  bool check_slot = false;
  uint32_t slot_index = 0;
};

// Verifies a whole stored block (header at block[0, kBlockHeaderBytes), payload right after)
// against `expected`: the header checks of DecodeBlockHeader, then slot, generation, layout,
// key, namespace, tokens, payload length and payload checksum, in that order. Returns the first
// failed check, or kOk. `block` must hold at least kBlockHeaderBytes + expected.payload_bytes
// bytes or the result is kWrongPayloadLength.
BlockCheck VerifyBlock(std::span<const uint8_t> block, const ExpectedBlock& expected,
                       DecodedBlockHeader* header_out = nullptr);

}  // namespace kvtier

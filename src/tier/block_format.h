// The at-rest format of one stored block, shared by the disk tier (G3) and remote storage (G4).
//
// A stored block is a header followed by the payload (the block's KV bytes in the canonical
// layout order). The header names the block (key, parent, namespace, layout), carries the
// block's own token ids, and checksums itself and the payload, so a reader can prove that the
// bytes it got are exactly the block it asked for. Its size, header_bytes, is a multiple of
// 4 KiB and a function of the token count only (BlockHeaderBytesFor): 4 KiB for blocks of up to
// kMaxNarrowTokens tokens, more for longer ones (20 KiB for 4096 tokens):
//
//   offset  size  field
//        0     8  magic               kBlockMagic
//        8     4  format_version      kBlockFormatVersion; any change to this table bumps it
//       12     4  header_bytes        BlockHeaderBytesFor(token_count)
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
//      128     *  tokens              token_count ids, token_width bytes each, little-endian,
//                                     then zeros up to the checksum
//   hb - 8     8  header_checksum     XXH3-64 of bytes [0, hb - 8), hb = header_bytes
//
// All integers are little-endian. In a 4 KiB header 1024 tokens x 4 bytes would not fit, so
// blocks of kMaxWideTokens + 1 .. kMaxNarrowTokens tokens store each id in 3 bytes (ids < 2^24;
// the largest vocabularies in use are ~2^18); a block that needs more is refused at write time,
// never truncated. Longer blocks get a larger header holding 4-byte ids.
//
// Versions: 1 had only the 4 KiB header (header_bytes 4096, at most 1024 tokens); version 2
// added the larger headers of longer blocks (any block size up to kMaxTokensPerBlock, not only
// powers of two). A 4 KiB version 2 header is byte for byte a version 1 header but for the
// version field, so G3 directories and G4 objects written by version 1 stay readable: the decoder
// takes both (kOldestReadableBlockFormatVersion..kBlockFormatVersion) and refuses any other
// version with a message naming it.
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
#include <optional>
#include <span>

#include "kvtier/block_key.h"
#include "kvtier/layout.h"
#include "kvtier/status.h"

namespace kvtier {

// The smallest header, and the only size of version 1.
inline constexpr uint64_t kBlockHeaderBytes = 4096;
inline constexpr uint32_t kBlockFormatVersion = 2;
inline constexpr uint32_t kOldestReadableBlockFormatVersion = 1;
// "KVTBLOCK" read as a little-endian integer.
inline constexpr uint64_t kBlockMagic = 0x4b434f4c4254564bull;
inline constexpr size_t kBlockHeaderFixedBytes = 128;
// The token area of a 4 KiB header.
inline constexpr size_t kBlockTokenAreaBytes = kBlockHeaderBytes - kBlockHeaderFixedBytes - 8;
// Blocks of up to this many tokens store 4-byte ids in a 4 KiB header.
inline constexpr uint32_t kMaxWideTokens = kBlockTokenAreaBytes / 4;
// Blocks of up to this many tokens fit a 4 KiB header (3-byte ids past kMaxWideTokens).
inline constexpr uint32_t kMaxNarrowTokens = kBlockTokenAreaBytes / 3;
inline constexpr uint32_t kMaxNarrowTokenId = (1u << 24) - 1;

// Bytes of the header of a block of `token_count` tokens (and so of the header area in front of
// the payload in a G2 slot, a G3 slot and a G4 object of such blocks): 4 KiB up to
// kMaxNarrowTokens tokens, else the smallest multiple of 4 KiB holding the ids at 4 bytes each.
constexpr uint64_t BlockHeaderBytesFor(uint64_t token_count) {
  if (token_count <= kMaxNarrowTokens) return kBlockHeaderBytes;
  return (kBlockHeaderFixedBytes + 4 * token_count + 8 + 4095) / 4096 * 4096;
}
// The header area of a layout's blocks: BlockHeaderBytesFor(layout.tokens_per_block).
inline uint64_t BlockHeaderBytes(const KvLayout& layout) {
  return BlockHeaderBytesFor(layout.tokens_per_block);
}
inline constexpr uint64_t kMaxBlockHeaderBytes = BlockHeaderBytesFor(KvLayout::kMaxTokensPerBlock);

// A 4 KiB header exactly as stored (a longer header has the same first 128 bytes, a longer
// token area and the checksum in its last 8 bytes). Use EncodeBlockHeader / DecodeBlockHeader
// rather than reading fields of untrusted bytes directly.
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
static_assert(kMaxNarrowTokens >= 1024, "every version 1 block fits a 4 KiB header");
static_assert(kMaxWideTokens >= 784, "blocks of <= 784 tokens keep full 32-bit token ids");
static_assert(BlockHeaderBytesFor(kMaxNarrowTokens + 1) == 2 * kBlockHeaderBytes,
              "past a 4 KiB header, ids are 4 bytes again");
static_assert(kMaxBlockHeaderBytes == 20480, "4096 tokens: a 20 KiB header");

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
  uint32_t format_version = 0;  // as stored: 1 or 2
  uint64_t header_bytes = 0;    // where the payload starts
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
  kWrongLayout,         // layout fingerprint or header size (block size) differs
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
// `payload_checksum` into out[0, BlockHeaderBytesFor(tokens.size())). Returns InvalidArgument
// (and writes nothing) when there are more than KvLayout::kMaxTokensPerBlock tokens, when a
// block of kMaxWideTokens + 1 .. kMaxNarrowTokens tokens has an id above kMaxNarrowTokenId, or
// payload_bytes exceeds KvLayout::kMaxBlockBytes.
Status EncodeBlockHeader(const BlockHeaderFields& fields, std::span<const TokenId> tokens,
                         uint64_t payload_bytes, uint64_t payload_checksum, uint8_t* out);

// Parses and checks untrusted header bytes: size, magic, version, header size, header
// checksum, and every length (token count and width, payload bytes) before it is used. Reads
// format versions kOldestReadableBlockFormatVersion..kBlockFormatVersion. Never reads outside
// `bytes`. On failure returns kEmpty (all-zero magic) or kBadHeader and, when `why` is given,
// a message naming what was wrong (for a version it does not read: the version, the versions it
// reads, and what to do).
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
  // Where the reader expects the payload (its header area, BlockHeaderBytes(layout)); a header
  // of another size is kWrongLayout. 0 takes the stored header's own size (tools).
  uint64_t header_bytes = 0;
  bool check_generation = false;
  uint64_t write_generation = 0;
  bool check_slot = false;
  uint32_t slot_index = 0;
};

// What a reader of a G3/G4 block of `layout` expects: the layout's fingerprint, header area
// (BlockHeaderBytes) and payload size, with the block's namespace, key and tokens.
inline ExpectedBlock ExpectedLayoutBlock(const KvLayout& layout, uint64_t namespace_id,
                                         const BlockKey& key, std::span<const TokenId> tokens) {
  ExpectedBlock e;
  e.layout_fingerprint = layout.Fingerprint();
  e.namespace_id = namespace_id;
  e.key = key;
  e.tokens = tokens;
  e.payload_bytes = layout.BlockBytes();
  e.header_bytes = BlockHeaderBytes(layout);
  return e;
}

// Verifies a whole stored block (header at block[0, header_bytes), payload right after) against
// `expected`: the header checks of DecodeBlockHeader, then slot, generation, layout (and header
// size), key, namespace, tokens, payload length and payload checksum, in that order. Returns
// the first failed check, or kOk. `block` must hold at least header_bytes +
// expected.payload_bytes bytes or the result is kWrongPayloadLength.
BlockCheck VerifyBlock(std::span<const uint8_t> block, const ExpectedBlock& expected,
                       DecodedBlockHeader* header_out = nullptr);

// VerifyBlock for a block received in pieces (RemoteGet::pieces): `header` holds the object's
// first expected.header_bytes bytes, `payload` the pieces the rest of it landed in, in order,
// and `object_bytes` is the object's size as received. The same checks in the same order as
// VerifyBlock on the contiguous bytes, with the same answers but one: a stored header longer
// than `header` cannot be decoded here (kBadHeader, where VerifyBlock says kWrongLayout). The
// payload checksum runs over the pieces in place. REQUIRES: header.size() ==
// expected.header_bytes > 0.
// `landed_checksum`: when given, the payload checksum is not taken over the pieces again: it is
// this value, the XXH3-64 of the object's bytes after the header as they landed (PayloadHasher
// fed by RemoteGet::on_landed), and the object must then hold exactly the payload, no more.
BlockCheck VerifyBlockPieces(std::span<const uint8_t> header,
                             std::span<const std::span<uint8_t>> payload, uint64_t object_bytes,
                             const ExpectedBlock& expected,
                             std::optional<uint64_t> landed_checksum = std::nullopt);

// XXH3-64 of bytes fed in order, in ranges of any size: PayloadChecksum's value for their
// concatenation. Move-only; not thread-safe.
class PayloadHasher {
 public:
  PayloadHasher();
  ~PayloadHasher();
  PayloadHasher(PayloadHasher&& other) noexcept;
  PayloadHasher& operator=(PayloadHasher&& other) noexcept;
  PayloadHasher(const PayloadHasher&) = delete;
  PayloadHasher& operator=(const PayloadHasher&) = delete;

  // Starts again with nothing fed.
  void Reset();
  void Update(std::span<const uint8_t> bytes);
  uint64_t Digest() const;

 private:
  void* state_ = nullptr;  // an XXH3_state_t
};

// XXH3-64 of the concatenation of `pieces`' first `bytes` bytes (the same value PayloadChecksum
// gives for them contiguous). REQUIRES: the pieces hold at least `bytes` bytes.
uint64_t PayloadChecksumPieces(std::span<const std::span<uint8_t>> pieces, uint64_t bytes);

}  // namespace kvtier

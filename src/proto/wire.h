// The byte format of kvtier serve's protocol: the frame header every message starts with, and
// the little-endian field encoding of message payloads.
//
// A frame on the stream is a 24-byte header followed by `payload_bytes` of payload:
//
//   offset  size  field
//        0     4  magic          kWireMagic, "KVTS" in ASCII when read as bytes
//        4     2  version        kWireVersion; a peer speaking another version is refused
//        6     2  type           the message type (the service layer's enum)
//        8     8  seq            the sender's sequence number; a reply carries its request's
//       16     4  payload_bytes  <= kMaxPayloadBytes
//       20     4  flags          reserved for the service layer; not interpreted here
//
// Every integer on the wire is little-endian, written and read byte by byte (never a memcpy of
// a struct), so the format does not depend on the host's byte order or struct padding. Any
// change to the header or to a field's encoding must bump kWireVersion.
//
// Payload fields are written by WireWriter and read back by WireReader in the same order; the
// format carries no field tags. The reader never trusts a length or count from the wire: each
// is checked against the caller's limit and against the bytes actually left before anything is
// allocated, so a forged message costs at most its own size in memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.h"

namespace kvtier::proto {

inline constexpr uint32_t kWireMagic = 0x5354564b;  // "KVTS" little-endian
// 2: kFetch, kFetchDone, kG4Config and kG4Ready on the data connection (G4 loads straight into
// an engine's G1).
inline constexpr uint16_t kWireVersion = 2;
inline constexpr uint32_t kMaxPayloadBytes = 64u << 20;
// The largest Hello kvtier serve reads: a model id, an instance name and a layout take a few
// KiB; a peer announcing more is refused before its payload is read.
inline constexpr uint32_t kMaxHelloPayloadBytes = 64u << 10;
inline constexpr size_t kFrameHeaderBytes = 24;

struct FrameHeader {
  uint32_t magic = kWireMagic;
  uint16_t version = kWireVersion;
  uint16_t type = 0;
  uint64_t seq = 0;
  uint32_t payload_bytes = 0;
  uint32_t flags = 0;
};

// Writes `h` into `out` in the layout above, every field as given (a header with a wrong magic
// or version can be encoded, for tests of the refusals). Never fails.
void EncodeHeader(const FrameHeader& h, uint8_t out[kFrameHeaderBytes]);

// Reads a header from the first kFrameHeaderBytes of `bytes` (more are ignored). Returns it, or
// InvalidArgument when:
//   - `bytes` holds fewer than kFrameHeaderBytes,
//   - the magic is not kWireMagic ("not a kvtier service frame (magic 0x...)"),
//   - the version is not kWireVersion ("protocol version N, this build speaks 2: upgrade the
//     older side"),
//   - payload_bytes exceeds kMaxPayloadBytes.
Result<FrameHeader> DecodeHeader(std::span<const uint8_t> bytes);

// Appends little-endian fields to a byte vector. Never fails; the caller keeps a message under
// kMaxPayloadBytes (SendFrame refuses a larger one). A String or array longer than UINT32_MAX
// elements cannot be encoded: REQUIRES size <= UINT32_MAX (asserted).
class WireWriter {
 public:
  void U8(uint8_t v);
  void U16(uint16_t v);
  void U32(uint32_t v);
  void U64(uint64_t v);
  void I64(int64_t v);  // two's complement, as a U64
  // The bytes as they are, without a length: the reader must know n.
  void Bytes(std::span<const uint8_t> bytes);
  // A u32 length, then the bytes.
  void String(std::string_view s);
  // A u32 count, then each value.
  void U32Array(std::span<const uint32_t> values);
  void U64Array(std::span<const uint64_t> values);

  // The bytes written so far.
  const std::vector<uint8_t>& data() const { return buf_; }
  // Moves the bytes out; the writer is empty afterwards and can be used again.
  std::vector<uint8_t> Take();
  size_t size() const { return buf_.size(); }

 private:
  std::vector<uint8_t> buf_;
};

// Reads fields from a payload in the order they were written, checking every bound.
//
// Every failure is InvalidArgument, its message starting "service protocol: " and naming the
// field, e.g. "service protocol: field 'prompt' needs 4 bytes, 2 left". `field` is only used for
// messages; it may be a temporary.
//
// A failed read leaves the reader unusable: every later read, and Done(), return that first
// failure again (naming the field that failed) and read nothing, so a decoder may check only
// Done() at the end without ever acting on a field read after a bad one. Output parameters of a
// failed read are left unchanged.
//
// The reader does not own the bytes: REQUIRES they outlive it and every span Bytes() returned.
class WireReader {
 public:
  explicit WireReader(std::span<const uint8_t> bytes);

  Status U8(const char* field, uint8_t* out);
  Status U16(const char* field, uint16_t* out);
  Status U32(const char* field, uint32_t* out);
  Status U64(const char* field, uint64_t* out);
  Status I64(const char* field, int64_t* out);
  // The next `n` bytes, as a view into the reader's buffer (nothing copied).
  Status Bytes(const char* field, size_t n, std::span<const uint8_t>* out);
  // A u32 length, at most `max_len`, then that many bytes.
  Status String(const char* field, uint32_t max_len, std::string* out);
  // A u32 count (checked as Count does, with 4 and 8 bytes per element), then the values.
  Status U32Array(const char* field, uint32_t max_count, std::vector<uint32_t>* out);
  Status U64Array(const char* field, uint32_t max_count, std::vector<uint64_t>* out);
  // Reads a u32 count and checks count <= max and count * min_bytes_per_elem <= remaining(), so
  // a forged count cannot make the caller allocate: a caller decoding `count` elements of its
  // own, each at least min_bytes_per_elem on the wire, may reserve `count` of them.
  Status Count(const char* field, uint32_t max, uint32_t min_bytes_per_elem, uint32_t* out);
  // Ok when every byte was read. InvalidArgument when bytes are left over ("N trailing bytes
  // after field 'F'") or when an earlier read failed (that read's message).
  Status Done() const;
  // Bytes not yet read (0 once a read failed).
  size_t remaining() const;

 private:
  // Ok, with *at = the position of the next `n` bytes (consumed, `field` recorded as the last
  // field read), when the reader has not failed and `n` bytes are left; otherwise the reader
  // fails with "field 'F' needs n bytes, k left" (or returns its earlier failure).
  Status Consume(const char* field, size_t n, size_t* at);
  // Fails the reader with `msg` (without the "service protocol: " prefix) and returns it.
  Status Fail(std::string msg);

  std::span<const uint8_t> bytes_;
  size_t pos_ = 0;
  std::string last_field_;  // the last field read successfully; empty before the first
  Status error_;            // the first failure; every later call returns it
};

}  // namespace kvtier::proto

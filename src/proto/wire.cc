#include "proto/wire.h"

#include <bit>
#include <cstring>

#include <cassert>
#include <cinttypes>
#include <cstdio>
#include <limits>
#include <utility>

namespace kvtier::proto {
namespace {

void PutLe(uint8_t* out, uint64_t v, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}

uint64_t GetLe(const uint8_t* in, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(in[i]) << (8 * i);
  return v;
}

void AppendLe(std::vector<uint8_t>* buf, uint64_t v, size_t n) {
  const size_t at = buf->size();
  buf->resize(at + n);
  PutLe(buf->data() + at, v, n);
}

uint32_t CheckedLength(size_t n) {
  assert(n <= std::numeric_limits<uint32_t>::max() && "a wire length or count must fit in u32");
  return static_cast<uint32_t>(n);
}

std::string Protocol(std::string msg) { return "service protocol: " + std::move(msg); }

}  // namespace

void EncodeHeader(const FrameHeader& h, uint8_t out[kFrameHeaderBytes]) {
  PutLe(out + 0, h.magic, 4);
  PutLe(out + 4, h.version, 2);
  PutLe(out + 6, h.type, 2);
  PutLe(out + 8, h.seq, 8);
  PutLe(out + 16, h.payload_bytes, 4);
  PutLe(out + 20, h.flags, 4);
}

Result<FrameHeader> DecodeHeader(std::span<const uint8_t> bytes) {
  if (bytes.size() < kFrameHeaderBytes) {
    return Status::InvalidArgument(Protocol("a frame header needs " +
                                            std::to_string(kFrameHeaderBytes) + " bytes, " +
                                            std::to_string(bytes.size()) + " given"));
  }
  const uint8_t* p = bytes.data();
  FrameHeader h;
  h.magic = static_cast<uint32_t>(GetLe(p + 0, 4));
  h.version = static_cast<uint16_t>(GetLe(p + 4, 2));
  h.type = static_cast<uint16_t>(GetLe(p + 6, 2));
  h.seq = GetLe(p + 8, 8);
  h.payload_bytes = static_cast<uint32_t>(GetLe(p + 16, 4));
  h.flags = static_cast<uint32_t>(GetLe(p + 20, 4));
  if (h.magic != kWireMagic) {
    char hex[16];
    std::snprintf(hex, sizeof(hex), "0x%08" PRIx32, h.magic);
    return Status::InvalidArgument(
        Protocol(std::string("not a kvtier service frame (magic ") + hex + ")"));
  }
  if (h.version != kWireVersion) {
    return Status::InvalidArgument(Protocol("protocol version " + std::to_string(h.version) +
                                            ", this build speaks " + std::to_string(kWireVersion) +
                                            ": upgrade the older side"));
  }
  if (h.payload_bytes > kMaxPayloadBytes) {
    return Status::InvalidArgument(Protocol("frame payload of " + std::to_string(h.payload_bytes) +
                                            " bytes exceeds the limit " +
                                            std::to_string(kMaxPayloadBytes)));
  }
  return h;
}

void WireWriter::U8(uint8_t v) { buf_.push_back(v); }
void WireWriter::U16(uint16_t v) { AppendLe(&buf_, v, 2); }
void WireWriter::U32(uint32_t v) { AppendLe(&buf_, v, 4); }
void WireWriter::U64(uint64_t v) { AppendLe(&buf_, v, 8); }
void WireWriter::I64(int64_t v) { AppendLe(&buf_, static_cast<uint64_t>(v), 8); }

void WireWriter::Bytes(std::span<const uint8_t> bytes) {
  buf_.insert(buf_.end(), bytes.begin(), bytes.end());
}

void WireWriter::String(std::string_view s) {
  U32(CheckedLength(s.size()));
  buf_.insert(buf_.end(), s.begin(), s.end());
}

void WireWriter::U32Array(std::span<const uint32_t> values) {
  U32(CheckedLength(values.size()));
  if constexpr (std::endian::native == std::endian::little) {
    // The wire's byte order is the host's: one copy (a 131,072-token prompt is 512 KiB).
    const auto* p = reinterpret_cast<const uint8_t*>(values.data());
    buf_.insert(buf_.end(), p, p + 4 * values.size());
    return;
  }
  buf_.reserve(buf_.size() + 4 * values.size());
  for (uint32_t v : values) U32(v);
}

void WireWriter::U64Array(std::span<const uint64_t> values) {
  U32(CheckedLength(values.size()));
  buf_.reserve(buf_.size() + 8 * values.size());
  for (uint64_t v : values) U64(v);
}

std::vector<uint8_t> WireWriter::Take() {
  std::vector<uint8_t> out = std::move(buf_);
  buf_.clear();
  return out;
}

WireReader::WireReader(std::span<const uint8_t> bytes) : bytes_(bytes) {}

size_t WireReader::remaining() const { return error_.ok() ? bytes_.size() - pos_ : 0; }

Status WireReader::Fail(std::string msg) {
  error_ = Status::InvalidArgument(Protocol(std::move(msg)));
  return error_;
}

Status WireReader::Consume(const char* field, size_t n, size_t* at) {
  if (!error_.ok()) return error_;
  const size_t left = bytes_.size() - pos_;
  if (n > left) {
    return Fail("field '" + std::string(field) + "' needs " + std::to_string(n) + " bytes, " +
                std::to_string(left) + " left");
  }
  *at = pos_;
  pos_ += n;
  last_field_ = field;
  return Status::Ok();
}

Status WireReader::U8(const char* field, uint8_t* out) {
  size_t at = 0;
  KVTIER_RETURN_IF_ERROR(Consume(field, 1, &at));
  *out = bytes_[at];
  return Status::Ok();
}

Status WireReader::U16(const char* field, uint16_t* out) {
  size_t at = 0;
  KVTIER_RETURN_IF_ERROR(Consume(field, 2, &at));
  *out = static_cast<uint16_t>(GetLe(bytes_.data() + at, 2));
  return Status::Ok();
}

Status WireReader::U32(const char* field, uint32_t* out) {
  size_t at = 0;
  KVTIER_RETURN_IF_ERROR(Consume(field, 4, &at));
  *out = static_cast<uint32_t>(GetLe(bytes_.data() + at, 4));
  return Status::Ok();
}

Status WireReader::U64(const char* field, uint64_t* out) {
  size_t at = 0;
  KVTIER_RETURN_IF_ERROR(Consume(field, 8, &at));
  *out = GetLe(bytes_.data() + at, 8);
  return Status::Ok();
}

Status WireReader::I64(const char* field, int64_t* out) {
  uint64_t v = 0;
  KVTIER_RETURN_IF_ERROR(U64(field, &v));
  *out = static_cast<int64_t>(v);  // two's complement (defined since C++20)
  return Status::Ok();
}

Status WireReader::Bytes(const char* field, size_t n, std::span<const uint8_t>* out) {
  size_t at = 0;
  KVTIER_RETURN_IF_ERROR(Consume(field, n, &at));
  *out = bytes_.subspan(at, n);
  return Status::Ok();
}

Status WireReader::Count(const char* field, uint32_t max, uint32_t min_bytes_per_elem,
                         uint32_t* out) {
  uint32_t count = 0;
  KVTIER_RETURN_IF_ERROR(U32(field, &count));
  if (count > max) {
    return Fail("field '" + std::string(field) + "' count " + std::to_string(count) +
                " exceeds the limit " + std::to_string(max));
  }
  const uint64_t needs = static_cast<uint64_t>(count) * min_bytes_per_elem;
  const size_t left = bytes_.size() - pos_;
  if (needs > left) {
    return Fail("field '" + std::string(field) + "' count " + std::to_string(count) +
                " needs at least " + std::to_string(needs) + " bytes, " + std::to_string(left) +
                " left");
  }
  *out = count;
  return Status::Ok();
}

Status WireReader::String(const char* field, uint32_t max_len, std::string* out) {
  uint32_t len = 0;
  KVTIER_RETURN_IF_ERROR(U32(field, &len));
  if (len > max_len) {
    return Fail("field '" + std::string(field) + "' length " + std::to_string(len) +
                " exceeds the limit " + std::to_string(max_len));
  }
  size_t at = 0;
  KVTIER_RETURN_IF_ERROR(Consume(field, len, &at));
  out->assign(reinterpret_cast<const char*>(bytes_.data() + at), len);
  return Status::Ok();
}

Status WireReader::U32Array(const char* field, uint32_t max_count, std::vector<uint32_t>* out) {
  uint32_t count = 0;
  KVTIER_RETURN_IF_ERROR(Count(field, max_count, 4, &count));
  size_t at = 0;
  KVTIER_RETURN_IF_ERROR(Consume(field, size_t{4} * count, &at));
  out->resize(count);
  if constexpr (std::endian::native == std::endian::little) {
    if (count > 0) std::memcpy(out->data(), bytes_.data() + at, size_t{4} * count);
    return Status::Ok();
  }
  for (uint32_t i = 0; i < count; ++i) {
    (*out)[i] = static_cast<uint32_t>(GetLe(bytes_.data() + at + 4 * size_t{i}, 4));
  }
  return Status::Ok();
}

Status WireReader::U64Array(const char* field, uint32_t max_count, std::vector<uint64_t>* out) {
  uint32_t count = 0;
  KVTIER_RETURN_IF_ERROR(Count(field, max_count, 8, &count));
  size_t at = 0;
  KVTIER_RETURN_IF_ERROR(Consume(field, size_t{8} * count, &at));
  out->resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    (*out)[i] = GetLe(bytes_.data() + at + 8 * size_t{i}, 8);
  }
  return Status::Ok();
}

Status WireReader::Done() const {
  if (!error_.ok()) return error_;
  const size_t left = bytes_.size() - pos_;
  if (left == 0) return Status::Ok();
  std::string msg = "service protocol: " + std::to_string(left) + " trailing bytes ";
  msg += last_field_.empty() ? "in a message with no fields read"
                             : "after field '" + last_field_ + "'";
  return Status::InvalidArgument(std::move(msg));
}

}  // namespace kvtier::proto

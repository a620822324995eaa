#include "kvtier/block_key.h"

#include <xxhash.h>

#include <cstring>

#include "core/sha256.h"
#include "kvtier/layout.h"

namespace kvtier {

namespace {

constexpr char kHexDigits[] = "0123456789abcdef";

void PutBigEndian(uint64_t v, uint8_t* p) {
  for (int i = 7; i >= 0; --i) {
    p[i] = static_cast<uint8_t>(v);
    v >>= 8;
  }
}

uint64_t GetBigEndian(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}

void PutLength(std::string& buf, size_t len) {
  for (int i = 0; i < 4; ++i) buf.push_back(static_cast<char>(len >> (8 * i)));
}

}  // namespace

std::string BlockKey::ToHex() const {
  uint8_t bytes[16];
  PutBigEndian(hi, bytes);
  PutBigEndian(lo, bytes + 8);
  std::string s(32, '0');
  for (int i = 0; i < 16; ++i) {
    s[2 * i] = kHexDigits[bytes[i] >> 4];
    s[2 * i + 1] = kHexDigits[bytes[i] & 15];
  }
  return s;
}

Result<BlockKey> BlockKey::FromHex(std::string_view hex) {
  if (hex.size() != 32) {
    return Status::InvalidArgument("a block key is 32 hex digits; got " +
                                   std::to_string(hex.size()) + " characters");
  }
  uint8_t bytes[16];
  for (int i = 0; i < 32; ++i) {
    char c = hex[i];
    int v = (c >= '0' && c <= '9')   ? c - '0'
            : (c >= 'a' && c <= 'f') ? c - 'a' + 10
            : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                     : -1;
    if (v < 0) {
      return Status::InvalidArgument("block key '" + std::string(hex) +
                                     "' has a character that is not a hex digit");
    }
    if (i % 2 == 0) {
      bytes[i / 2] = static_cast<uint8_t>(v << 4);
    } else {
      bytes[i / 2] |= static_cast<uint8_t>(v);
    }
  }
  return BlockKey{GetBigEndian(bytes), GetBigEndian(bytes + 8)};
}

const char* HashAlgorithmName(HashAlgorithm algorithm) {
  switch (algorithm) {
    case HashAlgorithm::kSha256:
      return "sha256";
    case HashAlgorithm::kXxh3_128:
      return "xxh3-128";
  }
  return "?";
}

Result<HashAlgorithm> ParseHashAlgorithm(std::string_view name) {
  if (name == "sha256") return HashAlgorithm::kSha256;
  if (name == "xxh3-128" || name == "xxh3") return HashAlgorithm::kXxh3_128;
  return Status::InvalidArgument("hash algorithm '" + std::string(name) +
                                 "' is not known; use sha256 (default) or xxh3-128");
}

Result<BlockHasher> BlockHasher::Create(const KeyNamespace& ns, uint32_t tokens_per_block,
                                        HashAlgorithm algorithm) {
  if (tokens_per_block < 1 || tokens_per_block > KvLayout::kMaxTokensPerBlock) {
    return Status::InvalidArgument("tokens_per_block = " + std::to_string(tokens_per_block) +
                                   " is out of range; allowed: 1.." +
                                   std::to_string(KvLayout::kMaxTokensPerBlock));
  }
  if (algorithm != HashAlgorithm::kSha256 && algorithm != HashAlgorithm::kXxh3_128) {
    return Status::InvalidArgument("hash algorithm must be sha256 or xxh3-128");
  }
  BlockHasher h(tokens_per_block, algorithm);
  // Length-prefixed fields so that ("ab", "c") and ("a", "bc") name different namespaces.
  std::string buf = "kvtier-namespace-v1";
  PutLength(buf, ns.model_id.size());
  buf += ns.model_id;
  for (int i = 0; i < 8; ++i) buf.push_back(static_cast<char>(ns.layout_fingerprint >> (8 * i)));
  PutLength(buf, ns.cache_salt.size());
  buf += ns.cache_salt;
  PutLength(buf, ns.adapter_id.size());
  buf += ns.adapter_id;
  PutLength(buf, tokens_per_block);
  h.root_ = h.Digest(reinterpret_cast<const uint8_t*>(buf.data()), buf.size());
  return h;
}

BlockKey BlockHasher::Digest(const uint8_t* data, size_t len) const {
  if (algorithm_ == HashAlgorithm::kXxh3_128) {
    XXH128_canonical_t canon;
    XXH128_canonicalFromHash(&canon, XXH3_128bits(data, len));
    return BlockKey{GetBigEndian(canon.digest), GetBigEndian(canon.digest + 8)};
  }
  uint8_t digest[32];
  Sha256(data, len, digest);
  return BlockKey{GetBigEndian(digest), GetBigEndian(digest + 8)};
}

BlockKey BlockHasher::Chain(const BlockKey& parent, std::span<const TokenId> block_tokens,
                            std::span<const uint8_t> extra) const {
  // Message: parent (16 bytes, big-endian hi then lo) || tokens (uint32 little-endian) || extra.
  const size_t len = 16 + 4 * block_tokens.size() + extra.size();
  uint8_t stack_buf[16 + 4 * 64 + 64];
  std::vector<uint8_t> heap_buf;
  uint8_t* buf = stack_buf;
  if (len > sizeof(stack_buf)) {
    heap_buf.resize(len);
    buf = heap_buf.data();
  }
  PutBigEndian(parent.hi, buf);
  PutBigEndian(parent.lo, buf + 8);
  uint8_t* p = buf + 16;
  for (TokenId t : block_tokens) {
    p[0] = static_cast<uint8_t>(t);
    p[1] = static_cast<uint8_t>(t >> 8);
    p[2] = static_cast<uint8_t>(t >> 16);
    p[3] = static_cast<uint8_t>(t >> 24);
    p += 4;
  }
  if (!extra.empty()) std::memcpy(p, extra.data(), extra.size());
  return Digest(buf, len);
}

size_t BlockHasher::AppendKeys(std::span<const TokenId> tokens, const BlockKey& parent,
                               std::vector<BlockKey>* out) const {
  return AppendKeys(tokens, parent, out, {});
}

size_t BlockHasher::AppendKeys(std::span<const TokenId> tokens, const BlockKey& parent,
                               std::vector<BlockKey>* out,
                               std::span<const std::string> extra) const {
  const size_t n = tokens.size() / tokens_per_block_;
  BlockKey prev = parent;  // copied first: `parent` may live in *out, which reserve can move
  out->reserve(out->size() + n);
  for (size_t i = 0; i < n; ++i) {
    std::span<const uint8_t> e;
    if (i < extra.size()) {
      e = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(extra[i].data()),
                                   extra[i].size());
    }
    prev = Chain(prev, tokens.subspan(i * tokens_per_block_, tokens_per_block_), e);
    out->push_back(prev);
  }
  return n;
}

std::vector<BlockKey> BlockHasher::KeysFor(std::span<const TokenId> tokens) const {
  std::vector<BlockKey> keys;
  AppendKeys(tokens, root_, &keys);
  return keys;
}

}  // namespace kvtier

// Block keys: 128-bit names of a token block *and its whole prefix*.
//
//   key[-1] = H(namespace)            namespace = model id, layout fingerprint, tenant salt,
//                                                 adapter (LoRA) id, tokens per block
//   key[i]  = H(key[i-1] || tokens[i] || extra[i])
//
// H is SHA-256 truncated to 128 bits by default; XXH3-128 on request, for trusted setups
// (prompts come from untrusted users, and a weak hash would let one forge another's hit). Keys
// are a pure function of their inputs: identical in every process and on every machine.
#pragma once

#include <compare>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.h"

namespace kvtier {

using TokenId = uint32_t;

struct BlockKey {
  uint64_t hi = 0;  // first 8 bytes of the digest, big-endian
  uint64_t lo = 0;  // next 8 bytes

  friend bool operator==(const BlockKey&, const BlockKey&) = default;
  friend auto operator<=>(const BlockKey&, const BlockKey&) = default;

  bool IsZero() const { return hi == 0 && lo == 0; }
  // 32 lowercase hex digits, the digest's first 16 bytes in order.
  std::string ToHex() const;
  // Parses ToHex()'s output; InvalidArgument on anything else.
  static Result<BlockKey> FromHex(std::string_view hex);
};

// For hash containers. Keys are already uniformly distributed, so this only folds them.
struct BlockKeyHash {
  size_t operator()(const BlockKey& k) const { return k.lo ^ (k.hi * 0x9e3779b97f4a7c15ull); }
};

enum class HashAlgorithm : uint8_t { kSha256 = 0, kXxh3_128 = 1 };
const char* HashAlgorithmName(HashAlgorithm algorithm);  // "sha256", "xxh3-128"
Result<HashAlgorithm> ParseHashAlgorithm(std::string_view name);

// What makes two identical token sequences cache-distinct.
struct KeyNamespace {
  std::string model_id;         // e.g. "HuggingFaceTB/SmolLM2-135M-Instruct@Q4_1"
  uint64_t layout_fingerprint;  // KvLayout::Fingerprint()
  std::string cache_salt;       // per tenant; empty = shared
  std::string adapter_id;       // LoRA adapter; empty = base model
};

// Computes chained block keys. Immutable after construction; safe to share between threads.
class BlockHasher {
 public:
  // InvalidArgument unless tokens_per_block is in 1..KvLayout::kMaxTokensPerBlock (4096; any
  // size, not only powers of two).
  static Result<BlockHasher> Create(const KeyNamespace& ns, uint32_t tokens_per_block,
                                    HashAlgorithm algorithm = HashAlgorithm::kSha256);

  // key[-1]: the parent of a prompt's first block.
  const BlockKey& root() const { return root_; }
  uint32_t tokens_per_block() const { return tokens_per_block_; }
  HashAlgorithm algorithm() const { return algorithm_; }

  // The key of the block holding `block_tokens` (exactly tokens_per_block() of them) whose
  // prefix ends in `parent`. `extra` carries whatever else the block's KV depends on
  // (multimodal input hashes, for instance); empty for plain text.
  // REQUIRES: block_tokens.size() == tokens_per_block().
  BlockKey Chain(const BlockKey& parent, std::span<const TokenId> block_tokens,
                 std::span<const uint8_t> extra = {}) const;

  // Appends to `out` the keys of the full blocks of `tokens`, chained from `parent` (root() for
  // the start of a prompt). A partial last block is not keyed. Returns the number appended.
  size_t AppendKeys(std::span<const TokenId> tokens, const BlockKey& parent,
                    std::vector<BlockKey>* out) const;
  // The same, with `extra[i]` mixed into the key of the i-th block appended (Chain's `extra`);
  // blocks past the end of `extra` have none. With an empty `extra` the keys are AppendKeys'.
  size_t AppendKeys(std::span<const TokenId> tokens, const BlockKey& parent,
                    std::vector<BlockKey>* out, std::span<const std::string> extra) const;

  // The keys of the full blocks of a whole prompt.
  std::vector<BlockKey> KeysFor(std::span<const TokenId> tokens) const;

 private:
  BlockHasher(uint32_t tokens_per_block, HashAlgorithm algorithm)
      : tokens_per_block_(tokens_per_block), algorithm_(algorithm) {}
  BlockKey Digest(const uint8_t* data, size_t len) const;

  uint32_t tokens_per_block_;
  HashAlgorithm algorithm_;
  BlockKey root_;
};

}  // namespace kvtier

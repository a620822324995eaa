// Tokenizer: GPT-2-style byte-level BPE, built from a GGUF file's tokenizer metadata
// (tokenizer.ggml.model = "gpt2").
//
// Encoding: special tokens (token type CONTROL or USER_DEFINED) are matched first, longest
// first, when the caller allows them; the text between them is split by the pre-tokenizer
// (pretokenizer.h); each piece's bytes are mapped to the byte-level alphabet (printable bytes
// stand for themselves, the others for U+0100 + n, so a space is "Ġ"), then adjacent symbols
// are merged repeatedly, lowest merge rank first (ties: leftmost), and each final symbol is
// looked up in the vocabulary.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/gguf.h"
#include "engine/pretokenizer.h"
#include "kvtier/block_key.h"
#include "kvtier/status.h"

namespace kvtier::engine {

// GGUF tokenizer.ggml.token_type values.
enum class TokenType : int32_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// Everything a tokenizer is built from (what GGUF metadata holds).
struct TokenizerSpec {
  std::vector<std::string> tokens;   // id -> text in the byte-level alphabet
  std::vector<int32_t> token_types;  // id -> TokenType; empty = all normal
  std::vector<std::string> merges;   // "left right", highest priority first
  PreTokenizerKind pre = PreTokenizerKind::kGpt2;
  int64_t bos_id = -1;  // -1: none
  int64_t eos_id = -1;
  int64_t unk_id = -1;
};

class Tokenizer {
 public:
  // Reads tokenizer.ggml.{model,tokens,token_type,merges,pre,bos_token_id,eos_token_id,
  // unknown_token_id}. NotFound when tokens or merges are missing; InvalidArgument when the
  // model is not "gpt2", the pre-tokenizer is unsupported, or Create rejects the spec.
  static Result<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& file);
  // InvalidArgument for an empty vocabulary, token_types of another length, a merge without
  // exactly one separating space, or a bos/eos/unk id outside the vocabulary.
  static Result<std::unique_ptr<Tokenizer>> Create(TokenizerSpec spec);

  // Token ids of `text`. With parse_special, special-token texts in `text` become their ids;
  // without, they are encoded as plain text (use this for untrusted user content). Bytes that
  // no vocabulary entry covers become unk_id, or are dropped when there is none.
  std::vector<TokenId> Encode(std::string_view text, bool parse_special) const;

  // The text of `ids` (bytes, normally UTF-8). Control tokens are written as their text unless
  // skip_special. Ids outside the vocabulary are skipped.
  std::string Decode(std::span<const TokenId> ids, bool skip_special = false) const;

  uint32_t vocab_size() const { return static_cast<uint32_t>(spec_.tokens.size()); }
  int64_t bos_id() const { return spec_.bos_id; }
  int64_t eos_id() const { return spec_.eos_id; }
  // The id of a vocabulary entry spelled exactly `text` (byte-level alphabet), or -1.
  int64_t Find(std::string_view text) const;
  // TokenType of `id` (kNormal when the spec had no types). REQUIRES: id < vocab_size().
  TokenType type(TokenId id) const;

 private:
  explicit Tokenizer(TokenizerSpec spec) : spec_(std::move(spec)) {}
  void EncodePiece(std::string_view piece, std::vector<TokenId>* out) const;

  TokenizerSpec spec_;
  std::unordered_map<std::string, TokenId> vocab_;
  std::unordered_map<std::string, uint32_t> merge_rank_;  // "left right" -> rank
  std::vector<TokenId> specials_;                         // longest text first
  std::string byte_to_symbol_[256];                       // byte -> UTF-8 of its symbol
  std::unordered_map<uint32_t, uint8_t> symbol_to_byte_;  // code point -> byte
};

}  // namespace kvtier::engine

// The pre-tokenizer of GPT-2-style byte-level BPE: splits text into the pieces BPE merges
// within, hand-written (no regex library). It reproduces the GPT-2 split pattern
//
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
// (first alternative that matches at each position wins), optionally after isolating every
// \p{N} character as a piece of its own (HF's Digits(individual_digits=true), used by
// StarCoder-family tokenizers such as SmolLM's: GGUF pre "smollm").
//
// Character classes are exact for ASCII. Outside ASCII, \p{L}, \p{N} and \s come from compact
// range tables covering Latin, Greek, Cyrillic, Armenian, Hebrew, Arabic, the Indic scripts,
// Thai, Georgian, Hangul, kana and CJK ideographs, and the common numeric and space
// characters; characters of rarer scripts fall in the "other" class (a split that may differ
// from HF's for them, never a failure).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.h"

namespace kvtier::engine {

enum class PreTokenizerKind : uint8_t {
  kGpt2 = 0,            // the GPT-2 pattern alone ("gpt2", "default" in GGUF)
  kDigitsThenGpt2 = 1,  // each digit isolated, then the GPT-2 pattern ("smollm", "starcoder")
};

// Maps GGUF `tokenizer.ggml.pre` to a kind; InvalidArgument lists the supported names.
Result<PreTokenizerKind> ParsePreTokenizer(std::string_view name);

// Splits `text` (UTF-8; invalid bytes are taken one by one as "other" characters) into pieces
// whose concatenation is `text`. Pieces are views into `text`.
std::vector<std::string_view> PreTokenize(std::string_view text, PreTokenizerKind kind);

// Decodes the code point at text[pos]; sets *len to its byte length (1 for an invalid byte,
// which decodes as 0xFFFD). REQUIRES: pos < text.size().
uint32_t DecodeUtf8(std::string_view text, size_t pos, size_t* len);
// Appends the UTF-8 encoding of `cp` (REQUIRES: cp <= 0x10FFFF).
void AppendUtf8(uint32_t cp, std::string* out);

// Unicode classes as the pre-tokenizer sees them (see the note above).
bool IsUnicodeLetter(uint32_t cp);
bool IsUnicodeNumber(uint32_t cp);
bool IsUnicodeSpace(uint32_t cp);

}  // namespace kvtier::engine

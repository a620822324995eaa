#include "engine/tokenizer.h"

#include <algorithm>
#include <limits>

namespace kvtier::engine {
namespace {

// Bytes that stand for themselves in the byte-level alphabet: '!'..'~', U+00A1..U+00AC and
// U+00AE..U+00FF. The other 68 bytes map to U+0100, U+0101, ... in byte order.
bool IsSelfByte(uint32_t b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& file) {
  Result<std::string> model = file.GetString("tokenizer.ggml.model");
  if (!model.ok()) return model.status();
  if (*model != "gpt2") {
    return Status::InvalidArgument("tokenizer.ggml.model '" + *model +
                                   "' is not supported (only byte-level BPE, 'gpt2')");
  }
  TokenizerSpec spec;
  KVTIER_ASSIGN_OR_RETURN(spec.tokens, file.GetStringArray("tokenizer.ggml.tokens"));
  KVTIER_ASSIGN_OR_RETURN(spec.merges, file.GetStringArray("tokenizer.ggml.merges"));
  if (file.Find("tokenizer.ggml.token_type") != nullptr) {
    KVTIER_ASSIGN_OR_RETURN(std::vector<int64_t> types,
                            file.GetIntArray("tokenizer.ggml.token_type"));
    spec.token_types.reserve(types.size());
    for (int64_t t : types) {
      if (t < std::numeric_limits<int32_t>::min() || t > std::numeric_limits<int32_t>::max()) {
        return Status::InvalidArgument("tokenizer.ggml.token_type holds " + std::to_string(t));
      }
      spec.token_types.push_back(static_cast<int32_t>(t));
    }
  }
  std::string pre;
  if (file.Find("tokenizer.ggml.pre") != nullptr) {
    KVTIER_ASSIGN_OR_RETURN(pre, file.GetString("tokenizer.ggml.pre"));
  }
  KVTIER_ASSIGN_OR_RETURN(spec.pre, ParsePreTokenizer(pre));
  struct IdKey {
    const char* key;
    int64_t* out;
  };
  for (IdKey k : {IdKey{"tokenizer.ggml.bos_token_id", &spec.bos_id},
                  IdKey{"tokenizer.ggml.eos_token_id", &spec.eos_id},
                  IdKey{"tokenizer.ggml.unknown_token_id", &spec.unk_id}}) {
    if (file.Find(k.key) == nullptr) continue;
    KVTIER_ASSIGN_OR_RETURN(uint32_t id, file.GetUint32(k.key));
    *k.out = id;
  }
  return Create(std::move(spec));
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::Create(TokenizerSpec spec) {
  const size_t n = spec.tokens.size();
  if (n == 0) return Status::InvalidArgument("tokenizer vocabulary is empty");
  if (n > std::numeric_limits<TokenId>::max()) {
    return Status::InvalidArgument("tokenizer vocabulary is too large");
  }
  if (!spec.token_types.empty() && spec.token_types.size() != n) {
    return Status::InvalidArgument("tokenizer has " + std::to_string(n) + " tokens but " +
                                   std::to_string(spec.token_types.size()) + " token types");
  }
  for (auto [name, id] : {std::pair{"bos", spec.bos_id}, std::pair{"eos", spec.eos_id},
                          std::pair{"unk", spec.unk_id}}) {
    if (id < -1 || id >= static_cast<int64_t>(n)) {
      return Status::InvalidArgument(std::string("tokenizer ") + name + " id " +
                                     std::to_string(id) + " is outside the vocabulary of " +
                                     std::to_string(n));
    }
  }
  std::unique_ptr<Tokenizer> t(new Tokenizer(std::move(spec)));
  const TokenizerSpec& s = t->spec_;
  t->vocab_.reserve(n);
  for (size_t id = 0; id < n; ++id) {
    t->vocab_.emplace(s.tokens[id], static_cast<TokenId>(id));  // first id wins on duplicates
    const TokenType type = t->type(static_cast<TokenId>(id));
    if ((type == TokenType::kControl || type == TokenType::kUserDefined) && !s.tokens[id].empty()) {
      t->specials_.push_back(static_cast<TokenId>(id));
    }
  }
  std::stable_sort(t->specials_.begin(), t->specials_.end(),
                   [&](TokenId a, TokenId b) { return s.tokens[a].size() > s.tokens[b].size(); });
  t->merge_rank_.reserve(s.merges.size());
  for (size_t r = 0; r < s.merges.size(); ++r) {
    const std::string& m = s.merges[r];
    const size_t sp = m.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == m.size() ||
        m.find(' ', sp + 1) != std::string::npos) {
      return Status::InvalidArgument("tokenizer merge " + std::to_string(r) + " '" + m +
                                     "' is not two symbols separated by one space");
    }
    t->merge_rank_.emplace(m, static_cast<uint32_t>(r));
  }
  uint32_t next = 0x100;
  for (uint32_t b = 0; b < 256; ++b) {
    const uint32_t cp = IsSelfByte(b) ? b : next++;
    AppendUtf8(cp, &t->byte_to_symbol_[b]);
    t->symbol_to_byte_.emplace(cp, static_cast<uint8_t>(b));
  }
  return t;
}

TokenType Tokenizer::type(TokenId id) const {
  return spec_.token_types.empty() ? TokenType::kNormal
                                   : static_cast<TokenType>(spec_.token_types[id]);
}

int64_t Tokenizer::Find(std::string_view text) const {
  auto it = vocab_.find(std::string(text));
  return it == vocab_.end() ? -1 : it->second;
}

void Tokenizer::EncodePiece(std::string_view piece, std::vector<TokenId>* out) const {
  std::vector<std::string> syms;
  syms.reserve(piece.size());
  for (char ch : piece) syms.push_back(byte_to_symbol_[static_cast<unsigned char>(ch)]);
  std::string key;
  while (syms.size() > 1) {
    uint32_t best_rank = std::numeric_limits<uint32_t>::max();
    size_t best = 0;
    for (size_t k = 0; k + 1 < syms.size(); ++k) {
      key.assign(syms[k]).append(" ").append(syms[k + 1]);
      auto it = merge_rank_.find(key);
      if (it != merge_rank_.end() && it->second < best_rank) {
        best_rank = it->second;
        best = k;
      }
    }
    if (best_rank == std::numeric_limits<uint32_t>::max()) break;
    syms[best] += syms[best + 1];
    syms.erase(syms.begin() + static_cast<ptrdiff_t>(best) + 1);
  }
  for (const std::string& sym : syms) {
    auto it = vocab_.find(sym);
    if (it != vocab_.end()) {
      out->push_back(it->second);
      continue;
    }
    // A symbol the vocabulary lacks: fall back to its single-byte symbols.
    for (size_t pos = 0; pos < sym.size();) {
      size_t len = 0;
      DecodeUtf8(sym, pos, &len);
      auto b = vocab_.find(sym.substr(pos, len));
      if (b != vocab_.end()) {
        out->push_back(b->second);
      } else if (spec_.unk_id >= 0) {
        out->push_back(static_cast<TokenId>(spec_.unk_id));
      }
      pos += len;
    }
  }
}

std::vector<TokenId> Tokenizer::Encode(std::string_view text, bool parse_special) const {
  std::vector<TokenId> out;
  auto encode_plain = [&](std::string_view span) {
    for (std::string_view piece : PreTokenize(span, spec_.pre)) EncodePiece(piece, &out);
  };
  if (!parse_special || specials_.empty()) {
    encode_plain(text);
    return out;
  }
  size_t plain_start = 0;
  for (size_t pos = 0; pos < text.size();) {
    TokenId hit = 0;
    size_t hit_len = 0;
    for (TokenId id : specials_) {  // longest first
      const std::string& s = spec_.tokens[id];
      if (text.compare(pos, s.size(), s) == 0) {
        hit = id;
        hit_len = s.size();
        break;
      }
    }
    if (hit_len == 0) {
      ++pos;
      continue;
    }
    encode_plain(text.substr(plain_start, pos - plain_start));
    out.push_back(hit);
    pos += hit_len;
    plain_start = pos;
  }
  encode_plain(text.substr(plain_start));
  return out;
}

std::string Tokenizer::Decode(std::span<const TokenId> ids, bool skip_special) const {
  std::string out;
  for (TokenId id : ids) {
    if (id >= spec_.tokens.size()) continue;
    const std::string& s = spec_.tokens[id];
    const TokenType t = type(id);
    if (t == TokenType::kControl) {
      if (!skip_special) out += s;
      continue;
    }
    for (size_t pos = 0; pos < s.size();) {
      size_t len = 0;
      const uint32_t cp = DecodeUtf8(s, pos, &len);
      auto it = symbol_to_byte_.find(cp);
      if (it != symbol_to_byte_.end() && len > 0) {
        out.push_back(static_cast<char>(it->second));
      } else {
        out.append(s, pos, len);  // not in the byte alphabet: keep as written
      }
      pos += len;
    }
  }
  return out;
}

}  // namespace kvtier::engine

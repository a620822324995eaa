#include "sim/replay_trace.h"

#include <cerrno>
#include <cstring>
#include <unordered_map>

#include "sim/jsonl_line.h"

namespace kvtier::cli {

namespace {

// A request may hold at most this many tokens (16 Mi): a typo or a hostile file must not make
// the replay allocate without bound.
constexpr uint64_t kMaxRequestTokens = 1ull << 24;

uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct TokenLine {
  std::vector<TokenId> tokens;
  std::string request_id;
};

Status ParseTokenLine(std::string_view text, uint64_t line, TokenLine* out) {
  JsonLineParser p(text, line);
  if (Status s = p.Expect('{'); !s.ok()) return s;
  bool have_tokens = false, have_id = false;
  if (!p.Take('}')) {
    do {
      auto key = p.String();
      if (!key.ok()) return key.status();
      if (Status s = p.Expect(':'); !s.ok()) return s;
      if (*key == "tokens") {
        if (have_tokens) return p.Error("duplicate key \"tokens\"");
        have_tokens = true;
        if (Status s = p.Expect('['); !s.ok()) return s;
        if (!p.Take(']')) {
          do {
            if (out->tokens.size() >= kMaxRequestTokens) {
              return p.Error("more than " + std::to_string(kMaxRequestTokens) +
                             " tokens in one request; split it");
            }
            auto t = p.Uint("tokens[" + std::to_string(out->tokens.size()) + "]", UINT32_MAX);
            if (!t.ok()) return t.status();
            out->tokens.push_back(static_cast<TokenId>(*t));
          } while (p.Take(','));
          if (Status s = p.Expect(']'); !s.ok()) return s;
        }
      } else if (*key == "request_id") {
        if (have_id) return p.Error("duplicate key \"request_id\"");
        have_id = true;
        auto id = p.String();
        if (!id.ok()) return id.status();
        if (id->empty()) return p.Error("\"request_id\" is empty; omit it or name the request");
        out->request_id = std::string(*id);
      } else if (*key == "timestamp") {
        if (auto v = p.NonNegativeNumber("timestamp"); !v.ok()) return v.status();
      } else if (Status s = p.SkipValue(); !s.ok()) {
        return s;
      }
    } while (p.Take(','));
    if (Status s = p.Expect('}'); !s.ok()) return s;
  }
  if (!p.AtEnd()) return p.Error("unexpected text after the object");
  if (!have_tokens) return p.Error("missing \"tokens\" (an array of token ids)");
  if (out->tokens.empty()) return p.Error("\"tokens\" is empty; a request needs a prompt");
  return Status::Ok();
}

}  // namespace

TokenId MooncakeToken(uint64_t hash_id, uint32_t position) {
  return static_cast<TokenId>(Mix64(Mix64(hash_id) + position) % 128000);
}

ReplayTrace ReplayTrace::FromMooncake(Trace trace, uint32_t tokens_per_block) {
  ReplayTrace t;
  t.format_ = Format::kMooncake;
  t.tpb_ = tokens_per_block;
  t.blocks_ = std::move(trace);
  return t;
}

Result<ReplayTrace> ReplayTrace::ParseTokens(std::istream& in, uint32_t tokens_per_block) {
  ReplayTrace t;
  t.format_ = Format::kTokens;
  t.tpb_ = tokens_per_block;
  KVTIER_ASSIGN_OR_RETURN(BlockHasher hasher,
                          BlockHasher::Create(KeyNamespace{"kvtier-replay-trace", 0, "", ""},
                                              tokens_per_block, HashAlgorithm::kXxh3_128));
  std::unordered_map<BlockKey, uint64_t, BlockKeyHash> id_of;
  std::string text;
  JsonLineReader reader(in);
  while (reader.Next(&text)) {
    const uint64_t line = reader.line();
    if (text.find_first_not_of(" \t\r\n") == std::string::npos) continue;
    TokenLine parsed;
    KVTIER_RETURN_IF_ERROR(ParseTokenLine(text, line, &parsed));
    for (const BlockKey& key : hasher.KeysFor(parsed.tokens)) {
      auto [it, inserted] = id_of.try_emplace(key, id_of.size());
      t.blocks_.ids.push_back(it->second);
    }
    t.blocks_.request_ends.push_back(t.blocks_.ids.size());
    t.blocks_.input_lengths.push_back(parsed.tokens.size());
    t.tokens_.insert(t.tokens_.end(), parsed.tokens.begin(), parsed.tokens.end());
    t.token_ends_.push_back(t.tokens_.size());
    t.ids_.push_back(std::move(parsed.request_id));
  }
  KVTIER_RETURN_IF_ERROR(reader.status());
  if (in.bad()) return Status::IOError("reading the trace failed");
  t.blocks_.distinct_blocks = id_of.size();
  return t;
}

Result<ReplayTrace> ReplayTrace::Load(const std::string& path, const std::string& format,
                                      uint32_t tokens_per_block) {
  if (format != "auto" && format != "mooncake" && format != "kvtier") {
    return Status::InvalidArgument("--format " + format + ": use auto, mooncake or kvtier");
  }
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<RegularFileStream> stream, OpenTraceFile(path));
  std::istream& in = *stream;
  bool mooncake = format == "mooncake";
  if (format == "auto") {
    std::string first;
    JsonLineReader reader(in);
    while (reader.Next(&first) && first.find_first_not_of(" \t\r\n") == std::string::npos) {
    }
    if (!stream->read_error().ok()) return stream->read_error();
    if (!reader.status().ok())
      return Status::InvalidArgument(path + ": " + reader.status().message());
    mooncake = first.find("\"hash_ids\"") != std::string::npos;
    in.clear();
    in.seekg(0);
  }
  if (mooncake) {
    auto trace = ParseMooncakeTrace(in);
    if (!stream->read_error().ok()) return stream->read_error();
    if (!trace.ok()) return Status::InvalidArgument(path + ": " + trace.status().message());
    return FromMooncake(std::move(*trace), tokens_per_block);
  }
  auto trace = ParseTokens(in, tokens_per_block);
  if (!stream->read_error().ok()) return stream->read_error();
  if (!trace.ok()) return Status::InvalidArgument(path + ": " + trace.status().message());
  return trace;
}

void ReplayTrace::Prompt(size_t r, std::vector<TokenId>* out) const {
  out->clear();
  if (format_ == Format::kTokens) {
    const uint64_t begin = r == 0 ? 0 : token_ends_[r - 1];
    out->assign(tokens_.begin() + begin, tokens_.begin() + token_ends_[r]);
    return;
  }
  out->reserve((blocks_.end(r) - blocks_.begin(r)) * tpb_ + 1);
  for (uint64_t i = blocks_.begin(r); i < blocks_.end(r); ++i) {
    for (uint32_t p = 0; p < tpb_; ++p) out->push_back(MooncakeToken(blocks_.ids[i], p));
  }
  out->push_back(static_cast<TokenId>(Mix64(~uint64_t{r}) % 128000));  // the tail token
}

uint64_t ReplayTrace::cost_tokens(size_t r) const {
  const uint64_t n = prompt_blocks(r);
  if (format_ == Format::kTokens) return token_ends_[r] - (r == 0 ? 0 : token_ends_[r - 1]);
  const uint64_t given = r < blocks_.input_lengths.size() ? blocks_.input_lengths[r] : 0;
  if (given > (n == 0 ? 0 : (n - 1) * tpb_) && given <= n * tpb_) return given;
  return n * tpb_ + 1;
}

std::string ReplayTrace::RequestId(size_t r) const {
  if (r < ids_.size() && !ids_[r].empty()) return ids_[r];
  return "r" + std::to_string(r);
}

}  // namespace kvtier::cli

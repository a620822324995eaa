#include "index/policy_sim.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

namespace kvtier {

namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The hash id of a root (no parent); real ids are < 2^64 - 1 (see ParseUint).
constexpr uint64_t kNoParent = std::numeric_limits<uint64_t>::max();

// A cursor over one JSONL line: just enough JSON to read the trace's objects and skip any
// value it does not need. Every error names the line and column.
class LineParser {
 public:
  LineParser(std::string_view text, uint64_t line) : s_(text), line_(line) {}

  Status Error(const std::string& what) const {
    return Status::InvalidArgument("trace line " + std::to_string(line_) + ", column " +
                                   std::to_string(pos_ + 1) + ": " + what);
  }

  void SkipSpace() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\r' || s_[pos_] == '\n')) {
      ++pos_;
    }
  }
  bool AtEnd() {
    SkipSpace();
    return pos_ >= s_.size();
  }
  // Consumes `c` (after blanks) if it is next.
  bool Take(char c) {
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  Status Expect(char c) {
    if (Take(c)) return Status::Ok();
    return Error(std::string("expected '") + c + "'" + Found());
  }

  // A JSON string; escapes are kept undecoded (keys of interest have none).
  Result<std::string_view> String() {
    SkipSpace();
    if (pos_ >= s_.size() || s_[pos_] != '"') return Error("expected a string" + Found());
    const size_t start = ++pos_;
    while (pos_ < s_.size() && s_[pos_] != '"') {
      if (static_cast<unsigned char>(s_[pos_]) < 0x20) return Error("control character in string");
      if (s_[pos_] == '\\') ++pos_;  // the escaped character is skipped whatever it is
      ++pos_;
    }
    if (pos_ >= s_.size()) return Error("unterminated string");
    return s_.substr(start, pos_++ - start);
  }

  // A non-negative integer that fits below 2^64 - 1 (digits only: no sign, fraction or
  // exponent).
  Result<uint64_t> Uint(const std::string& what) {
    SkipSpace();
    const size_t start = pos_;
    uint64_t v = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      const uint64_t digit = static_cast<uint64_t>(s_[pos_] - '0');
      if (v > (kNoParent - 1 - digit) / 10) {
        pos_ = start;
        return Error(what + " is too large");
      }
      v = v * 10 + digit;
      ++pos_;
    }
    if (pos_ == start || (pos_ < s_.size() && (s_[pos_] == '.' || s_[pos_] == 'e' ||
                                               s_[pos_] == 'E' || s_[pos_] == '-'))) {
      pos_ = start;
      return Error(what + " must be a non-negative integer" + Found());
    }
    return v;
  }

  // A finite, non-negative JSON number.
  Result<double> NonNegativeNumber(const std::string& what) {
    SkipSpace();
    const size_t start = pos_;
    while (pos_ < s_.size() && std::strchr("+-0123456789.eE", s_[pos_]) != nullptr) ++pos_;
    const std::string text(s_.substr(start, pos_ - start));
    char* end = nullptr;
    errno = 0;
    const double v = text.empty() ? 0.0 : std::strtod(text.c_str(), &end);
    if (text.empty() || errno != 0 || *end != '\0' || !std::isfinite(v) || v < 0) {
      pos_ = start;
      return Error(what + " must be a finite non-negative number" + Found());
    }
    return v;
  }

  // Skips any JSON value. Nesting deeper than kMaxDepth is refused, so a hostile line cannot
  // exhaust the stack.
  Status SkipValue(int depth = 0) {
    static constexpr int kMaxDepth = 64;
    if (depth > kMaxDepth) return Error("values nested too deeply");
    SkipSpace();
    if (pos_ >= s_.size()) return Error("expected a value at the end of the line");
    const char c = s_[pos_];
    if (c == '"') return String().status();
    if (c == '{' || c == '[') {
      const char close = c == '{' ? '}' : ']';
      ++pos_;
      if (Take(close)) return Status::Ok();
      do {
        if (c == '{') {
          if (auto key = String(); !key.ok()) return key.status();
          if (Status s = Expect(':'); !s.ok()) return s;
        }
        if (Status s = SkipValue(depth + 1); !s.ok()) return s;
      } while (Take(','));
      return Expect(close);
    }
    for (std::string_view word : {"true", "false", "null"}) {
      if (s_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return Status::Ok();
      }
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      while (pos_ < s_.size() && std::strchr("+-0123456789.eE", s_[pos_]) != nullptr) ++pos_;
      return Status::Ok();
    }
    return Error("expected a value" + Found());
  }

 private:
  std::string Found() const {
    if (pos_ >= s_.size()) return ", found the end of the line";
    return std::string(", found '") + s_[pos_] + "'";
  }

  std::string_view s_;
  size_t pos_ = 0;
  uint64_t line_;
};

// Parses one non-blank line into `ids` (appended). On error `ids` may hold part of the line.
Status ParseLine(std::string_view text, uint64_t line, std::vector<uint64_t>* ids) {
  LineParser p(text, line);
  if (Status s = p.Expect('{'); !s.ok()) return s;
  bool have_ids = false;
  if (!p.Take('}')) {
    do {
      auto key = p.String();
      if (!key.ok()) return key.status();
      if (Status s = p.Expect(':'); !s.ok()) return s;
      if (*key == "hash_ids") {
        if (have_ids) return p.Error("duplicate key \"hash_ids\"");
        have_ids = true;
        if (Status s = p.Expect('['); !s.ok()) return s;
        if (!p.Take(']')) {
          do {
            auto id = p.Uint("hash_ids[" + std::to_string(ids->size()) + "]");
            if (!id.ok()) return id.status();
            ids->push_back(*id);
          } while (p.Take(','));
          if (Status s = p.Expect(']'); !s.ok()) return s;
        }
      } else if (*key == "timestamp" || *key == "input_length" || *key == "output_length") {
        if (auto v = p.NonNegativeNumber(std::string(*key)); !v.ok()) return v.status();
      } else if (Status s = p.SkipValue(); !s.ok()) {
        return s;
      }
    } while (p.Take(','));
    if (Status s = p.Expect('}'); !s.ok()) return s;
  }
  if (!p.AtEnd()) return p.Error("unexpected text after the object");
  if (!have_ids) return p.Error("missing \"hash_ids\"");
  return Status::Ok();
}

}  // namespace

Result<Trace> ParseMooncakeTrace(std::istream& in) {
  Trace trace;
  std::unordered_map<uint64_t, uint64_t> parent_of;  // id -> parent id (kNoParent at the root)
  std::string text;
  std::vector<uint64_t> ids;
  for (uint64_t line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r\n") == std::string::npos) continue;
    ids.clear();
    if (Status s = ParseLine(text, line, &ids); !s.ok()) return s;
    for (size_t i = 0; i < ids.size(); ++i) {
      const uint64_t parent = i == 0 ? kNoParent : ids[i - 1];
      auto [it, inserted] = parent_of.try_emplace(ids[i], parent);
      if (!inserted && it->second != parent) ++trace.lineage_conflicts;
      trace.ids.push_back(ids[i]);
    }
    trace.request_ends.push_back(trace.ids.size());
  }
  if (in.bad()) return Status::IOError("reading the trace failed");
  trace.distinct_blocks = parent_of.size();
  return trace;
}

Result<Trace> LoadMooncakeTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound("trace " + path + " does not exist");
    return Status::IOError("cannot open trace " + path + ": " + std::strerror(err));
  }
  auto trace = ParseMooncakeTrace(in);
  if (!trace.ok()) return Status::InvalidArgument(path + ": " + trace.status().message());
  return trace;
}

BlockKey TraceBlockKey(uint64_t hash_id) { return BlockKey{hash_id + 1, SplitMix64(hash_id)}; }

BlockKey TraceRootKey() { return BlockKey{0, SplitMix64(kNoParent)}; }

std::vector<BlockKey> TraceReferences(const Trace& trace) {
  std::vector<BlockKey> refs;
  refs.reserve(trace.ids.size());
  for (uint64_t id : trace.ids) refs.push_back(TraceBlockKey(id));
  return refs;
}

uint64_t CapacityForFraction(const Trace& trace, double fraction) {
  const double blocks = std::ceil(fraction * static_cast<double>(trace.distinct_blocks));
  if (!(blocks >= 1.0)) return 1;
  if (blocks >= static_cast<double>(std::numeric_limits<uint64_t>::max())) {
    return std::numeric_limits<uint64_t>::max();
  }
  return static_cast<uint64_t>(blocks);
}

Result<SimResult> SimulatePolicy(const Trace& trace, EvictionPolicy& policy,
                                 uint64_t capacity_blocks) {
  if (capacity_blocks == 0) return Status::InvalidArgument("capacity must be at least one block");
  if (policy.size() != 0) return Status::InvalidArgument("the policy must start empty");
  SimResult result;
  std::unordered_set<BlockKey, BlockKeyHash> cached;
  cached.reserve(static_cast<size_t>(std::min<uint64_t>(capacity_blocks, trace.ids.size())) * 2);
  const auto any = [](const BlockKey&) { return true; };
  for (size_t r = 0; r < trace.requests(); ++r) {
    const uint64_t begin = trace.begin(r);
    const uint64_t end = trace.end(r);
    uint64_t i = begin;
    for (; i < end && cached.contains(TraceBlockKey(trace.ids[i])); ++i) {
      policy.OnAccess(TraceBlockKey(trace.ids[i]));
    }
    result.hit_blocks += i - begin;
    for (; i < end; ++i) {
      const BlockKey key = TraceBlockKey(trace.ids[i]);
      if (cached.contains(key)) {
        policy.OnAccess(key);
        ++result.late_accesses;
        continue;
      }
      if (cached.size() >= capacity_blocks) {
        const std::optional<BlockKey> victim = policy.Victim(any);
        if (!victim) return Status::Internal("the policy named no victim in a full tier");
        if (cached.erase(*victim) != 1) {
          return Status::Internal("the policy named a victim that is not cached: " +
                                  victim->ToHex());
        }
        policy.OnRemove(*victim);
        ++result.evictions;
      }
      const BlockKey parent = i == begin ? TraceRootKey() : TraceBlockKey(trace.ids[i - 1]);
      policy.OnInsert(key, parent);
      cached.insert(key);
      ++result.inserts;
    }
  }
  result.blocks = trace.ids.size();
  if (policy.size() != cached.size()) {
    return Status::Internal("the policy tracks " + std::to_string(policy.size()) +
                            " blocks but the tier holds " + std::to_string(cached.size()));
  }
  return result;
}

SimResult SimulateUnbounded(const Trace& trace) {
  SimResult result;
  std::unordered_set<uint64_t> cached;
  cached.reserve(trace.distinct_blocks * 2);
  for (size_t r = 0; r < trace.requests(); ++r) {
    uint64_t i = trace.begin(r);
    for (; i < trace.end(r) && cached.contains(trace.ids[i]); ++i) ++result.hit_blocks;
    for (; i < trace.end(r); ++i) {
      if (cached.insert(trace.ids[i]).second) {
        ++result.inserts;
      } else {
        ++result.late_accesses;
      }
    }
  }
  result.blocks = trace.ids.size();
  return result;
}

}  // namespace kvtier

// JsonLineParser: a cursor over one line of a JSONL trace (the Mooncake format of kvtier sim,
// the kvtier token format of kvtier replay). Just enough JSON to read flat objects of numbers,
// strings and arrays, and to skip any other value; every error is InvalidArgument naming the
// line and the column, so a user can find and fix the bad record.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <istream>
#include <memory>
#include <string>
#include <string_view>

#include "core/regular_file.h"
#include "kvtier/status.h"

namespace kvtier {

// The longest line a trace may hold. A request of 16 Mi tokens written as JSON fits; a file with
// no newline (/dev/zero, a binary file given by mistake) is refused at this size instead of
// growing memory without end (std::getline has no bound).
inline constexpr size_t kMaxTraceLineBytes = size_t{64} << 20;
// The most block ids (Mooncake "hash_ids") one request may hold: 16384 blocks of 1024 tokens
// are 16 Mi tokens, the bound of a request's tokens. Each id becomes tokens_per_block tokens in a
// replay, so a line's ids are bounded up front, not after its prompt was built.
inline constexpr size_t kMaxTraceLineIds = 16384;

// Opens the trace file `path` for reading: a regular file only (a directory, a FIFO or a device
// is refused by name: std::ifstream aborted on a directory and blocked on a FIFO). NotFound when
// it does not exist, InvalidArgument when it is not a regular file, IOError otherwise; each
// message names the path and says what to give instead.
inline Result<std::unique_ptr<RegularFileStream>> OpenTraceFile(const std::string& path) {
  if (path.empty()) {
    return Status::InvalidArgument("the trace path is empty; give the path of a JSONL trace file");
  }
  auto opened = RegularFileStream::Open(path);
  if (opened.ok()) return opened;
  const Status& s = opened.status();
  if (s.Is(StatusCode::kNotFound)) {
    return Status::NotFound("trace " + path +
                            " does not exist; give the path of a JSONL trace file");
  }
  if (s.Is(StatusCode::kInvalidArgument)) {
    return Status::InvalidArgument("trace " + s.message() + "; give a JSONL trace file");
  }
  return Status(s.code(), "cannot open trace " + path + ": " + s.message());
}

// Reads a JSONL stream one line at a time, holding at most `max_bytes` of a line: a longer one
// ends the reading with InvalidArgument naming its number.
class JsonLineReader {
 public:
  explicit JsonLineReader(std::istream& in, size_t max_bytes = kMaxTraceLineBytes)
      : in_(in), max_bytes_(max_bytes) {}

  // The next line (without its '\n') into *text: true, or false at the end of the stream or
  // on an over-long line (status() then says which) or a read error.
  bool Next(std::string* text) {
    text->clear();
    std::streambuf* sb = in_.rdbuf();
    if (sb == nullptr || !status_.ok()) return false;
    bool any = false;
    for (;;) {
      const int c = sb->sbumpc();
      if (c == std::char_traits<char>::eof()) {
        in_.setstate(std::ios::eofbit);
        if (!any) return false;
        break;
      }
      any = true;
      if (c == '\n') break;
      if (text->size() >= max_bytes_) {
        status_ = Status::InvalidArgument(
            "trace line " + std::to_string(line_ + 1) + " is longer than " +
            std::to_string(max_bytes_) +
            " bytes (no newline so far); a trace is JSON lines, one request per line");
        text->clear();
        return false;
      }
      text->push_back(static_cast<char>(c));
    }
    ++line_;
    return true;
  }
  // The number of the line Next returned last (1 for the first).
  uint64_t line() const { return line_; }
  // Ok, or why reading stopped early.
  const Status& status() const { return status_; }

 private:
  std::istream& in_;
  const size_t max_bytes_;
  uint64_t line_ = 0;
  Status status_;
};

// A cursor over one JSONL line: just enough JSON to read a trace's objects and skip any value
// it does not need. Every error names the line and column ("trace line N, column C: ...").
class JsonLineParser {
 public:
  JsonLineParser(std::string_view text, uint64_t line) : s_(text), line_(line) {}

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

  // A non-negative integer no larger than `max` (digits only: no sign, fraction or exponent).
  // The default bound keeps 2^64 - 1 free for callers that use it as a marker.
  Result<uint64_t> Uint(const std::string& what, uint64_t max = UINT64_MAX - 1) {
    const uint64_t kMaxUint = max;
    SkipSpace();
    const size_t start = pos_;
    uint64_t v = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      const uint64_t digit = static_cast<uint64_t>(s_[pos_] - '0');
      if (digit > kMaxUint || v > (kMaxUint - digit) / 10) {
        pos_ = start;
        return Error(what + " is too large (at most " + std::to_string(kMaxUint) + ")");
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

}  // namespace kvtier

#include "engine/pretokenizer.h"

#include <algorithm>
#include <iterator>

namespace kvtier::engine {
namespace {

struct Range {
  uint32_t lo, hi;  // inclusive
};

bool InRanges(uint32_t cp, const Range* begin, const Range* end) {
  // Ranges are sorted and disjoint.
  const Range* it =
      std::upper_bound(begin, end, cp, [](uint32_t c, const Range& r) { return c < r.lo; });
  return it != begin && cp <= (it - 1)->hi;
}

// Letters outside ASCII (a compact approximation of \p{L}; see the header).
constexpr Range kLetters[] = {
    {0x00AA, 0x00AA}, {0x00B5, 0x00B5}, {0x00BA, 0x00BA},   {0x00C0, 0x00D6}, {0x00D8, 0x00F6},
    {0x00F8, 0x02C1}, {0x02C6, 0x02D1}, {0x02E0, 0x02E4},   {0x0370, 0x0374}, {0x0376, 0x0377},
    {0x037A, 0x037D}, {0x037F, 0x037F}, {0x0386, 0x0386},   {0x0388, 0x03FF}, {0x0400, 0x0481},
    {0x048A, 0x052F}, {0x0531, 0x0556}, {0x0560, 0x0588},   {0x05D0, 0x05EA}, {0x05EF, 0x05F2},
    {0x0620, 0x064A}, {0x066E, 0x066F}, {0x0671, 0x06D3},   {0x06D5, 0x06D5}, {0x06FA, 0x06FC},
    {0x0904, 0x0939}, {0x093D, 0x093D}, {0x0950, 0x0950},   {0x0958, 0x0961}, {0x0972, 0x0980},
    {0x0985, 0x09B9}, {0x0A05, 0x0A39}, {0x0A85, 0x0AB9},   {0x0B05, 0x0B39}, {0x0B85, 0x0BB9},
    {0x0C05, 0x0C39}, {0x0C85, 0x0CB9}, {0x0D05, 0x0D3A},   {0x0E01, 0x0E30}, {0x0E32, 0x0E33},
    {0x0E40, 0x0E46}, {0x10A0, 0x10FF}, {0x1100, 0x11FF},   {0x1E00, 0x1FBC}, {0x1FC2, 0x1FCC},
    {0x1FD0, 0x1FDB}, {0x1FE0, 0x1FEC}, {0x1FF2, 0x1FFC},   {0x3041, 0x3096}, {0x309D, 0x309F},
    {0x30A1, 0x30FA}, {0x30FC, 0x30FF}, {0x3105, 0x312F},   {0x3131, 0x318E}, {0x3400, 0x4DBF},
    {0x4E00, 0x9FFF}, {0xA000, 0xA48C}, {0xAC00, 0xD7A3},   {0xF900, 0xFAFF}, {0xFF21, 0xFF3A},
    {0xFF41, 0xFF5A}, {0xFF66, 0xFFBE}, {0x20000, 0x2FA1F},
};

// Numbers outside ASCII (\p{Nd}, \p{Nl}, \p{No}, common ones).
constexpr Range kNumbers[] = {
    {0x00B2, 0x00B3}, {0x00B9, 0x00B9}, {0x00BC, 0x00BE}, {0x0660, 0x0669}, {0x06F0, 0x06F9},
    {0x0966, 0x096F}, {0x09E6, 0x09EF}, {0x0A66, 0x0A6F}, {0x0AE6, 0x0AEF}, {0x0B66, 0x0B6F},
    {0x0BE6, 0x0BF2}, {0x0C66, 0x0C6F}, {0x0CE6, 0x0CEF}, {0x0D66, 0x0D78}, {0x0E50, 0x0E59},
    {0x2070, 0x2070}, {0x2074, 0x2079}, {0x2080, 0x2089}, {0x2150, 0x2182}, {0x2185, 0x2189},
    {0x2460, 0x249B}, {0x24EA, 0x24FF}, {0x2776, 0x2793}, {0x3007, 0x3007}, {0x3021, 0x3029},
    {0x3038, 0x303A}, {0xFF10, 0xFF19},
};

constexpr Range kSpaces[] = {
    {0x0009, 0x000D}, {0x0020, 0x0020}, {0x0085, 0x0085}, {0x00A0, 0x00A0}, {0x1680, 0x1680},
    {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000},
};

enum class Cls : uint8_t { kLetter, kNumber, kSpace, kOther };

Cls Classify(uint32_t cp) {
  if (IsUnicodeLetter(cp)) return Cls::kLetter;
  if (IsUnicodeNumber(cp)) return Cls::kNumber;
  if (IsUnicodeSpace(cp)) return Cls::kSpace;
  return Cls::kOther;
}

struct Char {
  uint32_t cp;
  size_t off;  // byte offset in the segment
  Cls cls;
};

// Applies the GPT-2 pattern to one segment.
void SplitGpt2(std::string_view seg, std::vector<std::string_view>* out) {
  std::vector<Char> cs;
  for (size_t pos = 0; pos < seg.size();) {
    size_t len = 0;
    const uint32_t cp = DecodeUtf8(seg, pos, &len);
    cs.push_back({cp, pos, Classify(cp)});
    pos += len;
  }
  const size_t n = cs.size();
  auto byte_at = [&](size_t i) { return i < n ? cs[i].off : seg.size(); };
  size_t i = 0;
  while (i < n) {
    size_t end = i + 1;  // in characters
    const uint32_t c = cs[i].cp;
    bool matched = false;
    // 1. Contractions (lowercase, as GPT-2's pattern).
    if (c == '\'' && i + 1 < n) {
      const uint32_t c1 = cs[i + 1].cp;
      if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
        end = i + 2;
        matched = true;
      } else if (i + 2 < n) {
        const uint32_t c2 = cs[i + 2].cp;
        if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
          end = i + 3;
          matched = true;
        }
      }
    }
    // 2-4. ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`.
    if (!matched) {
      size_t k = (c == ' ' && i + 1 < n) ? i + 1 : i;
      const Cls cls = cs[k].cls;
      if (cls != Cls::kSpace) {
        end = k + 1;
        while (end < n && cs[end].cls == cls) ++end;
        matched = true;
      }
    }
    // 5-6. `\s+(?!\S)`, `\s+`.
    if (!matched) {
      size_t e = i + 1;
      while (e < n && cs[e].cls == Cls::kSpace) ++e;
      if (e == n || e - i == 1) {
        end = e == n ? e : i + 1;
      } else {
        end = e - 1;  // leave the last space to prefix the next word
      }
    }
    out->push_back(seg.substr(byte_at(i), byte_at(end) - byte_at(i)));
    i = end;
  }
}

}  // namespace

bool IsUnicodeLetter(uint32_t cp) {
  if (cp < 0x80) return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z');
  return InRanges(cp, std::begin(kLetters), std::end(kLetters));
}

bool IsUnicodeNumber(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return InRanges(cp, std::begin(kNumbers), std::end(kNumbers));
}

bool IsUnicodeSpace(uint32_t cp) { return InRanges(cp, std::begin(kSpaces), std::end(kSpaces)); }

uint32_t DecodeUtf8(std::string_view s, size_t pos, size_t* len) {
  const auto b0 = static_cast<unsigned char>(s[pos]);
  *len = 1;
  if (b0 < 0x80) return b0;
  size_t need;
  uint32_t cp;
  if ((b0 & 0xE0) == 0xC0) {
    need = 1;
    cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    need = 2;
    cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    need = 3;
    cp = b0 & 0x07;
  } else {
    return 0xFFFD;
  }
  if (pos + need >= s.size()) return 0xFFFD;  // truncated sequence
  for (size_t k = 1; k <= need; ++k) {
    const auto b = static_cast<unsigned char>(s[pos + k]);
    if ((b & 0xC0) != 0x80) return 0xFFFD;
    cp = (cp << 6) | (b & 0x3F);
  }
  // Reject overlong forms, surrogates and values past U+10FFFF.
  static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
  if (cp < kMin[need] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0xFFFD;
  *len = need + 1;
  return cp;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

Result<PreTokenizerKind> ParsePreTokenizer(std::string_view name) {
  if (name == "gpt2" || name == "default" || name.empty()) return PreTokenizerKind::kGpt2;
  if (name == "smollm" || name == "starcoder" || name == "refact") {
    return PreTokenizerKind::kDigitsThenGpt2;
  }
  return Status::InvalidArgument("unsupported tokenizer.ggml.pre '" + std::string(name) +
                                 "' (supported: gpt2, default, smollm, starcoder, refact)");
}

std::vector<std::string_view> PreTokenize(std::string_view text, PreTokenizerKind kind) {
  std::vector<std::string_view> out;
  if (kind == PreTokenizerKind::kGpt2) {
    SplitGpt2(text, &out);
    return out;
  }
  // Isolate each number character, then split the runs between them.
  size_t run_start = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t len = 0;
    const uint32_t cp = DecodeUtf8(text, pos, &len);
    if (IsUnicodeNumber(cp)) {
      SplitGpt2(text.substr(run_start, pos - run_start), &out);
      out.push_back(text.substr(pos, len));
      run_start = pos + len;
    }
    pos += len;
  }
  SplitGpt2(text.substr(run_start), &out);
  return out;
}

}  // namespace kvtier::engine

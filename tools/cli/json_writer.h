// A flat JSON object writer for the tool's --json output.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

namespace kvtier::cli {

class JsonObject {
 public:
  JsonObject& Add(const std::string& key, double v) {
    char buf[64];
    if (std::isfinite(v)) {
      std::snprintf(buf, sizeof(buf), "%.6g", v);
    } else {
      std::snprintf(buf, sizeof(buf), "null");
    }
    return Raw(key, buf);
  }
  JsonObject& Add(const std::string& key, uint64_t v) { return Raw(key, std::to_string(v)); }
  JsonObject& Add(const std::string& key, int v) { return Raw(key, std::to_string(v)); }
  JsonObject& Add(const std::string& key, unsigned v) { return Raw(key, std::to_string(v)); }
  JsonObject& Add(const std::string& key, bool v) { return Raw(key, v ? "true" : "false"); }
  JsonObject& Add(const std::string& key, const std::string& v) { return Raw(key, Quote(v)); }
  JsonObject& Add(const std::string& key, const char* v) { return Add(key, std::string(v)); }
  // Adds an already-serialized JSON value (an object or array).
  JsonObject& Raw(const std::string& key, const std::string& json) {
    body_ += (body_.empty() ? "" : ", ") + Quote(key) + ": " + json;
    return *this;
  }
  std::string Str() const { return "{" + body_ + "}"; }

  static std::string Quote(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') {
        out += '\\';
        out += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\u%04x", c);
        out += buf;
      } else {
        out += c;
      }
    }
    return out + "\"";
  }

 private:
  std::string body_;
};

}  // namespace kvtier::cli

#include "core/log.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kvtier {
namespace {

LogLevel ThresholdFromEnv() {
  const char* v = std::getenv("KVTIER_LOG_LEVEL");
  if (v == nullptr) return LogLevel::kInfo;
  if (std::strcmp(v, "debug") == 0) return LogLevel::kDebug;
  if (std::strcmp(v, "warn") == 0) return LogLevel::kWarn;
  if (std::strcmp(v, "error") == 0) return LogLevel::kError;
  return LogLevel::kInfo;
}

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarn:
      return "WARN";
    case LogLevel::kError:
      return "ERROR";
  }
  return "?";
}

}  // namespace

bool LogEnabled(LogLevel level) {
  static const LogLevel threshold = ThresholdFromEnv();
  return level >= threshold;
}

void LogLine(LogLevel level, const std::string& message) {
  // One fprintf call per line: stdio locks the stream, so lines from threads do not interleave.
  std::fprintf(stderr, "kvtier %s: %s\n", LevelName(level), message.c_str());
}

}  // namespace kvtier

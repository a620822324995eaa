// Minimal leveled logging to stderr. KVTIER_LOG_LEVEL=debug|info|warn|error (default info).
#pragma once

#include <sstream>
#include <string>

namespace kvtier {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// True when messages of `level` are printed.
bool LogEnabled(LogLevel level);
// Prints one line "kvtier <LEVEL>: <message>" to stderr, atomically with respect to other lines.
void LogLine(LogLevel level, const std::string& message);

namespace internal {
class LogMessage {
 public:
  explicit LogMessage(LogLevel level) : level_(level) {}
  ~LogMessage() { LogLine(level_, stream_.str()); }
  std::ostringstream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};
// Turns the stream expression into void, so KVTIER_LOG is one expression (safe in an unbraced if).
struct LogVoidify {
  void operator&(std::ostream&) {}
};
}  // namespace internal

}  // namespace kvtier

// KVTIER_LOG(kWarn) << "text " << value;
#define KVTIER_LOG(level)                          \
  !::kvtier::LogEnabled(::kvtier::LogLevel::level) \
      ? (void)0                                    \
      : ::kvtier::internal::LogVoidify() &         \
            ::kvtier::internal::LogMessage(::kvtier::LogLevel::level).stream()

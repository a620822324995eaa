#include "cli/progress.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kvtier::cli {

namespace {

std::string Duration(double s) {
  char buf[32];
  if (s < 60) {
    std::snprintf(buf, sizeof(buf), "%.1fs", s);
  } else if (s < 3600) {
    std::snprintf(buf, sizeof(buf), "%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%dh%02dm", static_cast<int>(s) / 3600,
                  static_cast<int>(s) / 60 % 60);
  }
  return buf;
}

}  // namespace

std::string FormatProgress(const std::string& label, uint64_t done, uint64_t total,
                           const std::string& unit, double elapsed_seconds) {
  char buf[256];
  const double rate = elapsed_seconds > 0 ? static_cast<double>(done) / elapsed_seconds : 0;
  std::string line = label + "  " + std::to_string(done);
  if (total > 0) line += "/" + std::to_string(total);
  line += " " + unit;
  std::snprintf(buf, sizeof(buf), "  %.1f/s", rate);
  line += buf;
  if (total > 0 && done < total && rate > 0) {
    line += "  eta " + Duration(static_cast<double>(total - done) / rate);
  } else if (total > 0 && done >= total) {
    line += "  done in " + Duration(elapsed_seconds);
  }
  return line;
}

bool Progress::Enabled() {
  const char* env = std::getenv("KVTIER_PROGRESS");
  if (env != nullptr && std::strcmp(env, "0") == 0) return false;
  return isatty(STDERR_FILENO) == 1;
}

Progress::Progress(std::string label, uint64_t total, std::string unit)
    : label_(std::move(label)),
      total_(total),
      unit_(std::move(unit)),
      enabled_(Enabled()),
      start_(std::chrono::steady_clock::now()) {}

Progress::~Progress() {
  if (drawn_) Finish();
}

void Progress::Update(uint64_t done, uint64_t total) {
  done_ = done;
  if (total != 0) total_ = total;
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (drawn_ && now - last_draw_ < std::chrono::milliseconds(200)) return;
  last_draw_ = now;
  Draw(false);
}

void Progress::Finish() {
  if (!enabled_ || finished_) return;
  finished_ = true;
  Draw(true);
}

void Progress::Clear() {
  if (!enabled_ || !drawn_ || finished_) return;
  std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
  drawn_ = false;
}

void Progress::Draw(bool final) {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const std::string line = FormatProgress(label_, done_, total_, unit_, elapsed);
  // \r and "erase to end of line": the line is redrawn in place.
  std::fprintf(stderr, "\r\033[K%s%s", line.c_str(), final ? "\n" : "");
  std::fflush(stderr);
  drawn_ = true;
}

}  // namespace kvtier::cli

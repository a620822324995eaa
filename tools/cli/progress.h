// Progress: a one-line "label  done/total unit  rate/s  eta" on stderr for long commands
// (replay, demo, the benchmarks, G3 recovery), redrawn in place at most 5 times a second, and
// only when stderr is a terminal: piped or redirected, it prints nothing, so scripts and --json
// output stay clean. KVTIER_PROGRESS=0 turns it off on a terminal too.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace kvtier::cli {

class Progress {
 public:
  // `total` 0: unknown (no eta is shown).
  Progress(std::string label, uint64_t total, std::string unit);
  // Ends the line (as Finish) when anything was drawn.
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Whether progress is drawn at all: stderr is a terminal and KVTIER_PROGRESS is not 0.
  static bool Enabled();

  // Sets the count done (and the total, when `total` is not 0). Cheap when not drawing (a clock
  // read at most).
  void Update(uint64_t done, uint64_t total = 0);
  // Draws the final state and ends the line. Idempotent.
  void Finish();
  // Erases the line drawn so far (before other output to the terminal); the next Update
  // draws it again.
  void Clear();

 private:
  void Draw(bool final);

  const std::string label_;
  uint64_t total_;
  const std::string unit_;
  const bool enabled_;
  const std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_{};
  uint64_t done_ = 0;
  bool drawn_ = false;
  bool finished_ = false;
};

// One line of progress text (without the leading carriage return), exposed for tests:
// "replay  120/500 requests  38.2/s  eta 9.9s".
std::string FormatProgress(const std::string& label, uint64_t done, uint64_t total,
                           const std::string& unit, double elapsed_seconds);

}  // namespace kvtier::cli

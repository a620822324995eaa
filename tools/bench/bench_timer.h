// Wall-clock timing for the bench commands.
#pragma once

#include <chrono>

namespace kvtier::cli {

class Stopwatch {
 public:
  Stopwatch() : t0_(std::chrono::steady_clock::now()) {}
  double Seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  double Micros() const { return Seconds() * 1e6; }
  double Millis() const { return Seconds() * 1e3; }

 private:
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace kvtier::cli

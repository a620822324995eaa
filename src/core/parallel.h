// Runs a function over an index range on a few threads. For start-up work and benchmarks;
// hot paths use the transfer engine's long-lived workers instead.
#pragma once

#include <cstddef>
#include <functional>
#include <thread>
#include <vector>

namespace kvtier {

// Calls fn(thread_index, begin, end) on `threads` threads (the caller's among them), splitting
// [0, n) into contiguous ranges of nearly equal size. Returns when all calls have returned.
// REQUIRES: threads >= 1.
inline void ParallelRanges(unsigned threads, size_t n,
                           const std::function<void(unsigned, size_t, size_t)>& fn) {
  if (threads <= 1 || n <= 1) {
    fn(0, 0, n);
    return;
  }
  std::vector<std::thread> workers;
  workers.reserve(threads - 1);
  for (unsigned t = 1; t < threads; ++t) {
    const size_t b = n * t / threads, e = n * (t + 1) / threads;
    workers.emplace_back([&fn, t, b, e] { fn(t, b, e); });
  }
  fn(0, 0, n / threads);
  for (auto& w : workers) w.join();
}

// Online CPUs, at least 1.
inline unsigned OnlineCpus() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : n;
}

}  // namespace kvtier

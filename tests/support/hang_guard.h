// Tests of "nothing waits forever": run a call that may block, bound the wait, and when it did
// block, unblock it (so the test fails instead of hanging the suite) and say so.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <future>
#include <string>
#include <thread>

namespace kvtier::testing {

// Unblocks a reader stuck in open(2) of the FIFO at `path`: opens it for writing without
// blocking (which succeeds only while a reader waits) and closes it at once, so the reader's
// open returns and its read sees end-of-file. True when there was a reader to release.
inline bool ReleaseFifoReaders(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

struct GuardedCall {
  bool returned_in_time = false;  // `fn` returned within the limit, without rescue
  std::chrono::milliseconds took{0};
};

// Runs `fn` on its own thread and waits up to `limit` for it. When it has not returned by
// then, calls `rescue` (which must unblock it) every 50 ms until it returns. Returns whether
// it returned in time and how long it took (until the rescue, when one was needed).
inline GuardedCall RunGuarded(const std::function<void()>& fn, std::chrono::milliseconds limit,
                              const std::function<void()>& rescue) {
  const auto t0 = std::chrono::steady_clock::now();
  std::packaged_task<void()> task(fn);
  std::future<void> done = task.get_future();
  std::thread t(std::move(task));
  GuardedCall r;
  r.returned_in_time = done.wait_for(limit) == std::future_status::ready;
  r.took =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  while (done.wait_for(std::chrono::milliseconds(50)) != std::future_status::ready) rescue();
  t.join();
  return r;
}

}  // namespace kvtier::testing

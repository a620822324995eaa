// Condition-variable waits on an annotated kvtier::Mutex that the caller holds through a
// MutexLock. The lock is adopted for the wait and handed back held, so the thread-safety
// analysis keeps seeing it held across the call. Callers re-check their condition in a loop.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "core/mutex.h"

namespace kvtier {

// Blocks until notified, a spurious wake-up, or `timeout` passes. REQUIRES: *mu held.
inline void CondWaitFor(std::condition_variable* cv, Mutex* mu, std::chrono::nanoseconds timeout)
    REQUIRES(*mu) {
  std::unique_lock<std::mutex> lock(mu->native(), std::adopt_lock);
  cv->wait_for(lock, timeout);
  lock.release();
}

// Blocks until notified or a spurious wake-up. REQUIRES: *mu held.
inline void CondWait(std::condition_variable* cv, Mutex* mu) REQUIRES(*mu) {
  std::unique_lock<std::mutex> lock(mu->native(), std::adopt_lock);
  cv->wait(lock);
  lock.release();
}

}  // namespace kvtier

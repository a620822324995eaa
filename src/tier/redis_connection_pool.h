// RedisConnectionPool: the connections of one Redis node, bounded, shared by the threads that
// call a RedisStore. Thread-safe.
#pragma once

#include <condition_variable>
#include <memory>
#include <string>
#include <vector>

#include "core/mutex.h"
#include "tier/cond_wait.h"
#include "tier/redis_wire.h"
#include "tier/remote_store.h"

namespace kvtier {

// A bounded pool of connections to one node: at most `limit` open at once; a caller that
// finds none idle opens one while under the limit, else waits (bounded by its deadline).
class RedisConnectionPool {
 public:
  explicit RedisConnectionPool(uint32_t limit) : limit_(limit) {}

  // An idle connection, or nullptr when the caller may open a new one (it then counts as
  // open: hand it back with Release or Forget). TimedOut when none frees up by `deadline`.
  Result<std::unique_ptr<RedisConnection>> Take(RemoteDeadline deadline) {
    MutexLock lock(&mu_);
    while (idle_.empty() && open_ >= limit_) {
      if (RemoteClock::now() >= deadline) {
        return Status::TimedOut("all " + std::to_string(limit_) +
                                " connections of the pool are busy until the deadline");
      }
      CondWaitFor(&cv_, &mu_, deadline - RemoteClock::now());
    }
    if (!idle_.empty()) {
      std::unique_ptr<RedisConnection> c = std::move(idle_.back());
      idle_.pop_back();
      return c;
    }
    ++open_;
    return std::unique_ptr<RedisConnection>();
  }
  // Returns a healthy connection for reuse.
  void Release(std::unique_ptr<RedisConnection> c) {
    MutexLock lock(&mu_);
    idle_.push_back(std::move(c));
    cv_.notify_one();
  }
  // A connection taken (or a slot reserved by Take) is gone: closed after an error, or never
  // opened.
  void Forget() {
    MutexLock lock(&mu_);
    --open_;
    cv_.notify_one();
  }
  // Closes every idle connection (after one failed, the others to that server likely did too).
  void DropIdle() {
    std::vector<std::unique_ptr<RedisConnection>> drop;
    {
      MutexLock lock(&mu_);
      drop.swap(idle_);
      open_ -= static_cast<uint32_t>(drop.size());
      cv_.notify_all();
    }
  }

 private:
  const uint32_t limit_;
  Mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<RedisConnection>> idle_ GUARDED_BY(mu_);
  uint32_t open_ GUARDED_BY(mu_) = 0;
};

}  // namespace kvtier

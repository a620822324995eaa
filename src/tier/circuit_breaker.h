// CircuitBreaker: stops calling a backend that keeps failing, and probes until it is back.
//
// States (the contract of CircuitBreakerOptions in remote_store.h):
//   closed    calls go through; `failure_threshold` consecutive failures open the breaker.
//   open      calls are refused without touching the backend until `open_for` has passed.
//   half-open after that, exactly one caller is let through as a probe; every other caller
//             is still refused. The probe's success closes the breaker (and resets the open
//             time); its failure opens it again for twice the previous time, capped at
//             `max_open_for`.
// A probe whose caller never reports within `max_open_for` is presumed lost (it failed), so a
// breaker can never stay half-open forever.
//
// Thread-safe: every method may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

#include "core/mutex.h"
#include "tier/remote_store.h"

namespace kvtier {

class CircuitBreaker {
 public:
  using Clock = std::function<RemoteClock::time_point()>;

  // What Admit() allows the caller to do.
  enum class Decision : uint8_t {
    kAllow,   // closed: call, then report with OnSuccess/OnFailure(false)
    kProbe,   // half-open: this caller is the probe; call, then report with probe = true
    kReject,  // open: do not call; fail the operation as Unavailable
  };

  // `clock` is injectable for tests (default: steady_clock::now). REQUIRES: options have
  // failure_threshold >= 1 and 0 < open_for <= max_open_for.
  explicit CircuitBreaker(CircuitBreakerOptions options, Clock clock = nullptr);
  CircuitBreaker(const CircuitBreaker&) = delete;
  CircuitBreaker& operator=(const CircuitBreaker&) = delete;

  // Whether the caller may call the backend now. Never blocks; no syscall besides the clock.
  Decision Admit();

  // The outcome of a call that Admit() allowed. `probe`: the decision was kProbe. A failure
  // means the backend is unreachable or unresponsive (connection refused, reset, timed out);
  // an error reply from a live server is a success here.
  void OnSuccess(bool probe);
  void OnFailure(bool probe);

  // Opens the breaker now, as if the threshold had been reached (e.g. the server was down when
  // the store was opened). The first probe comes after `open_for`. No-op when already open.
  void ForceOpen();

  // True while open or half-open.
  bool IsOpen() const;
  // Closed -> open transitions so far (ForceOpen included).
  uint64_t opens() const;
  // How long the breaker stays open after the next failed probe, for tests.
  std::chrono::milliseconds current_open_for() const;

  // A valid CircuitBreakerOptions, or InvalidArgument naming the bad field.
  static Status Validate(const CircuitBreakerOptions& options);

 private:
  enum class State : uint8_t { kClosed, kOpen, kHalfOpen };

  RemoteClock::time_point Now() const { return clock_ ? clock_() : RemoteClock::now(); }
  void OpenLocked(RemoteClock::time_point now) REQUIRES(mu_);

  const CircuitBreakerOptions options_;
  const Clock clock_;
  mutable Mutex mu_;
  State state_ GUARDED_BY(mu_) = State::kClosed;
  uint32_t consecutive_failures_ GUARDED_BY(mu_) = 0;
  std::chrono::milliseconds open_for_ GUARDED_BY(mu_);
  RemoteClock::time_point open_until_ GUARDED_BY(mu_);
  RemoteClock::time_point probe_started_ GUARDED_BY(mu_);
  uint64_t opens_ GUARDED_BY(mu_) = 0;
};

}  // namespace kvtier

#include "tier/circuit_breaker.h"

#include <algorithm>
#include <string>
#include <utility>

namespace kvtier {

Status CircuitBreaker::Validate(const CircuitBreakerOptions& o) {
  if (o.failure_threshold < 1) {
    return Status::InvalidArgument("breaker failure_threshold must be >= 1, got 0");
  }
  if (o.open_for.count() <= 0) {
    return Status::InvalidArgument("breaker open_for must be > 0 ms, got " +
                                   std::to_string(o.open_for.count()));
  }
  if (o.max_open_for < o.open_for) {
    return Status::InvalidArgument(
        "breaker max_open_for (" + std::to_string(o.max_open_for.count()) +
        " ms) must be >= open_for (" + std::to_string(o.open_for.count()) + " ms)");
  }
  return Status::Ok();
}

CircuitBreaker::CircuitBreaker(CircuitBreakerOptions options, Clock clock)
    : options_(options), clock_(std::move(clock)), open_for_(options.open_for) {}

void CircuitBreaker::OpenLocked(RemoteClock::time_point now) {
  if (state_ == State::kClosed) ++opens_;
  state_ = State::kOpen;
  open_until_ = now + open_for_;
}

CircuitBreaker::Decision CircuitBreaker::Admit() {
  MutexLock lock(&mu_);
  if (state_ == State::kClosed) return Decision::kAllow;
  const RemoteClock::time_point now = Now();
  if (state_ == State::kHalfOpen) {
    // A probe that never reported is presumed failed: let another one through.
    if (now - probe_started_ < options_.max_open_for) return Decision::kReject;
    open_for_ = std::min(open_for_ * 2, options_.max_open_for);
  } else if (now < open_until_) {
    return Decision::kReject;
  }
  state_ = State::kHalfOpen;
  probe_started_ = now;
  return Decision::kProbe;
}

void CircuitBreaker::OnSuccess(bool probe) {
  MutexLock lock(&mu_);
  if (state_ == State::kClosed) {
    consecutive_failures_ = 0;
    return;
  }
  // Only the probe closes the breaker: a call admitted before the breaker opened proves
  // little about the server now.
  if (probe && state_ == State::kHalfOpen) {
    state_ = State::kClosed;
    consecutive_failures_ = 0;
    open_for_ = options_.open_for;
  }
}

void CircuitBreaker::OnFailure(bool probe) {
  MutexLock lock(&mu_);
  const RemoteClock::time_point now = Now();
  if (state_ == State::kClosed) {
    if (++consecutive_failures_ >= options_.failure_threshold) OpenLocked(now);
    return;
  }
  if (probe && state_ == State::kHalfOpen) {
    open_for_ = std::min(open_for_ * 2, options_.max_open_for);
    OpenLocked(now);
  }
}

void CircuitBreaker::ForceOpen() {
  MutexLock lock(&mu_);
  if (state_ != State::kClosed) return;
  OpenLocked(Now());
}

bool CircuitBreaker::IsOpen() const {
  MutexLock lock(&mu_);
  return state_ != State::kClosed;
}

uint64_t CircuitBreaker::opens() const {
  MutexLock lock(&mu_);
  return opens_;
}

std::chrono::milliseconds CircuitBreaker::current_open_for() const {
  MutexLock lock(&mu_);
  return open_for_;
}

}  // namespace kvtier

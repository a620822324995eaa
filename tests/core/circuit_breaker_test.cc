// CircuitBreaker: state transitions on a fake clock, and many threads at once on the real one.
#include "tier/circuit_breaker.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace kvtier {
namespace {

using std::chrono::milliseconds;
using Decision = CircuitBreaker::Decision;

struct FakeClock {
  RemoteClock::time_point now{};
  CircuitBreaker::Clock fn() {
    return [this] { return now; };
  }
};

CircuitBreakerOptions Opts(uint32_t threshold = 3, int open_ms = 100, int max_ms = 1000) {
  CircuitBreakerOptions o;
  o.failure_threshold = threshold;
  o.open_for = milliseconds(open_ms);
  o.max_open_for = milliseconds(max_ms);
  return o;
}

TEST(CircuitBreakerTest, OpensAfterThresholdConsecutiveFailures) {
  FakeClock clock;
  CircuitBreaker b(Opts(3), clock.fn());
  EXPECT_EQ(b.Admit(), Decision::kAllow);
  b.OnFailure(false);
  b.OnFailure(false);
  b.OnSuccess(false);  // resets the run of failures
  b.OnFailure(false);
  b.OnFailure(false);
  EXPECT_FALSE(b.IsOpen());
  EXPECT_EQ(b.Admit(), Decision::kAllow);
  b.OnFailure(false);
  EXPECT_TRUE(b.IsOpen());
  EXPECT_EQ(b.opens(), 1u);
  EXPECT_EQ(b.Admit(), Decision::kReject);
}

TEST(CircuitBreakerTest, OneProbeAfterOpenForThenClosesOnSuccess) {
  FakeClock clock;
  CircuitBreaker b(Opts(1, 100), clock.fn());
  b.OnFailure(false);
  ASSERT_TRUE(b.IsOpen());
  clock.now += milliseconds(99);
  EXPECT_EQ(b.Admit(), Decision::kReject);
  clock.now += milliseconds(1);
  EXPECT_EQ(b.Admit(), Decision::kProbe);
  // Half-open: everyone else is still refused while the probe runs.
  EXPECT_EQ(b.Admit(), Decision::kReject);
  EXPECT_EQ(b.Admit(), Decision::kReject);
  // A late success of a call admitted before the breaker opened does not close it.
  b.OnSuccess(false);
  EXPECT_TRUE(b.IsOpen());
  b.OnSuccess(true);
  EXPECT_FALSE(b.IsOpen());
  EXPECT_EQ(b.Admit(), Decision::kAllow);
  EXPECT_EQ(b.opens(), 1u);
}

TEST(CircuitBreakerTest, FailedProbesDoubleOpenTimeUpToMax) {
  FakeClock clock;
  CircuitBreaker b(Opts(1, 100, 500), clock.fn());
  b.OnFailure(false);
  const int expected[] = {200, 400, 500, 500};
  int open_ms = 100;
  for (int want : expected) {
    clock.now += milliseconds(open_ms);
    ASSERT_EQ(b.Admit(), Decision::kProbe);
    b.OnFailure(true);
    EXPECT_EQ(b.current_open_for(), milliseconds(want));
    clock.now += milliseconds(want - 1);
    EXPECT_EQ(b.Admit(), Decision::kReject) << "reopened for " << want << " ms";
    open_ms = 1;
  }
  // Still counted as one opening: the breaker never closed in between.
  EXPECT_EQ(b.opens(), 1u);
  clock.now += milliseconds(1);
  ASSERT_EQ(b.Admit(), Decision::kProbe);
  b.OnSuccess(true);
  EXPECT_EQ(b.current_open_for(), milliseconds(100));  // reset on close
  b.OnFailure(false);
  EXPECT_EQ(b.opens(), 2u);
}

TEST(CircuitBreakerTest, LostProbeIsReplacedAfterMaxOpenFor) {
  FakeClock clock;
  CircuitBreaker b(Opts(1, 100, 300), clock.fn());
  b.OnFailure(false);
  clock.now += milliseconds(100);
  ASSERT_EQ(b.Admit(), Decision::kProbe);  // this caller never reports
  clock.now += milliseconds(299);
  EXPECT_EQ(b.Admit(), Decision::kReject);
  clock.now += milliseconds(1);
  EXPECT_EQ(b.Admit(), Decision::kProbe);
}

TEST(CircuitBreakerTest, ForceOpenStartsOpenAndProbesLater) {
  FakeClock clock;
  CircuitBreaker b(Opts(3, 100), clock.fn());
  b.ForceOpen();
  EXPECT_TRUE(b.IsOpen());
  EXPECT_EQ(b.opens(), 1u);
  b.ForceOpen();  // no-op when open
  EXPECT_EQ(b.opens(), 1u);
  EXPECT_EQ(b.Admit(), Decision::kReject);
  clock.now += milliseconds(100);
  EXPECT_EQ(b.Admit(), Decision::kProbe);
}

TEST(CircuitBreakerTest, ValidateNamesTheBadField) {
  EXPECT_TRUE(CircuitBreaker::Validate(Opts()).ok());
  Status s = CircuitBreaker::Validate(Opts(0));
  EXPECT_TRUE(s.Is(StatusCode::kInvalidArgument));
  EXPECT_NE(s.message().find("failure_threshold"), std::string::npos);
  s = CircuitBreaker::Validate(Opts(1, 0));
  EXPECT_NE(s.message().find("open_for"), std::string::npos);
  s = CircuitBreaker::Validate(Opts(1, 100, 50));
  EXPECT_NE(s.message().find("max_open_for"), std::string::npos);
}

// Many threads hammer an open breaker: exactly one of them becomes the probe.
TEST(CircuitBreakerTest, ExactlyOneProbeUnderContention) {
  CircuitBreaker b(Opts(1, 1, 60000));
  b.OnFailure(false);
  std::this_thread::sleep_for(milliseconds(5));
  std::atomic<int> probes{0}, rejects{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        Decision d = b.Admit();
        if (d == Decision::kProbe) ++probes;
        if (d == Decision::kReject) ++rejects;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(probes.load(), 1);
  EXPECT_EQ(rejects.load(), 8 * 1000 - 1);
}

}  // namespace
}  // namespace kvtier

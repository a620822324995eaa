// Metrics: counters, gauges and histograms that hot paths record into without locks, and a
// registry that snapshots them (plus values computed at scrape time by collectors) for the
// Prometheus exposition (prometheus_text.h) and the /metrics endpoint (metrics_server.h).
//
// Invariants:
//  - Recording (Counter::Add, Gauge::Set, Histogram::Observe) is a few relaxed atomic
//    operations: no lock, no allocation, no syscall. A snapshot may see a histogram whose sum
//    and buckets are a few observations apart (they are separate atomics); Prometheus tolerates
//    that, and every bucket and the count are monotonic.
//  - Metrics are created once, before the hot path uses them; the registry owns them and never
//    moves or frees one while it lives (pointers stay valid).
//  - This module knows nothing of the manager: the manager (or any owner) feeds it.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/mutex.h"

namespace kvtier {

// A label set, in the order it is printed: {{"tier", "g2"}}.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

enum class MetricType : uint8_t { kCounter, kGauge, kHistogram };

// The fixed histogram buckets, in seconds: log-spaced 1-2.5-5 from 1 us to 10 s (22 bounds),
// plus +Inf. Wide enough for a G2 lookup (us) and a G4 load at its deadline (s).
inline constexpr size_t kHistogramBounds = 22;
const std::array<double, kHistogramBounds>& HistogramBoundsSeconds();

// A monotonically increasing count. Thread-safe, lock-free.
class Counter {
 public:
  void Add(uint64_t n = 1) { v_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t Value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

// A value that goes up and down. Thread-safe, lock-free.
class Gauge {
 public:
  void Set(double v) { v_.store(v, std::memory_order_relaxed); }
  double Value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0};
};

// Durations in fixed log-spaced buckets (HistogramBoundsSeconds). Thread-safe, lock-free.
class Histogram {
 public:
  struct Snapshot {
    std::array<uint64_t, kHistogramBounds + 1>
        buckets{};  // per bucket (not cumulative); last: +Inf
    uint64_t count = 0;
    double sum_seconds = 0;
  };
  // Records one duration. Negative durations count as 0.
  void ObserveNanos(int64_t nanos);
  void ObserveSeconds(double seconds) { ObserveNanos(static_cast<int64_t>(seconds * 1e9)); }
  Snapshot Read() const;

 private:
  // Threads record into one of kStripes copies (picked once per thread), each on its own cache
  // lines, so threads timing the same operation do not contend on one line; Read() sums them.
  static constexpr size_t kStripes = 8;
  struct alignas(64) Stripe {
    std::array<std::atomic<uint64_t>, kHistogramBounds + 1> buckets{};
    std::atomic<uint64_t> sum_nanos{0};
  };
  static size_t ThisThreadStripe();
  std::array<Stripe, kStripes> stripes_{};
};

// One sample of a family, as a collector reports it.
struct MetricSample {
  MetricLabels labels;
  double value = 0;               // counters and gauges
  Histogram::Snapshot histogram;  // histograms
};

// A metric family at snapshot time: what the exposition prints.
struct MetricFamily {
  std::string name;  // without _total / _bucket suffixes: kvtier_hit_blocks (a counter)
  std::string help;
  MetricType type = MetricType::kCounter;
  std::vector<MetricSample> samples;
};

// Where collectors put values computed at scrape time.
class MetricSink {
 public:
  // Adds a sample to family `name` (created with `help` and `type` on first use).
  void Add(const std::string& name, const std::string& help, MetricType type, MetricLabels labels,
           double value);
  std::vector<MetricFamily>& families() { return families_; }

 private:
  std::vector<MetricFamily> families_;
};

// Owns the metrics of one process (or one component) and snapshots them.
class MetricsRegistry {
 public:
  using Collector = std::function<void(MetricSink&)>;

  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Creates a metric. `name` follows Prometheus rules ([a-zA-Z_:][a-zA-Z0-9_:]*; a counter's
  // name is given without _total, which the exposition appends). The pointer lives as long as
  // the registry. REQUIRES: a valid name, and the same type and help for every label set of one
  // name (programmer errors: the process aborts with a message).
  Counter* AddCounter(const std::string& name, const std::string& help, MetricLabels labels = {});
  Gauge* AddGauge(const std::string& name, const std::string& help, MetricLabels labels = {});
  Histogram* AddHistogram(const std::string& name, const std::string& help,
                          MetricLabels labels = {});
  // Registers a function called at every Snapshot to add computed samples (values another
  // component keeps, e.g. the manager's counters). It runs on the scraping thread.
  void AddCollector(Collector collector);

  // Every family: registered metrics, then collectors' samples, sorted by name. Takes the
  // registry's own lock (never held by recording), and whatever the collectors take.
  std::vector<MetricFamily> Snapshot() const;

 private:
  struct Entry {
    std::string name, help;
    MetricType type;
    MetricLabels labels;
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
  };
  Entry& NewEntry(const std::string& name, const std::string& help, MetricType type,
                  MetricLabels labels) REQUIRES(mu_);

  mutable Mutex mu_;
  std::vector<std::unique_ptr<Entry>> entries_ GUARDED_BY(mu_);
  std::vector<Collector> collectors_ GUARDED_BY(mu_);
};

// Whether `name` is a valid Prometheus metric name (label names: the same without ':').
bool IsValidMetricName(const std::string& name);

// Nanoseconds from `start` to now.
inline int64_t NanosSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              start)
      .count();
}

// Records the time from construction to destruction into `h` when `h` is not null (metrics on).
class ScopedLatency {
 public:
  explicit ScopedLatency(Histogram* h)
      : h_(h),
        start_(h ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{}) {}
  ~ScopedLatency() {
    if (h_) h_->ObserveNanos(NanosSince(start_));
  }
  ScopedLatency(const ScopedLatency&) = delete;
  ScopedLatency& operator=(const ScopedLatency&) = delete;

 private:
  Histogram* const h_;
  const std::chrono::steady_clock::time_point start_;
};

}  // namespace kvtier

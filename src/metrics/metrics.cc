#include "metrics/metrics.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>

namespace kvtier {

namespace {

constexpr std::array<double, kHistogramBounds> kBounds = {
    1e-6, 2.5e-6, 5e-6,   1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3,
    5e-3, 1e-2,   2.5e-2, 5e-2, 0.1,    0.25, 0.5,  1.0,    2.5,  5.0,  10.0};

// The bounds in nanoseconds, for an integer comparison on the hot path.
constexpr std::array<int64_t, kHistogramBounds> BoundsNanos() {
  std::array<int64_t, kHistogramBounds> n{};
  for (size_t i = 0; i < kHistogramBounds; ++i) n[i] = static_cast<int64_t>(kBounds[i] * 1e9 + 0.5);
  return n;
}
constexpr std::array<int64_t, kHistogramBounds> kBoundsNanos = BoundsNanos();

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "kvtier metrics: programmer error: %s\n", what.c_str());
  std::abort();
}

}  // namespace

const std::array<double, kHistogramBounds>& HistogramBoundsSeconds() { return kBounds; }

bool IsValidMetricName(const std::string& name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    const bool digit = c >= '0' && c <= '9';
    if (!alpha && !(digit && i > 0)) return false;
  }
  return true;
}

void Histogram::ObserveNanos(int64_t nanos) {
  if (nanos < 0) nanos = 0;
  // Bucket i holds (bound[i-1], bound[i]]: the first bound >= nanos.
  const size_t b = static_cast<size_t>(
      std::lower_bound(kBoundsNanos.begin(), kBoundsNanos.end(), nanos) - kBoundsNanos.begin());
  Stripe& stripe = stripes_[ThisThreadStripe()];
  stripe.buckets[b].fetch_add(1, std::memory_order_relaxed);
  stripe.sum_nanos.fetch_add(static_cast<uint64_t>(nanos), std::memory_order_relaxed);
}

size_t Histogram::ThisThreadStripe() {
  static std::atomic<size_t> next{0};
  thread_local const size_t mine = next.fetch_add(1, std::memory_order_relaxed) % kStripes;
  return mine;
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  uint64_t sum_nanos = 0;
  for (const Stripe& stripe : stripes_) {
    for (size_t i = 0; i < stripe.buckets.size(); ++i) {
      s.buckets[i] += stripe.buckets[i].load(std::memory_order_relaxed);
    }
    sum_nanos += stripe.sum_nanos.load(std::memory_order_relaxed);
  }
  for (uint64_t n : s.buckets) s.count += n;
  s.sum_seconds = static_cast<double>(sum_nanos) / 1e9;
  return s;
}

void MetricSink::Add(const std::string& name, const std::string& help, MetricType type,
                     MetricLabels labels, double value) {
  auto it = std::find_if(families_.begin(), families_.end(),
                         [&](const MetricFamily& f) { return f.name == name; });
  if (it == families_.end()) {
    families_.push_back(MetricFamily{name, help, type, {}});
    it = families_.end() - 1;
  } else if (it->type != type) {
    Die("metric " + name + " reported with two types");
  }
  MetricSample s;
  s.labels = std::move(labels);
  s.value = value;
  it->samples.push_back(std::move(s));
}

MetricsRegistry::Entry& MetricsRegistry::NewEntry(const std::string& name, const std::string& help,
                                                  MetricType type, MetricLabels labels) {
  if (!IsValidMetricName(name)) Die("invalid metric name '" + name + "'");
  for (const auto& [k, v] : labels) {
    if (!IsValidMetricName(k) || k.find(':') != std::string::npos) {
      Die("invalid label name '" + k + "' on " + name);
    }
  }
  for (const auto& e : entries_) {
    if (e->name == name && (e->type != type || e->help != help)) {
      Die("metric " + name + " registered twice with a different type or help");
    }
    if (e->name == name && e->labels == labels) Die("metric " + name + " registered twice");
  }
  auto e = std::make_unique<Entry>();
  e->name = name;
  e->help = help;
  e->type = type;
  e->labels = std::move(labels);
  entries_.push_back(std::move(e));
  return *entries_.back();
}

Counter* MetricsRegistry::AddCounter(const std::string& name, const std::string& help,
                                     MetricLabels labels) {
  MutexLock lock(&mu_);
  Entry& e = NewEntry(name, help, MetricType::kCounter, std::move(labels));
  e.counter = std::make_unique<Counter>();
  return e.counter.get();
}

Gauge* MetricsRegistry::AddGauge(const std::string& name, const std::string& help,
                                 MetricLabels labels) {
  MutexLock lock(&mu_);
  Entry& e = NewEntry(name, help, MetricType::kGauge, std::move(labels));
  e.gauge = std::make_unique<Gauge>();
  return e.gauge.get();
}

Histogram* MetricsRegistry::AddHistogram(const std::string& name, const std::string& help,
                                         MetricLabels labels) {
  MutexLock lock(&mu_);
  Entry& e = NewEntry(name, help, MetricType::kHistogram, std::move(labels));
  e.histogram = std::make_unique<Histogram>();
  return e.histogram.get();
}

void MetricsRegistry::AddCollector(Collector collector) {
  MutexLock lock(&mu_);
  collectors_.push_back(std::move(collector));
}

std::vector<MetricFamily> MetricsRegistry::Snapshot() const {
  MetricSink sink;
  std::vector<Collector> collectors;
  {
    MutexLock lock(&mu_);
    for (const auto& e : entries_) {
      std::vector<MetricFamily>& fams = sink.families();
      auto it = std::find_if(fams.begin(), fams.end(),
                             [&](const MetricFamily& f) { return f.name == e->name; });
      if (it == fams.end()) {
        fams.push_back(MetricFamily{e->name, e->help, e->type, {}});
        it = fams.end() - 1;
      }
      MetricSample s;
      s.labels = e->labels;
      if (e->counter) s.value = static_cast<double>(e->counter->Value());
      if (e->gauge) s.value = e->gauge->Value();
      if (e->histogram) s.histogram = e->histogram->Read();
      it->samples.push_back(std::move(s));
    }
    collectors = collectors_;
  }
  for (const Collector& c : collectors) c(sink);
  std::vector<MetricFamily> out = std::move(sink.families());
  std::stable_sort(out.begin(), out.end(),
                   [](const MetricFamily& a, const MetricFamily& b) { return a.name < b.name; });
  return out;
}

}  // namespace kvtier

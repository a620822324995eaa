#include "metrics/prometheus_text.h"

#include <cmath>
#include <cstdio>

namespace kvtier {

namespace {

std::string EscapeHelp(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeLabelValue(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// {a="x",b="y"} with an optional extra label last (le for buckets); empty when no labels.
std::string LabelText(const MetricLabels& labels, const char* extra_name = nullptr,
                      const std::string& extra_value = "") {
  if (labels.empty() && extra_name == nullptr) return "";
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : labels) {
    if (!first) out += ',';
    first = false;
    out += k + "=\"" + EscapeLabelValue(v) + "\"";
  }
  if (extra_name != nullptr) {
    if (!first) out += ',';
    out += std::string(extra_name) + "=\"" + EscapeLabelValue(extra_value) + "\"";
  }
  out += '}';
  return out;
}

const char* TypeName(MetricType t) {
  switch (t) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

}  // namespace

std::string FormatMetricValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[40];
  if (v == std::floor(v) && std::fabs(v) < 9.007199254740992e15) {
    std::snprintf(buf, sizeof(buf), "%.0f", v);
  } else {
    std::snprintf(buf, sizeof(buf), "%.17g", v);
  }
  return buf;
}

std::string RenderPrometheusText(const std::vector<MetricFamily>& families) {
  std::string out;
  out.reserve(families.size() * 256);
  const auto& bounds = HistogramBoundsSeconds();
  for (const MetricFamily& f : families) {
    const std::string name = f.type == MetricType::kCounter ? f.name + "_total" : f.name;
    out += "# HELP " + name + " " + EscapeHelp(f.help) + "\n";
    out += "# TYPE " + name + " " + TypeName(f.type) + "\n";
    for (const MetricSample& s : f.samples) {
      if (f.type != MetricType::kHistogram) {
        out += name + LabelText(s.labels) + " " + FormatMetricValue(s.value) + "\n";
        continue;
      }
      uint64_t cumulative = 0;
      for (size_t i = 0; i < s.histogram.buckets.size(); ++i) {
        cumulative += s.histogram.buckets[i];
        char le[32];
        if (i < bounds.size()) {
          std::snprintf(le, sizeof(le), "%g", bounds[i]);
        } else {
          std::snprintf(le, sizeof(le), "+Inf");
        }
        out += name + "_bucket" + LabelText(s.labels, "le", le) + " " + std::to_string(cumulative) +
               "\n";
      }
      out += name + "_sum" + LabelText(s.labels) + " " +
             FormatMetricValue(s.histogram.sum_seconds) + "\n";
      out += name + "_count" + LabelText(s.labels) + " " + std::to_string(cumulative) + "\n";
    }
  }
  return out;
}

}  // namespace kvtier

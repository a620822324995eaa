// The Prometheus text exposition format, version 0.0.4 (what GET /metrics returns):
//
//   # HELP kvtier_hit_blocks_total Blocks loaded into G1, by source tier.
//   # TYPE kvtier_hit_blocks_total counter
//   kvtier_hit_blocks_total{tier="g2"} 42
//
// Counters print with the _total suffix; histograms as cumulative _bucket{le="..."} lines
// (ending with le="+Inf"), _sum and _count. Help text escapes \ and newline; label values
// escape \, " and newline.
#pragma once

#include <string>
#include <vector>

#include "metrics/metrics.h"

namespace kvtier {

// The Content-Type of the exposition.
inline constexpr const char* kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

// Renders `families` (as MetricsRegistry::Snapshot returns them) in the text format.
std::string RenderPrometheusText(const std::vector<MetricFamily>& families);

// A sample value as the format writes it: integers without a fraction, NaN, +Inf, -Inf.
std::string FormatMetricValue(double v);

}  // namespace kvtier

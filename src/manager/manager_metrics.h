// ManagerMetrics: what a BlockManager feeds to the metrics module (src/metrics), and the
// /metrics endpoint it serves when metrics.port (KVTIER_METRICS_PORT) is set. docs/metrics.md
// lists every metric.
//
// The manager records latencies into the histograms here (lock-free) on its hot paths, only
// when metrics are on (a null ManagerMetrics costs nothing). Counters and gauges are not
// recorded twice: a collector reads the manager's own counters (ManagerStats) at scrape time,
// on the server's thread.
#pragma once

#include <array>
#include <chrono>
#include <functional>
#include <memory>

#include "kvtier/connector.h"
#include "manager/manager_settings.h"
#include "metrics/metrics.h"
#include "metrics/metrics_server.h"

namespace kvtier {

class ManagerMetrics {
 public:
  // Scrape-time values the manager keeps beside ManagerStats (queue depths).
  struct Queues {
    uint64_t queued_saves = 0;         // save moves waiting in the transfer engine
    uint64_t demotions_in_flight = 0;  // G2 -> G3 writes not yet ended
    uint64_t g4_writes_in_flight = 0;  // G4 writes not yet ended
  };
  struct Sources {
    std::function<ManagerStats()> stats;
    std::function<Queues()> queues;
    uint64_t block_bytes = 0;  // payload bytes of one block (for the bytes gauges)
  };

  // Nullptr when options.port (metrics.port) is 0 (off). Otherwise the histograms, the
  // collector over `sources`, and the server listening on options.bind:options.port. Unavailable
  // (the port is in use, the address cannot be bound) or InvalidArgument (metrics.bind is not an
  // address) with a message saying what to change.
  static Result<std::unique_ptr<ManagerMetrics>> Create(const MetricsOptions& options,
                                                        Sources sources);
  // Stops the server first: no scrape runs once this returns.
  ~ManagerMetrics();
  // Stops serving /metrics (joins the server's thread); recording stays valid. Idempotent.
  void StopServer() { server_.reset(); }

  // The port served (the one asked for). REQUIRES: StopServer not called.
  uint16_t port() const { return server_->port(); }
  // The whole exposition, as GET /metrics returns it.
  std::string Render() const;

  Histogram* lookup = nullptr;               // Lookup calls
  std::array<Histogram*, kNumTiers> load{};  // per block loaded, StartLoad to batch end
  Histogram* save = nullptr;                 // per block saved, StartSave to batch end
  Histogram* commit = nullptr;               // Commit calls
  std::array<std::array<Histogram*, 2>, kNumTiers> io{};  // [tier][write]: G3 and G4 I/O

 private:
  ManagerMetrics() = default;

  MetricsRegistry registry_;
  Sources sources_;
  std::unique_ptr<MetricsServer> server_;
};

// Adds every field of `s` (counters and gauges, docs/metrics.md) to `sink`.
void AddManagerStats(const ManagerStats& s, uint64_t block_bytes, MetricSink& sink);

}  // namespace kvtier

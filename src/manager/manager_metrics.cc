#include "manager/manager_metrics.h"

#include <string>
#include <type_traits>

#include "metrics/prometheus_text.h"

namespace kvtier {

namespace {

constexpr const char* kTierLabel[kNumTiers] = {"g1", "g2", "g3", "g4"};

// "g1_to_g2": a bytes_by_path sample's label.
std::string PathLabel(const TransferPath& p) {
  return std::string(kTierLabel[p.from]) + "_to_" + kTierLabel[p.to];
}

}  // namespace

void AddManagerStats(const ManagerStats& s, uint64_t block_bytes, MetricSink& sink) {
  // Every field with a family (manager_stats_fields.h); the sink keeps a family's samples in
  // the table's order.
  ForEachStatField(
      [&](const StatField& f, const auto& v) {
        if (*f.metric == '\0') return;
        const MetricType type =
            f.kind == StatKind::kCounter ? MetricType::kCounter : MetricType::kGauge;
        using V = std::remove_cvref_t<decltype(v)>;
        if constexpr (std::is_same_v<V, StatPerTier>) {
          for (TierId t : {kTierG2, kTierG3, kTierG4})
            sink.Add(f.metric, f.help, type, {{"tier", kTierLabel[t]}}, static_cast<double>(v[t]));
        } else if constexpr (std::is_same_v<V, StatPerPath>) {
          for (size_t p = 0; p < v.size(); ++p)
            sink.Add(f.metric, f.help, type, {{"path", PathLabel(kTransferPaths[p])}},
                     static_cast<double>(v[p]));
        } else {
          MetricLabels labels;
          if (*f.label != '\0') labels.push_back({"tier", f.label});
          sink.Add(f.metric, f.help, type, std::move(labels), static_cast<double>(v));
        }
      },
      s);
  // Derived: payload bytes held, from the blocks held.
  sink.Add("kvtier_stored_bytes", "Payload bytes held now, by tier.", MetricType::kGauge,
           {{"tier", "g2"}}, static_cast<double>(s.g2_blocks) * block_bytes);
  sink.Add("kvtier_stored_bytes", "Payload bytes held now, by tier.", MetricType::kGauge,
           {{"tier", "g3"}}, static_cast<double>(s.g3_blocks) * block_bytes);
}

Result<std::unique_ptr<ManagerMetrics>> ManagerMetrics::Create(const MetricsOptions& options,
                                                               Sources sources) {
  const uint64_t port = options.port;
  if (port == 0) return std::unique_ptr<ManagerMetrics>();
  std::unique_ptr<ManagerMetrics> m(new ManagerMetrics());
  m->sources_ = std::move(sources);
  MetricsRegistry& r = m->registry_;
  m->lookup = r.AddHistogram("kvtier_lookup_seconds", "Lookup latency.");
  for (TierId t : {kTierG2, kTierG3, kTierG4}) {
    m->load[t] = r.AddHistogram("kvtier_load_seconds",
                                "Load latency per block, StartLoad to the batch's last layer, by "
                                "source tier.",
                                {{"tier", kTierLabel[t]}});
  }
  m->save = r.AddHistogram("kvtier_save_seconds",
                           "Save latency per block, StartSave to the batch landing in G2.");
  m->commit = r.AddHistogram("kvtier_commit_seconds", "Commit call latency.");
  for (TierId t : {kTierG3, kTierG4}) {
    for (int w = 0; w < 2; ++w) {
      m->io[t][w] =
          r.AddHistogram("kvtier_io_seconds", "G3 I/O (per block) and G4 call (per batch) latency.",
                         {{"tier", kTierLabel[t]}, {"op", w ? "write" : "read"}});
    }
  }
  const Sources* src = &m->sources_;
  r.AddCollector([src](MetricSink& sink) {
    AddManagerStats(src->stats(), src->block_bytes, sink);
    const Queues q = src->queues();
    sink.Add("kvtier_queue_depth", "Work queued or in flight now, by queue.", MetricType::kGauge,
             {{"queue", "saves"}}, static_cast<double>(q.queued_saves));
    sink.Add("kvtier_queue_depth", "Work queued or in flight now, by queue.", MetricType::kGauge,
             {{"queue", "demotions"}}, static_cast<double>(q.demotions_in_flight));
    sink.Add("kvtier_queue_depth", "Work queued or in flight now, by queue.", MetricType::kGauge,
             {{"queue", "g4_writes"}}, static_cast<double>(q.g4_writes_in_flight));
  });
  MetricsServer::Options so;
  so.bind = options.bind;
  so.port = static_cast<uint16_t>(port);
  const ManagerMetrics* self = m.get();
  KVTIER_ASSIGN_OR_RETURN(m->server_, MetricsServer::Start(so, [self] { return self->Render(); }));
  return m;
}

ManagerMetrics::~ManagerMetrics() { server_.reset(); }

std::string ManagerMetrics::Render() const { return RenderPrometheusText(registry_.Snapshot()); }

}  // namespace kvtier

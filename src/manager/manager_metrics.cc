#include "manager/manager_metrics.h"

#include "metrics/prometheus_text.h"

namespace kvtier {

namespace {

// ManagerStats::bytes_by_path's order.
constexpr const char* kPaths[8] = {"g1_to_g2", "g2_to_g1", "g2_to_g3", "g3_to_g2",
                                   "g3_to_g1", "g2_to_g4", "g4_to_g2", "g4_to_g1"};
constexpr const char* kTierLabel[kNumTiers] = {"g1", "g2", "g3", "g4"};

}  // namespace

void AddManagerStats(const ManagerStats& s, uint64_t block_bytes, MetricSink& sink) {
  const auto counter = [&](const char* name, const char* help, double v, MetricLabels l = {}) {
    sink.Add(name, help, MetricType::kCounter, std::move(l), v);
  };
  const auto gauge = [&](const char* name, const char* help, double v, MetricLabels l = {}) {
    sink.Add(name, help, MetricType::kGauge, std::move(l), v);
  };
  counter("kvtier_lookups", "Lookup calls (scheduler asks how much of a prompt is cached).",
          s.lookups);
  counter("kvtier_lookup_blocks", "Prompt blocks asked about by Lookup (past the engine's prefix).",
          s.lookup_blocks);
  for (TierId t : {kTierG2, kTierG3, kTierG4}) {
    counter("kvtier_hit_blocks", "Blocks loaded into G1, by source tier.", s.hit_blocks[t],
            {{"tier", kTierLabel[t]}});
  }
  counter("kvtier_miss_blocks", "Blocks asked about that no tier could supply.", s.miss_blocks);
  counter("kvtier_load_failures", "Blocks whose load failed (the engine recomputes them).",
          s.load_failures);
  counter("kvtier_saved_blocks", "Blocks written to G2 by Commit/StartSave.", s.saved_blocks);
  counter("kvtier_dedup_blocks", "Committed blocks already stored (not saved again).",
          s.dedup_blocks);
  counter("kvtier_dropped_saves", "Saves dropped: queue full, or no G2 slot free nor freeing.",
          s.dropped_saves);
  counter("kvtier_deferred_saves", "Saves that waited for a G2 slot freed by a demotion.",
          s.deferred_saves);
  counter("kvtier_demoted_blocks", "G2 victims written to G3.", s.demoted_blocks);
  counter("kvtier_demotions_not_admitted", "G2 victims G3's admission refused.",
          s.demotions_not_admitted);
  counter("kvtier_demotions_first_sighting",
          "G2 victims below g3.admit_min_seen sightings that G3 took (the first-sighting gate).",
          s.demotions_first_sighting);
  counter("kvtier_demotion_failures", "G2 -> G3 demotion writes that failed.", s.demotion_failures);
  counter("kvtier_evicted_blocks", "Blocks evicted, by tier.", s.evicted_blocks_g2,
          {{"tier", "g2"}});
  counter("kvtier_evicted_blocks", "Blocks evicted, by tier.", s.evicted_blocks_g3,
          {{"tier", "g3"}});
  counter("kvtier_promoted_blocks", "G3 blocks staged into G2 by loads (promoted).",
          s.promoted_blocks);
  counter("kvtier_staged_via_pool_blocks", "G3 loads staged through the staging pool.",
          s.staged_via_pool);
  counter("kvtier_corrupt_blocks", "Stored blocks that failed verification (never served).",
          s.corrupt_blocks, {{"tier", "g3"}});
  counter("kvtier_corrupt_blocks", "Stored blocks that failed verification (never served).",
          s.g4_corrupt_blocks, {{"tier", "g4"}});
  counter("kvtier_g3_quarantines", "Times G3 was quarantined after repeated errors.",
          s.g3_quarantines);
  counter("kvtier_events_emitted", "Store/removal events emitted to subscribers.",
          s.events_emitted);
  for (size_t p = 0; p < s.bytes_by_path.size(); ++p) {
    counter("kvtier_transfer_bytes", "Bytes moved, by path (source_to_destination).",
            s.bytes_by_path[p], {{"path", kPaths[p]}});
  }
  counter("kvtier_g4_lookup_blocks", "Blocks G4 added to Lookup matches past the local prefix.",
          s.g4_lookup_blocks);
  counter("kvtier_g4_skipped_lookups",
          "Lookups that did not ask G4 (loading estimated slower than recomputing).",
          s.g4_skipped_lookups);
  counter("kvtier_g4_lookup_failures", "Lookups whose G4 query failed or was late (a miss).",
          s.g4_lookup_failures);
  counter("kvtier_g4_lookup_timeouts", "G4 lookup queries past their deadline.",
          s.g4_lookup_timeouts);
  counter("kvtier_g4_saved_blocks", "Blocks written to G4.", s.g4_saved_blocks);
  counter("kvtier_g4_save_failures", "G4 writes that failed (server down, timed out, full).",
          s.g4_save_failures);
  counter("kvtier_g4_dropped_saves", "G4 writes dropped because their queue was full.",
          s.g4_dropped_saves);
  counter("kvtier_g4_load_failures", "G4 loads that failed (the engine recomputes them).",
          s.g4_load_failures);
  counter("kvtier_g4_timeouts", "G4 moves that ended TimedOut.", s.g4_timeouts);
  counter("kvtier_g4_abandoned_loads", "G4 loads ended at their deadline with the call running.",
          s.g4_abandoned_loads);
  counter("kvtier_g4_late_returns", "Abandoned G4 calls that returned since (results discarded).",
          s.g4_late_returns);
  counter("kvtier_g4_removed_corrupt", "Corrupt G4 objects deleted from the store.",
          s.g4_removed_corrupt);
  counter("kvtier_expired_requests",
          "Request entries dropped after manager.idle_request_ttl_ms idle (never finished).",
          s.expired_requests);

  gauge("kvtier_blocks", "Blocks held now, by tier.", s.g2_blocks, {{"tier", "g2"}});
  gauge("kvtier_blocks", "Blocks held now, by tier.", s.g3_blocks, {{"tier", "g3"}});
  gauge("kvtier_stored_bytes", "Payload bytes held now, by tier.",
        static_cast<double>(s.g2_blocks) * block_bytes, {{"tier", "g2"}});
  gauge("kvtier_stored_bytes", "Payload bytes held now, by tier.",
        static_cast<double>(s.g3_blocks) * block_bytes, {{"tier", "g3"}});
  gauge("kvtier_slots", "Slots (block capacity), by tier (G2 includes the staging pool).",
        s.g2_slots, {{"tier", "g2"}});
  gauge("kvtier_slots", "Slots (block capacity), by tier (G2 includes the staging pool).",
        s.g3_slots, {{"tier", "g3"}});
  gauge("kvtier_free_slots", "G2 slots free now.", s.g2_free_slots, {{"tier", "g2"}});
  gauge("kvtier_staging_slots", "G2 slots in the staging pool.", s.g2_staging_slots);
  gauge("kvtier_pinned_blocks", "Pins held now (0 when idle).", s.pinned_blocks);
  gauge("kvtier_tracked_requests", "Request entries held now (0 when idle: a leak check).",
        s.tracked_requests);
  gauge("kvtier_g4_rejected_keys",
        "G4 keys remembered as bad (failed verification or vanished): never offered.",
        s.g4_rejected_keys);
  gauge("kvtier_g3_admitting_first_sightings",
        "1 while the first-sighting gate admits blocks below g3.admit_min_seen, else 0.",
        s.g3_admitting_first_sightings ? 1 : 0);
  gauge("kvtier_g3_quarantined", "1 while G3 is quarantined, else 0.", s.g3_quarantined ? 1 : 0);
  gauge("kvtier_g4_enabled", "1 when a G4 store is configured and open.", s.g4_enabled ? 1 : 0);
  gauge("kvtier_g4_breaker_open", "1 while the G4 circuit breaker refuses calls, else 0.",
        s.g4_breaker_open ? 1 : 0);
}

Result<std::unique_ptr<ManagerMetrics>> ManagerMetrics::Create(const Config& config,
                                                               Sources sources) {
  const uint64_t port = config.GetUint("metrics.port");
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
  so.bind = config.GetString("metrics.bind");
  so.port = static_cast<uint16_t>(port);
  const ManagerMetrics* self = m.get();
  KVTIER_ASSIGN_OR_RETURN(m->server_, MetricsServer::Start(so, [self] { return self->Render(); }));
  return m;
}

ManagerMetrics::~ManagerMetrics() { server_.reset(); }

std::string ManagerMetrics::Render() const { return RenderPrometheusText(registry_.Snapshot()); }

}  // namespace kvtier

// The fields of ManagerStats (kvtier/manager_stats.h), one row each: the only place a counter or
// gauge is defined. Every consumer reads this table: ManagerStats's members, kvtier's /metrics,
// the service protocol's Stats reply, the attached manager's sums, the Python stats dict and
// stats_fields(), and the vLLM connector's metric lists. Adding a counter is one row here plus
// the line of BlockManagerImpl::Stats (src/manager) that fills it.
//
//   KVTIER_STAT(name, type, kind, vllm, metric, label, help)
//     name    the member of ManagerStats, and its key in Python's stats dict
//     type    StatU64, StatFlag (bool), StatPerTier (by TierId), StatPerPath (by kTransferPaths)
//     kind    kCounter: only grows over a manager's life (an attached engine sums it across
//             daemon restarts); kGauge: a value now
//     vllm    kOwnName: vLLM's /metrics shows it as vllm:kvtier_<name>; kFigure: the connector
//             reports it in its own figures (python/kvtier/vllm/observe.py, _COUNTERS); kNone:
//             not in vLLM's metrics
//     metric  its Prometheus family on kvtier's /metrics (counters without _total), or "" for
//             none. A per-tier field has a sample per source tier G2..G4 ({tier="g2"}), a
//             per-path one a sample per path ({path="g1_to_g2"}); a flag reads 0 or 1
//     label   for a scalar field that shares its family with others: its tier label ("g2")
//     help    the family's help text (fields sharing a family share it)
//
// Rows are in the order of the service protocol's Stats reply (docs/service.md): a row added,
// removed or changed in type changes that reply's size, which a peer of another build refuses.
//
// This file is included several times with KVTIER_STAT defined each time, so it has no include
// guard. Include kvtier/manager_stats.h, never this file on its own.
#ifndef KVTIER_STAT
#error "include kvtier/manager_stats.h; this table is read with KVTIER_STAT defined"
#endif

KVTIER_STAT(lookups, StatU64, kCounter, kFigure, "kvtier_lookups", "",
            "Lookup calls (scheduler asks how much of a prompt is cached).")
// prompt blocks asked about (after num_computed_tokens)
KVTIER_STAT(lookup_blocks, StatU64, kCounter, kOwnName, "kvtier_lookup_blocks", "",
            "Prompt blocks asked about by Lookup (past the engine's prefix).")
// blocks loaded into G1, by source tier
KVTIER_STAT(hit_blocks, StatPerTier, kCounter, kFigure, "kvtier_hit_blocks", "",
            "Blocks loaded into G1, by source tier.")
// blocks asked about that no tier could supply
KVTIER_STAT(miss_blocks, StatU64, kCounter, kFigure, "kvtier_miss_blocks", "",
            "Blocks asked about that no tier could supply.")
// blocks whose load failed (the engine recomputes them)
KVTIER_STAT(load_failures, StatU64, kCounter, kFigure, "kvtier_load_failures", "",
            "Blocks whose load failed (the engine recomputes them).")
// blocks written to G2 by Commit/StartSave
KVTIER_STAT(saved_blocks, StatU64, kCounter, kFigure, "kvtier_saved_blocks", "",
            "Blocks written to G2 by Commit/StartSave.")
// committed blocks already stored (not saved again)
KVTIER_STAT(dedup_blocks, StatU64, kCounter, kOwnName, "kvtier_dedup_blocks", "",
            "Committed blocks already stored (not saved again).")
// saves dropped: queue full, or no G2 slot free nor freeing
KVTIER_STAT(dropped_saves, StatU64, kCounter, kFigure, "kvtier_dropped_saves", "",
            "Saves dropped: queue full, or no G2 slot free nor freeing.")
// saves that waited for a G2 slot (freed by a demotion)
KVTIER_STAT(deferred_saves, StatU64, kCounter, kOwnName, "kvtier_deferred_saves", "",
            "Saves that waited for a G2 slot freed by a demotion.")
// G2 victims written to G3
KVTIER_STAT(demoted_blocks, StatU64, kCounter, kFigure, "kvtier_demoted_blocks", "",
            "G2 victims written to G3.")
// G2 victims G3's admission refused
KVTIER_STAT(demotions_not_admitted, StatU64, kCounter, kOwnName, "kvtier_demotions_not_admitted",
            "", "G2 victims G3's admission refused.")
// G2 victims seen fewer than g3.admit_min_seen times that G3 took anyway, because the
// first-sighting gate measured enough G3 hits on such blocks (g3.admit_max_writes_per_hit)
KVTIER_STAT(demotions_first_sighting, StatU64, kCounter, kOwnName,
            "kvtier_demotions_first_sighting", "",
            "G2 victims below g3.admit_min_seen sightings that G3 took (the first-sighting gate).")
// the gate admits first sightings now
KVTIER_STAT(g3_admitting_first_sightings, StatFlag, kGauge, kOwnName,
            "kvtier_g3_admitting_first_sightings", "",
            "1 while the first-sighting gate admits blocks below g3.admit_min_seen, else 0.")
KVTIER_STAT(demotion_failures, StatU64, kCounter, kOwnName, "kvtier_demotion_failures", "",
            "G2 -> G3 demotion writes that failed.")
KVTIER_STAT(evicted_blocks_g2, StatU64, kCounter, kOwnName, "kvtier_evicted_blocks", "g2",
            "Blocks evicted, by tier.")
KVTIER_STAT(evicted_blocks_g3, StatU64, kCounter, kOwnName, "kvtier_evicted_blocks", "g3",
            "Blocks evicted, by tier.")
// G3 blocks staged into G2 by loads
KVTIER_STAT(promoted_blocks, StatU64, kCounter, kOwnName, "kvtier_promoted_blocks", "",
            "G3 blocks staged into G2 by loads (promoted).")
// G3 blocks that failed verification (never served)
KVTIER_STAT(corrupt_blocks, StatU64, kCounter, kFigure, "kvtier_corrupt_blocks", "g3",
            "Stored blocks that failed verification (never served).")
KVTIER_STAT(g3_quarantines, StatU64, kCounter, kOwnName, "kvtier_g3_quarantines", "",
            "Times G3 was quarantined after repeated errors.")
KVTIER_STAT(g3_quarantined, StatFlag, kGauge, kOwnName, "kvtier_g3_quarantined", "",
            "1 while G3 is quarantined, else 0.")
// G1->G2, G2->G1, G2->G3, G3->G2, G3->G1 (staged), G2->G4, G4->G2, G4->G1 (the G1 leg of a
// staged load, or an attached engine's fetch straight into its G1: docs/service.md)
KVTIER_STAT(bytes_by_path, StatPerPath, kCounter, kFigure, "kvtier_transfer_bytes", "",
            "Bytes moved, by path (source_to_destination).")
KVTIER_STAT(g2_blocks, StatU64, kGauge, kOwnName, "kvtier_blocks", "g2",
            "Blocks held now, by tier.")
KVTIER_STAT(g2_slots, StatU64, kGauge, kOwnName, "kvtier_slots", "g2",
            "Slots (block capacity), by tier (G2 includes the staging pool).")
KVTIER_STAT(g2_free_slots, StatU64, kGauge, kOwnName, "kvtier_free_slots", "g2",
            "G2 slots free now.")
KVTIER_STAT(g3_blocks, StatU64, kGauge, kOwnName, "kvtier_blocks", "g3",
            "Blocks held now, by tier.")
KVTIER_STAT(g3_slots, StatU64, kGauge, kOwnName, "kvtier_slots", "g3",
            "Slots (block capacity), by tier (G2 includes the staging pool).")
// G2 slots in the staging pool (g2.staging_slots)
KVTIER_STAT(g2_staging_slots, StatU64, kGauge, kNone, "kvtier_staging_slots", "",
            "G2 slots in the staging pool.")
// G3 loads staged through the pool (not promoted to G2)
KVTIER_STAT(staged_via_pool, StatU64, kCounter, kOwnName, "kvtier_staged_via_pool_blocks", "",
            "G3 loads staged through the staging pool.")
// pins held now (0 when idle: a leak check)
KVTIER_STAT(pinned_blocks, StatU64, kGauge, kOwnName, "kvtier_pinned_blocks", "",
            "Pins held now (0 when idle).")
KVTIER_STAT(events_emitted, StatU64, kCounter, kOwnName, "kvtier_events_emitted", "",
            "Store/removal events emitted to subscribers.")
// The event stream on the wire (events.endpoint; docs/events.md); 0 when it is off.
// events sent to the PUB socket
KVTIER_STAT(events_published, StatU64, kCounter, kOwnName, "", "", "Events sent to the PUB socket.")
// events dropped: the send queue (events.queue_events) full
KVTIER_STAT(events_publish_dropped, StatU64, kCounter, kOwnName, "", "",
            "Events dropped: the send queue (events.queue_events) full.")
// batches sent (the next sequence number)
KVTIER_STAT(event_batches_published, StatU64, kCounter, kNone, "", "",
            "Event batches sent (the next sequence number).")
// requests the replay socket answered
KVTIER_STAT(event_replay_requests, StatU64, kCounter, kNone, "", "",
            "Requests the event replay socket answered.")
// G4 (networked, shared by workers; docs/g4.md). hit_blocks[kTierG4] counts its loads. Every
// G4 failure is a miss or a dropped save, never an error returned to the engine.
KVTIER_STAT(g4_enabled, StatFlag, kGauge, kNone, "kvtier_g4_enabled", "",
            "1 when a G4 store is configured and open.")
// the store refuses calls now (server down)
KVTIER_STAT(g4_breaker_open, StatFlag, kGauge, kOwnName, "kvtier_g4_breaker_open", "",
            "1 while the G4 circuit breaker refuses calls, else 0.")
// blocks G4 added to Lookup matches past the local prefix
KVTIER_STAT(g4_lookup_blocks, StatU64, kCounter, kOwnName, "kvtier_g4_lookup_blocks", "",
            "Blocks G4 added to Lookup matches past the local prefix.")
// Lookups that did not ask G4 because loading a block from it is estimated slower than
// recomputing it (g4.load_gbps and g4.recompute_tokens_per_s).
KVTIER_STAT(g4_skipped_lookups, StatU64, kCounter, kOwnName, "kvtier_g4_skipped_lookups", "",
            "Lookups that did not ask G4 (loading estimated slower than recomputing).")
// Lookups whose G4 query failed or was late (a miss)
KVTIER_STAT(g4_lookup_failures, StatU64, kCounter, kOwnName, "kvtier_g4_lookup_failures", "",
            "Lookups whose G4 query failed or was late (a miss).")
// of those, the deadline passed
KVTIER_STAT(g4_lookup_timeouts, StatU64, kCounter, kOwnName, "kvtier_g4_lookup_timeouts", "",
            "G4 lookup queries past their deadline.")
// blocks written to G4
KVTIER_STAT(g4_saved_blocks, StatU64, kCounter, kFigure, "kvtier_g4_saved_blocks", "",
            "Blocks written to G4.")
// G4 writes that failed (server down, timed out, full)
KVTIER_STAT(g4_save_failures, StatU64, kCounter, kOwnName, "kvtier_g4_save_failures", "",
            "G4 writes that failed (server down, timed out, full).")
// G4 writes dropped because their queue was full
KVTIER_STAT(g4_dropped_saves, StatU64, kCounter, kOwnName, "kvtier_g4_dropped_saves", "",
            "G4 writes dropped because their queue was full.")
// G4 loads that failed (the engine recomputes those blocks)
KVTIER_STAT(g4_load_failures, StatU64, kCounter, kOwnName, "kvtier_g4_load_failures", "",
            "G4 loads that failed (the engine recomputes them).")
// G4 objects that failed verification (never served)
KVTIER_STAT(g4_corrupt_blocks, StatU64, kCounter, kOwnName, "kvtier_corrupt_blocks", "g4",
            "Stored blocks that failed verification (never served).")
// G4 moves that ended TimedOut
KVTIER_STAT(g4_timeouts, StatU64, kCounter, kOwnName, "kvtier_g4_timeouts", "",
            "G4 moves that ended TimedOut.")
// G4 loads ended at their deadline while the store's call had not returned (a stuck NFS
// server, a FIFO under an object name): the engine recomputed them. Their G2 slots stay lent
// to the call until it returns; g4_late_returns counts those that have (results discarded).
KVTIER_STAT(g4_abandoned_loads, StatU64, kCounter, kOwnName, "kvtier_g4_abandoned_loads", "",
            "G4 loads ended at their deadline with the call running.")
KVTIER_STAT(g4_late_returns, StatU64, kCounter, kOwnName, "kvtier_g4_late_returns", "",
            "Abandoned G4 calls that returned since (results discarded).")
// G4 keys remembered now as bad: their object failed verification, or vanished after a
// Lookup found it. Lookup never offers them (a gauge; at most 65536, oldest forgotten first)
// until this manager writes the block to G4 again.
KVTIER_STAT(g4_rejected_keys, StatU64, kGauge, kOwnName, "kvtier_g4_rejected_keys", "",
            "G4 keys remembered as bad (failed verification or vanished): never offered.")
// corrupt G4 objects deleted from the store
KVTIER_STAT(g4_removed_corrupt, StatU64, kCounter, kOwnName, "kvtier_g4_removed_corrupt", "",
            "Corrupt G4 objects deleted from the store.")
// Request entries held now (Lookup creates them, RequestFinished or the idle TTL ends them).
// 0 when every request has finished and nothing is in flight: a leak check.
KVTIER_STAT(tracked_requests, StatU64, kGauge, kOwnName, "kvtier_tracked_requests", "",
            "Request entries held now (0 when idle: a leak check).")
// Entries dropped after manager.idle_request_ttl_ms with nothing in flight and no call for
// them (the engine never called RequestFinished).
KVTIER_STAT(expired_requests, StatU64, kCounter, kOwnName, "kvtier_expired_requests", "",
            "Request entries dropped after manager.idle_request_ttl_ms idle (never finished).")

"""kvtier.vllm.observe takes its lists of ManagerStats fields from kvtier's stats table
(kvtier.stats_fields(), include/kvtier/manager_stats_fields.h): every field the table marks for
vLLM reaches a worker's KvtierConnectorStats with its value, and the vllm:kvtier_* names vLLM
showed before the lists came from the table are all still there.

Run by tests/vllm/run.sh (ctest: vllm_scheduler_test); needs vLLM's classes only.
"""

from __future__ import annotations

from typing import Any, Dict

import kvtier
from kvtier.vllm import observe

# The ManagerStats counters and gauges vLLM's /metrics showed under their own names when
# observe.py still spelled them out (issue 42): none may disappear or change name.
_COUNTERS_BEFORE = (
    "lookup_blocks", "dedup_blocks", "deferred_saves", "demotions_not_admitted",
    "demotions_first_sighting", "demotion_failures", "evicted_blocks_g2", "evicted_blocks_g3",
    "promoted_blocks", "g3_quarantines", "staged_via_pool", "events_emitted", "events_published",
    "events_publish_dropped", "g4_lookup_blocks", "g4_skipped_lookups", "g4_lookup_failures",
    "g4_lookup_timeouts", "g4_save_failures", "g4_dropped_saves", "g4_load_failures",
    "g4_corrupt_blocks", "g4_timeouts", "g4_removed_corrupt", "expired_requests",
    "g4_abandoned_loads", "g4_late_returns")
_GAUGES_BEFORE = (
    "g2_blocks", "g2_slots", "g2_free_slots", "g3_blocks", "g3_slots", "pinned_blocks",
    "g3_quarantined", "g3_admitting_first_sightings", "g4_breaker_open", "g4_rejected_keys",
    "tracked_requests")


def _distinct_stats() -> Dict[str, Any]:
    """A stats dict shaped as BlockManager.stats() returns it, each field its own value."""
    paths = [f"G{a}->G{b}" for a, b in ((1, 2), (2, 1), (2, 3), (3, 2), (3, 1), (2, 4), (4, 2),
                                        (4, 1))]
    s: Dict[str, Any] = {}
    for i, f in enumerate(kvtier.stats_fields(), 1):
        if f["shape"] == "per_tier":
            s[f["name"]] = {t: 1000 * i + k for k, t in enumerate(kvtier.TIER_NAMES)}
        elif f["shape"] == "per_path":
            s[f["name"]] = {p: 1000 * i + k for k, p in enumerate(paths)}
        elif f["shape"] == "flag":
            s[f["name"]] = True
        else:
            s[f["name"]] = 1000 * i
    return s


def test_every_field_marked_for_vllm_reaches_the_connector_stats() -> None:
    s = _distinct_stats()
    delta = observe.worker_stats(s, load_error_blocks=0, extra={}, prev={})
    own = [f for f in kvtier.stats_fields() if f["vllm"] == "own_name"]
    assert own
    for f in own:
        if f["kind"] == "counter":
            assert delta[f["name"]] == s[f["name"]], f
        else:
            assert delta["gauge:" + f["name"]] == int(s[f["name"]]), f
    # The names vLLM registers (KvtierPromMetrics) hold every one of those fields.
    assert {f["name"] for f in own if f["kind"] == "counter"} <= set(observe._MANAGER_COUNTERS)
    assert {f["name"] for f in own if f["kind"] == "gauge"} <= set(observe._GAUGES)


def test_the_vllm_metric_names_of_before_are_kept() -> None:
    assert set(_COUNTERS_BEFORE) <= set(observe._MANAGER_COUNTERS)
    assert set(_GAUGES_BEFORE) <= set(observe._GAUGES)
    # A field the connector reports in its own figures is not registered a second time.
    figures = {f["name"] for f in kvtier.stats_fields() if f["vllm"] == "figure"}
    assert not figures & set(observe._MANAGER_COUNTERS)

"""KvtierConnector's figures on their way into vLLM: per-step stats (KVConnectorStats),
vLLM's Prometheus metrics (vllm:kvtier_*), and kvtier's store/remove events in vLLM's
KVCacheEvent format."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Dict, List, Sequence, cast

if TYPE_CHECKING:
    from vllm.config import VllmConfig

from vllm.distributed.kv_events import (
    MEDIUM_CPU,
    MEDIUM_STORAGE,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    KVConnectorKVEvents,
    KVEventAggregator,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

import kvtier
from kvtier.vllm.groups import GROUP_TAG, KvGroup
from kvtier.vllm.keys import published_lora_name
from kvtier.vllm.lookup import COUNTERS as LOOKUP_SERVER_COUNTERS

_COUNTERS = ("lookups", "lookup_failures", "lookup_microseconds", "hit_blocks_g2",
             "hit_blocks_g3", "hit_blocks_g4", "miss_blocks", "load_failures", "saved_blocks",
             "dropped_saves", "corrupt_blocks", "bytes_loaded", "bytes_saved",
             "load_error_blocks", "evicted_blocks", "demoted_blocks", "g4_saved_blocks",
             "g4_failures",
             # The connector's own (docs/vllm.md, "Correctness"): loads that lost blocks,
             # requests whose loads are no longer offered (max_load_failures), save frontiers
             # moved back to a failed block, saves a worker skipped or cut for a failed load.
             "failed_loads", "load_retries_exhausted", "save_rollbacks", "save_gaps",
             "saves_cut_by_load_errors",
             # Disaggregated decode (docs/pd.md): requests that waited for a producer's blocks,
             # the time they waited, the tokens producers announced and those that never came.
             "pd_waits", "pd_waited_microseconds", "pd_expected_tokens", "pd_missing_tokens",
             # Hybrid models (kvtier/vllm/groups.py): blocks planned to load per group kind,
             # hybrid loads that came short (failed_recving: recomputed), and the time the
             # forward pass waited for the last step's sliding-window and state saves.
             "hybrid_full_load_blocks", "hybrid_sliding_load_blocks",
             "hybrid_state_load_blocks", "hybrid_failed_loads", "hybrid_fence_microseconds",
             # vLLM's sleep mode (kvtier/vllm/sleep.py): unregisters, the time their drain
             # took, loads refused and saves skipped while asleep, wake-ups that found the KV
             # cache moved; may_load_async's lookups, those answered too late, their time.
             "sleep_unregisters", "sleep_drain_microseconds", "sleep_refused_loads",
             "sleep_skipped_saves", "sleep_address_changes", "async_probes",
             "async_probes_late", "async_probe_microseconds")
# Every other ManagerStats counter, under its own name (docs/metrics.md lists them; the same
# figures kvtier's own /metrics exports as kvtier_*_total): the table's scalar counters whose
# vllm column is own_name (include/kvtier/manager_stats_fields.h).
_MANAGER_COUNTERS = tuple(f["name"] for f in kvtier.stats_fields()
                          if f["kind"] == "counter" and f["shape"] == "u64"
                          and f["vllm"] == "own_name")
# The worker's lookup server (kvtier.vllm.lookup.COUNTERS), as lookup_server_<name>: refused
# peers and secrets, malformed frames and time-outs say that something else talks to the socket.
_SERVER_COUNTERS = tuple("lookup_server_" + name for name in LOOKUP_SERVER_COUNTERS)
# Occupancy and state: gauges (summed over TP workers, set once per step that reports them),
# the table's own_name gauges.
_GAUGES = tuple(f["name"] for f in kvtier.stats_fields()
                if f["kind"] == "gauge" and f["vllm"] == "own_name")
_GAUGE_PREFIX = "gauge:"


def _path_name(path: str) -> str:
    """ "G2->G1" -> "bytes_g2_to_g1" (a counter of the bytes moved on that path)."""
    src, _, dst = path.partition("->")
    return f"bytes_{src.lower()}_to_{dst.lower()}"


_PATHS = tuple(_path_name(f"G{a}->G{b}") for a in range(1, 5) for b in range(1, 5) if a != b)


@dataclasses.dataclass
class KvtierConnectorStats(KVConnectorStats):  # type: ignore[misc]  # vLLM's class: Any to mypy
    """Counters since the last report, summed over workers (vLLM aggregates them)."""

    def __post_init__(self) -> None:
        for k in _COUNTERS:
            self.data.setdefault(k, 0)

    def reset(self) -> None:
        self.data = {k: 0 for k in _COUNTERS}

    def aggregate(self, other: KVConnectorStats) -> "KvtierConnectorStats":
        for k, v in other.data.items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> Dict[str, int | float]:
        return dict(self.data)

    def is_empty(self) -> bool:
        return not any(self.data.values())


class KvtierPromMetrics(KVConnectorPromMetrics):  # type: ignore[misc]  # vLLM's class: Any to mypy
    """kvtier's counters in vLLM's own /metrics, as vllm:kvtier_* counters."""

    def __init__(self, vllm_config: "VllmConfig", metric_types: Dict[type, type],
                 labelnames: List[str], per_engine_labelvalues: Dict[int, List[object]]) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counters: Dict[str, Dict[int, Any]] = {}
        self._gauges: Dict[str, Dict[int, Any]] = {}
        for name in _COUNTERS + _MANAGER_COUNTERS + _SERVER_COUNTERS + _PATHS:
            counter = self._counter_cls(
                name=f"vllm:kvtier_{name}",
                documentation=f"kvtier connector: {name.replace('_', ' ')}",
                labelnames=labelnames)
            self._counters[name] = {idx: counter.labels(*values)
                                    for idx, values in per_engine_labelvalues.items()}
        for name in _GAUGES:
            gauge = self._gauge_cls(
                name=f"vllm:kvtier_{name}",
                documentation=f"kvtier connector (gauge, summed over workers): "
                              f"{name.replace('_', ' ')}",
                labelnames=labelnames, multiprocess_mode="mostrecent")
            self._gauges[name] = {idx: gauge.labels(*values)
                                  for idx, values in per_engine_labelvalues.items()}

    def observe(self, transfer_stats_data: Dict[str, Any], engine_idx: int = 0) -> None:
        for name, value in transfer_stats_data.items():
            if name.startswith(_GAUGE_PREFIX):
                per_engine = self._gauges.get(name[len(_GAUGE_PREFIX):])
                if per_engine is not None:
                    per_engine[engine_idx].set(value)
                continue
            per_engine = self._counters.get(name)
            if per_engine is not None and value:
                per_engine[engine_idx].inc(value)


class KvtierKVEvents(KVConnectorKVEvents):  # type: ignore[misc]  # vLLM's class: Any to mypy
    """kvtier's store/remove events from the workers, on their way to take_events()."""

    def __init__(self, num_workers: int) -> None:
        self._aggregator = KVEventAggregator(num_workers)

    def add_events(self, events: List[KVCacheEvent]) -> None:
        self._aggregator.add_events(events)

    def aggregate(self) -> "KvtierKVEvents":
        # Only rank 0 publishes (every rank's keys differ: the rank is in the namespace), so
        # there is nothing to intersect across workers.
        return self

    def increment_workers(self, count: int = 1) -> None:
        self._aggregator.increment_workers(count)

    def get_all_events(self) -> List[KVCacheEvent]:
        return cast(List[KVCacheEvent], self._aggregator.get_all_events())

    def get_number_of_workers(self) -> int:
        return int(self._aggregator.get_number_of_workers())

    def clear_events(self) -> None:
        self._aggregator.clear_events()
        self._aggregator.reset_workers()


# vLLM's medium names (vllm/distributed/kv_events.py); G3 and G4 are both storage, told apart
# by locality.
_TIER_MEDIUM = {"G2": (MEDIUM_CPU, None), "G3": (MEDIUM_STORAGE, "LOCAL"),
                "G4": (MEDIUM_STORAGE, "REMOTE")}


def worker_stats(s: Dict[str, Any], load_error_blocks: int, extra: Dict[str, int],
                 prev: Dict[str, int]) -> Dict[str, int]:
    """The counters of one worker's ManagerStats `s` since `prev` (updated in place), plus the
    gauges, as KvtierConnectorStats data."""
    now = {
        "lookups": s["lookups"],
        "hit_blocks_g2": s["hit_blocks"]["G2"],
        "hit_blocks_g3": s["hit_blocks"]["G3"],
        "hit_blocks_g4": s["hit_blocks"]["G4"],
        "miss_blocks": s["miss_blocks"],
        "load_failures": s["load_failures"],
        "saved_blocks": s["saved_blocks"],
        "dropped_saves": s["dropped_saves"],
        "corrupt_blocks": s["corrupt_blocks"] + s["g4_corrupt_blocks"],
        "bytes_loaded": sum(v for k, v in s["bytes_by_path"].items() if k.endswith("G1")),
        "bytes_saved": s["bytes_by_path"]["G1->G2"],
        "load_error_blocks": load_error_blocks,
        "evicted_blocks": s["evicted_blocks_g2"] + s["evicted_blocks_g3"],
        "demoted_blocks": s["demoted_blocks"],
        "g4_saved_blocks": s["g4_saved_blocks"],
        "g4_failures": (s["g4_lookup_failures"] + s["g4_save_failures"]
                        + s["g4_load_failures"] + s["g4_dropped_saves"]),
    }
    now.update(extra)
    for k in _MANAGER_COUNTERS:
        now[k] = int(s.get(k, 0))
    for path, n in s["bytes_by_path"].items():
        now[_path_name(path)] = n
    delta = {k: v - prev.get(k, 0) for k, v in now.items()}
    prev.clear()
    prev.update(now)
    # Gauges travel with every step's stats, from every worker, so vLLM's per-step sum over
    # the workers is the engine's total.
    for k in _GAUGES:
        delta[_GAUGE_PREFIX + k] = int(s.get(k, 0))
    return delta


def vllm_events(raw: List[Dict[str, Any]], block_size: int,
                groups: Sequence[KvGroup] = ()) -> List[KVCacheEvent]:
    """kvtier's events (BlockManager.take_events(details=True)) as vLLM's KVCacheEvents. A
    hybrid model's (`groups`, kvtier/vllm/groups.py) carry vLLM's group_idx and spec kind,
    read from the group tag of the block's salt, which is not published."""
    events: List[KVCacheEvent] = []
    by_index = {g.index: g for g in groups}
    for e in raw:
        tier = e["tier"]
        medium, locality = _TIER_MEDIUM.get(tier, (MEDIUM_STORAGE, None))
        group = None
        full_salt = e.get("cache_salt") or ""
        if GROUP_TAG in full_salt:
            full_salt, _, idx = full_salt.partition(GROUP_TAG)
            group = by_index.get(int(idx)) if idx.isdigit() else None
        per_group: Dict[str, Any] = {}
        if group is not None:
            per_group = {"group_idx": group.index, "kv_cache_spec_kind": group.spec_kind,
                         "kv_cache_spec_sliding_window": group.window or None}
        if e["kind"] == "stored":
            # vLLM's fields, so that any consumer (kvtier router, Dynamo, llm-d) can compute its
            # own hashes: the block's token ids, the parent's name (None for a first block), the
            # salt in the first block's extra keys. The reset epoch is kvtier's own business and
            # stays out of the salt published, as the adapter's path stays out of its name.
            salt = full_salt.split("\x00kvtier-epoch-")[0]
            lora = published_lora_name(e["lora_name"] or "")
            first = bool(e["parent_is_root"])
            events.append(BlockStored(
                block_hashes=[e["key"]], parent_block_hash=None if first else e["parent"],
                token_ids=list(e["token_ids"]), block_size=block_size, lora_id=None,
                medium=medium, lora_name=lora or None,
                # vLLM's order: the LoRA name (when lora_name is set), then the salt.
                extra_keys=([tuple(x for x in (lora, salt) if x)]
                            if first and (salt or lora) else None),
                locality=locality, ownership=f"kvtier:{tier}", **per_group))
        else:
            removed_group = {"group_idx": per_group["group_idx"]} if per_group else {}
            events.append(BlockRemoved(block_hashes=[e["key"]], medium=medium,
                                       locality=locality, ownership=f"kvtier:{tier}",
                                       **removed_group))
    return events

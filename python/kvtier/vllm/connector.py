"""KvtierConnector: kvtier as a vLLM KV connector (KVConnectorBase_V1).

Load it with::

    kv_transfer_config={"kv_connector": "KvtierConnector",
                        "kv_connector_module_path": "kvtier.vllm",
                        "kv_role": "kv_both",
                        "kv_connector_extra_config": {"g2.capacity_bytes": "4GiB"}}

Where things live (docs/vllm.md says why):

- Each model worker (one per tensor-parallel rank) owns a kvtier BlockManager: the index, G2,
  G3 and G4. G1<->G2 copies are kvtier's own memcpy workers reading and writing vLLM's KV
  tensors in place: no copy passes through Python or a socket.
- The scheduler side (engine-core process) keeps no tiers. It asks every rank's manager
  "how much of this prompt can you load?" over a local lookup channel (kvtier/vllm/lookup.py)
  answered from the in-memory index, and takes the smallest answer: a block counts only when
  every rank holds its shard. Each step's plan (loads, newly computed tokens to save, finished
  and preempted requests) travels to the workers in the connector metadata vLLM already sends.
- Keys are kvtier's chained block keys over the token ids, the cache_salt and the LoRA name,
  in a namespace holding the model, the KV layout (dtype, block size, heads), the CPU
  instruction set the CPU backend's byte layout depends on, and the TP rank and size: a
  restarted vLLM, or another vLLM process with the same model, finds the same blocks.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Set, Tuple

import torch
from vllm.distributed.kv_events import (
    MEDIUM_CPU,
    MEDIUM_STORAGE,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    KVConnectorKVEvents,
    KVEventAggregator,
)
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

import kvtier
from vllm.logger import init_logger
from kvtier.vllm.layouts import KvCacheLayout, describe_kv_caches
from kvtier.vllm.lookup import LookupClient, LookupServer
from kvtier.vllm.settings import ConnectorSettings

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

logger = init_logger("kvtier.vllm")

_TIER_HIT_SOURCE = {
    "G2": CacheHitSource.HOST,
    "G3": CacheHitSource.DISK,
    "G4": CacheHitSource.EXTERNAL_UNSPECIFIED,
}
# vLLM's medium names (vllm/distributed/kv_events.py); G3 and G4 are both storage, told apart
# by locality.
_TIER_MEDIUM = {"G2": (MEDIUM_CPU, None), "G3": (MEDIUM_STORAGE, "LOCAL"),
                "G4": (MEDIUM_STORAGE, "REMOTE")}


# ---------------------------------------------------------------------------------------------
# What the scheduler sends the workers each step
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class LoadSpec:
    key: str  # the request's id in kvtier (vLLM's id and a generation; see _SchedReq)
    block_ids: List[int]  # the request's whole G1 block table
    num_tokens: int  # tokens to load past num_computed_tokens
    num_computed_tokens: int  # what vLLM's own prefix cache supplied
    is_async: bool


@dataclasses.dataclass
class SaveSpec:
    key: str
    new_tokens: List[int]  # token ids past what earlier steps sent (whole blocks only)
    new_block_ids: List[int]  # block-table entries past what earlier steps sent


@dataclasses.dataclass
class KvtierMetadata(KVConnectorMetadata):
    loads: List[LoadSpec] = dataclasses.field(default_factory=list)
    saves: List[SaveSpec] = dataclasses.field(default_factory=list)
    # (key, delay_free): requests vLLM finished; delay_free means the scheduler waits for the
    # worker to list the request in get_finished()'s sending set before freeing its blocks.
    finished: List[Tuple[str, bool]] = dataclasses.field(default_factory=list)
    preempted: List[str] = dataclasses.field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# Stats, Prometheus metrics and events that travel from workers to the scheduler
# ---------------------------------------------------------------------------------------------

_COUNTERS = ("lookups", "lookup_failures", "lookup_microseconds", "hit_blocks_g2",
             "hit_blocks_g3", "hit_blocks_g4", "miss_blocks", "load_failures", "saved_blocks",
             "dropped_saves", "corrupt_blocks", "bytes_loaded", "bytes_saved",
             "load_error_blocks", "evicted_blocks", "demoted_blocks", "g4_saved_blocks",
             "g4_failures")
# Every other ManagerStats counter, under its own name (docs/metrics.md lists them; the same
# figures kvtier's own /metrics exports as kvtier_*_total).
_MANAGER_COUNTERS = ("lookup_blocks", "dedup_blocks", "deferred_saves",
                     "demotions_not_admitted", "demotions_first_sighting",
                     "demotion_failures", "evicted_blocks_g2",
                     "evicted_blocks_g3", "promoted_blocks", "g3_quarantines", "staged_via_pool",
                     "events_emitted", "events_published", "events_publish_dropped",
                     "g4_lookup_blocks", "g4_skipped_lookups", "g4_lookup_failures",
                     "g4_lookup_timeouts", "g4_save_failures", "g4_dropped_saves",
                     "g4_load_failures", "g4_corrupt_blocks", "g4_timeouts")
# Occupancy and state: gauges (summed over TP workers, set once per step that reports them).
_GAUGES = ("g2_blocks", "g2_slots", "g2_free_slots", "g3_blocks", "g3_slots", "pinned_blocks",
           "g3_quarantined", "g3_admitting_first_sightings", "g4_breaker_open")  # summed over the workers of one step
_GAUGE_PREFIX = "gauge:"


def _path_name(path: str) -> str:
    """ "G2->G1" -> "bytes_g2_to_g1" (a counter of the bytes moved on that path)."""
    src, _, dst = path.partition("->")
    return f"bytes_{src.lower()}_to_{dst.lower()}"


_PATHS = tuple(_path_name(f"G{a}->G{b}") for a in range(1, 5) for b in range(1, 5) if a != b)


@dataclasses.dataclass
class KvtierConnectorStats(KVConnectorStats):
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


class KvtierPromMetrics(KVConnectorPromMetrics):
    """kvtier's counters in vLLM's own /metrics, as vllm:kvtier_* counters."""

    def __init__(self, vllm_config: "VllmConfig", metric_types: Dict[type, type],
                 labelnames: List[str], per_engine_labelvalues: Dict[int, List[object]]) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counters: Dict[str, Dict[int, Any]] = {}
        self._gauges: Dict[str, Dict[int, Any]] = {}
        for name in _COUNTERS + _MANAGER_COUNTERS + _PATHS:
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


class KvtierKVEvents(KVConnectorKVEvents):
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
        return self._aggregator.get_all_events()

    def get_number_of_workers(self) -> int:
        return self._aggregator.get_number_of_workers()

    def clear_events(self) -> None:
        self._aggregator.clear_events()
        self._aggregator.reset_workers()


# ---------------------------------------------------------------------------------------------
# The connector
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _SchedReq:
    """The scheduler's view of one request."""

    request: "Request"
    generation: int = 0  # bumped at each preemption: a resumed request is a new kvtier request
    block_ids: List[int] = dataclasses.field(default_factory=list)
    block_ids_sent: int = 0
    tokens_sent: int = 0
    lookup_computed: int = 0  # num_computed_tokens the last lookup was given
    lookup_tokens: int = 0
    lookup_by_tier: Tuple[int, int, int, int] = (0, 0, 0, 0)
    lookup_async: bool = False
    pending_load: Optional[LoadSpec] = None
    # A lookup still out: (what was asked, a sequence number per rank, when it was sent).
    pending_lookup: Optional[Tuple[Tuple[int, int, str, str], List[int], float]] = None

    @property
    def key(self) -> str:
        return f"{self.request.request_id}#{self.generation}"


@dataclasses.dataclass
class _WorkerReq:
    tokens: List[int] = dataclasses.field(default_factory=list)
    block_ids: List[int] = dataclasses.field(default_factory=list)


class KvtierConnector(KVConnectorBase_V1):
    """vLLM's KV connector over kvtier's BlockManager (see the module docstring)."""

    _cache_hit_source = CacheHitSource.HOST

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 kv_cache_config: Optional["KVCacheConfig"] = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        self._settings = ConnectorSettings.parse(extra)
        self._block_size = vllm_config.cache_config.block_size
        self._engine_id = str(self._kv_transfer_config.engine_id)
        self._tp_size = vllm_config.parallel_config.tensor_parallel_size
        self._model_name = self._settings.model_id or str(vllm_config.model_config.model)
        self._manager: Optional[kvtier.BlockManager] = None  # worker side only
        if role == KVConnectorRole.SCHEDULER:
            # kvtier is a cache: a block that fails to load is recomputed, never fatal. vLLM
            # reads this right after building the scheduler's connector.
            self._kv_transfer_config.kv_load_failure_policy = self._settings.load_failure_policy
            self._init_scheduler()
        else:
            self._init_worker()

    # ======================= scheduler side =======================

    @property
    def requires_kv_delivery(self) -> bool:
        # A dropped save is only a future miss: a preempted request need not be recomputed
        # for kvtier's sake.
        return False

    def _init_scheduler(self) -> None:
        self._clients = [LookupClient(self._engine_id, r) for r in range(self._tp_size)]
        self._reqs: Dict[str, _SchedReq] = {}
        self._finished: List[Tuple[str, bool]] = []
        self._preempted: List[str] = []
        self._events: Optional[KvtierKVEvents] = None
        # Since the last get_kv_connector_stats (the scheduler's share of the stats).
        self._lookup_failures = 0
        self._lookup_seconds = 0.0
        # Bumped by reset_cache: later requests key under a new namespace (see reset_cache).
        self._epoch = 0

    def get_num_new_matched_tokens(self, request: "Request",
                                   num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        state = self._reqs.get(request.request_id)
        if state is None:
            state = self._reqs[request.request_id] = _SchedReq(request)
        tokens = list(request.all_token_ids)
        salt = request.cache_salt or ""
        if self._epoch:
            salt = f"{salt}\x00kvtier-epoch-{self._epoch}"
        lora = request.lora_request.lora_name if request.lora_request is not None else ""
        signature = (len(tokens), num_computed_tokens, salt, lora)
        t0 = time.perf_counter()
        pending = state.pending_lookup
        if pending is None or pending[0] != signature:
            self._forget_lookup(state)
            query = (state.key, tokens, num_computed_tokens, salt, lora)
            pending = state.pending_lookup = (signature, [c.submit(query) for c in self._clients],
                                              time.monotonic())
        # Wait a little for the answers (a lookup is normally well under a millisecond); a
        # slower one (a G4 query) is asked about again at the next step: (None, False).
        wait_until = time.monotonic() + self._settings.lookup_wait_ms / 1000.0
        results = [c.result(seq, wait_until - time.monotonic())
                   for c, seq in zip(self._clients, pending[1])]
        self._lookup_seconds += time.perf_counter() - t0
        state.lookup_computed = num_computed_tokens
        statuses = {r[0] for r in results}
        if LookupClient.FAILED not in statuses and LookupClient.PENDING in statuses:
            if time.monotonic() - pending[2] < self._settings.lookup_timeout_ms / 1000.0:
                return None, False  # the answers that came stay with their client
            statuses.add(LookupClient.FAILED)
        self._forget_lookup(state)
        if LookupClient.FAILED in statuses:
            why = next((r[1] for r in results if r[0] == LookupClient.FAILED), "timed out")
            logger.warning("kvtier: lookup for %s failed (counted as a miss): %s",
                           request.request_id, why)
            self._lookup_failures += 1
            state.lookup_tokens, state.lookup_by_tier, state.lookup_async = 0, (0, 0, 0, 0), False
            return 0, False
        answers = [r[1] for r in results]
        num = min(a[0] for a in answers)
        # Tiers as rank 0 reports them (ranks hold the same blocks unless one lost some).
        by_tier = answers[0][1]
        slow = by_tier[2] + by_tier[3] > 0
        is_async = num > 0 and slow and self._settings.async_load == "auto"
        state.lookup_tokens, state.lookup_by_tier, state.lookup_async = num, by_tier, is_async
        return num, is_async

    def _forget_lookup(self, state: _SchedReq) -> None:
        if state.pending_lookup is not None:
            for c, seq in zip(self._clients, state.pending_lookup[1]):
                c.forget(seq)
            state.pending_lookup = None

    def get_external_cache_hit_sources(self, request: "Request",
                                       num_external_tokens: int) -> Dict[CacheHitSource, int]:
        state = self._reqs.get(request.request_id)
        if num_external_tokens == 0 or state is None:
            return {}
        # Blocks are taken fastest tier first along the prefix only as far as the index says;
        # split the loaded tokens in proportion to the tiers of the offered blocks.
        out: Dict[CacheHitSource, int] = {}
        left = num_external_tokens
        for tier, blocks in zip(("G2", "G3", "G4"), state.lookup_by_tier[1:]):
            take = min(left, blocks * self._block_size)
            if take > 0:
                src = _TIER_HIT_SOURCE[tier]
                out[src] = out.get(src, 0) + take
                left -= take
        if left > 0:
            out[CacheHitSource.EXTERNAL_UNSPECIFIED] = (
                out.get(CacheHitSource.EXTERNAL_UNSPECIFIED, 0) + left)
        return out

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks",
                                 num_external_tokens: int) -> None:
        state = self._reqs.get(request.request_id)
        if state is None or num_external_tokens == 0:
            return
        block_ids = list(blocks.get_block_ids()[0])
        # request.num_computed_tokens can be 0 here: keep what the lookup was given.
        state.pending_load = LoadSpec(state.key, block_ids, num_external_tokens,
                                      state.lookup_computed, state.lookup_async)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        meta = KvtierMetadata(finished=self._finished, preempted=self._preempted)
        self._finished, self._preempted = [], []
        for rid in scheduler_output.preempted_req_ids or ():
            state = self._reqs.get(rid)
            if state is not None:
                meta.preempted.append(state.key)
                state.generation += 1
                state.block_ids, state.block_ids_sent, state.tokens_sent = [], 0, 0
                state.pending_load = None
        for state in self._reqs.values():
            if state.pending_load is not None:
                meta.loads.append(state.pending_load)
                state.pending_load = None
        # Saves: every full block whose KV exists once this step has run.
        new_reqs = {r.req_id: r for r in scheduler_output.scheduled_new_reqs}
        cached = scheduler_output.scheduled_cached_reqs
        updates: List[Tuple[str, Optional[List[int]], bool]] = [
            (r.req_id, list(r.block_ids[0]), True) for r in new_reqs.values()]
        for i, rid in enumerate(cached.req_ids):
            new_ids = cached.new_block_ids[i]
            resumed = rid in cached.resumed_req_ids
            updates.append((rid, list(new_ids[0]) if new_ids is not None else None, resumed))
        for rid, new_ids, replace in updates:
            state = self._reqs.get(rid)
            if state is None:
                continue
            if replace:
                state.block_ids, state.block_ids_sent = list(new_ids or []), 0
            elif new_ids:
                state.block_ids.extend(new_ids)
            req = state.request
            after = req.num_computed_tokens + scheduler_output.num_scheduled_tokens.get(rid, 0)
            full = min(after, len(state.block_ids) * self._block_size)
            full -= full % self._block_size
            if full <= state.tokens_sent:
                continue
            all_ids = req.all_token_ids
            meta.saves.append(SaveSpec(state.key, list(all_ids[state.tokens_sent:full]),
                                       state.block_ids[state.block_ids_sent:]))
            state.tokens_sent = full
            state.block_ids_sent = len(state.block_ids)
        return meta

    def update_connector_output(self, connector_output: "KVConnectorOutput") -> None:
        events = connector_output.kv_cache_events
        if isinstance(events, KvtierKVEvents):
            if self._events is None:
                self._events = events
            else:
                self._events.add_events(events.get_all_events())
                self._events.increment_workers(events.get_number_of_workers())

    def request_finished(self, request: "Request",
                         block_ids: List[int]) -> Tuple[bool, Optional[Dict[str, Any]]]:
        state = self._reqs.pop(request.request_id, None)
        if state is None:
            return False, None
        self._forget_lookup(state)
        # Blocks saved by earlier steps may still be copying out of G1: the worker lists the
        # request in finished_sending when kvtier no longer reads them.
        delay = state.tokens_sent > 0
        self._finished.append((state.key, delay))
        return delay, None

    def take_events(self) -> Iterable[KVCacheEvent]:
        if self._events is None:
            return
        self._events.aggregate()
        events = self._events.get_all_events()
        self._events.clear_events()
        self._events = None
        yield from events

    # ======================= worker side =======================

    def _init_worker(self) -> None:
        self._server: Optional[LookupServer] = None
        self._layout: Optional[KvCacheLayout] = None
        self._layer_index: Dict[str, int] = {}
        self._wreqs: Dict[str, _WorkerReq] = {}
        self._sync_loads: List[Tuple[LoadSpec, int]] = []  # (spec, tokens planned)
        self._async_loads: Dict[str, Tuple[LoadSpec, int]] = {}
        self._load_errors: Set[int] = set()
        self._sending_done: Set[str] = set()  # vLLM ids whose saves no longer read G1
        self._held: Set[str] = set()  # kvtier keys kept for saves (RequestFinished -> True)
        self._layer_error: Optional[str] = None
        self._stats_prev: Dict[str, int] = {}
        self._load_error_count = 0  # G1 blocks reported to vLLM as failed loads
        self._rank = 0
        self._lock = threading.Lock()

    def register_kv_caches(self, kv_caches: Dict[str, torch.Tensor]) -> None:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        self._rank = get_tensor_model_parallel_rank() if self._tp_size > 1 else 0
        model_config = self._vllm_config.model_config
        layout = describe_kv_caches(
            kv_caches, block_size=self._block_size,
            num_kv_heads=model_config.get_num_kv_heads(self._vllm_config.parallel_config),
            head_size=model_config.get_head_size())
        self._layout = layout
        self._layer_index = {name: i for i, name in enumerate(layout.layer_names)}
        config = self._settings.kvtier_config(tp_rank=self._rank, tp_size=self._tp_size)
        # With kvtier's own publisher on (events.endpoint), its events go out there; handing them
        # to vLLM's stream as well would make a subscriber of both hear every block twice.
        self._own_publisher = bool(config.get("events.endpoint"))
        model_id = (f"{self._model_name}|{layout.namespace_tag}"
                    f"|tp{self._rank}of{self._tp_size}")
        # vLLM's CPU worker pins this thread to its OpenMP cores, and threads inherit the
        # mask: kvtier's copy, disk and lookup threads would then compete with the model for
        # the compute cores. They are started on the cores vLLM left free (all cores when it
        # left none), and this thread's mask is restored.
        pinned = os.sched_getaffinity(0)
        free = set(range(os.cpu_count() or 1)) - pinned
        try:
            os.sched_setaffinity(0, free or set(range(os.cpu_count() or 1)))
        except OSError as e:  # a cgroup may refuse some cores: keep vLLM's mask
            logger.warning("kvtier: could not move its threads off vLLM's cores: %s", e)
        try:
            self._manager = kvtier.BlockManager(layout.layout, model_id, config)
            self._manager.register_memory(layout.layout, layout.num_blocks, layout.regions,
                                          layout.on_device)
            self._server = LookupServer(self._engine_id, self._rank, self._lookup)
        finally:
            os.sched_setaffinity(0, pinned)
        logger.info("kvtier: rank %d of %d, %s, %d G1 blocks, model id %r", self._rank,
                    self._tp_size, layout.layout, layout.num_blocks, model_id)

    def _lookup(self, key: str, tokens: List[int], num_computed: int, salt: str,
                lora: str) -> Tuple[int, Tuple[int, int, int, int]]:
        assert self._manager is not None, "lookup before register_kv_caches"
        return self._manager.lookup(key, tokens, num_computed, cache_salt=salt,
                                    adapter_id=lora)

    def _meta(self) -> Optional[KvtierMetadata]:
        if not self.has_connector_metadata():
            return None
        meta = self._get_connector_metadata()
        return meta if isinstance(meta, KvtierMetadata) else None

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        if not isinstance(kv_connector_metadata, KvtierMetadata) or self._manager is None:
            return
        if not kv_connector_metadata.preempted:
            return
        # A preempted request's blocks are freed and reused at once: saves still reading them
        # must end first. Preemption is rare; this waits for all saves in flight.
        self._manager.wait_for_saves()
        for key in kv_connector_metadata.preempted:
            self._wreqs.pop(key, None)
            self._manager.request_finished(key)

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        meta = self._meta()
        m = self._manager
        if meta is None or m is None:
            return
        for key, delay_free in meta.finished:
            self._wreqs.pop(key, None)
            kept = m.request_finished(key)
            if kept:
                self._held.add(key)
            elif delay_free:
                self._sending_done.add(key.rsplit("#", 1)[0])
        self._layer_error = None
        if not meta.loads:
            return
        for spec in meta.loads:
            try:
                planned = m.prepare_load(spec.key, spec.block_ids, spec.num_tokens)
            except kvtier.KvtierError as e:
                logger.warning("kvtier: prepare_load(%s) failed: %s", spec.key, e)
                planned = 0
            if spec.is_async:
                self._async_loads[spec.key] = (spec, planned)
            else:
                self._sync_loads.append((spec, planned))
        m.start_load()

    def wait_for_layer_load(self, layer_name: str) -> None:
        if not self._sync_loads or self._manager is None:
            return
        layer = self._layer_index.get(layer_name)
        if layer is None:
            return
        err = self._manager.wait_layer(layer)
        if err is not None and self._layer_error is None:
            self._layer_error = err
            logger.warning("kvtier: a load failed at layer %d (recomputed by vLLM): %s",
                           layer, err)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor,
                      attn_metadata: "AttentionMetadata", **kwargs: Any) -> None:
        # kvtier saves whole blocks once every layer is computed (wait_for_save).
        return

    def _note_load_errors(self, spec: LoadSpec, planned: int, loaded: int) -> None:
        first = spec.num_computed_tokens // self._block_size
        ok_blocks = min(planned, loaded) // self._block_size
        want_blocks = spec.num_tokens // self._block_size
        failed = spec.block_ids[first + ok_blocks:first + want_blocks]
        self._load_errors.update(failed)
        self._load_error_count += len(failed)

    def wait_for_save(self) -> None:
        m = self._manager
        if m is None:
            return
        for spec, planned in self._sync_loads:
            loaded = m.loaded_tokens(spec.key) if planned else 0
            self._note_load_errors(spec, planned, loaded)
        self._sync_loads = []
        meta = self._meta()
        if meta is None or not meta.saves:
            return
        for save in meta.saves:
            req = self._wreqs.setdefault(save.key, _WorkerReq())
            req.tokens.extend(save.new_tokens)
            req.block_ids.extend(save.new_block_ids)
            try:
                m.commit(save.key, req.tokens, req.block_ids)
            except kvtier.KvtierError as e:
                # NotFound: the lookup for this request failed; its blocks are not saved.
                logger.debug("kvtier: commit(%s): %s", save.key, e)
        m.start_save()

    def get_finished(self, finished_req_ids: Set[str]) -> Tuple[Optional[Set[str]],
                                                                 Optional[Set[str]]]:
        m = self._manager
        if m is None:
            return None, None
        saves_done, loads_done = m.finished()
        for key in saves_done:
            if key in self._held:
                self._held.discard(key)
                self._sending_done.add(key.rsplit("#", 1)[0])
        recving: Set[str] = set()
        for key in loads_done:
            entry = self._async_loads.pop(key, None)
            if entry is None:
                continue
            spec, planned = entry
            self._note_load_errors(spec, planned, m.loaded_tokens(key) if planned else 0)
            recving.add(key.rsplit("#", 1)[0])
        # Async loads that planned nothing never start a transfer: done at once.
        for key, (spec, planned) in list(self._async_loads.items()):
            if planned == 0:
                del self._async_loads[key]
                self._note_load_errors(spec, 0, 0)
                recving.add(key.rsplit("#", 1)[0])
        sending = self._sending_done
        self._sending_done = set()
        return (sending or None), (recving or None)

    def get_block_ids_with_load_errors(self) -> Set[int]:
        errors = self._load_errors
        self._load_errors = set()
        return errors

    def get_kv_connector_stats(self) -> Optional[KVConnectorStats]:
        if self._role == KVConnectorRole.SCHEDULER:
            # Whole microseconds: vLLM's offline metrics reader truncates counters to integers.
            data = {"lookup_failures": self._lookup_failures,
                    "lookup_microseconds": int(self._lookup_seconds * 1e6)}
            self._lookup_failures, self._lookup_seconds = 0, 0.0
            stats = KvtierConnectorStats(data=data)
            return None if stats.is_empty() else stats
        if self._manager is None:
            return None
        s = self._manager.stats()
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
            "load_error_blocks": self._load_error_count,
            "evicted_blocks": s["evicted_blocks_g2"] + s["evicted_blocks_g3"],
            "demoted_blocks": s["demoted_blocks"],
            "g4_saved_blocks": s["g4_saved_blocks"],
            "g4_failures": (s["g4_lookup_failures"] + s["g4_save_failures"]
                            + s["g4_load_failures"] + s["g4_dropped_saves"]),
        }
        for k in _MANAGER_COUNTERS:
            now[k] = int(s.get(k, 0))
        for path, n in s["bytes_by_path"].items():
            now[_path_name(path)] = n
        delta = {k: v - self._stats_prev.get(k, 0) for k, v in now.items()}
        self._stats_prev = now
        # Gauges travel with every step's stats, from every worker, so vLLM's per-step sum over
        # the workers is the engine's total.
        for k in _GAUGES:
            delta[_GAUGE_PREFIX + k] = int(s[k])
        stats = KvtierConnectorStats(data=delta)
        return None if stats.is_empty() else stats

    def get_kv_connector_kv_cache_events(self) -> Optional[KVConnectorKVEvents]:
        if self._manager is None or self._layout is None:
            return None
        raw = self._manager.take_events(details=True)
        if self._rank != 0 or getattr(self, "_own_publisher", False):
            return None
        if not raw:
            return None
        events: List[KVCacheEvent] = []
        for e in raw:
            tier = e["tier"]
            medium, locality = _TIER_MEDIUM.get(tier, (MEDIUM_STORAGE, None))
            if e["kind"] == "stored":
                # vLLM's fields, so that any consumer (kvtier router, Dynamo, llm-d) can compute
                # its own hashes: the block's token ids, the parent's name (None for a first
                # block), the salt in the first block's extra keys. The reset epoch is kvtier's
                # own business and stays out of the salt published.
                salt = (e["cache_salt"] or "").split("\x00kvtier-epoch-")[0]
                first = bool(e["parent_is_root"])
                events.append(BlockStored(
                    block_hashes=[e["key"]], parent_block_hash=None if first else e["parent"],
                    token_ids=list(e["token_ids"]), block_size=self._block_size, lora_id=None,
                    medium=medium, lora_name=e["lora_name"] or None,
                    # vLLM's order: the LoRA name (when lora_name is set), then the salt.
                    extra_keys=([tuple(x for x in (e["lora_name"], salt) if x)]
                                if first and (salt or e["lora_name"]) else None),
                    locality=locality, ownership=f"kvtier:{tier}"))
            else:
                events.append(BlockRemoved(block_hashes=[e["key"]], medium=medium,
                                           locality=locality, ownership=f"kvtier:{tier}"))
        out = KvtierKVEvents(num_workers=1)
        out.add_events(events)
        return out

    def shutdown(self) -> None:
        server, self._server = getattr(self, "_server", None), None
        if server is not None:
            server.close()
        m, self._manager = getattr(self, "_manager", None), None
        if m is not None:
            m.close()  # the same clean flush to G3 as the C++ manager's destructor
        for c in getattr(self, "_clients", []):
            c.close()

    def reset_cache(self) -> Optional[bool]:
        """vLLM's reset_prefix_cache(reset_connector=True). Every block stored so far becomes
        unreachable for this engine: later requests key under a new namespace (an epoch in the
        salt), and the old blocks leave the tiers as eviction takes them. A restarted vLLM
        starts again at epoch 0. (vLLM's plain reset_prefix_cache() leaves kvtier alone.)"""
        if self._role != KVConnectorRole.SCHEDULER:
            return None
        self._epoch += 1
        return True

    # ======================= both =======================

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[Dict[str, Any]] = None
                                 ) -> Optional[KVConnectorStats]:
        return KvtierConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config: "VllmConfig", metric_types: Dict[type, type],
                           labelnames: List[str],
                           per_engine_labelvalues: Dict[int, List[object]]
                           ) -> Optional[KVConnectorPromMetrics]:
        return KvtierPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)



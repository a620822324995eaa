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
  "how much of this prompt can you load?" over the lookup channel (kvtier/vllm/lookup.py) and
  takes the smallest answer. Each step's plan (loads; the tokens to save, at absolute
  positions; finished and preempted requests) travels to the workers in the connector
  metadata vLLM already sends.
- Keys: kvtier's chained block keys over the token ids, the per-block digests of whatever else
  the block's KV depends on (multimodal inputs, prompt embeddings: kvtier/vllm/keys.py), under
  a namespace of the model and its weights' fingerprint, the KV layout, the salt, the LoRA
  adapter (name and path), the TP rank and size, and the DP rank.

The rules that keep an answer right whatever vLLM does (docs/vllm.md, "Correctness"):

1. The save frontier is clamped to the tokens that exist: under async scheduling
   ``num_computed_tokens`` counts output placeholders, under speculative decoding draft
   tokens; only ``all_token_ids`` is real. Saves carry absolute offsets, so a worker can never
   append tokens in the wrong place.
2. A block that failed to load is never saved as good: the worker commits nothing of a request
   from its first block that failed to load in this step, and the scheduler moves the request's
   save frontier back to that block, so the recomputed KV is saved when it exists. A request's
   loads are retried at most ``max_load_failures`` times; it then computes.
3. A request is reported finished once: in finished_recving when vLLM holds its blocks for a
   load (WAITING_FOR_REMOTE_KVS), else in finished_sending when saves still read them.
4. A preempted request is a new kvtier request (its id and vLLM's num_preemptions), noticed as
   soon as vLLM looks it up again, so a preemption and a resume in one step keep the resumed
   request's planned load.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import os
import threading
import time
from typing import (TYPE_CHECKING, Any, Deque, Dict, Iterable, List, Optional, Sequence, Set,
                    Tuple)

import torch
from vllm.distributed.kv_events import KVCacheEvent
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

try:  # vLLM's hybrid memory allocator (HMA) interface; older vLLMs have none
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorTransferResults,
        SupportsHMA,
    )
except ImportError:  # pragma: no cover - depends on the installed vLLM
    KVConnectorTransferResults = None  # type: ignore[assignment,misc]

    class SupportsHMA:  # type: ignore[no-redef]
        pass
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)
from vllm.logger import init_logger
from vllm.v1.metrics.cache_hit_source import CacheHitSource

import kvtier
from kvtier.vllm import compat
from kvtier.vllm.keys import UnkeyableRequest, adapter_id, block_extras, model_fingerprint
from kvtier.vllm.layout_vouch import LayoutVouch, vouch_registered_caches
from kvtier.vllm.layouts import KvCacheLayout, describe_kv_caches
from kvtier.vllm.daemon_lookup import DaemonLookupClient, instance_name
from kvtier.vllm.groups import (
    FULL,
    GROUP_TAG,
    SLIDING,
    STATE,
    check_aliasing,
    first_held,
    group_key,
    held_ids,
    plan_groups,
    state_table,
)
from kvtier.vllm.lookup import LookupClient, LookupServer
from kvtier.vllm.observe import (
    KvtierConnectorStats,
    KvtierKVEvents,
    KvtierPromMetrics,
    vllm_events,
    worker_stats,
)
from kvtier.vllm.params import RequestControls
from kvtier.vllm.settings import ConnectorSettings
from kvtier.vllm.sleep import G1Sleep, KvtierSleepError

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
_NO_HIT: Tuple[int, int, int, int] = (0, 0, 0, 0)
_FINISHED_KEYS_KEPT = 65536  # late lookups for these keys are answered 0 without the manager
# A state-space hybrid's lookup probes at most this many block boundaries per state group (the
# prompt's last ones): a state further back is not offered (docs/hybrid.md).
_MAX_STATE_PROBES = 32
# A sliding-window group is probed for the window's blocks alone at the prompt's last this many
# boundaries (below them it must hold every block from the engine's own hit).
_MAX_WINDOW_PROBES = 4
# A P/D consumer's request waiting for its producer's blocks is looked up again after 1 ms,
# then 2, 4, 8, 16, then every 20 ms until they are there or pd_wait_ms is over (docs/pd.md):
# vLLM asks at every pass of its loop, which spins while requests wait (thousands a second),
# and each lookup sends and hashes the whole prompt. Between lookups the answer is None, with
# no lookup. The cap bounds what it adds to the wait once the blocks have landed.
_PD_POLL_FIRST_S = 0.001
_PD_POLL_MAX_S = 0.020
# may_load_async waits this long for its lookup (vLLM asks it as each request arrives, on the
# engine core's thread): an answer later than that makes it say True.
_PROBE_WAIT_S = 0.002


# ---------------------------------------------------------------------------------------------
# What the scheduler sends the workers each step
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class LoadSpec:
    key: str  # the request's id in kvtier: vLLM's id and its preemption count
    block_ids: List[int]  # the request's whole G1 block table
    num_tokens: int  # tokens to load past num_computed_tokens
    num_computed_tokens: int  # what vLLM's own prefix cache supplied
    is_async: bool
    # Hybrid models (kvtier/vllm/groups.py): every group's whole table, and the lookup's
    # (tokens, salt, lora, extras, load_tiers, store_tiers) for the sliding groups, whose loads
    # start at the window (the worker looks them up again from there).
    group_block_ids: Optional[List[List[int]]] = None
    query: Optional[Tuple[Any, ...]] = None


@dataclasses.dataclass
class SaveSpec:
    key: str
    token_start: int  # the absolute position of tokens[0] in the request
    tokens: List[int]  # real token ids (whole blocks only)
    block_start: int  # the absolute index of block_ids[0] in the request's block table
    block_ids: List[int]
    group_block_ids: Optional[List[List[int]]] = None  # hybrid: every group's, from block_start
    # hybrid with state (mamba) groups: (group, block index, G1 block id) of each state vLLM
    # handed over at a boundary this save keys (SchedulerOutput.kv_connector_block_state).
    state_blocks: List[Tuple[int, int, int]] = dataclasses.field(default_factory=list)


# How a finished request is reported back (rule 3 of the module docstring).
REPORT_NONE, REPORT_SENDING, REPORT_RECVING = "none", "sending", "recving"


@dataclasses.dataclass
class FinishSpec:
    key: str
    report: str  # REPORT_NONE | REPORT_SENDING | REPORT_RECVING


@dataclasses.dataclass
class KvtierMetadata(KVConnectorMetadata):
    loads: List[LoadSpec] = dataclasses.field(default_factory=list)
    saves: List[SaveSpec] = dataclasses.field(default_factory=list)
    finished: List[FinishSpec] = dataclasses.field(default_factory=list)
    preempted: List[str] = dataclasses.field(default_factory=list)  # kvtier keys


def vllm_id(key: str) -> str:
    return key.rsplit("#", 1)[0]


# ---------------------------------------------------------------------------------------------
# The scheduler's view of a request
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _SchedReq:
    request: "Request"
    controls: RequestControls
    generation: int = 0  # vLLM's num_preemptions when this state was (re)started
    block_ids: List[int] = dataclasses.field(default_factory=list)
    block_ids_sent: int = 0
    tokens_sent: int = 0  # the save frontier: tokens the workers were sent to commit
    lookup_computed: int = 0  # num_computed_tokens the last lookup was given
    lookup_tokens: int = 0
    lookup_by_tier: Tuple[int, int, int, int] = _NO_HIT
    lookup_async: bool = False
    pending_load: Optional[LoadSpec] = None
    load_block_ids: List[int] = dataclasses.field(default_factory=list)  # of the last load
    load_in_flight: bool = False  # an async load planned and not yet in finished_recving
    load_failures: int = 0  # loads of this request that lost blocks (all generations)
    extras: Optional[List[bytes]] = None
    refused: str = ""  # why kvtier neither loads nor saves this request
    pending_lookup: Optional[Tuple[Tuple[Any, ...], List[int], float]] = None
    consumer: bool = False  # P/D decode side: loads the producer's blocks, saves no prompt
    producer: bool = False  # P/D prefill side: announces what it saved (expect_tokens)
    pd_wait_since: Optional[float] = None  # when it began waiting for the producer's blocks
    pd_poll_s: float = 0.0  # while it waits: the current interval between its lookups
    pd_next_lookup: float = 0.0  # while it waits: no lookup before this (time.monotonic())
    group_block_ids: List[List[int]] = dataclasses.field(default_factory=list)  # hybrid
    query: Optional[Tuple[Any, ...]] = None  # hybrid: the last lookup's, for LoadSpec.query

    @property
    def key(self) -> str:
        return f"{self.request.request_id}#{self.generation}"


@dataclasses.dataclass
class _WorkerReq:
    tokens: List[int] = dataclasses.field(default_factory=list)
    block_ids: List[int] = dataclasses.field(default_factory=list)
    group_block_ids: List[List[int]] = dataclasses.field(default_factory=list)  # hybrid


_VOUCHED: Optional[compat.CheckReport] = None


def _vouch_for_vllm() -> None:
    """compat.check_vllm once per process: raises VllmNotVouched, or logs what was checked."""
    global _VOUCHED
    if _VOUCHED is None:
        report = compat.check_vllm()
        (logger.info if report.tested else logger.warning)(
            "kvtier: %s%s", report.summary(),
            "" if report.tested else f"; it runs because every check passed (checked: "
                                     f"{', '.join(report.checked)})")
        _VOUCHED = report


class KvtierConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM's KV connector over kvtier's BlockManager (see the module docstring). A
    SupportsHMA: vLLM keeps its hybrid memory allocator on for hybrid models
    (kvtier/vllm/groups.py says which groups kvtier moves)."""

    _cache_hit_source = CacheHitSource.HOST

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 kv_cache_config: Optional["KVCacheConfig"] = None) -> None:
        # Refuses (VllmNotVouched) a vLLM whose structures kvtier has not seen (compat.py).
        _vouch_for_vllm()
        super().__init__(vllm_config, role, kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        self._settings = ConnectorSettings.parse(extra)
        self._block_size = vllm_config.cache_config.block_size
        self._engine_id = str(self._kv_transfer_config.engine_id)
        pc = vllm_config.parallel_config
        self._tp_size = pc.tensor_parallel_size
        self._pp_size = pc.pipeline_parallel_size
        self._dp_rank, self._dp_size, _ = compat.parallel_ranks(pc)
        self._check_deployment(vllm_config)
        self._groups = plan_groups(kv_cache_config, self._block_size)
        self._state_group_ids = {g.index for g in self._groups.state_groups}
        if self._groups.refused and role == KVConnectorRole.SCHEDULER:
            logger.warning("kvtier: %s. kvtier neither loads nor saves for this model; vLLM "
                           "runs it with its hybrid KV cache manager as without kvtier.",
                           self._groups.refused)
        self._model_name = self._settings.model_id or str(vllm_config.model_config.model)
        # Disaggregated prefill/decode (docs/pd.md): vLLM's kv_role, or per request vLLM's own
        # do_remote_prefill / do_remote_decode.
        self._kv_role = compat.kv_role(self._kv_transfer_config)
        self._manager: Optional[kvtier.BlockManager] = None  # worker side only
        if role == KVConnectorRole.SCHEDULER:
            self._apply_load_failure_policy()
            self._init_scheduler()
        else:
            self._init_worker()

    def _check_deployment(self, vllm_config: "VllmConfig") -> None:
        nnodes = compat.parallel_ranks(vllm_config.parallel_config)[2]
        if nnodes > 1 and self._tp_size * self._pp_size > 1:
            # The lookup channel is a local socket: a rank on another node cannot answer it, and
            # every lookup would silently miss.
            raise ValueError(
                f"kvtier: tensor/pipeline parallelism across {nnodes} nodes is not supported "
                f"(the lookup channel is local to a host); run one engine per node, or "
                f"without kvtier")
        if compat.sleep_mode_enabled(vllm_config.model_config) and not compat.has_sleep_hooks():
            # This vLLM frees the KV cache in sleep mode without telling its connector: a copy
            # of kvtier's still in flight, or started after the wake-up, would touch freed or
            # remapped memory (kvtier/vllm/sleep.py).
            raise ValueError(
                f"kvtier: vLLM {compat.vllm_version()} frees the KV cache in sleep mode without "
                f"telling its KV connector (the unregister_kv_caches/restore_kv_caches hooks "
                f"came in vLLM 0.33); run without --enable-sleep-mode, or on vLLM 0.33 or later")

    def _instance(self, pp_rank: int) -> str:
        """The lookup channel's name: one per engine instance, DP rank and PP stage."""
        return f"{self._engine_id}-dp{self._dp_rank}-pp{pp_rank}"

    def _apply_load_failure_policy(self) -> None:
        # vLLM reads kv_load_failure_policy right after building the scheduler's connector. Its
        # default is "fail", and it cannot say whether the user chose it: kvtier keeps an
        # explicit "recompute", or its own load_failure_policy setting when given, and
        # otherwise recomputes (kvtier is a cache: a lost block is a miss).
        chosen = self._settings.load_failure_policy
        if chosen == "auto":
            current = compat.load_failure_policy(self._kv_transfer_config)
            if current != "recompute":
                logger.info("kvtier: kv_load_failure_policy is 'fail' (vLLM's default); "
                            "kvtier recomputes blocks that fail to load instead. Set "
                            "load_failure_policy='fail' in kv_connector_extra_config to fail "
                            "such requests.")
            chosen = "recompute"
        self._kv_transfer_config.kv_load_failure_policy = chosen

    # ======================= scheduler side =======================

    @property
    def requires_kv_delivery(self) -> bool:
        # A dropped save is only a future miss: a preempted request need not be recomputed
        # for kvtier's sake.
        return False

    def _service_instance(self, config: "kvtier.Config", pp_rank: int, tp_rank: int) -> str:
        """Attached mode: the daemon's name for one worker (the scheduler looks up under it)."""
        return instance_name(config.get("service.instance"), self._engine_id, self._dp_rank,
                             pp_rank, tp_rank)

    def _init_scheduler(self) -> None:
        pp_stages = range(self._pp_size)
        config = self._settings.kvtier_config(dp_rank=self._dp_rank, dp_size=self._dp_size)
        self._clients: List[Any]
        # Tiers whose loads are asynchronous (async_load "auto"): the daemon's are not known
        # here when attached.
        self._slow_tiers = bool(config.get("service.socket")) or (
            config.get("g3.enabled") == "true" or config.get("g4.backend") not in ("", "none"))
        if config.get("service.socket"):
            # Attached (docs/service.md): the daemon holds the index; ask it directly, under
            # each worker's instance name, not the workers.
            self._clients = [DaemonLookupClient(config, self._service_instance(config, pp, r))
                             for pp in pp_stages for r in range(self._tp_size)]
        else:
            self._clients = [LookupClient(self._instance(pp), r)
                             for pp in pp_stages for r in range(self._tp_size)]
        self._reqs: Dict[str, _SchedReq] = {}
        self._finished: List[FinishSpec] = []
        self._preempted: List[str] = []
        self._events: Optional[KvtierKVEvents] = None
        # Since the last get_kv_connector_stats (the scheduler's share of the stats).
        self._sched_counts: Dict[str, int] = collections.Counter()
        self._lookup_seconds = 0.0
        self._warned: Set[str] = set()
        # Bumped by reset_cache (persistent: kept in g3.dir; see reset_cache).
        self._epoch = self._settings.load_epoch(dp_rank=self._dp_rank, dp_size=self._dp_size)

    def _state(self, request: "Request") -> _SchedReq:
        state = self._reqs.get(request.request_id)
        if state is None:
            controls = RequestControls.parse(compat.kv_transfer_params(request))
            state = self._reqs[request.request_id] = _SchedReq(
                request, controls, generation=compat.num_preemptions(request),
                consumer=self._kv_role == "kv_consumer" or controls.remote_prefill,
                producer=self._kv_role == "kv_producer" or controls.remote_decode)
            if controls.error:
                state.refused = controls.error
                self._warn_once("params", f"kvtier: request {request.request_id}: "
                                          f"{controls.error}; kvtier ignores this request")
        self._sync_generation(state)
        return state

    def _sync_generation(self, state: _SchedReq) -> None:
        """A preempted request starts again as a new kvtier request (rule 4)."""
        gen = compat.num_preemptions(state.request)
        if gen == state.generation:
            return
        self._preempted.append(state.key)
        self._forget_lookup(state)
        state.generation = gen
        state.block_ids, state.block_ids_sent, state.tokens_sent = [], 0, 0
        state.group_block_ids = []
        state.pending_load, state.load_block_ids, state.load_in_flight = None, [], False
        state.lookup_tokens, state.lookup_by_tier, state.lookup_async = 0, _NO_HIT, False

    def _warn_once(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            logger.warning(message)

    def _keying(self, state: _SchedReq) -> Optional[List[bytes]]:
        if state.extras is None and not state.refused:
            try:
                state.extras = block_extras(state.request, self._block_size)
            except UnkeyableRequest as e:
                state.refused = str(e)
                self._warn_once("unkeyable", f"kvtier: request {state.request.request_id} is "
                                             f"neither loaded nor saved: {e}")
        return state.extras

    def _load_tiers(self, state: _SchedReq, request: "Request", count: bool = True) -> str:
        """The tiers the request's lookup may offer blocks from ("none": nothing loads, but it
        is still looked up: the lookup tells the workers what the request is, so that its
        blocks are saved)."""
        c = state.controls
        if not c.load or compat.skips_external_kv(request):
            # vLLM takes no connector KV for it (0.34 zeroes the hit itself): no load is
            # planned, no G4 is queried, no block is pinned, no hit is counted.
            return "none"
        if state.load_failures >= self._settings.max_load_failures:
            if count:
                self._sched_counts["load_retries_exhausted"] += 1
            return "none"
        if state.producer and not self._settings.producer_loads:
            return "none"
        return c.load_tiers

    def get_num_new_matched_tokens(self, request: "Request",
                                   num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        return self._match(request, num_computed_tokens, self._settings.lookup_wait_ms / 1000.0)

    def may_load_async(self, request: "Request") -> bool:
        """vLLM 0.34, with --max-num-inflight-kv-loads, as the request enters the waiting
        queues: will the lookup answer with an asynchronous load? (True lets vLLM start that
        load while the running batch is full.) False at once when nothing can make it one
        (async_load "never", no G3/G4, the request's controls, no full block before the
        prompt's last token); else a lookup from token 0 says, waited for at most
        _PROBE_WAIT_S: no answer by then is True (it may be). docs/vllm.md, "Sleep mode,
        may_load_async, lookahead hashes"."""
        state = self._state(request)
        hybrid = self._groups.hybrid
        if ((not hybrid and (self._settings.async_load == "never" or not self._slow_tiers))
                or self._groups.refused or state.refused
                or len(request.all_token_ids) <= self._block_size):
            return False
        tiers = self._load_tiers(state, request, count=False)
        if tiers == "none" or (not hybrid and tiers and "G3" not in tiers and "G4" not in tiers):
            return False
        if state.consumer and state.controls.expect_tokens:
            return True  # the producer's blocks may not be there yet to ask about
        t0 = time.perf_counter()
        num, is_async = self._match(request, 0, _PROBE_WAIT_S)
        self._sched_counts["async_probes"] += 1
        self._sched_counts["async_probe_microseconds"] += int((time.perf_counter() - t0) * 1e6)
        if num is None:  # not answered yet (the lookup stays in flight for the scheduler)
            self._sched_counts["async_probes_late"] += 1
            return True
        return is_async

    def _match(self, request: "Request", num_computed_tokens: int,
               wait_s: float) -> Tuple[Optional[int], bool]:
        """get_num_new_matched_tokens, waiting at most wait_s for the ranks' answers (None:
        asked again later; the lookup stays in flight for the next call)."""
        state = self._state(request)
        if self._groups.refused and not state.refused:
            state.refused = self._groups.refused
        extras = self._keying(state)
        c = state.controls
        if state.refused or extras is None:
            return 0, False  # neither loaded nor saved
        if (state.pd_wait_since is not None and state.pending_lookup is None
                and time.monotonic() < state.pd_next_lookup):
            return None, False  # waiting for a producer's blocks: not yet time to look again
        load_tiers = self._load_tiers(state, request)
        tokens = list(request.all_token_ids)
        salt = request.cache_salt or ""
        if self._epoch:
            salt = f"{salt}\x00kvtier-epoch-{self._epoch}"
        lora = adapter_id(request)
        signature = (state.key, len(tokens), num_computed_tokens, salt, lora, load_tiers)
        t0 = time.perf_counter()
        pending = state.pending_lookup
        if pending is None or pending[0] != signature:
            self._forget_lookup(state)
            if self._groups.hybrid:
                # Every group is a kvtier request of its own (kvtier/vllm/groups.py), looked
                # up from num_computed_tokens; state groups (states only at the boundaries
                # vLLM kept one) and sliding groups (only the window's blocks needed) are also
                # probed at the prompt's last boundaries (_probe_plan, _hybrid_hit).
                queries = self._hybrid_queries(state.key, tokens, num_computed_tokens, salt,
                                               lora, extras, load_tiers, c.store_tiers)
                state.query = (tokens, salt, lora, extras, load_tiers, c.store_tiers)
            else:
                queries = [(state.key, tokens, num_computed_tokens, salt, lora, extras,
                            load_tiers, c.store_tiers)]
            pending = state.pending_lookup = (
                signature, [(cl, cl.submit(q)) for cl in self._clients for q in queries],
                time.monotonic())
        # Wait a little for the answers (a lookup is normally well under a millisecond); a
        # slower one (a G4 query) is asked about again at the next step: (None, False).
        wait_until = time.monotonic() + wait_s
        results = [cl.result(seq, wait_until - time.monotonic()) for cl, seq in pending[1]]
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
            self._sched_counts["lookup_failures"] += 1
            state.lookup_tokens, state.lookup_by_tier, state.lookup_async = 0, _NO_HIT, False
            return 0, False
        answers = [r[1] for r in results]
        cap = None
        if c.max_load_tokens is not None:
            cap = c.max_load_tokens - c.max_load_tokens % self._block_size
        if self._groups.hybrid:
            num, by_tier = self._hybrid_hit(answers, len(pending[1]) // len(self._clients),
                                            len(tokens), num_computed_tokens, cap)
        else:
            num = min(a[0] for a in answers)
            if cap is not None:
                num = min(num, cap)
            # Tiers as rank 0 reports them (ranks hold the same blocks unless one lost some).
            by_tier = answers[0][1]
        slow = by_tier[2] + by_tier[3] > 0
        is_async = num > 0 and slow and self._settings.async_load == "auto"
        if self._groups.hybrid:
            # With several groups vLLM cannot take back single blocks that failed to load
            # (get_block_ids_with_load_errors raises in its scheduler), only a whole async load
            # (failed_recving, recomputed): hybrid loads are asynchronous.
            is_async = num > 0
        if state.consumer and c.expect_tokens and load_tiers != "none":
            waited = self._pd_wait(state, num_computed_tokens + num)
            if waited:
                return None, False  # asked again at the next step
        state.lookup_tokens, state.lookup_by_tier, state.lookup_async = num, by_tier, is_async
        return num, is_async

    def _probe_plan(self, num_tokens: int, num_computed: int) -> List[Tuple[int, int, int]]:
        """The hybrid lookup's probes, in submission order: (group index, end, start). Each is
        the prompt cut after `end` + 1 tokens looked up from `start`, and says whether kvtier
        holds every block of [start, end) of that group:
        - a state group, at the prompt's last _MAX_STATE_PROBES boundaries past num_computed:
          the block before the boundary (the state at `end`);
        - a sliding-window group, at the last _MAX_WINDOW_PROBES: the blocks vLLM's own prefix
          cache needs for a hit at `end` (cdiv(window - 1, block) of them, its
          _contiguous_blocks_for_hit), so that a group that lost earlier blocks still hits
          there. Below those, a sliding group must hold every block from num_computed."""
        bs = self._block_size
        ends = self._probe_ends(num_tokens, num_computed)
        out = [(g.index, e, e - bs) for g in self._groups.state_groups for e in ends]
        for g in self._groups.groups:
            if g.kind == SLIDING:
                need = -(-(g.window - 1) // bs) * bs
                out += [(g.index, e, max(num_computed, e - need))
                        for e in ends[:_MAX_WINDOW_PROBES]]
        return out

    def _probe_ends(self, num_tokens: int, num_computed: int) -> List[int]:
        bs = self._block_size
        top = (num_tokens - 1) // bs * bs
        return list(range(top, num_computed, -bs))[:_MAX_STATE_PROBES]

    def _hybrid_queries(self, key: str, tokens: List[int], num_computed: int, salt: str,
                        lora: str, extras: List[bytes], load_tiers: str,
                        store_tiers: str) -> List[Tuple[Any, ...]]:
        """The probes (_probe_plan) first, then every group's whole-prompt lookup: a group's
        last lookup is the one its saves follow."""
        probes = [(group_key(key, g), tokens[:e + 1], start,
                   salt + self._groups.groups[g].salt_tag, lora, extras, load_tiers,
                   store_tiers)
                  for g, e, start in self._probe_plan(len(tokens), num_computed)]
        return probes + [(group_key(key, g.index), tokens, num_computed, salt + g.salt_tag,
                          lora, extras, load_tiers, store_tiers) for g in self._groups.groups]

    def _hybrid_hit(self, answers: List[Any], per_client: int, num_tokens: int,
                    num_computed: int,
                    cap: Optional[int]) -> Tuple[int, Tuple[int, int, int, int]]:
        """The hit of a hybrid model from every rank's answers to _hybrid_queries: the longest
        boundary n within the full-attention groups' shortest answer (capped) at which, on
        every rank, every state group holds its state and every sliding group holds either
        every block from num_computed or (a probed n) the window's blocks. By tier: the
        primary group's on rank 0."""
        bs = self._block_size
        groups = self._groups.groups
        plan = self._probe_plan(num_tokens, num_computed)
        assert per_client == len(plan) + len(groups), (per_client, len(plan), len(groups))
        ranks = len(answers) // per_client
        whole = [answers[r * per_client + len(plan):(r + 1) * per_client] for r in range(ranks)]
        bound = min(a[g.index][0] for a in whole for g in groups if g.kind == FULL)
        if cap is not None:
            bound = min(bound, cap)
        by_tier = whole[0][self._groups.primary][1]
        held: Dict[Tuple[int, int], bool] = {}
        for i, (g, e, start) in enumerate(plan):
            held[(g, e)] = all(answers[r * per_client + i][0] >= e - start for r in range(ranks))
        sliding = [g for g in groups if g.kind == SLIDING]
        states = self._groups.state_groups
        contiguous = {g.index: min(a[g.index][0] for a in whole) for g in sliding}
        for n in range(num_computed + bound - bound % bs, num_computed, -bs):
            if not all(held.get((g.index, n), False) for g in states):
                continue
            if all(n - num_computed <= contiguous[g.index] or held.get((g.index, n), False)
                   for g in sliding):
                return n - num_computed, by_tier
        return 0, by_tier

    def _pd_wait(self, state: _SchedReq, found_end: int) -> bool:
        """A consumer's request whose producer announced `expect_tokens`: True while fewer
        have arrived and pd_wait_ms has not passed since the first lookup (vLLM asks again at
        every step; the next lookup waits for state.pd_next_lookup: _PD_POLL_FIRST_S doubling
        to _PD_POLL_MAX_S). Once they are all there, or the wait is over, the lookup's answer
        stands and the shortfall is counted; the missing blocks are computed."""
        req = state.request
        bs = self._block_size
        # At most the prompt's full blocks before its last token (vLLM computes that one).
        target = min(state.controls.expect_tokens, (req.num_prompt_tokens - 1) // bs * bs)
        if found_end >= target:
            if state.pd_wait_since is not None:
                self._sched_counts["pd_waited_microseconds"] += int(
                    (time.monotonic() - state.pd_wait_since) * 1e6)
                state.pd_wait_since = None
                state.pd_poll_s = state.pd_next_lookup = 0.0
            self._sched_counts["pd_expected_tokens"] += target
            return False
        now = time.monotonic()
        if state.pd_wait_since is None:
            state.pd_wait_since = now
            self._sched_counts["pd_waits"] += 1
        deadline = state.pd_wait_since + self._settings.pd_wait_ms / 1000.0
        if now < deadline:
            # The next lookup: after the interval, doubled up to the cap, and at the latest
            # when pd_wait_ms is over.
            state.pd_poll_s = min(_PD_POLL_MAX_S, max(_PD_POLL_FIRST_S, 2 * state.pd_poll_s))
            state.pd_next_lookup = min(now + state.pd_poll_s, deadline)
            return True
        logger.warning("kvtier: request %s: %d of the %d tokens its producer saved arrived "
                       "within pd_wait_ms (%d ms); the rest is computed", req.request_id,
                       found_end, target, self._settings.pd_wait_ms)
        self._sched_counts["pd_waited_microseconds"] += int((now - state.pd_wait_since) * 1e6)
        self._sched_counts["pd_expected_tokens"] += target
        self._sched_counts["pd_missing_tokens"] += target - found_end
        state.pd_wait_since = None
        state.pd_poll_s = state.pd_next_lookup = 0.0
        return False

    def _forget_lookup(self, state: _SchedReq) -> None:
        if state.pending_lookup is not None:
            for cl, seq in state.pending_lookup[1]:
                cl.forget(seq)
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
        self._sync_generation(state)
        all_ids = blocks.get_block_ids()
        block_ids = list(all_ids[self._groups.primary] if self._groups.hybrid else all_ids[0])
        # request.num_computed_tokens can be 0 here: keep what the lookup was given.
        first = state.lookup_computed // self._block_size
        state.pending_load = LoadSpec(state.key, block_ids, num_external_tokens,
                                      state.lookup_computed, state.lookup_async)
        if self._groups.hybrid:
            state.pending_load.group_block_ids = [list(ids) for ids in all_ids]
            state.pending_load.query = state.query
        state.load_block_ids = block_ids[first:first + num_external_tokens // self._block_size]
        # An async load puts the request in WAITING_FOR_REMOTE_KVS: vLLM holds its blocks until
        # the worker lists it in finished_recving.
        state.load_in_flight = state.lookup_async

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        for rid in scheduler_output.preempted_req_ids or ():
            state = self._reqs.get(rid)
            if state is not None:
                self._sync_generation(state)  # a no-op when a lookup already noticed it
        meta = KvtierMetadata(finished=self._finished, preempted=self._preempted)
        self._finished, self._preempted = [], []
        for state in self._reqs.values():
            if state.pending_load is not None:
                meta.loads.append(state.pending_load)
                state.pending_load = None
        # Saves: every full block whose KV exists once this step has run (rule 1).
        updates = compat.scheduled_updates(scheduler_output)
        hybrid = self._groups.hybrid
        p = self._groups.primary if hybrid else 0
        # vLLM hands the mamba ("align") states of the boundaries it keeps over with their exact
        # blocks: a state group's table cannot be read positionally (groups.py).
        offers = compat.boundary_state_offloads(scheduler_output)
        for rid, new_ids, replace in updates:
            state = self._reqs.get(rid)
            if state is None:
                continue
            if replace:
                state.block_ids, state.block_ids_sent = list(new_ids[p] if new_ids else []), 0
                if hybrid:
                    state.group_block_ids = [list(ids) for ids in new_ids or ()]
            elif new_ids:
                state.block_ids.extend(new_ids[p])
                if hybrid:
                    while len(state.group_block_ids) < len(new_ids):
                        state.group_block_ids.append([])
                    for g, ids in enumerate(new_ids):
                        state.group_block_ids[g].extend(ids)
            if state.refused or not state.controls.save or state.extras is None:
                continue
            save = self._next_save(state, scheduler_output.num_scheduled_tokens.get(rid, 0),
                                   offers.get(rid, ()))
            if save is not None:
                meta.saves.append(save)
        return meta

    def _next_save(self, state: _SchedReq, num_scheduled: int,
                   offers: Sequence[Tuple[int, int, int]] = ()) -> Optional[SaveSpec]:
        req = state.request
        all_ids = req.all_token_ids
        # num_computed_tokens counts output placeholders (async scheduling) and this step's
        # drafts count in num_scheduled (speculative decoding): only all_token_ids is real.
        frontier = min(req.num_computed_tokens + num_scheduled, len(all_ids),
                       len(state.block_ids) * self._block_size)
        if not self._settings.save_decode_tokens:
            frontier = min(frontier, req.num_prompt_tokens)
        # Newer vLLMs (not 0.32) say how many of a request's blocks hold published KV (with
        # EAGLE, the draft's KV too): no block past them is saved (docs/wip/hma-plan.md 3.5).
        publishable = compat.publishable_blocks(req)
        if publishable is not None:
            frontier = min(frontier, publishable * self._block_size)
        full = frontier - frontier % self._block_size
        if full <= state.tokens_sent:
            return None
        if state.consumer and not self._settings.consumer_saves_prompt:
            # The producer saved the prompt: nothing is sent until generated tokens fill a
            # block (that save keys the whole sequence, and the prompt's blocks kvtier holds
            # are not copied again: dedup).
            if full <= req.num_prompt_tokens - req.num_prompt_tokens % self._block_size:
                return None
        save = SaveSpec(state.key, state.tokens_sent, list(all_ids[state.tokens_sent:full]),
                        state.block_ids_sent, state.block_ids[state.block_ids_sent:])
        if self._groups.hybrid:
            save.group_block_ids = [ids[state.block_ids_sent:] for ids in state.group_block_ids]
            # The states vLLM handed over at boundaries this save keys (a boundary already sent
            # is committed past: kvtier keeps only states whose block it has not passed).
            bs = self._block_size
            save.state_blocks = [(g, end // bs - 1, b) for g, b, end in offers
                                 if g in self._state_group_ids and end % bs == 0
                                 and state.tokens_sent < end <= full]
        state.tokens_sent = full
        state.block_ids_sent = len(state.block_ids)
        return save

    def update_connector_output(self, connector_output: "KVConnectorOutput") -> None:
        events = connector_output.kv_cache_events
        if isinstance(events, KvtierKVEvents):
            if self._events is None:
                self._events = events
            else:
                self._events.add_events(events.get_all_events())
                self._events.increment_workers(events.get_number_of_workers())
        for rid in connector_output.finished_recving or ():
            state = self._reqs.get(rid)
            if state is not None:
                state.load_in_flight = False
        for rid in compat.failed_recving(connector_output):
            # A hybrid load that lost blocks: vLLM recomputes the request from the start.
            state = self._reqs.get(rid)
            if state is not None:
                state.load_failures += 1
                state.load_block_ids = []
                self._sched_counts["failed_loads"] += 1
        invalid = connector_output.invalid_block_ids
        if invalid:
            self._on_load_errors(set(invalid))

    def _on_load_errors(self, invalid: Set[int]) -> None:
        """Blocks that did not arrive intact (rule 2): the loads that lost them count against
        their requests' retries, and every request whose sent save range holds one moves its
        frontier back to it, so the recomputed KV is saved."""
        bs = self._block_size
        for state in self._reqs.values():
            if state.load_block_ids and not invalid.isdisjoint(state.load_block_ids):
                state.load_failures += 1
                state.load_block_ids = []
                self._sched_counts["failed_loads"] += 1
            for i, b in enumerate(state.block_ids[:state.tokens_sent // bs]):
                if b in invalid:
                    state.tokens_sent = i * bs
                    self._sched_counts["save_rollbacks"] += 1
                    break

    def request_finished(self, request: "Request",
                         block_ids: List[int]) -> Tuple[bool, Optional[Dict[str, Any]]]:
        state = self._reqs.pop(request.request_id, None)
        if state is None:
            return False, None
        self._forget_lookup(state)
        if state.load_in_flight:
            # WAITING_FOR_REMOTE_KVS: vLLM itself keeps the blocks until finished_recving, which
            # the worker sends once the load (if it started at all) has ended. Never also in
            # finished_sending: vLLM frees the request at the first of the two (rule 3).
            self._finished.append(FinishSpec(state.key, REPORT_RECVING))
            return False, None
        # Blocks saved by earlier steps may still be copying out of G1: the worker lists the
        # request in finished_sending when kvtier no longer reads them.
        delay = state.tokens_sent > 0
        self._finished.append(FinishSpec(state.key, REPORT_SENDING if delay else REPORT_NONE))
        params = None
        if state.producer and not state.refused:
            # What a consumer should wait for (a P/D proxy hands it over with the request);
            # vLLM's own P/D key says the KV is to be fetched, not recomputed.
            params = {"do_remote_prefill": True,
                      "kvtier": {"expect_tokens": state.tokens_sent}}
        return delay, params

    def request_finished_all_groups(self, request: "Request", block_ids: Tuple[List[int], ...]
                                    ) -> Tuple[bool, Optional[Dict[str, Any]]]:
        """SupportsHMA: request_finished for every group at once (vLLM calls this one, not
        request_finished, on a SupportsHMA connector, whatever the number of groups)."""
        p = self._groups.primary if self._groups.hybrid else 0
        return self.request_finished(request, list(block_ids[p]) if len(block_ids) > p else [])

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
        self._layout_vouch: Optional[LayoutVouch] = None
        self._layer_index: Dict[str, int] = {}
        self._wreqs: Dict[str, _WorkerReq] = {}
        self._sync_loads: List[Tuple[LoadSpec, int]] = []  # this step's (spec, tokens planned)
        self._async_loads: Dict[str, Tuple[LoadSpec, int]] = {}
        self._loads_reported: Set[str] = set()  # keys whose async load was in finished_recving
        self._recving_on_done: Set[str] = set()  # finished keys to report when their load ends
        self._recving_now: Set[str] = set()  # vLLM ids to report in finished_recving
        self._load_errors: Set[int] = set()  # to report in get_block_ids_with_load_errors
        self._step_failed: Set[int] = set()  # G1 blocks that failed to load in this step
        self._sending_done: Set[str] = set()  # vLLM ids whose saves no longer read G1
        self._held: Set[str] = set()  # keys finished while saves read their blocks
        self._finished_keys: "collections.OrderedDict[str, None]" = collections.OrderedDict()
        self._finished_lock = threading.Lock()
        self._layer_error: Optional[str] = None
        self._stats_prev: Dict[str, int] = {}
        self._worker_counts: Dict[str, int] = collections.Counter()
        self._rank = 0
        self._pp_rank = 0
        # Hybrid models (kvtier/vllm/groups.py):
        # key -> {gkey: (tokens wanted, planned, loaded once done)}
        self._hybrid_loads: Dict[str, Dict[str, Tuple[int, int, Optional[int]]]] = {}
        self._failed_recving: Set[str] = set()  # vLLM ids whose hybrid load lost blocks
        self._fence: Set[str] = set()  # sliding groups' keys saved last step (see _fence_saves)
        self._held_groups: Dict[str, Set[str]] = {}  # key -> its groups' keys saves still read
        self._g1 = G1Sleep()  # vLLM's sleep mode (kvtier/vllm/sleep.py)
        self._warned: Set[str] = set()

    def register_kv_caches(self, kv_caches: Dict[str, torch.Tensor]) -> None:
        from vllm.distributed.parallel_state import (
            get_pp_group,
            get_tensor_model_parallel_rank,
        )

        self._rank = get_tensor_model_parallel_rank() if self._tp_size > 1 else 0
        self._pp_rank = get_pp_group().rank_in_group if self._pp_size > 1 else 0
        if self._groups.refused:
            # The scheduler neither loads nor saves (it said why): no manager, no tiers.
            logger.info("kvtier: rank %d stays out of this model's KV cache: %s", self._rank,
                        self._groups.refused)
            return
        model_config = self._vllm_config.model_config
        # The KV cache manager's block count tells an attention backend's kernel blocks (a
        # block dimension k times longer) from vLLM's blocks; older vLLMs pass no config.
        kv_cache_config = getattr(self, "_kv_cache_config", None)
        groups_tag = ""
        if self._groups.hybrid:
            # The primary (first full-attention) group's layers stand for every group's: they
            # view the same memory (a state group's padded page is an attention page).
            primary = self._groups.groups[self._groups.primary]
            check_aliasing(self._groups.groups, kv_caches, primary.index)
            kv_caches = {n: kv_caches[n] for n in primary.layer_names}
            # Kinds and windows in clear, the layer lists as a hash: a model whose grouping
            # changes gets new keys, and the id stays short (every layer of every group
            # spelled out passed the daemon's model-id limit with 12 layers).
            layers = hashlib.sha256("|".join(
                "+".join(g.layer_names) for g in self._groups.groups).encode()).hexdigest()[:16]
            groups_tag = "|hma:" + ",".join(
                f"{g.kind}{g.window or ''}" for g in self._groups.groups) + ":" + layers
        layout = describe_kv_caches(
            kv_caches, block_size=self._block_size,
            num_kv_heads=model_config.get_num_kv_heads(self._vllm_config.parallel_config),
            head_size=model_config.get_head_size(),
            num_blocks=getattr(kv_cache_config, "num_blocks", None))
        # Refuses (KvLayoutNotVouched) a layout kvtier has not seen; fingerprints the block
        # bytes' real order for the namespace (kvtier/vllm/layout_vouch.py).
        vouch = vouch_registered_caches(
            self._vllm_config, kv_cache_config, kv_caches, layout.layer_names,
            self._block_size, layout.num_blocks, layout.namespace_tag,
            self._settings.allow_unvouched_layout)
        self._layout, self._layout_vouch = layout, vouch
        self._layer_index = {name: i for i, name in enumerate(layout.layer_names)}
        self._g1.record(kv_caches)
        config = self._settings.kvtier_config(
            tp_rank=self._rank, tp_size=self._tp_size, pp_rank=self._pp_rank,
            pp_size=self._pp_size, dp_rank=self._dp_rank, dp_size=self._dp_size)
        # With kvtier's own publisher on (events.endpoint), its events go out there; handing them
        # to vLLM's stream as well would make a subscriber of both hear every block twice.
        self._own_publisher = bool(config.get("events.endpoint"))
        t0 = time.perf_counter()
        weights = model_fingerprint(self._vllm_config, self._settings.weights_id)
        took = time.perf_counter() - t0
        model_id = (f"{self._model_name}|w{weights}|{vouch.namespace_tag}"
                    f"|tp{self._rank}of{self._tp_size}|pp{self._pp_rank}of{self._pp_size}"
                    f"{groups_tag}")
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
        attached = bool(config.get("service.socket"))
        if attached:
            config.set("service.instance",
                       self._service_instance(config, self._pp_rank, self._rank))
        try:
            self._manager = kvtier.BlockManager(layout.layout, model_id, config)
            self._manager.register_memory(layout.layout, layout.num_blocks, layout.regions,
                                          layout.on_device)
            if not attached:  # attached: the scheduler asks kvtier serve itself
                self._server = LookupServer(self._instance(self._pp_rank), self._rank,
                                            self._lookup)
        finally:
            os.sched_setaffinity(0, pinned)
        logger.info("kvtier: rank %d of %d (pp %d, dp %d), %s, %d G1 blocks, model id %r "
                    "(weights fingerprint in %.0f ms); %s", self._rank, self._tp_size,
                    self._pp_rank, self._dp_rank, layout.layout, layout.num_blocks, model_id,
                    took * 1e3, vouch.summary())

    def _lookup(self, key: str, tokens: List[int], num_computed: int, salt: str, lora: str,
                extras: List[bytes], load_tiers: str,
                store_tiers: str) -> Tuple[int, Tuple[int, int, int, int]]:
        assert self._manager is not None, "lookup before register_kv_caches"
        if self._g1.off:
            return 0, _NO_HIT  # asleep (kvtier/vllm/sleep.py): a hit could not be loaded
        with self._finished_lock:
            if key.split(GROUP_TAG, 1)[0] in self._finished_keys:
                return 0, _NO_HIT  # arrived after the request's end: nothing to remember
        return self._manager.lookup(key, tokens, num_computed, cache_salt=salt,
                                    adapter_id=lora, block_extra=extras, load_tiers=load_tiers,
                                    store_tiers=store_tiers)

    def _meta(self) -> Optional[KvtierMetadata]:
        if not self.has_connector_metadata():
            return None
        meta = self._get_connector_metadata()
        return meta if isinstance(meta, KvtierMetadata) else None

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if self._role == KVConnectorRole.WORKER:
            self._step_failed = set()
            self._layer_error = None
            self._fence_saves()

    def _gkeys(self, key: str) -> List[str]:
        """The kvtier request ids of a request: one per KV cache group of a hybrid model."""
        if not self._groups.hybrid:
            return [key]
        return [group_key(key, g.index) for g in self._groups.groups]

    def _fence_saves(self) -> None:
        """Before the forward pass: vLLM frees a sliding-window group's blocks once they leave
        the window (a state group's once the state moved two blocks on), even while the
        request runs, and may hand them to another request (or group) in this very step. The saves that read such blocks last step end first (their
        unstarted ones are dropped: counted, a later miss). Full-attention blocks stay the
        request's until finished_sending."""
        m = self._manager
        if not self._fence or m is None:
            return
        fence, self._fence = self._fence, set()
        t0 = time.perf_counter()
        for gkey in fence:
            m.wait_for_request_saves(gkey)
        self._worker_counts["hybrid_fence_microseconds"] += int(
            (time.perf_counter() - t0) * 1e6)

    def _forget_key(self, key: str) -> None:
        self._wreqs.pop(key, None)
        with self._finished_lock:
            self._finished_keys[key] = None
            while len(self._finished_keys) > _FINISHED_KEYS_KEPT:
                self._finished_keys.popitem(last=False)

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        m = self._manager
        if not isinstance(kv_connector_metadata, KvtierMetadata) or m is None:
            return
        for key in kv_connector_metadata.preempted:
            # Its blocks are freed and reused at once: its saves still reading them end first
            # (only its own: other requests' saves, demotions and G4 writes go on).
            for gkey in self._gkeys(key):
                m.wait_for_request_saves(gkey)
            self._forget_key(key)
            for gkey in self._gkeys(key):
                m.request_finished(gkey)

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        meta = self._meta()
        m = self._manager
        if meta is None or m is None:
            return
        for fin in meta.finished:
            self._finish(fin)
        if not meta.loads:
            return
        if self._g1.off:
            self._refuse_loads(meta.loads)
            return
        for spec in meta.loads:
            if spec.group_block_ids is not None:
                self._prepare_hybrid_load(m, spec)
                continue
            try:
                planned = self._prepare_load(m, spec)
            except kvtier.KvtierError as e:
                logger.warning("kvtier: prepare_load(%s) failed: %s", spec.key, e)
                planned = 0
            if spec.is_async:
                self._async_loads[spec.key] = (spec, planned)
            else:
                self._sync_loads.append((spec, planned))
        if self._layout is not None and self._layout.on_device:
            # vLLM zeroes and copies blocks on its stream right before the loads into them.
            try:
                m.start_load(torch.cuda.current_stream().cuda_stream)
            except kvtier.KvtierError as e:  # started anyway; they fail and are recomputed
                logger.warning("kvtier: loads not ordered after vLLM's stream: %s", e)
        else:
            m.start_load()

    def _refuse_loads(self, loads: List[LoadSpec]) -> None:
        """Loads planned while kvtier is off G1 (asleep: vLLM ran a step between
        unregister_kv_caches and restore_kv_caches): none starts, every block is reported as a
        load error (a hybrid request as failed_recving), and vLLM computes them."""
        self._warn_once("asleep", "kvtier: loads planned while vLLM's KV cache is unregistered "
                                  "(sleep mode) are not started; vLLM computes those blocks")
        for spec in loads:
            self._worker_counts["sleep_refused_loads"] += 1
            if spec.group_block_ids is not None:
                self._hybrid_loads[spec.key] = {
                    group_key(spec.key, g.index): (spec.num_tokens, 0, None)
                    for g in self._groups.groups}
            elif spec.is_async:
                self._async_loads[spec.key] = (spec, 0)  # done at the next get_finished
            else:
                self._sync_loads.append((spec, 0))

    @staticmethod
    def _prepare_load(m: Any, spec: LoadSpec) -> int:
        # An async load is polled through finished(); wait_layer never waits for it.
        return m.prepare_load(spec.key, spec.block_ids, spec.num_tokens,
                              async_load=spec.is_async)

    def _prepare_hybrid_load(self, m: Any, spec: LoadSpec) -> None:
        """One load per group, all asynchronous (see get_num_new_matched_tokens). A full-
        attention group loads every block of the hit; a sliding-window group only the blocks
        vLLM allocated for it (those inside the window at the end of the hit): its kvtier
        request is looked up again from the first of them; a state group only the block of the
        state at the end of the hit (looked up again from that block)."""
        assert spec.group_block_ids is not None
        bs = self._block_size
        end = spec.num_computed_tokens + spec.num_tokens
        parts: Dict[str, Tuple[int, int, Optional[int]]] = {}
        for g in self._groups.groups:
            gkey = group_key(spec.key, g.index)
            ids = spec.group_block_ids[g.index]
            start = spec.num_computed_tokens
            try:
                if g.kind == STATE:
                    start = end - bs
                    if not 0 <= end // bs - 1 < len(ids) or ids[end // bs - 1] == 0:
                        # vLLM gave no block for the state: the load cannot be whole.
                        logger.warning("kvtier: %s: no block for the state at %d tokens",
                                       gkey, end)
                        parts[gkey] = (bs, 0, None)
                        continue
                if g.kind == SLIDING:
                    start = first_held(ids, start // bs, end // bs) * bs
                    if start >= end:
                        continue  # nothing of this group to load
                if start > spec.num_computed_tokens:
                    assert spec.query is not None
                    tokens, salt, lora, extras, load_tiers, store_tiers = spec.query
                    m.lookup(gkey, tokens, start, cache_salt=salt + g.salt_tag,
                             adapter_id=lora, block_extra=extras, load_tiers=load_tiers,
                             store_tiers=store_tiers)
                planned = m.prepare_load(gkey, held_ids(ids, kvtier.NO_G1_BLOCK),
                                         end - start, async_load=True)
            except kvtier.KvtierError as e:
                logger.warning("kvtier: prepare_load(%s) failed: %s", gkey, e)
                planned = 0
            parts[gkey] = (end - start, planned, None)
            self._worker_counts[f"hybrid_{g.kind}_load_blocks"] += planned // bs
        self._hybrid_loads[spec.key] = parts

    def _finish(self, fin: FinishSpec) -> None:
        m = self._manager
        assert m is not None
        self._forget_key(fin.key)
        if self._groups.hybrid:
            held = {gkey for gkey in self._gkeys(fin.key) if m.request_finished(gkey)}
            if held:
                self._held_groups[fin.key] = held
            kept = bool(held)
        else:
            kept = m.request_finished(fin.key)
        if fin.report == REPORT_RECVING:
            if fin.key in self._async_loads or fin.key in self._hybrid_loads:
                self._recving_on_done.add(fin.key)  # reported when the load ends
            elif fin.key not in self._loads_reported:
                self._recving_now.add(vllm_id(fin.key))  # the load never started
        elif fin.report == REPORT_SENDING:
            if kept:
                if not self._groups.hybrid:  # hybrid: _held_groups
                    self._held.add(fin.key)
            else:
                self._sending_done.add(vllm_id(fin.key))
        self._loads_reported.discard(fin.key)

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

    def _failed_blocks(self, spec: LoadSpec, planned: int, loaded: int) -> List[int]:
        first = spec.num_computed_tokens // self._block_size
        ok_blocks = min(planned, loaded) // self._block_size
        want_blocks = spec.num_tokens // self._block_size
        return spec.block_ids[first + ok_blocks:first + want_blocks]

    def _settle_sync_loads(self) -> None:
        """This step's synchronous loads, whose blocks the forward pass has used by now: the
        blocks that did not arrive are reported in this step's output (vLLM then discards the
        step's tokens of their requests), even when wait_for_save comes later (speculative
        decoding defers it past get_block_ids_with_load_errors)."""
        m = self._manager
        if not self._sync_loads or m is None:
            return
        for spec, planned in self._sync_loads:
            loaded = m.loaded_tokens(spec.key) if planned else 0
            failed = self._failed_blocks(spec, planned, loaded)
            if failed:
                self._load_errors.update(failed)
                self._step_failed.update(failed)
                self._worker_counts["load_error_blocks"] += len(failed)
        self._sync_loads = []

    def wait_for_save(self) -> None:
        m = self._manager
        if m is None:
            return
        self._settle_sync_loads()
        meta = self._meta()
        if meta is None or not meta.saves:
            return
        if self._g1.off:  # asleep: nothing reads G1 (kvtier/vllm/sleep.py)
            self._worker_counts["sleep_skipped_saves"] += len(meta.saves)
            return
        bs = self._block_size
        for save in meta.saves:
            req = self._wreqs.setdefault(save.key, _WorkerReq())
            if save.token_start > len(req.tokens) or save.block_start > len(req.block_ids):
                # Tokens this worker did not commit (a failed load cut them): the scheduler
                # sends them again from the failed block once they are recomputed.
                self._worker_counts["save_gaps"] += 1
                continue
            del req.tokens[save.token_start:]
            req.tokens.extend(save.tokens)
            del req.block_ids[save.block_start:]
            req.block_ids.extend(save.block_ids)
            if save.group_block_ids is not None:
                while len(req.group_block_ids) < len(save.group_block_ids):
                    req.group_block_ids.append([])
                for table, ids in zip(req.group_block_ids, save.group_block_ids):
                    del table[save.block_start:]
                    table.extend(ids)
            if self._step_failed:
                # Rule 2: nothing from a block that failed to load in this step (this step's
                # forward pass computed what follows it from a wrong KV).
                for i, b in enumerate(req.block_ids[:len(req.tokens) // bs]):
                    if b in self._step_failed:
                        del req.tokens[i * bs:]
                        self._worker_counts["saves_cut_by_load_errors"] += 1
                        break
            if not req.tokens:
                continue
            if save.group_block_ids is not None:
                self._commit_groups(m, save.key, req, save.state_blocks)
                continue
            try:
                m.commit(save.key, req.tokens, req.block_ids)
            except kvtier.KvtierError as e:
                # NotFound: the lookup for this request failed; its blocks are not saved.
                logger.debug("kvtier: commit(%s): %s", save.key, e)
        if self._layout is not None and self._layout.on_device:
            # The forward pass that wrote these blocks may still run on vLLM's stream.
            try:
                m.start_save(torch.cuda.current_stream().cuda_stream)
            except kvtier.KvtierError as e:  # started anyway; they fail (dropped, counted)
                logger.warning("kvtier: saves not ordered after vLLM's stream: %s", e)
        else:
            m.start_save()

    def _commit_groups(self, m: Any, key: str, req: _WorkerReq,
                       state_blocks: Sequence[Tuple[int, int, int]]) -> None:
        """A hybrid model's save: every group's blocks under its own kvtier request. Blocks a
        group does not hold (vLLM's null block: a sliding window's blocks left behind by a
        prefix hit) are neither saved nor reused; a state group's only the states vLLM handed
        over (groups.state_table); the sliding and state groups' saves end before the next
        forward pass (_fence_saves)."""
        for g in self._groups.groups:
            gkey = group_key(key, g.index)
            table = req.group_block_ids[g.index]
            if g.kind == STATE:
                ids = state_table(len(table), [(i, b) for gg, i, b in state_blocks
                                               if gg == g.index], kvtier.NO_G1_BLOCK)
            else:
                ids = held_ids(table, kvtier.NO_G1_BLOCK)
            try:
                m.commit(gkey, req.tokens, ids)
            except kvtier.KvtierError as e:
                logger.debug("kvtier: commit(%s): %s", gkey, e)
                continue
            if g.kind != FULL:
                self._fence.add(gkey)

    def _settle_hybrid_loads(self, m: Any, loads_done: List[str], recving: Set[str]) -> None:
        """A hybrid request's load ends when every group's has: finished_recving, and
        failed_recving as well when a group's came short (vLLM recomputes the request)."""
        for gkey in loads_done:
            base = gkey.split(GROUP_TAG, 1)[0]
            parts = self._hybrid_loads.get(base)
            if parts is not None and gkey in parts:
                # Read now: LoadedTokens of a load listed by Finished() is kept only so long.
                want, planned, _ = parts[gkey]
                parts[gkey] = (want, planned, m.loaded_tokens(gkey))
        for key in list(self._hybrid_loads):
            parts = self._hybrid_loads[key]
            if any(planned > 0 and loaded is None for _, planned, loaded in parts.values()):
                continue
            del self._hybrid_loads[key]
            if key in self._recving_on_done:
                self._recving_on_done.discard(key)  # finished meanwhile: nothing to report
                recving.add(vllm_id(key))
                continue
            failed = any(planned < want or (planned > 0 and (loaded or 0) < want)
                         for want, planned, loaded in parts.values())
            if failed:
                self._failed_recving.add(vllm_id(key))
                self._worker_counts["hybrid_failed_loads"] += 1
            self._loads_reported.add(key)
            recving.add(vllm_id(key))

    def get_transfer_results(self, finished_req_ids: Set[str]) -> Any:
        """get_finished, plus the hybrid loads that failed (vLLM's failed_recving)."""
        sending, recving = self.get_finished(finished_req_ids)
        failed, self._failed_recving = self._failed_recving, set()
        assert KVConnectorTransferResults is not None
        return KVConnectorTransferResults(finished_sending=set(sending or ()),
                                          finished_recving=set(recving or ()),
                                          failed_recving=failed)

    def get_finished(self, finished_req_ids: Set[str]) -> Tuple[Optional[Set[str]],
                                                                 Optional[Set[str]]]:
        m = self._manager
        if m is None:
            return None, None
        self._settle_sync_loads()
        # Asleep: Finished() could start deferred saves (none are left, but it is not asked).
        saves_done, loads_done = ([], []) if self._g1.off else m.finished()
        for key in saves_done:
            if key in self._held:
                self._held.discard(key)
                self._sending_done.add(vllm_id(key))
            elif GROUP_TAG in key:
                base = key.split(GROUP_TAG, 1)[0]
                held = self._held_groups.get(base)
                if held is not None:
                    held.discard(key)
                    if not held:
                        del self._held_groups[base]
                        self._sending_done.add(vllm_id(base))
        recving = self._recving_now
        self._recving_now = set()
        if self._hybrid_loads:
            self._settle_hybrid_loads(m, loads_done, recving)
        done = [k for k in loads_done if k in self._async_loads]
        # Async loads that planned nothing never start a transfer: done at once.
        done += [k for k, (_, planned) in self._async_loads.items() if planned == 0]
        for key in done:
            entry = self._async_loads.pop(key, None)
            if entry is None:
                continue
            spec, planned = entry
            if key in self._recving_on_done:
                self._recving_on_done.discard(key)  # finished meanwhile: no errors to report
            else:
                loaded = m.loaded_tokens(key) if planned else 0
                failed = self._failed_blocks(spec, planned, loaded)
                self._load_errors.update(failed)
                self._worker_counts["load_error_blocks"] += len(failed)
                self._loads_reported.add(key)
            recving.add(vllm_id(key))
        sending = self._sending_done
        self._sending_done = set()
        return (sending or None), (recving or None)

    def get_block_ids_with_load_errors(self) -> Set[int]:
        self._settle_sync_loads()
        errors = self._load_errors
        self._load_errors = set()
        return errors

    def get_kv_connector_stats(self) -> Optional[KVConnectorStats]:
        if self._role == KVConnectorRole.SCHEDULER:
            # Whole microseconds: vLLM's offline metrics reader truncates counters to integers.
            data = dict(self._sched_counts)
            data["lookup_microseconds"] = int(self._lookup_seconds * 1e6)
            self._sched_counts, self._lookup_seconds = collections.Counter(), 0.0
            stats = KvtierConnectorStats(data=data)
            return None if stats.is_empty() else stats
        if self._manager is None:
            return None
        counts = dict(self._worker_counts)
        if self._server is not None:
            counts.update(("lookup_server_" + k, v) for k, v in self._server.stats().items())
        delta = worker_stats(self._manager.stats(), counts.pop("load_error_blocks", 0), counts,
                             self._stats_prev)
        stats = KvtierConnectorStats(data=delta)
        return None if stats.is_empty() else stats

    def get_kv_connector_kv_cache_events(self) -> Optional[KvtierKVEvents]:
        if self._manager is None or self._layout is None:
            return None
        raw = self._manager.take_events(details=True)
        if self._rank != 0 or self._pp_rank != 0 or getattr(self, "_own_publisher", False):
            return None
        if not raw:
            return None
        out = KvtierKVEvents(num_workers=1)
        out.add_events(vllm_events(raw, self._block_size, self._groups.groups))
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
        salt, kept in g3.dir so a restart does not revive the keys from before the reset), and
        the old blocks leave the tiers as eviction takes them. (vLLM's plain
        reset_prefix_cache() leaves kvtier alone.)"""
        if self._role != KVConnectorRole.SCHEDULER:
            return None
        self._epoch = self._settings.bump_epoch(self._epoch, dp_rank=self._dp_rank,
                                                dp_size=self._dp_size)
        return True

    # ---- vLLM's sleep mode (0.33+; kvtier/vllm/sleep.py) ----

    def unregister_kv_caches(self) -> None:
        """Before vLLM frees or remaps the KV cache: kvtier's own saves and loads end first
        (vLLM's "transfers are drained" does not cover them), then kvtier touches no G1 byte
        until restore_kv_caches. Idempotent."""
        m = self._manager
        if m is None or self._g1.suspended:
            return
        loads = list(self._async_loads) + [spec.key for spec, _ in self._sync_loads]
        loads += [gkey for parts in self._hybrid_loads.values()
                  for gkey, (_, planned, loaded) in parts.items() if planned and loaded is None]
        waited, took = self._g1.suspend(m, loads)
        self._worker_counts["sleep_unregisters"] += 1
        self._worker_counts["sleep_drain_microseconds"] += int(took * 1e6)
        logger.info("kvtier: rank %d let go of vLLM's KV cache (sleep mode) after %.1f ms: "
                    "every save ended (dropped ones counted), %d loads waited for", self._rank,
                    took * 1e3, waited)

    def restore_kv_caches(self) -> None:
        """After vLLM mapped the KV cache again: kvtier may touch it again, if it is where it
        was registered; otherwise kvtier stays off it for good and raises KvtierSleepError.
        Idempotent."""
        if self._manager is None:
            return
        try:
            self._g1.resume()
        except KvtierSleepError as e:
            self._worker_counts["sleep_address_changes"] += 1
            logger.error("kvtier: %s", e)
            raise

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: Any) -> bool:
        # Where vLLM has the hooks (0.33+); on 0.32 a sleep-mode engine is refused at start.
        return compat.has_sleep_hooks()

    @classmethod
    def supports_lookahead_block_hashes(cls, kv_transfer_config: Any) -> bool:
        # kvtier's keys cover a block's own tokens, not the tokens after it that an EAGLE
        # drafter's KV at the block's last position depends on (docs/vllm.md).
        return False

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

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: Dict[str, Any]) -> bool:
        # G2 loads are layer-pipelined (wait_for_layer_load between the layers' attention):
        # a full CUDA graph would replay the layers without those waits.
        return True

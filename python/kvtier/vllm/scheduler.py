"""The scheduler side of KvtierConnector, in vLLM's engine-core process.

It keeps no tiers. It asks every rank's manager "how much of this prompt can you load?" over
the lookup channel (kvtier/vllm/lookup.py; attached to ``kvtier serve``, the daemon directly:
daemon_lookup.py) and takes the smallest answer. Each step's plan (loads; the tokens to save,
at absolute positions; finished and preempted requests) travels to the workers in the connector
metadata (metadata.py). connector.py's module docstring has the rules it keeps (1 to 4).
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from vllm.distributed.kv_events import KVCacheEvent
from vllm.logger import init_logger
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvtier.vllm import compat
from kvtier.vllm.daemon_lookup import DaemonLookupClient
from kvtier.vllm.deployment import Deployment, warn_once
from kvtier.vllm.hybrid_lookup import HybridLookup
from kvtier.vllm.keys import UnkeyableRequest, adapter_id, block_extras
from kvtier.vllm.lookup import LookupClient
from kvtier.vllm.metadata import (
    NO_HIT,
    REPORT_NONE,
    REPORT_RECVING,
    REPORT_SENDING,
    FinishSpec,
    KvtierMetadata,
    LoadSpec,
    SaveSpec,
)
from kvtier.vllm.observe import KvtierConnectorStats, KvtierKVEvents
from kvtier.vllm.params import RequestControls

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

logger = init_logger("kvtier.vllm")

_TIER_HIT_SOURCE = {
    "G2": CacheHitSource.HOST,
    "G3": CacheHitSource.DISK,
    "G4": CacheHitSource.EXTERNAL_UNSPECIFIED,
}
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
    lookup_by_tier: Tuple[int, int, int, int] = NO_HIT
    lookup_async: bool = False
    pending_load: Optional[LoadSpec] = None
    load_block_ids: List[int] = dataclasses.field(default_factory=list)  # of the last load
    load_in_flight: bool = False  # an async load planned and not yet in finished_recving
    load_failures: int = 0  # loads of this request that lost blocks (all generations)
    extras: Optional[List[bytes]] = None
    refused: str = ""  # why kvtier neither loads nor saves this request
    # (signature, [(client, seq)], when submitted) of the lookup in flight
    pending_lookup: Optional[Tuple[Tuple[Any, ...], List[Tuple[Any, int]], float]] = None
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


class KvtierScheduler:
    """KvtierConnector's scheduler-side hooks (the connector hands each to this object)."""

    def __init__(self, deployment: Deployment) -> None:
        d = self._deployment = deployment
        self._settings = d.settings
        self._block_size = d.block_size
        self._groups = d.groups
        self._state_group_ids = {g.index for g in d.groups.state_groups}
        self._hybrid = HybridLookup(d.groups, d.block_size)
        self._dp_rank, self._dp_size = d.dp_rank, d.dp_size
        self._kv_role = d.kv_role
        pp_stages = range(d.pp_size)
        config = self._settings.kvtier_config(dp_rank=self._dp_rank, dp_size=self._dp_size)
        self._clients: List[Any]
        # Tiers whose loads are asynchronous (async_load "auto"): the daemon's are not known
        # here when attached.
        self._slow_tiers = bool(config.get("service.socket")) or (
            config.get("g3.enabled") == "true" or config.get("g4.backend") not in ("", "none"))
        if config.get("service.socket"):
            # Attached (docs/service.md): the daemon holds the index; ask it directly, under
            # each worker's instance name, not the workers.
            self._clients = [DaemonLookupClient(config, d.service_instance(config, pp, r))
                             for pp in pp_stages for r in range(d.tp_size)]
        else:
            self._clients = [LookupClient(d.instance(pp), r)
                             for pp in pp_stages for r in range(d.tp_size)]
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
                warn_once(logger, self._warned, "params",
                          f"kvtier: request {request.request_id}: {controls.error}; kvtier "
                          f"ignores this request")
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
        state.lookup_tokens, state.lookup_by_tier, state.lookup_async = 0, NO_HIT, False


    def _keying(self, state: _SchedReq) -> Optional[List[bytes]]:
        if state.extras is None and not state.refused:
            try:
                state.extras = block_extras(state.request, self._block_size)
            except UnkeyableRequest as e:
                state.refused = str(e)
                warn_once(logger, self._warned, "unkeyable",
                          f"kvtier: request {state.request.request_id} is neither loaded nor "
                          f"saved: {e}")
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
                queries = self._hybrid.queries(state.key, tokens, num_computed_tokens, salt,
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
            state.lookup_tokens, state.lookup_by_tier, state.lookup_async = 0, NO_HIT, False
            return 0, False
        answers = [r[1] for r in results]
        cap = None
        if c.max_load_tokens is not None:
            cap = c.max_load_tokens - c.max_load_tokens % self._block_size
        if self._groups.hybrid:
            num, by_tier = self._hybrid.hit(answers, len(pending[1]) // len(self._clients),
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
        for tier, blocks in zip(("G2", "G3", "G4"), state.lookup_by_tier[1:], strict=False):
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

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KvtierMetadata:
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

    def stats(self) -> Optional[KvtierConnectorStats]:
        """The scheduler's share of get_kv_connector_stats, since the last call."""
        # Whole microseconds: vLLM's offline metrics reader truncates counters to integers.
        data = dict(self._sched_counts)
        data["lookup_microseconds"] = int(self._lookup_seconds * 1e6)
        self._sched_counts, self._lookup_seconds = collections.Counter(), 0.0
        stats = KvtierConnectorStats(data=data)
        return None if stats.is_empty() else stats

    def reset_cache(self) -> bool:
        """vLLM's reset_prefix_cache(reset_connector=True): see KvtierConnector.reset_cache."""
        self._epoch = self._settings.bump_epoch(self._epoch, dp_rank=self._dp_rank,
                                                dp_size=self._dp_size)
        return True

    def shutdown(self) -> None:
        for c in getattr(self, "_clients", []):
            c.close()

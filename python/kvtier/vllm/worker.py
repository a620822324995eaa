"""The worker side of KvtierConnector, in each vLLM model worker (one per tensor-parallel rank
and pipeline stage).

It owns a kvtier BlockManager (the index, G2, G3 and G4) over vLLM's KV tensors: G1<->G2 copies
are kvtier's own memcpy workers reading and writing them in place, no copy passes through Python
or a socket. It answers the scheduler's lookups (kvtier/vllm/lookup.py's LookupServer; attached
to ``kvtier serve``, the daemon answers them), and carries out each step's plan (metadata.py):
loads before the forward pass, saves after it, finished requests reported back once. connector.py's
module docstring has the rules it keeps (1 to 4).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Set, Tuple

import torch
from vllm.logger import init_logger

import kvtier
from kvtier.vllm.deployment import Deployment, warn_once
from kvtier.vllm.groups import (
    FULL,
    GROUP_TAG,
    SLIDING,
    STATE,
    first_held,
    group_key,
    held_ids,
    state_table,
)
from kvtier.vllm.layout_vouch import LayoutVouch
from kvtier.vllm.layouts import KvCacheLayout
from kvtier.vllm.lookup import LookupServer
from kvtier.vllm.metadata import (
    NO_HIT,
    REPORT_RECVING,
    REPORT_SENDING,
    FinishSpec,
    KvtierMetadata,
    LoadSpec,
    vllm_id,
)
from kvtier.vllm.observe import KvtierConnectorStats, KvtierKVEvents, vllm_events, worker_stats
from kvtier.vllm.registration import describe_registration, off_vllm_cores
from kvtier.vllm.sleep import G1Sleep, KvtierSleepError

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

logger = init_logger("kvtier.vllm")

_FINISHED_KEYS_KEPT = 65536  # late lookups for these keys are answered 0 without the manager


@dataclasses.dataclass
class _WorkerReq:
    tokens: List[int] = dataclasses.field(default_factory=list)
    block_ids: List[int] = dataclasses.field(default_factory=list)
    group_block_ids: List[List[int]] = dataclasses.field(default_factory=list)  # hybrid


class KvtierWorker:
    """KvtierConnector's worker-side hooks (the connector hands each to this object)."""

    def __init__(self, deployment: Deployment, vllm_config: "VllmConfig",
                 kv_cache_config: Optional["KVCacheConfig"]) -> None:
        d = self._deployment = deployment
        self._vllm_config = vllm_config
        self._kv_cache_config = kv_cache_config
        self._settings = d.settings
        self._block_size = d.block_size
        self._groups = d.groups
        self._tp_size, self._pp_size, self._dp_rank = d.tp_size, d.pp_size, d.dp_rank
        self._manager: Optional[kvtier.BlockManager] = None
        self._init_state()

    def _init_state(self) -> None:
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
        self._own_publisher = False  # kvtier publishes its own events (register_kv_caches)
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
        reg = describe_registration(self._deployment, self._vllm_config, self._kv_cache_config,
                                    kv_caches, self._rank, self._pp_rank)
        layout, vouch = reg.layout, reg.vouch
        self._layout, self._layout_vouch = layout, vouch
        self._layer_index = {name: i for i, name in enumerate(layout.layer_names)}
        self._g1.record(reg.kv_caches)
        config = self._settings.kvtier_config(
            tp_rank=self._rank, tp_size=self._tp_size, pp_rank=self._pp_rank,
            pp_size=self._pp_size, dp_rank=self._dp_rank, dp_size=self._deployment.dp_size)
        # With kvtier's own publisher on (events.endpoint), its events go out there; handing them
        # to vLLM's stream as well would make a subscriber of both hear every block twice.
        self._own_publisher = bool(config.get("events.endpoint"))
        attached = bool(config.get("service.socket"))
        if attached:
            config.set("service.instance",
                       self._deployment.service_instance(config, self._pp_rank, self._rank))
        with off_vllm_cores():
            self._manager = kvtier.BlockManager(layout.layout, reg.model_id, config)
            self._manager.register_memory(layout.layout, layout.num_blocks, layout.regions,
                                          layout.on_device)
            if not attached:  # attached: the scheduler asks kvtier serve itself
                self._server = LookupServer(self._deployment.instance(self._pp_rank), self._rank,
                                            self._lookup)
        logger.info("kvtier: rank %d of %d (pp %d, dp %d), %s, %d G1 blocks, model id %r "
                    "(weights fingerprint in %.0f ms); %s", self._rank, self._tp_size,
                    self._pp_rank, self._dp_rank, layout.layout, layout.num_blocks, reg.model_id,
                    reg.fingerprint_s * 1e3, vouch.summary())

    def _lookup(self, key: str, tokens: List[int], num_computed: int, salt: str, lora: str,
                extras: List[bytes], load_tiers: str,
                store_tiers: str) -> Tuple[int, Tuple[int, int, int, int]]:
        assert self._manager is not None, "lookup before register_kv_caches"
        if self._g1.off:
            return 0, NO_HIT  # asleep (kvtier/vllm/sleep.py): a hit could not be loaded
        with self._finished_lock:
            if key.split(GROUP_TAG, 1)[0] in self._finished_keys:
                return 0, NO_HIT  # arrived after the request's end: nothing to remember
        return self._manager.lookup(key, tokens, num_computed, cache_salt=salt,
                                    adapter_id=lora, block_extra=extras, load_tiers=load_tiers,
                                    store_tiers=store_tiers)

    def on_bind(self) -> None:
        """A step's metadata arrived (bind_connector_metadata): the step's state starts anew."""
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
        request runs, and may hand them to another request (or group) in this very step. The
        saves that read such blocks last step end first (their unstarted ones are dropped:
        counted, a later miss). Full-attention blocks stay the request's until
        finished_sending."""
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

    def handle_preemptions(self, kv_connector_metadata: Any) -> None:
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

    def start_load_kv(self, meta: Optional[KvtierMetadata]) -> None:
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
        warn_once(logger, self._warned, "asleep",
                  "kvtier: loads planned while vLLM's KV cache is unregistered (sleep mode) "
                  "are not started; vLLM computes those blocks")
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
    def _prepare_load(m: kvtier.BlockManager, spec: LoadSpec) -> int:
        # An async load is polled through finished(); wait_layer never waits for it.
        return m.prepare_load(spec.key, spec.block_ids, spec.num_tokens,
                              async_load=spec.is_async)

    def _prepare_hybrid_load(self, m: kvtier.BlockManager, spec: LoadSpec) -> None:
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

    def wait_for_save(self, meta: Optional[KvtierMetadata]) -> None:
        m = self._manager
        if m is None:
            return
        self._settle_sync_loads()
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
                for table, ids in zip(req.group_block_ids, save.group_block_ids, strict=False):
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

    def _commit_groups(self, m: kvtier.BlockManager, key: str, req: _WorkerReq,
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

    def _settle_hybrid_loads(self, m: kvtier.BlockManager, loads_done: List[str],
                             recving: Set[str]) -> None:
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

    def take_failed_recving(self) -> Set[str]:
        """The vLLM ids whose hybrid load lost blocks since the last call (failed_recving)."""
        failed, self._failed_recving = self._failed_recving, set()
        return failed

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

    def kv_cache_events(self) -> Optional[KvtierKVEvents]:
        if self._manager is None or self._layout is None:
            return None
        raw = self._manager.take_events(details=True)
        if self._rank != 0 or self._pp_rank != 0 or self._own_publisher:
            return None
        if not raw:
            return None
        out = KvtierKVEvents(num_workers=1)
        out.add_events(vllm_events(raw, self._block_size, self._groups.groups))
        return out

    def stats(self) -> Optional[KvtierConnectorStats]:
        """The worker's share of get_kv_connector_stats, since the last call."""
        if self._manager is None:
            return None
        counts = dict(self._worker_counts)
        if self._server is not None:
            counts.update(("lookup_server_" + k, v) for k, v in self._server.stats().items())
        delta = worker_stats(self._manager.stats(), counts.pop("load_error_blocks", 0), counts,
                             self._stats_prev)
        stats = KvtierConnectorStats(data=delta)
        return None if stats.is_empty() else stats

    def shutdown(self) -> None:
        server, self._server = getattr(self, "_server", None), None
        if server is not None:
            server.close()
        m, self._manager = getattr(self, "_manager", None), None
        if m is not None:
            m.close()  # the same clean flush to G3 as the C++ manager's destructor

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


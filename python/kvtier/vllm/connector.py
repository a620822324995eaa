"""KvtierConnector: kvtier as a vLLM KV connector (KVConnectorBase_V1).

Load it with::

    kv_transfer_config={"kv_connector": "KvtierConnector",
                        "kv_connector_module_path": "kvtier.vllm",
                        "kv_role": "kv_both",
                        "kv_connector_extra_config": {"g2.capacity_bytes": "4GiB"}}

Where things live (docs/vllm.md says why). This class is a thin adapter, as vLLM's own
OffloadingConnector is: it hands each of vLLM's hooks to a scheduler-side object
(scheduler.py, in the engine-core process) or a worker-side object (worker.py, in each model
worker), whichever its role built. metadata.py holds what the first sends the second each step,
deployment.py what both read from vLLM's configuration.

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

from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Set, Tuple

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
    KVConnectorTransferResults = None

    class SupportsHMA:  # type: ignore[no-redef]
        pass
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)
from vllm.logger import init_logger
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvtier.vllm import compat
from kvtier.vllm.deployment import Deployment
from kvtier.vllm.groups import plan_groups
from kvtier.vllm.metadata import KvtierMetadata
from kvtier.vllm.observe import KvtierConnectorStats, KvtierKVEvents, KvtierPromMetrics
from kvtier.vllm.scheduler import KvtierScheduler
from kvtier.vllm.settings import ConnectorSettings
from kvtier.vllm.worker import KvtierWorker

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


class KvtierConnector(KVConnectorBase_V1, SupportsHMA):  # type: ignore[misc]  # vLLM's: Any
    """vLLM's KV connector over kvtier's BlockManager (see the module docstring). A
    SupportsHMA: vLLM keeps its hybrid memory allocator on for hybrid models
    (kvtier/vllm/groups.py says which groups kvtier moves). Exactly one of connector_scheduler
    and connector_worker is set, by the role vLLM builds it in."""

    _cache_hit_source = CacheHitSource.HOST

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 kv_cache_config: Optional["KVCacheConfig"] = None) -> None:
        # Refuses (VllmNotVouched) a vLLM whose structures kvtier has not seen (compat.py).
        _vouch_for_vllm()
        super().__init__(vllm_config, role, kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        settings = ConnectorSettings.parse(extra)
        block_size = vllm_config.cache_config.block_size
        pc = vllm_config.parallel_config
        self._tp_size = pc.tensor_parallel_size
        self._pp_size = pc.pipeline_parallel_size
        dp_rank, dp_size, _ = compat.parallel_ranks(pc)
        self._check_deployment(vllm_config)
        groups = plan_groups(kv_cache_config, block_size)
        if groups.refused and role == KVConnectorRole.SCHEDULER:
            logger.warning("kvtier: %s. kvtier neither loads nor saves for this model; vLLM "
                           "runs it with its hybrid KV cache manager as without kvtier.",
                           groups.refused)
        self._deployment = Deployment(
            settings=settings, block_size=block_size,
            engine_id=str(self._kv_transfer_config.engine_id), tp_size=self._tp_size,
            pp_size=self._pp_size, dp_rank=dp_rank, dp_size=dp_size, groups=groups,
            model_name=settings.model_id or str(vllm_config.model_config.model),
            # Disaggregated prefill/decode (docs/pd.md): vLLM's kv_role, or per request vLLM's
            # own do_remote_prefill / do_remote_decode.
            kv_role=compat.kv_role(self._kv_transfer_config))
        self.connector_scheduler: Optional[KvtierScheduler] = None
        self.connector_worker: Optional[KvtierWorker] = None
        if role == KVConnectorRole.SCHEDULER:
            self._apply_load_failure_policy(settings)
            self.connector_scheduler = KvtierScheduler(self._deployment)
        else:
            self.connector_worker = KvtierWorker(self._deployment, vllm_config, kv_cache_config)

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

    def _apply_load_failure_policy(self, settings: ConnectorSettings) -> None:
        # vLLM reads kv_load_failure_policy right after building the scheduler's connector. Its
        # default is "fail", and it cannot say whether the user chose it: kvtier keeps an
        # explicit "recompute", or its own load_failure_policy setting when given, and
        # otherwise recomputes (kvtier is a cache: a lost block is a miss).
        chosen = settings.load_failure_policy
        if chosen == "auto":
            current = compat.load_failure_policy(self._kv_transfer_config)
            if current != "recompute":
                logger.info("kvtier: kv_load_failure_policy is 'fail' (vLLM's default); "
                            "kvtier recomputes blocks that fail to load instead. Set "
                            "load_failure_policy='fail' in kv_connector_extra_config to fail "
                            "such requests.")
            chosen = "recompute"
        self._kv_transfer_config.kv_load_failure_policy = chosen

    @property
    def _scheduler(self) -> KvtierScheduler:
        assert self.connector_scheduler is not None, "a scheduler-side hook on a worker"
        return self.connector_scheduler

    def _meta(self) -> Optional[KvtierMetadata]:
        if not self.has_connector_metadata():
            return None
        meta = self._get_connector_metadata()
        return meta if isinstance(meta, KvtierMetadata) else None

    # ======================= scheduler side (scheduler.py) =======================

    @property
    def requires_kv_delivery(self) -> bool:
        # A dropped save is only a future miss: a preempted request need not be recomputed
        # for kvtier's sake.
        return False

    def get_num_new_matched_tokens(self, request: "Request",
                                   num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def may_load_async(self, request: "Request") -> bool:
        """vLLM 0.34, with --max-num-inflight-kv-loads: KvtierScheduler.may_load_async."""
        return self._scheduler.may_load_async(request)

    def get_external_cache_hit_sources(self, request: "Request",
                                       num_external_tokens: int) -> Dict[CacheHitSource, int]:
        return self._scheduler.get_external_cache_hit_sources(request, num_external_tokens)

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks",
                                 num_external_tokens: int) -> None:
        self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        return self._scheduler.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: "KVConnectorOutput") -> None:
        self._scheduler.update_connector_output(connector_output)

    def request_finished(self, request: "Request",
                         block_ids: List[int]) -> Tuple[bool, Optional[Dict[str, Any]]]:
        return self._scheduler.request_finished(request, block_ids)

    def request_finished_all_groups(self, request: "Request", block_ids: Tuple[List[int], ...]
                                    ) -> Tuple[bool, Optional[Dict[str, Any]]]:
        """SupportsHMA: request_finished for every group at once (vLLM calls this one, not
        request_finished, on a SupportsHMA connector, whatever the number of groups)."""
        return self._scheduler.request_finished_all_groups(request, block_ids)

    def take_events(self) -> Iterable[KVCacheEvent]:
        return self._scheduler.take_events()

    def reset_cache(self) -> Optional[bool]:
        """vLLM's reset_prefix_cache(reset_connector=True). Every block stored so far becomes
        unreachable for this engine: later requests key under a new namespace (an epoch in the
        salt, kept in g3.dir so a restart does not revive the keys from before the reset), and
        the old blocks leave the tiers as eviction takes them. (vLLM's plain
        reset_prefix_cache() leaves kvtier alone.)"""
        if self.connector_scheduler is None:
            return None
        return self.connector_scheduler.reset_cache()

    # ======================= worker side (worker.py) =======================

    def register_kv_caches(self, kv_caches: Dict[str, torch.Tensor]) -> None:
        if self.connector_worker is not None:
            self.connector_worker.register_kv_caches(kv_caches)

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if self.connector_worker is not None:
            self.connector_worker.on_bind()

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        if self.connector_worker is not None:
            self.connector_worker.handle_preemptions(kv_connector_metadata)

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        if self.connector_worker is not None:
            self.connector_worker.start_load_kv(self._meta())

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self.connector_worker is not None:
            self.connector_worker.wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor,
                      attn_metadata: "AttentionMetadata", **kwargs: Any) -> None:
        # kvtier saves whole blocks once every layer is computed (wait_for_save).
        return

    def wait_for_save(self) -> None:
        if self.connector_worker is not None:
            self.connector_worker.wait_for_save(self._meta())

    def get_transfer_results(self, finished_req_ids: Set[str]) -> Any:
        """get_finished, plus the hybrid loads that failed (vLLM's failed_recving)."""
        sending, recving = self.get_finished(finished_req_ids)
        w = self.connector_worker
        failed = w.take_failed_recving() if w is not None else set()
        assert KVConnectorTransferResults is not None
        return KVConnectorTransferResults(finished_sending=set(sending or ()),
                                          finished_recving=set(recving or ()),
                                          failed_recving=failed)

    def get_finished(self, finished_req_ids: Set[str]) -> Tuple[Optional[Set[str]],
                                                                 Optional[Set[str]]]:
        if self.connector_worker is None:
            return None, None
        return self.connector_worker.get_finished(finished_req_ids)

    def get_block_ids_with_load_errors(self) -> Set[int]:
        if self.connector_worker is None:
            return set()
        return self.connector_worker.get_block_ids_with_load_errors()

    def get_kv_connector_kv_cache_events(self) -> Optional[KvtierKVEvents]:
        if self.connector_worker is None:
            return None
        return self.connector_worker.kv_cache_events()

    # ---- vLLM's sleep mode (0.33+; kvtier/vllm/sleep.py) ----

    def unregister_kv_caches(self) -> None:
        """Before vLLM frees or remaps the KV cache: kvtier's own saves and loads end first,
        then kvtier touches no G1 byte until restore_kv_caches. Idempotent."""
        if self.connector_worker is not None:
            self.connector_worker.unregister_kv_caches()

    def restore_kv_caches(self) -> None:
        """After vLLM mapped the KV cache again: kvtier may touch it again, if it is where it
        was registered; otherwise kvtier stays off it for good and raises KvtierSleepError.
        Idempotent."""
        if self.connector_worker is not None:
            self.connector_worker.restore_kv_caches()

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

    def get_kv_connector_stats(self) -> Optional[KVConnectorStats]:
        if self.connector_scheduler is not None:
            return self.connector_scheduler.stats()
        if self.connector_worker is not None:
            return self.connector_worker.stats()
        return None

    def shutdown(self) -> None:
        worker = getattr(self, "connector_worker", None)
        if worker is not None:
            worker.shutdown()
        scheduler = getattr(self, "connector_scheduler", None)
        if scheduler is not None:
            scheduler.shutdown()

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

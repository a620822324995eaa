"""Every vLLM structure whose shape depends on vLLM's version, read in one place, and the
start-up check that refuses a vLLM kvtier cannot vouch for (docs/vllm.md, "vLLM versions").

kvtier is tested against vLLM 0.32, 0.33 and 0.34 (``TESTED``). What moved between them, and
how this module reads each version:

- 0.34 removed ``CachedRequestData.resumed_req_ids``: a resumed request is sent again in
  ``scheduled_new_reqs`` with its whole block table (``scheduled_updates``).
- 0.34 replaced ``Request.skip_reading_prefix_cache`` with ``skip_reading_external_kv`` and
  ``prefix_cache_hit_limit`` (``skips_external_kv``).
- ``KVConnectorOutput.failed_recving``, ``Request.num_publishable_block_hashes`` and
  ``SchedulerOutput.kv_connector_block_state`` exist only in some versions (read as absent).
- 0.33 added the sleep-mode hooks (``has_sleep_hooks``), 0.34 ``may_load_async`` (asked only
  with ``--max-num-inflight-kv-loads``); both are checked where vLLM has them (``_OPTIONAL``).

``check_vllm`` compares what kvtier reads (``REQUIREMENTS``) with the installed classes. In a
tested version every requirement must hold; outside it, kvtier runs only if every one holds,
and logs what was checked. Otherwise it raises ``VllmNotVouched``, naming what changed and the
last tested version: kvtier never runs on structures it has not seen.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, cast

# (major, minor) of every vLLM release line kvtier's tests run against (tests/vllm/, and the
# version matrix of tests/vllm/run-matrix.sh).
TESTED: Tuple[Tuple[int, int], ...] = ((0, 32), (0, 33), (0, 34))
LAST_TESTED = "0.34.0"


class VllmNotVouched(RuntimeError):
    """The installed vLLM differs from every version kvtier was tested with in something
    kvtier relies on."""


def parse_version(text: str) -> Tuple[int, int, int]:
    """(major, minor, patch) of a version string such as '0.34.0', '0.33.1rc2+cu130' or
    '0.32.0+cpu'; (0, 0, 0) when it has no leading number."""
    m = re.match(r"\s*v?(\d+)(?:\.(\d+))?(?:\.(\d+))?", text or "")
    if not m:
        return (0, 0, 0)
    return (int(m.group(1)), int(m.group(2) or 0), int(m.group(3) or 0))


def vllm_version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "") or "unknown")


def is_tested(version: str) -> bool:
    return parse_version(version)[:2] in TESTED


# ---------------------------------------------------------------------------------------------
# Reading the structures that differ between versions
# ---------------------------------------------------------------------------------------------

Update = Tuple[str, Optional[Tuple[List[int], ...]], bool]


def scheduled_updates(scheduler_output: Any) -> List[Update]:
    """(request id, new block ids per group, replace) for every request scheduled in this step.
    replace: the block ids are the request's whole table (a new request, or a resumed one:
    0.32/0.33 list it in scheduled_cached_reqs.resumed_req_ids, 0.34 sends it again in
    scheduled_new_reqs); otherwise they are appended to what it had."""
    updates: List[Update] = [(r.req_id, r.block_ids, True)
                             for r in scheduler_output.scheduled_new_reqs]
    cached = scheduler_output.scheduled_cached_reqs
    resumed = resumed_ids(cached)
    for i, rid in enumerate(cached.req_ids):
        updates.append((rid, cached.new_block_ids[i], rid in resumed))
    return updates


def resumed_ids(cached: Any) -> Set[str]:
    """The requests of a CachedRequestData that resume after a preemption (whose block ids
    are a whole new table); always empty on 0.34, which sends them as new requests."""
    ids = getattr(cached, "resumed_req_ids", None)
    return set(ids) if ids else set()


def skips_external_kv(request: Any) -> bool:
    """True when vLLM will not take KV from a connector for this request: 0.34's
    skip_reading_external_kv (set whenever prefix_cache_hit_limit bounds the request's hit,
    e.g. prompt logprobs), 0.32/0.33's skip_reading_prefix_cache."""
    if hasattr(request, "skip_reading_external_kv"):
        return bool(request.skip_reading_external_kv)
    return bool(getattr(request, "skip_reading_prefix_cache", False))


def prefix_cache_hit_limit(request: Any) -> Optional[int]:
    """0.34's bound on a request's prefix cache hit (None: unbounded, or an older vLLM)."""
    limit = getattr(request, "prefix_cache_hit_limit", None)
    return int(limit) if limit is not None else None


def num_preemptions(request: Any) -> int:
    return int(getattr(request, "num_preemptions", 0) or 0)


def kv_transfer_params(request: Any) -> Any:
    return getattr(request, "kv_transfer_params", None)


def publishable_blocks(request: Any) -> Optional[int]:
    """How many of a request's blocks hold published KV (newer vLLMs; None where vLLM does not
    say)."""
    n = getattr(request, "num_publishable_block_hashes", None)
    return n if isinstance(n, int) and n >= 0 else None


def boundary_state_offloads(scheduler_output: Any) -> Dict[str, Sequence[Tuple[int, int, int]]]:
    """req id -> (group, G1 block, end token) of the mamba states vLLM hands over at block
    boundaries (hybrid models; {} where vLLM has no such field)."""
    block_state = getattr(scheduler_output, "kv_connector_block_state", None)
    return getattr(block_state, "boundary_state_offloads", None) or {}


def failed_recving(connector_output: Any) -> Sequence[str]:
    return getattr(connector_output, "failed_recving", None) or ()


def parallel_ranks(parallel_config: Any) -> Tuple[int, int, int]:
    """(DP rank, DP size, nodes within a DP replica). data_parallel_index: the replica's rank
    even where vLLM resets data_parallel_rank to 0 (dense models)."""
    pc = parallel_config
    dp_rank = int(getattr(pc, "data_parallel_index", None)
                  or getattr(pc, "data_parallel_rank", 0) or 0)
    dp_size = int(getattr(pc, "data_parallel_size", 1) or 1)
    try:
        nnodes = int(getattr(pc, "nnodes_within_dp", None) or getattr(pc, "nnodes", 1) or 1)
    except ValueError:
        nnodes = int(getattr(pc, "nnodes", 1) or 1)
    return dp_rank, dp_size, nnodes


def kv_role(kv_transfer_config: Any) -> str:
    return str(getattr(kv_transfer_config, "kv_role", None) or "kv_both")


def load_failure_policy(kv_transfer_config: Any) -> str:
    return str(getattr(kv_transfer_config, "kv_load_failure_policy", "fail"))


@dataclasses.dataclass(frozen=True)
class GroupSpec:
    """What kvtier reads of one KV cache group (vLLM's KVCacheGroupSpec and its spec), fields
    that some versions or spec types lack read as their "absent" meaning."""
    spec_type: str  # FullAttentionSpec, SlidingWindowSpec, MambaSpec, ...
    layer_names: Tuple[str, ...]
    block_size: Optional[int]
    sliding_window: int  # 0: none
    transferable: bool  # enable_kv_transfer (newer vLLMs; True when absent)
    host_resident: bool  # in a host pool (newer vLLMs; False when absent)
    mamba_cache_mode: str  # "none" when absent
    speculative_blocks: int
    prefill_checkpoint_blocks: int


def kv_cache_groups(kv_cache_config: Any) -> List[GroupSpec]:
    """Every KV cache group of vLLM's KVCacheConfig ([] when vLLM passes no config)."""
    out = []
    for g in list(getattr(kv_cache_config, "kv_cache_groups", None) or []):
        spec = g.kv_cache_spec
        bs = getattr(spec, "block_size", None)
        out.append(GroupSpec(
            spec_type=type(spec).__name__, layer_names=tuple(g.layer_names),
            block_size=int(bs) if bs is not None else None,
            sliding_window=int(getattr(spec, "sliding_window", 0) or 0),
            transferable=bool(getattr(g, "enable_kv_transfer", True)),
            host_resident=bool(getattr(g, "host_resident", False)),
            mamba_cache_mode=str(getattr(spec, "mamba_cache_mode", "none")),
            speculative_blocks=int(getattr(spec, "num_speculative_blocks", 0) or 0),
            prefill_checkpoint_blocks=int(getattr(spec, "num_prefill_checkpoint_blocks", 0)
                                          or 0)))
    return out


def hash_block_size(kv_cache_config: Any) -> Optional[int]:
    """The block size vLLM hashes prefixes with, where it differs from the cache's (None:
    vLLM does not say)."""
    n = getattr(kv_cache_config, "hash_block_size", None)
    return int(n) if n is not None else None


def kv_cache_num_blocks(kv_cache_config: Any) -> Optional[int]:
    """The KV cache manager's block count (None where vLLM passes no config)."""
    n = getattr(kv_cache_config, "num_blocks", None)
    return int(n) if n is not None else None


def hands_over_boundary_states() -> bool:
    """Whether the scheduler hands mamba states at block boundaries to connectors
    (SchedulerOutput.kv_connector_block_state)."""
    try:
        from vllm.v1.core.sched.output import KVConnectorBlockState  # noqa: F401
    except ImportError:
        return False
    return True


def mm_features(request: Any) -> Sequence[Any]:
    return getattr(request, "mm_features", None) or ()


def mm_identifier(feature: Any) -> Optional[str]:
    return getattr(feature, "identifier", None)


def prompt_embeds(request: Any) -> Any:
    return getattr(request, "prompt_embeds", None)


def lora(request: Any) -> Any:
    return getattr(request, "lora_request", None)


def lora_path(lora_request: Any) -> str:
    """The adapter's path (lora_path, or path in versions that renamed it; "" when none)."""
    return str(getattr(lora_request, "lora_path", None) or getattr(lora_request, "path", None)
               or "")


# ---------------------------------------------------------------------------------------------
# Reading the worker's attention layers (the KV-tensor half: kvtier/vllm/layout_vouch.py)
# ---------------------------------------------------------------------------------------------
# In 0.32-0.34 every attention layer registers itself in
# compilation_config.static_forward_context under its layer name; its attn_backend class names
# the layout (get_name(), supported_kv_cache_layouts()), its impl writes the KV
# (do_kv_cache_update), and the KV tensor it is handed is the logical [B, H, N, C] view whose
# physical order is the KVCacheLayout vLLM resolved once per engine
# (cache_config.kv_cache_layout, KVCacheConfig.kv_cache_layout).


def attention_layers(vllm_config: Any) -> Dict[str, Any]:
    """layer name -> vLLM's attention module ({} where vLLM registered none, e.g. no model)."""
    cc = getattr(vllm_config, "compilation_config", None)
    ctx = getattr(cc, "static_forward_context", None)
    return dict(ctx) if isinstance(ctx, dict) else {}


def attention_backend(layer: Any) -> Any:
    """The layer's attention backend class (None when it names none)."""
    get = getattr(layer, "get_attn_backend", None)
    if callable(get):
        return get()
    return getattr(layer, "attn_backend", None)


def backend_name(backend: Any) -> str:
    return str(backend.get_name())


def backend_is_mla(backend: Any) -> bool:
    is_mla = getattr(backend, "is_mla", None)
    return bool(is_mla()) if callable(is_mla) else False


def backend_layouts(backend: Any) -> Optional[List[str]]:
    """The KVCacheLayout names the backend's kernels accept, most preferred first; None: any
    layout (the backend declares none, or this vLLM has no such declaration)."""
    fn = getattr(backend, "supported_kv_cache_layouts", None)
    layouts = fn() if callable(fn) else None
    return None if layouts is None else [str(getattr(x, "name", x)) for x in layouts]


def kv_cache_layout_orders() -> Dict[str, Tuple[int, ...]]:
    """vLLM's KVCacheLayout members: name -> stride permutation of the logical
    [L, B, H, N, C] (empty where this vLLM has no such enum)."""
    try:
        from vllm.v1.kv_cache_layout import KVCacheLayout
    except ImportError:
        return {}
    return {m.name: tuple(m.value) for m in KVCacheLayout}


def resolved_kv_cache_layout(vllm_config: Any, kv_cache_config: Any) -> Optional[str]:
    """The KVCacheLayout name vLLM resolved for this engine (None when not (yet) resolved)."""
    name = getattr(getattr(vllm_config, "cache_config", None), "kv_cache_layout", None)
    return str(name) if name else (
        str(getattr(kv_cache_config, "kv_cache_layout", None) or "") or None)


def model_dtype(vllm_config: Any) -> Any:
    """The model's activation dtype (what the attention layers write into the KV cache)."""
    return getattr(getattr(vllm_config, "model_config", None), "dtype", None)


@dataclasses.dataclass
class AttentionLayerInfo:
    """What an attention module says about the KV it keeps."""
    backend: Any  # the backend class
    impl: Any
    kv_cache_dtype: str  # vLLM's cache dtype string: "auto", "fp8_e4m3", ...
    num_kv_heads: Optional[int]
    head_size: Optional[int]
    head_size_v: Optional[int]  # 0 for MLA (one latent)
    isa: Optional[str]  # CPU backends: the kernel family that orders a block's bytes


def attention_layer_info(layer: Any) -> AttentionLayerInfo:
    """Reads an attention module (Attention or MLAAttention of 0.32-0.34). Raises
    AttributeError naming what is missing."""
    backend = attention_backend(layer)
    if backend is None:
        raise AttributeError(f"{type(layer).__name__} has neither get_attn_backend() nor "
                             f"attn_backend")
    impl = getattr(layer, "impl", None)
    mla = backend_is_mla(backend)

    def opt_int(name: str) -> Optional[int]:
        v = getattr(layer, name, None)
        return int(v) if isinstance(v, int) and not isinstance(v, bool) else None

    head_size = opt_int("head_size")
    head_size_v = 0 if mla else (opt_int("head_size_v") or head_size)
    isa = getattr(layer, "isa", None)
    return AttentionLayerInfo(
        backend=backend, impl=impl,
        kv_cache_dtype=str(getattr(layer, "kv_cache_dtype", None) or "auto"),
        num_kv_heads=opt_int("num_kv_heads"), head_size=head_size, head_size_v=head_size_v,
        isa=str(isa) if isa is not None else None)


KvCacheUpdate = Callable[[Any, Any, Any, Any, Any], None]


def kv_cache_update(impl: Any) -> Optional[KvCacheUpdate]:
    """impl.do_kv_cache_update when it takes (layer, key, value, kv_cache, slot_mapping) as
    the attention backends of 0.32-0.34 do (MLA's takes other arguments: None)."""
    fn = getattr(impl, "do_kv_cache_update", None)
    if not callable(fn):
        return None
    try:
        params = _params(fn)
    except (TypeError, ValueError):
        return None
    if params[:5] != ["layer", "key", "value", "kv_cache", "slot_mapping"]:
        return None
    return cast(KvCacheUpdate, fn)


def has_sleep_hooks() -> bool:
    """Whether vLLM tells its KV connector about sleep mode: 0.33+ calls the worker's
    unregister_kv_caches before it frees or remaps the KV cache and restore_kv_caches after;
    0.32 frees it without a word."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    return all(hasattr(KVConnectorBase_V1, name)
               for name in ("unregister_kv_caches", "restore_kv_caches", "supports_sleep_mode"))


def sleep_mode_enabled(model_config: Any) -> bool:
    return bool(getattr(model_config, "enable_sleep_mode", False))


# ---------------------------------------------------------------------------------------------
# The start-up check
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Requirement:
    what: str  # as the refusal names it, e.g. "SchedulerOutput.scheduled_new_reqs"
    check: Callable[[], Optional[str]]  # None when it holds, else what differs


def _fields(cls: Any) -> Set[str]:
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    names = set(getattr(cls, "__annotations__", {}))
    for base in getattr(cls, "__mro__", ())[1:]:
        names |= set(getattr(base, "__annotations__", {}))
    return names


def _has_field(cls: Any, name: str) -> Callable[[], Optional[str]]:
    def check() -> Optional[str]:
        if name in _fields(cls) or isinstance(inspect.getattr_static(cls, name, None), property):
            return None
        return f"{cls.__name__} has no field {name!r}"
    return check


def _instance_attr(cls: Any, names: Sequence[str]) -> Callable[[], Optional[str]]:
    """One of `names` is a property of cls or assigned to self in its source."""
    def check() -> Optional[str]:
        try:
            source = inspect.getsource(cls)
        except (OSError, TypeError):
            source = ""
        for name in names:
            if isinstance(inspect.getattr_static(cls, name, None), property) \
                    or name in _fields(cls) or re.search(rf"self\.{re.escape(name)}\s*[:=]",
                                                         source):
                return None
        return f"{cls.__name__} sets none of {', '.join(names)}"
    return check


def _params(fn: Any) -> List[str]:
    return [p for p in inspect.signature(fn).parameters if p not in ("self", "cls")]


def _method(cls: Any, name: str, params: Sequence[str]) -> Callable[[], Optional[str]]:
    """cls.name exists and its leading parameters are `params` (vLLM calls it with them)."""
    def check() -> Optional[str]:
        fn = getattr(cls, name, None)
        if fn is None:
            return f"{cls.__name__}.{name} is gone"
        got = _params(fn)
        if got[:len(params)] != list(params):
            return (f"{cls.__name__}.{name} takes ({', '.join(got)}); kvtier was written for "
                    f"({', '.join(params)})")
        return None
    return check


def _optional_method(cls: Any, name: str, params: Sequence[str]) -> Callable[[], Optional[str]]:
    """_method for a hook only some versions have: absent is fine, present must match."""
    def check() -> Optional[str]:
        return _method(cls, name, params)() if hasattr(cls, name) else None
    return check


def _abstract(cls: Any, expected: Set[str]) -> Callable[[], Optional[str]]:
    def check() -> Optional[str]:
        got = set(getattr(cls, "__abstractmethods__", ()))
        if got == expected:
            return None
        parts = []
        if got - expected:
            parts.append(f"new abstract methods {sorted(got - expected)}")
        if expected - got:
            parts.append(f"no longer abstract: {sorted(expected - got)}")
        return f"{cls.__name__}: " + "; ".join(parts)
    return check


def _members(enum_cls: Any, names: Sequence[str]) -> Callable[[], Optional[str]]:
    def check() -> Optional[str]:
        missing = [n for n in names if not hasattr(enum_cls, n)]
        return f"{enum_cls.__name__} lacks {missing}" if missing else None
    return check


# KVConnectorBase_V1's abstract methods, the same in 0.32-0.34.
_ABSTRACT = {"get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
             "start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save"}

# Methods vLLM calls on the connector, with the leading parameters kvtier's overrides take.
_CALLED: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("get_num_new_matched_tokens", ("request", "num_computed_tokens")),
    ("update_state_after_alloc", ("request", "blocks", "num_external_tokens")),
    ("build_connector_meta", ("scheduler_output",)),
    ("update_connector_output", ("connector_output",)),
    ("request_finished", ("request", "block_ids")),
    ("take_events", ()),
    ("get_external_cache_hit_sources", ("request", "num_external_tokens")),
    ("register_kv_caches", ("kv_caches",)),
    ("bind_connector_metadata", ("connector_metadata",)),
    ("clear_connector_metadata", ()),
    ("handle_preemptions", ("kv_connector_metadata",)),
    ("start_load_kv", ("forward_context",)),
    ("wait_for_layer_load", ("layer_name",)),
    ("save_kv_layer", ("layer_name", "kv_layer", "attn_metadata")),
    ("wait_for_save", ()),
    ("get_finished", ("finished_req_ids",)),
    ("get_block_ids_with_load_errors", ()),
    ("get_kv_connector_stats", ()),
    ("get_kv_connector_kv_cache_events", ()),
    ("reset_cache", ()),
    ("shutdown", ()),
)

# Hooks of newer vLLMs that kvtier implements (docs/vllm.md, "Sleep mode, may_load_async,
# lookahead hashes"): checked only where vLLM has them.
_OPTIONAL: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("supports_sleep_mode", ("kv_transfer_config",)),
    ("unregister_kv_caches", ()),
    ("restore_kv_caches", ()),
    ("may_load_async", ("request",)),
    ("supports_lookahead_block_hashes", ("kv_transfer_config",)),
)


def requirements() -> List[Requirement]:
    """What kvtier reads of vLLM, each as a check of the installed classes."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorBase_V1,
        KVConnectorRole,
    )
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
    from vllm.v1.metrics.cache_hit_source import CacheHitSource
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

    reqs = [Requirement("KVConnectorBase_V1 abstract methods",
                        _abstract(KVConnectorBase_V1, _ABSTRACT))]
    reqs += [Requirement(f"KVConnectorBase_V1.{name}", _method(KVConnectorBase_V1, name, params))
             for name, params in _CALLED]
    reqs += [Requirement(f"KVConnectorBase_V1.{name} (where vLLM has it)",
                         _optional_method(KVConnectorBase_V1, name, params))
             for name, params in _OPTIONAL]
    reqs += [Requirement(f"SchedulerOutput.{f}", _has_field(SchedulerOutput, f))
             for f in ("scheduled_new_reqs", "scheduled_cached_reqs", "num_scheduled_tokens",
                       "preempted_req_ids", "finished_req_ids")]
    reqs += [Requirement(f"NewRequestData.{f}", _has_field(NewRequestData, f))
             for f in ("req_id", "block_ids")]
    reqs += [Requirement(f"CachedRequestData.{f}", _has_field(CachedRequestData, f))
             for f in ("req_ids", "new_block_ids")]
    reqs += [Requirement(f"KVConnectorOutput.{f}", _has_field(KVConnectorOutput, f))
             for f in ("finished_sending", "finished_recving", "invalid_block_ids",
                       "kv_cache_events")]
    reqs += [Requirement(f"Request.{a}", _instance_attr(Request, (a,)))
             for a in ("request_id", "all_token_ids", "num_computed_tokens",
                       "num_prompt_tokens", "cache_salt", "num_preemptions",
                       "kv_transfer_params", "lora_request", "mm_features")]
    reqs.append(Requirement("Request.skip_reading_external_kv or skip_reading_prefix_cache",
                            _instance_attr(Request, ("skip_reading_external_kv",
                                                     "skip_reading_prefix_cache"))))
    reqs.append(Requirement("KVCacheBlocks.get_block_ids",
                            _method(KVCacheBlocks, "get_block_ids", ())))
    reqs.append(Requirement("KVConnectorRole", _members(KVConnectorRole, ("SCHEDULER", "WORKER"))))
    reqs.append(Requirement("CacheHitSource", _members(
        CacheHitSource, ("HOST", "DISK", "EXTERNAL_UNSPECIFIED"))))
    return reqs


@dataclasses.dataclass
class CheckReport:
    version: str
    tested: bool
    checked: List[str]
    problems: List[str]

    def summary(self) -> str:
        return (f"vLLM {self.version} ({'a tested version' if self.tested else 'not tested'}): "
                f"{len(self.checked) - len(self.problems)} of {len(self.checked)} structures "
                f"kvtier relies on as it expects")


def check_vllm(version: Optional[str] = None) -> CheckReport:
    """Checks every requirement against the installed vLLM (the given version string, or
    vllm.__version__). Raises VllmNotVouched when one does not hold: in a tested version that
    means vLLM was changed (patched, a fork); outside, that the new version moved something
    kvtier reads. The message names each difference and the last tested version."""
    version = version or vllm_version()
    tested = is_tested(version)
    checked, problems = [], []
    for r in requirements():
        checked.append(r.what)
        try:
            why = r.check()
        except Exception as e:  # a class that cannot be inspected is a difference too
            why = f"{r.what} could not be read ({type(e).__name__}: {e})"
        if why:
            problems.append(why)
    report = CheckReport(version, tested, checked, problems)
    if problems:
        where = ("which is a tested version, but its classes differ from the release's"
                 if tested else f"which kvtier has not been tested with (last tested: "
                                f"{LAST_TESTED})")
        raise VllmNotVouched(
            f"kvtier refuses to run on vLLM {version}, {where}: "
            + "; ".join(problems)
            + f". kvtier would read these structures wrongly (a wrong answer or a crash). Use "
              f"vLLM {', '.join('%d.%d' % t for t in TESTED)}, or a kvtier release that "
              f"supports this vLLM.")
    return report

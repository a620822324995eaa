"""Type stubs of kvtier's native module (python/src/kvtier_bindings.cc)."""

from typing import Any, Dict, List, Optional, Sequence, Tuple

NUM_TIERS: int
TIER_NAMES: Tuple[str, str, str, str]
NO_G1_BLOCK: int  # a G1 block id naming no block: Commit skips it, a load stops at it

class KvtierError(RuntimeError):
    code: str  # kvtier's StatusCode name, e.g. "InvalidArgument"
    detail: str  # the message without the code

class Config:
    """kvtier's settings; the same fields as `kvtier config`."""

    def __init__(self) -> None: ...
    def load_file(self, path: str) -> None: ...
    def load_environment(self) -> None: ...
    def set(self, name: str, value: str | int | float | bool) -> None: ...
    def get(self, name: str) -> str: ...
    def is_set(self, name: str) -> bool: ...
    def entries(self) -> List[Tuple[str, str, str, str, str]]: ...
    def warnings(self) -> List[str]: ...
    @staticmethod
    def field_names() -> List[str]: ...

class Layout:
    """The shape of one KV block: layers x planes x tokens x kv heads x head dim x dtype."""

    def __init__(
        self,
        num_layers: int,
        num_planes: int,
        num_kv_heads: int,
        head_dim: int,
        tokens_per_block: int,
        dtype: str,
        g1_arrangement: str = "layer-separate",
    ) -> None: ...
    num_layers: int
    num_planes: int
    num_kv_heads: int
    head_dim: int
    tokens_per_block: int
    dtype: str
    g1_arrangement: str
    chunk_bytes: int
    block_bytes: int
    fingerprint: int

def block_keys(
    tokens: Sequence[int],
    model_id: str,
    layout: Layout,
    cache_salt: str = "",
    adapter_id: str = "",
    algorithm: str = "sha256",
) -> List[bytes]: ...
def stats_fields() -> Tuple[Dict[str, str], ...]:
    """ManagerStats's fields in order (include/kvtier/manager_stats_fields.h): name, shape,
    kind, vllm, metric, label, help."""
    ...

class ServiceLookup:
    """include/kvtier/service_lookup.h: Lookup against kvtier serve (config's service.socket)
    for the attached engine instance `instance_name`; a daemon or instance that is not there
    answers 0 tokens."""

    def __init__(self, config: Config, instance_name: str) -> None: ...
    def lookup(
        self,
        request_id: str,
        prompt: Sequence[int],
        num_computed_tokens: int,
        cache_salt: str = "",
        adapter_id: str = "",
        block_extra: Sequence[bytes] = (),
        load_tiers: str = "",
        store_tiers: str = "",
    ) -> Tuple[int, Tuple[int, int, int, int]]: ...
    def stats(self) -> Dict[str, Any]: ...

class BlockManager:
    """kvtier's connector API (include/kvtier/connector.h), one method per C++ method."""

    def __init__(
        self, layout: Layout, model_id: str, config: Config, event_queue_capacity: int = 65536
    ) -> None: ...
    def close(self) -> None: ...
    def lookup(
        self,
        request_id: str,
        prompt: Sequence[int],
        num_computed_tokens: int,
        cache_salt: str = "",
        adapter_id: str = "",
        block_extra: Sequence[bytes] = (),
        load_tiers: str = "",  # "G2,G3": load only from these; "" every tier
        store_tiers: str = "",  # "G2": store only there (no G3 demotion, no G4); "" every tier
    ) -> Tuple[int, Tuple[int, int, int, int]]: ...
    # async_load: the engine polls finished() for it; wait_layer never waits for it.
    def prepare_load(
        self,
        request_id: str,
        g1_block_ids: Sequence[int],
        num_external_tokens: int,
        async_load: bool = False,
    ) -> int: ...
    def commit(
        self, request_id: str, tokens: Sequence[int], g1_block_ids: Sequence[int]
    ) -> None: ...
    def request_finished(self, request_id: str) -> bool: ...
    def register_memory(
        self,
        layout: Layout,
        num_blocks: int,
        regions: Sequence[Tuple[int, int]],
        on_device: bool,
    ) -> None: ...
    # engine_stream (device G1): the engine's CUDA stream as an int, e.g.
    # torch.cuda.current_stream().cuda_stream (0 = the legacy default stream); the loads write G1
    # only after the work queued on it so far. None: no ordering.
    def start_load(self, engine_stream: Optional[int] = None) -> None: ...
    def wait_layer(self, layer: int) -> Optional[str]: ...
    def loaded_tokens(self, request_id: str) -> int: ...
    # engine_stream as for start_load: the saves read G1 only after the work queued on it so far.
    def start_save(self, engine_stream: Optional[int] = None) -> None: ...
    def wait_for_saves(self) -> None: ...
    # Preemption: drops the request's unstarted saves, waits until none of its saves reads G1.
    def wait_for_request_saves(self, request_id: str) -> None: ...
    def finished(self) -> Tuple[List[str], List[str]]: ...
    def stats(self) -> Dict[str, Any]: ...
    # details=False: (kind, key, parent, tier, time_ns) tuples; details=True: dicts with those
    # names plus token_ids, block_size, parent_is_root, lora_name, cache_salt, namespace_known.
    def take_events(self, details: bool = False) -> List[Any]: ...
    @property
    def layout(self) -> Layout: ...

# The router's bindings (python/src/router_bindings.cc).
class BlockHasher:
    """Chained block keys under one namespace (include/kvtier/block_key.h)."""

    def __init__(
        self,
        model_id: str,
        tokens_per_block: int,
        cache_salt: str = "",
        adapter_id: str = "",
        layout_fingerprint: int = 0,
        algorithm: str = "sha256",
    ) -> None: ...
    @property
    def tokens_per_block(self) -> int: ...
    @property
    def root(self) -> bytes: ...
    # The key of the block holding `tokens` (exactly tokens_per_block) after `parent`.
    def chain(self, parent: bytes, tokens: Sequence[int]) -> bytes: ...
    # The keys of the full blocks of a prompt, first block first.
    def keys(self, tokens: Sequence[int]) -> List[bytes]: ...

class KvRouter:
    """Prefix index over workers' KV events and the tier-aware TTFT estimate
    (include/kvtier/router.h)."""

    def __init__(
        self,
        tokens_per_block: int,
        block_bytes: int,
        prefill_tokens_per_s: float,
        load_gbps: Sequence[float] = ...,
        queue_weight: float = 1.0,
        max_blocks_per_worker_tier: int = 0,
    ) -> None: ...
    def add_worker(self, worker: int) -> None: ...
    def remove_worker(self, worker: int) -> None: ...
    def set_up(self, worker: int, up: bool) -> None: ...
    def set_queue(self, worker: int, seconds: float) -> None: ...
    # Each event: (kind "stored"|"removed", 16-byte key, tier "G1".."G4").
    def apply(self, worker: int, events: List[Tuple[str, bytes, str]]) -> None: ...
    def clear(self, worker: int, tiers: Sequence[str]) -> None: ...
    # {"worker": id, "candidates": [dict per candidate]}
    def route(self, keys: List[bytes], prompt_tokens: int) -> Dict[str, Any]: ...
    def block_count(self, worker: int, tier: str) -> int: ...

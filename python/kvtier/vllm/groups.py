"""vLLM's KV cache groups (its hybrid memory allocator, HMA) as kvtier sees them.

A hybrid model (Gemma 2/3, gpt-oss: global attention mixed with sliding-window layers) gets
several KV cache groups from vLLM, each with its own block table over one shared block pool;
the j-th layer of every group views the same memory, so a block id names the same bytes in
every group, and the group that owns the id decides which layer's KV they hold.

kvtier keeps each group as its own key space (docs/hybrid.md): a request's blocks in group g
are a kvtier request of their own, keyed by the same token chain under a salt that names the
group. One kvtier layout (the layers of one group) then serves every group: a load or a save
of group g at block id b moves group g's layers at b.

What kvtier handles: full-attention and sliding-window groups whose layers have one shape and
block size. Anything else (state-space/mamba state, chunked local attention, cross attention,
groups of other block sizes) is refused with the reason; the connector then neither loads nor
saves, and vLLM runs the model with HMA on as it would without kvtier.
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional, Sequence, Tuple

FULL, SLIDING = "full", "sliding"
GROUP_TAG = "\x00kvtier-group-"  # appended to a request's salt: group g's key space


@dataclasses.dataclass(frozen=True)
class KvGroup:
    index: int
    kind: str  # FULL | SLIDING
    window: int  # the sliding window in tokens; 0 for FULL
    layer_names: Tuple[str, ...]

    @property
    def salt_tag(self) -> str:
        return f"{GROUP_TAG}{self.index}"

    @property
    def spec_kind(self) -> str:
        """vLLM's kv_cache_spec_kind for events."""
        return "sliding_window" if self.kind == SLIDING else "full_attention"


@dataclasses.dataclass
class GroupPlan:
    """What kvtier does with a model's KV cache groups."""

    groups: List[KvGroup]  # empty: one group, kvtier's single-table path
    refused: str = ""  # non-empty: kvtier neither loads nor saves (the reason)

    @property
    def hybrid(self) -> bool:
        return len(self.groups) > 1 and not self.refused


def plan_groups(kv_cache_config: Optional[Any], block_size: int) -> GroupPlan:
    """Reads vLLM's KVCacheConfig (None on vLLMs that pass none: one group)."""
    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
    if len(groups) <= 1:
        return GroupPlan([])
    out: List[KvGroup] = []
    for i, g in enumerate(groups):
        spec = g.kv_cache_spec
        name = type(spec).__name__
        window = int(getattr(spec, "sliding_window", 0) or 0)
        if name == "FullAttentionSpec" and not window:
            kind = FULL
        elif name == "SlidingWindowSpec" and window > 0:
            kind = SLIDING
        else:
            return GroupPlan([], refused=(
                f"KV cache group {i} is a {name} (layers {list(g.layer_names)[:3]}...); kvtier "
                f"saves and loads full-attention and sliding-window groups only"))
        if not getattr(g, "enable_kv_transfer", True) or getattr(g, "host_resident", False):
            return GroupPlan([], refused=(
                f"KV cache group {i} ({name}) is not transferable or lives in a host pool "
                f"(enable_kv_transfer / host_resident); kvtier moves plain device groups only"))
        bs = int(getattr(spec, "block_size", block_size))
        if bs != block_size:
            return GroupPlan([], refused=(
                f"KV cache group {i} has block size {bs}, the scheduler {block_size}; kvtier "
                f"needs one block size for every group"))
        out.append(KvGroup(i, kind, window, tuple(g.layer_names)))
    counts = {len(g.layer_names) for g in out}
    if len(counts) != 1:
        return GroupPlan([], refused=(
            f"KV cache groups of different layer counts {sorted(counts)}; kvtier needs groups "
            f"that view the same memory layer by layer"))
    hash_bs = getattr(kv_cache_config, "hash_block_size", None)
    if hash_bs is not None and int(hash_bs) != block_size:
        return GroupPlan([], refused=(
            f"hash_block_size {hash_bs} differs from the block size {block_size}"))
    return GroupPlan(out)


def group_key(key: str, group: int) -> str:
    """The kvtier request id of one group of a request."""
    return f"{key}{GROUP_TAG}{group}"


def check_aliasing(groups: Sequence[KvGroup], kv_caches: Any) -> None:
    """Every group's j-th layer must be the same tensor memory as group 0's j-th layer (vLLM's
    HMA lays groups over one buffer): kvtier registers group 0's layers and moves any group's
    blocks through them. Raises ValueError naming the layers and shapes otherwise."""
    first = groups[0]
    for g in groups[1:]:
        for j, name in enumerate(g.layer_names):
            a, b = kv_caches[first.layer_names[j]], kv_caches[name]
            if (a.data_ptr() != b.data_ptr() or tuple(a.shape) != tuple(b.shape)
                    or tuple(a.stride()) != tuple(b.stride()) or a.dtype != b.dtype):
                raise ValueError(
                    f"kvtier: KV cache group {g.index}'s layer {name} (shape "
                    f"{tuple(b.shape)}, stride {tuple(b.stride())}, {b.dtype}, at "
                    f"{b.data_ptr():#x}) does not view the same memory as group "
                    f"{first.index}'s layer {first.layer_names[j]} (shape {tuple(a.shape)}, "
                    f"stride {tuple(a.stride())}, {a.dtype}, at {a.data_ptr():#x}); kvtier "
                    f"cannot move this model's hybrid KV cache. Run it with "
                    f"disable_hybrid_kv_cache_manager=True, or without kvtier")


def first_held(block_ids: Sequence[int], start: int, end: int) -> int:
    """The first index in [start, end) whose block vLLM holds (not its null block 0); end when
    none. A sliding-window group holds only the blocks inside the window at the end of a hit."""
    for i in range(start, min(end, len(block_ids))):
        if block_ids[i] != 0:
            return i
    return end


def held_ids(block_ids: Sequence[int], no_block: int) -> List[int]:
    """vLLM's table with its null block 0 as kvtier's NO_G1_BLOCK (neither saved nor loaded)."""
    return [b if b != 0 else no_block for b in block_ids]

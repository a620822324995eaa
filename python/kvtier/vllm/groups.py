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
block size, and state-space (mamba) groups in vLLM's "align" prefix-caching mode, whose block
at index j holds the layer's state after (j+1) blocks of tokens when a step ended there. A
state's page is padded to the attention page and views the same memory, so kvtier moves a
state group's blocks through the attention layers (the whole page: the state and its padding).
Anything else (mamba without prefix caching, speculative or checkpoint state blocks, chunked
local attention, cross attention, groups of other block sizes) is refused with the reason; the
connector then neither loads nor saves, and vLLM runs the model with HMA on as it would
without kvtier.
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional, Sequence, Tuple

from kvtier.vllm import compat

FULL, SLIDING, STATE = "full", "sliding", "state"
_SPEC_KINDS = {FULL: "full_attention", SLIDING: "sliding_window", STATE: "mamba"}
GROUP_TAG = "\x00kvtier-group-"  # appended to a request's salt: group g's key space


@dataclasses.dataclass(frozen=True)
class KvGroup:
    index: int
    kind: str  # FULL | SLIDING | STATE
    window: int  # the sliding window in tokens; 0 for FULL
    layer_names: Tuple[str, ...]

    @property
    def salt_tag(self) -> str:
        return f"{GROUP_TAG}{self.index}"

    @property
    def spec_kind(self) -> str:
        """vLLM's kv_cache_spec_kind for events."""
        return _SPEC_KINDS[self.kind]


@dataclasses.dataclass
class GroupPlan:
    """What kvtier does with a model's KV cache groups."""

    groups: List[KvGroup]  # empty: one group, kvtier's single-table path
    refused: str = ""  # non-empty: kvtier neither loads nor saves (the reason)

    @property
    def hybrid(self) -> bool:
        return len(self.groups) > 1 and not self.refused

    @property
    def primary(self) -> int:
        """The first full-attention group: its table stands for the request's blocks (the
        group 0 of a state-space hybrid is often a mamba group)."""
        return next((g.index for g in self.groups if g.kind == FULL), 0)

    @property
    def state_groups(self) -> List[KvGroup]:
        return [g for g in self.groups if g.kind == STATE]


def plan_groups(kv_cache_config: Optional[Any], block_size: int) -> GroupPlan:
    """Reads vLLM's KVCacheConfig (None on vLLMs that pass none: one group)."""
    groups = compat.kv_cache_groups(kv_cache_config)
    if len(groups) <= 1:
        return GroupPlan([])
    out: List[KvGroup] = []
    for i, g in enumerate(groups):
        name = g.spec_type
        window = g.sliding_window
        if name == "FullAttentionSpec" and not window:
            kind = FULL
        elif name == "SlidingWindowSpec" and window > 0:
            kind = SLIDING
        elif name == "MambaSpec":
            why = _state_refusal(g)
            if why:
                return GroupPlan([], refused=f"KV cache group {i} is a MambaSpec {why}")
            kind = STATE
        else:
            return GroupPlan([], refused=(
                f"KV cache group {i} is a {name} (layers {list(g.layer_names)[:3]}...); kvtier "
                f"saves and loads full-attention, sliding-window and mamba (align) groups "
                f"only"))
        if not g.transferable or g.host_resident:
            return GroupPlan([], refused=(
                f"KV cache group {i} ({name}) is not transferable or lives in a host pool "
                f"(enable_kv_transfer / host_resident); kvtier moves plain device groups only"))
        bs = g.block_size if g.block_size is not None else block_size
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
    if not any(g.kind == FULL for g in out):
        return GroupPlan([], refused=(
            "no full-attention KV cache group; kvtier keys a hybrid model's blocks by its "
            "full-attention group"))
    hash_bs = compat.hash_block_size(kv_cache_config)
    if hash_bs is not None and hash_bs != block_size:
        return GroupPlan([], refused=(
            f"hash_block_size {hash_bs} differs from the block size {block_size}"))
    return GroupPlan(out)


def _state_refusal(spec: compat.GroupSpec) -> str:
    """Why kvtier cannot move a MambaSpec group ("" when it can)."""
    mode = spec.mamba_cache_mode
    if mode != "align":
        return (f"in mamba_cache_mode {mode!r} (its block holds the running state, not one at "
                f"a block boundary); kvtier moves mamba groups with prefix caching on "
                f"(mode 'align')")
    if spec.speculative_blocks:
        return ("with speculative state blocks (num_speculative_blocks > 0); kvtier does not "
                "move mamba groups under speculative decoding")
    if spec.prefill_checkpoint_blocks:
        return ("with in-pass prefill checkpoints (num_prefill_checkpoint_blocks > 0); kvtier "
                "moves states only at the block boundaries where a step ended")
    if not compat.hands_over_boundary_states():
        return ("and this vLLM hands no boundary states to connectors "
                "(SchedulerOutput.kv_connector_block_state); kvtier needs it to save states")
    return ""


def group_key(key: str, group: int) -> str:
    """The kvtier request id of one group of a request."""
    return f"{key}{GROUP_TAG}{group}"


def check_aliasing(groups: Sequence[KvGroup], kv_caches: Any, primary: int = 0) -> None:
    """Every group's j-th layer must be the same tensor memory as the primary (full-attention)
    group's j-th layer (vLLM's HMA lays groups over one buffer): kvtier registers the primary
    group's layers and moves any group's blocks through them. An attention group's layer must
    have the same shape, stride and dtype; a state group's must start at the same address,
    have as many blocks, one block every attention page, and a state that fits in the page.
    Raises ValueError naming the layers and shapes otherwise."""
    first = next(g for g in groups if g.index == primary)
    for g in groups:
        if g is first:
            continue
        for j, name in enumerate(g.layer_names):
            a, b = kv_caches[first.layer_names[j]], kv_caches[name]
            if g.kind == STATE:
                page = a.stride(0) * a.element_size()
                state = b[0].numel() * b.element_size()
                ok = (a.data_ptr() == b.data_ptr() and b.shape[0] == a.shape[0]
                      and b.stride(0) * b.element_size() == page and state <= page)
            else:
                ok = (a.data_ptr() == b.data_ptr() and tuple(a.shape) == tuple(b.shape)
                      and tuple(a.stride()) == tuple(b.stride()) and a.dtype == b.dtype)
            if not ok:
                raise ValueError(
                    f"kvtier: KV cache group {g.index}'s layer {name} (shape "
                    f"{tuple(b.shape)}, stride {tuple(b.stride())}, {b.dtype}, at "
                    f"{b.data_ptr():#x}) does not view the same memory as group "
                    f"{first.index}'s layer {first.layer_names[j]} (shape {tuple(a.shape)}, "
                    f"stride {tuple(a.stride())}, {a.dtype}, at {a.data_ptr():#x}); kvtier "
                    f"cannot move this model's hybrid KV cache. Run it with "
                    f"disable_hybrid_kv_cache_manager=True, or without kvtier")


def state_table(length: int, states: Sequence[Tuple[int, int]], no_block: int) -> List[int]:
    """A state group's table for a save: `states` ((block index, G1 block id) of the states vLLM
    handed over at boundaries), every other entry `no_block` (neither saved nor reused: a
    state block between boundaries holds a running or stale state, and vLLM nulls, frees and
    relocates them, so its table is never read positionally)."""
    out = [no_block] * max([length] + [i + 1 for i, _ in states])
    for i, b in states:
        if i >= 0 and b != 0:
            out[i] = b
    return out


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

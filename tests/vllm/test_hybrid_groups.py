"""kvtier/vllm/groups.py against vLLM's own KV cache specs (no model): which group mixes kvtier
moves and which it refuses (with the reason), the aliasing check on real tensors, the window
helpers, and the per-group fields of the events it hands to vLLM.

Run by tests/vllm/run.sh (ctest: vllm_hybrid_test) in the vLLM environment."""

from __future__ import annotations

from typing import Any, List

import pytest
import torch
from vllm.distributed.kv_events import BlockRemoved, BlockStored
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)

import kvtier
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
from kvtier.vllm.observe import vllm_events

BS = 128


def full(bs: int = BS) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=bs, num_kv_heads=2, head_size=64, dtype=torch.float32)


def sliding(window: int = 128, bs: int = BS) -> SlidingWindowSpec:
    return SlidingWindowSpec(block_size=bs, num_kv_heads=2, head_size=64, dtype=torch.float32,
                             sliding_window=window)


def config(specs: List[Any], layers: int = 2, hash_bs: Any = None) -> KVCacheConfig:
    groups = [KVCacheGroupSpec([f"model.layers.{g + k * len(specs)}.attn" for k in range(layers)],
                               spec) for g, spec in enumerate(specs)]
    return KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=groups,
                         hash_block_size=hash_bs)


def test_one_group_is_the_single_table_path() -> None:
    plan = plan_groups(config([full()]), BS)
    assert not plan.hybrid and not plan.refused and plan.groups == []
    assert not plan_groups(None, BS).hybrid


def test_sliding_and_full_groups_are_moved() -> None:
    plan = plan_groups(config([sliding(), sliding(), full()]), BS)
    assert plan.hybrid, plan.refused
    assert [g.kind for g in plan.groups] == [SLIDING, SLIDING, FULL]
    assert [g.window for g in plan.groups] == [128, 128, 0]
    assert plan.groups[0].layer_names == ("model.layers.0.attn", "model.layers.3.attn")
    assert plan.groups[2].spec_kind == "full_attention"
    assert plan.groups[0].spec_kind == "sliding_window"


def mamba(mode: str = "align", **kw: Any) -> MambaSpec:
    return MambaSpec(block_size=BS, shapes=((2, 256),), dtypes=(torch.float32,),
                     mamba_cache_mode=mode, **kw)


def test_mamba_align_groups_are_moved_through_the_full_attention_group() -> None:
    plan = plan_groups(config([mamba(), mamba(), full()]), BS)
    assert plan.hybrid, plan.refused
    assert [g.kind for g in plan.groups] == [STATE, STATE, FULL]
    assert plan.primary == 2, "the full-attention group's table stands for the request"
    assert [g.index for g in plan.state_groups] == [0, 1]
    assert plan.groups[0].spec_kind == "mamba"


@pytest.mark.parametrize("specs,hash_bs,why", [
    ([full(), mamba("none")], None, "KV cache group 1 is a MambaSpec in mamba_cache_mode 'none'"),
    ([full(), mamba(num_speculative_blocks=1)], None, "with speculative state blocks"),
    ([full(), mamba(num_prefill_checkpoint_blocks=1)], None, "in-pass prefill checkpoints"),
    ([sliding(), mamba()], None, "no full-attention KV cache group"),
    ([sliding(bs=64), full()], None, "group 0 has block size 64, the scheduler 128"),
    ([sliding(), full()], 64, "hash_block_size 64 differs from the block size 128"),
])
def test_other_groups_are_refused_with_the_reason(specs: List[Any], hash_bs: Any,
                                                  why: str) -> None:
    plan = plan_groups(config(specs, hash_bs=hash_bs), BS)
    assert not plan.hybrid
    assert why in plan.refused


def test_groups_of_different_layer_counts_are_refused() -> None:
    c = config([sliding(), full()])
    c.kv_cache_groups[1].layer_names.append("model.layers.9.attn")
    assert "different layer counts" in plan_groups(c, BS).refused


def test_aliasing_is_checked_layer_by_layer() -> None:
    plan = plan_groups(config([sliding(), full()]), BS)
    buf = torch.zeros(2, 4, 2, BS, 128)
    caches = {}
    for j in range(2):
        for g in plan.groups:
            caches[g.layer_names[j]] = buf[j]  # group g's j-th layer views buffer j
    check_aliasing(plan.groups, caches)
    caches[plan.groups[1].layer_names[1]] = torch.zeros(4, 2, BS, 128)  # its own memory
    with pytest.raises(ValueError, match="does not view the same memory"):
        check_aliasing(plan.groups, caches)


def test_a_state_group_must_view_the_attention_pages() -> None:
    # vLLM's layout: one int8 buffer; an attention layer views it as [blocks, heads, bs, 2D]
    # floats, a mamba layer as [blocks, 1, 1, state bytes] with one block every page.
    plan = plan_groups(config([mamba(), full()]), BS)
    blocks, page = 4, 2 * BS * 128 * 4
    buf = torch.zeros(2, blocks * page, dtype=torch.int8)
    caches = {}
    for j in range(2):
        caches[plan.groups[1].layer_names[j]] = buf[j].view(torch.float32).view(blocks, 2, BS, 128)
        caches[plan.groups[0].layer_names[j]] = torch.as_strided(
            buf[j], (blocks, 1, 1, 2048), (page, 2048, 2048, 1))
    check_aliasing(plan.groups, caches, plan.primary)
    # A state larger than the page cannot be a padded page of this buffer.
    caches[plan.groups[0].layer_names[1]] = torch.as_strided(
        buf[1], (blocks - 1, 1, 1, page + 1), (page, page + 1, page + 1, 1))
    with pytest.raises(ValueError, match="does not view the same memory"):
        check_aliasing(plan.groups, caches, plan.primary)


def test_state_table_names_only_the_handed_over_states() -> None:
    no = kvtier.NO_G1_BLOCK
    assert state_table(5, [(2, 17)], no) == [no, no, 17, no, no]
    assert state_table(2, [(3, 9)], no) == [no, no, no, 9], "a state past the table extends it"
    assert state_table(3, [(1, 0)], no) == [no] * 3, "vLLM's null block is never a state"
    assert state_table(3, [], no) == [no] * 3


def test_window_helpers() -> None:
    ids = [0, 0, 0, 7, 9, 0]
    assert first_held(ids, 0, 5) == 3
    assert first_held(ids, 4, 5) == 4
    assert first_held([0, 0], 0, 2) == 2  # nothing held: the end
    assert held_ids(ids, kvtier.NO_G1_BLOCK) == [kvtier.NO_G1_BLOCK] * 3 + [7, 9,
                                                                           kvtier.NO_G1_BLOCK]
    assert kvtier.NO_G1_BLOCK == 0xFFFFFFFF
    assert group_key("req#0", 3) == f"req#0{GROUP_TAG}3"


def test_events_carry_the_group_and_hide_its_tag() -> None:
    plan = plan_groups(config([sliding(), full()]), BS)
    raw = [{"kind": "stored", "key": b"k1", "parent": b"p", "tier": "G2", "time_ns": 1,
            "token_ids": [1, 2], "block_size": BS, "parent_is_root": True, "lora_name": "",
            "cache_salt": f"tenant\x00kvtier-epoch-2{GROUP_TAG}0", "namespace_known": True},
           {"kind": "stored", "key": b"k2", "parent": b"p", "tier": "G2", "time_ns": 1,
            "token_ids": [1, 2], "block_size": BS, "parent_is_root": True, "lora_name": "",
            "cache_salt": f"{GROUP_TAG}1", "namespace_known": True},
           {"kind": "removed", "key": b"k1", "parent": b"", "tier": "G2", "time_ns": 2,
            "token_ids": [], "block_size": BS, "parent_is_root": False, "lora_name": "",
            "cache_salt": f"tenant{GROUP_TAG}0", "namespace_known": True}]
    ev = vllm_events(raw, BS, plan.groups)
    assert isinstance(ev[0], BlockStored) and isinstance(ev[2], BlockRemoved)
    assert (ev[0].group_idx, ev[0].kv_cache_spec_kind, ev[0].kv_cache_spec_sliding_window) == (
        0, "sliding_window", 128)
    assert ev[0].extra_keys == [("tenant",)]  # neither the epoch nor the group tag
    assert (ev[1].group_idx, ev[1].kv_cache_spec_kind, ev[1].kv_cache_spec_sliding_window) == (
        1, "full_attention", None)
    assert ev[1].extra_keys is None
    assert ev[2].group_idx == 0
    # A single-group model's events carry no group.
    assert vllm_events(raw[:1], BS)[0].group_idx is None


def test_hybrid_hit_takes_the_longest_boundary_every_state_group_holds_on_every_rank() -> None:
    # The scheduler's reading of its lookups (HybridLookup.hit), without a vLLM:
    # per rank, each state group's probes (the prompt's boundaries, longest first), then every
    # group's whole-prompt answer. Groups: state 0, state 1, full 2; prompt 1000 tokens, 128 a
    # block, nothing local: boundaries 896, 768, ..., 128.
    from kvtier.vllm.hybrid_lookup import HybridLookup

    c = HybridLookup(plan_groups(config([mamba(), mamba(), full()]), BS), BS)
    ends = c.probe_ends(1000, 0)
    assert ends == [896, 768, 640, 512, 384, 256, 128]

    def rank(states: List[List[int]], full_tokens: int) -> List[Any]:
        probes = [(BS if e in held else 0, (0, 0, 0, 0)) for held in states for e in ends]
        return probes + [(0, (0, 0, 0, 0)), (0, (0, 0, 0, 0)), (full_tokens, (0, 5, 0, 0))]

    per = len(ends) * 2 + 3
    # Both groups hold 384 and 896; the full group all 7 blocks: 896.
    one = rank([[384, 896], [384, 896]], 896)
    assert c.hit(one, per, 1000, 0, None) == (896, (0, 5, 0, 0))
    # The full group holds 5 blocks: the longest state within them is 384.
    assert c.hit(rank([[384, 896], [384, 896]], 640), per, 1000, 0, None)[0] == 384
    # One group lacks 896: 384. A cap (max_load_tokens) below 384: nothing.
    assert c.hit(rank([[384, 896], [384]], 896), per, 1000, 0, None)[0] == 384
    assert c.hit(rank([[384, 896], [384, 896]], 896), per, 1000, 0, 256)[0] == 0
    # Two ranks: rank 1 lost 896 in group 0: 384 for both.
    two = one + rank([[384], [384, 896]], 896)
    assert c.hit(two, per, 1000, 0, None)[0] == 384
    # A local hit of 384: the boundaries above it only, the answer past it.
    ends_after = c.probe_ends(1000, 384)
    assert ends_after == [896, 768, 640, 512]
    per_after = len(ends_after) * 2 + 3
    probes = [(BS if e == 896 else 0, (0, 0, 0, 0)) for _ in range(2) for e in ends_after]
    after = probes + [(0, (0, 0, 0, 0))] * 2 + [(512, (0, 4, 0, 0))]
    assert c.hit(after, per_after, 1000, 384, None)[0] == 896 - 384


def test_a_sliding_group_needs_only_the_window_at_the_prompts_last_boundaries() -> None:
    # Groups: sliding 0 (window 128: one block before the hit's end, as vLLM's own rule), full
    # 1. The full group holds 7 blocks (896 tokens); the sliding group lost block 3, so it holds
    # blocks 0-2 contiguously (384 tokens) and blocks 4-6. Its window probes (the prompt's last
    # 4 boundaries: 896, 768, 640, 512) ask for the one block before each.
    from kvtier.vllm.hybrid_lookup import HybridLookup

    c = HybridLookup(plan_groups(config([sliding(), full()]), BS), BS)
    plan = c.probe_plan(1000, 0)
    assert plan == [(0, 896, 768), (0, 768, 640), (0, 640, 512), (0, 512, 384)]
    per = len(plan) + 2

    def answers(window_held: List[int], sliding_tokens: int) -> List[Any]:
        probes = [(BS if e in window_held else 0, (0, 0, 0, 0)) for _, e, _ in plan]
        return probes + [(sliding_tokens, (0, 0, 0, 0)), (896, (0, 7, 0, 0))]

    assert c.hit(answers([896, 768, 640], 384), per, 1000, 0, None) == (896, (0, 7, 0, 0))
    assert c.hit(answers([768, 640], 384), per, 1000, 0, None)[0] == 768
    # No window at the probed boundaries: every block from 0 is needed, as far as they go.
    assert c.hit(answers([], 384), per, 1000, 0, None)[0] == 384
    # Everything held: the full group's answer.
    assert c.hit(answers([], 896), per, 1000, 0, None)[0] == 896
    # A window of 200 tokens at block 128 needs 2 blocks before the hit's end.
    c = HybridLookup(plan_groups(config([sliding(window=200), full()]), BS), BS)
    assert c.probe_plan(1000, 0)[0] == (0, 896, 640)
    # With a local hit of 768 the probe starts there (vLLM holds the blocks before it).
    assert c.probe_plan(1000, 768) == [(0, 896, 768)]


def test_saves_stop_at_the_blocks_vllm_calls_publishable() -> None:
    # vLLM's num_publishable_block_hashes (newer vLLMs; absent in 0.32): no block past it is
    # saved, whatever was computed. Without the field the save covers every computed block.
    import types

    from kvtier.vllm.params import RequestControls
    from kvtier.vllm.scheduler import KvtierScheduler, _SchedReq

    c = object.__new__(KvtierScheduler)
    c._groups = plan_groups(None, BS)
    c._block_size = BS
    c._settings = types.SimpleNamespace(save_decode_tokens=True, consumer_saves_prompt=False)
    c._state_group_ids = set()

    def save(**fields: Any) -> int:
        req = types.SimpleNamespace(all_token_ids=list(range(5 * BS + 3)), num_computed_tokens=0,
                                    num_prompt_tokens=5 * BS + 3, request_id="r", **fields)
        state = _SchedReq(req, RequestControls(), block_ids=list(range(6)))
        spec = c._next_save(state, 5 * BS + 3)
        return 0 if spec is None else len(spec.tokens)

    assert save() == 5 * BS
    assert save(num_publishable_block_hashes=3) == 3 * BS
    assert save(num_publishable_block_hashes=0) == 0

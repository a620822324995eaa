"""vLLM's KV tensor layouts as kvtier regions (python/kvtier/vllm/layouts.py).

The region arithmetic of every layout (CPU backend, FlashAttention's [2, blocks, ...],
FlashInfer's [blocks, 2, ...], MLA) is checked on CPU tensors of the same shapes and strides,
then proven with the real manager: blocks saved out of one set of tensors and loaded into
another come back byte for byte, in the right blocks. On a GPU the same regions go to kvtier's
CUDA backend (on_device=True), which this machine cannot run: docs/cuda.md.
"""

from __future__ import annotations

from typing import Dict, List

import pytest
import torch

import kvtier
from kvtier.vllm.layouts import describe_kv_caches

LAYERS, BLOCKS, TPB, HEADS, HEAD = 3, 10, 16, 2, 8


def make(kind: str, dtype: torch.dtype = torch.float32) -> Dict[str, torch.Tensor]:
    shapes = {
        "cpu": (BLOCKS, HEADS, TPB, 2 * HEAD),
        "flash": (2, BLOCKS, TPB, HEADS, HEAD),
        "flashinfer": (BLOCKS, 2, TPB, HEADS, HEAD),
        "mla": (BLOCKS, TPB, HEAD),
    }
    # One allocation for all layers, one layer after another, as vLLM does.
    whole = torch.zeros((LAYERS,) + shapes[kind], dtype=dtype)
    return {f"model.layers.{i}.self_attn.attn": whole[i] for i in range(LAYERS)}


@pytest.mark.parametrize("kind,planes", [("cpu", 1), ("flash", 2), ("flashinfer", 2),
                                         ("mla", 1)])
def test_regions_point_at_each_blocks_chunks(kind: str, planes: int) -> None:
    caches = make(kind)
    d = describe_kv_caches(caches, block_size=TPB, num_kv_heads=HEADS, head_size=HEAD)
    assert d.layout.num_layers == LAYERS and d.layout.num_planes == planes
    assert d.num_blocks == BLOCKS and not d.on_device
    assert len(d.regions) == LAYERS * planes
    assert d.layer_names == [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
    chunk = d.layout.chunk_bytes
    for layer, name in enumerate(d.layer_names):
        t = caches[name]
        for plane in range(planes):
            base, stride = d.regions[layer * planes + plane]
            for b in (0, 3, BLOCKS - 1):
                # The chunk kvtier copies is exactly this block's plane of this layer.
                view = {"cpu": lambda: t[b], "flash": lambda: t[plane, b],
                        "flashinfer": lambda: t[b, plane], "mla": lambda: t[b]}[kind]()
                assert view.data_ptr() == base + b * stride
                assert view.numel() * view.element_size() == chunk
                assert view.is_contiguous()


def test_layer_order_follows_the_layer_number_not_the_dict_order() -> None:
    caches = make("cpu")
    shuffled = {k: caches[k] for k in reversed(list(caches))}
    names = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
    names_10 = describe_kv_caches(shuffled, TPB, HEADS, HEAD).layer_names
    assert names_10 == names


def test_refuses_what_it_cannot_copy() -> None:
    caches = make("cpu")
    bad = dict(caches)
    bad["model.layers.1.self_attn.attn"] = torch.zeros((BLOCKS, HEADS, TPB, HEAD))
    with pytest.raises(ValueError, match="one layout for every layer"):
        describe_kv_caches(bad, TPB, HEADS, HEAD)
    # A non-dense block: every other element of a bigger tensor.
    strided = {k: torch.zeros((BLOCKS, HEADS, TPB, 4 * HEAD))[..., ::2] for k in caches}
    with pytest.raises(ValueError, match="not one dense range"):
        describe_kv_caches(strided, TPB, HEADS, HEAD)
    with pytest.raises(ValueError, match="cannot read a KV cache tensor"):
        describe_kv_caches({"model.layers.0.attn": torch.zeros((7,))}, TPB, HEADS, HEAD)
    with pytest.raises(ValueError, match="dtype"):
        describe_kv_caches({"model.layers.0.attn": torch.zeros((BLOCKS, 4), dtype=torch.int64)},
                           TPB, HEADS, HEAD)
    with pytest.raises(ValueError, match="no KV cache tensors"):
        describe_kv_caches({}, TPB, HEADS, HEAD)


@pytest.mark.parametrize("kind", ["cpu", "flash", "flashinfer", "mla"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip_through_the_manager(kind: str, dtype: torch.dtype) -> None:
    src, dst = make(kind, dtype), make(kind, dtype)
    torch.manual_seed(7)
    for t in src.values():
        t.copy_(torch.randn(t.shape).to(dtype))
    dd = describe_kv_caches(dst, TPB, HEADS, HEAD)
    config = kvtier.load_config({"g2.capacity_bytes": 32 * (dd.layout.block_bytes + 4096),
                                 "g2.lock_memory": False, "g3.enabled": False}, file="",
                                environment=False)
    tokens: List[int] = list(range(4 * TPB + 3))
    save_blocks = [2, 7, 4, 9, 1]  # the request's block table
    m2 = kvtier.BlockManager(dd.layout, f"test-{kind}", config)
    m2.register_memory(dd.layout, dd.num_blocks, dd.regions, dd.on_device)
    for name in src:
        dst[name].copy_(src[name])
    m2.lookup("save", tokens, 0)
    m2.commit("save", tokens, save_blocks)
    m2.start_save()
    m2.request_finished("save")
    m2.wait_for_saves()
    for t in dst.values():
        t.zero_()
    load_blocks = [5, 0, 8, 3, 6]
    n, by_tier = m2.lookup("load", tokens, 0)
    assert n == 4 * TPB and by_tier[1] == 4
    assert m2.prepare_load("load", load_blocks, n) == n
    m2.start_load()
    for layer in range(LAYERS):
        assert m2.wait_layer(layer) is None
    assert m2.loaded_tokens("load") == n
    m2.request_finished("load")
    for name in src:
        for i in range(4):
            s, d = save_blocks[i], load_blocks[i]
            if kind == "flash":
                assert torch.equal(src[name][:, s], dst[name][:, d])
            else:
                assert torch.equal(src[name][s], dst[name][d])
        # Blocks not loaded stay untouched (zero).
        untouched = [b for b in range(BLOCKS) if b not in load_blocks[:4]]
        for b in untouched:
            blk = dst[name][:, b] if kind == "flash" else dst[name][b]
            assert not blk.any()
    m2.close()

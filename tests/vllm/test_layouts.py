"""vLLM's KV tensor layouts as kvtier regions (python/kvtier/vllm/layouts.py).

The region arithmetic of every layout (CPU backend, FlashAttention's [2, blocks, ...],
FlashInfer's [blocks, 2, ...], MLA) is checked on CPU tensors of the same shapes and strides,
then proven with the real manager: blocks saved out of one set of tensors and loaded into
another come back byte for byte, in the right blocks. On a GPU the same regions go to kvtier's
CUDA backend (on_device=True), which this machine cannot run: docs/cuda.md.

Kernel blocks (an attention backend's blocks, smaller than the manager's): the block dimension
then holds k kernel blocks per manager block, which describe_kv_caches regroups given the
manager's num_blocks, or refuses when a block's kernel blocks are not one byte range. Checked on
the same hand-made shapes and on the views vLLM's own allocator makes.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import pytest
import torch

import kvtier
from kvtier.vllm.layouts import KvCacheLayout, describe_kv_caches

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
    dd = describe_kv_caches(dst, TPB, HEADS, HEAD)
    save_blocks, load_blocks = save_and_load(src, dst, dd, f"test-{kind}")
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


def save_and_load(src: Dict[str, torch.Tensor], dst: Dict[str, torch.Tensor],
                  dd: KvCacheLayout, model: str) -> Tuple[List[int], List[int]]:
    """Random KV in `src`; dst (described by `dd`) gets src's bytes; manager blocks
    [2, 7, 4, 9] are saved from dst through the real manager, dst is zeroed, and the saved
    blocks are loaded back into blocks [5, 0, 8, 3]. Returns (save block ids, load block ids)."""
    torch.manual_seed(7)
    for t in src.values():
        t.copy_(torch.randn(t.shape).to(t.dtype))
    config = kvtier.load_config({"g2.capacity_bytes": 32 * (dd.layout.block_bytes + 4096),
                                 "g2.lock_memory": False, "g3.enabled": False}, file="",
                                environment=False)
    tokens: List[int] = list(range(4 * TPB + 3))
    save_blocks = [2, 7, 4, 9, 1]  # the request's block table
    m2 = kvtier.BlockManager(dd.layout, model, config)
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
    m2.close()
    return save_blocks, load_blocks


# ---- kernel blocks ----

K = 2  # kernel blocks per manager block (kernel block size TPB // K)


def make_kernel_split(kind: str, k: int = K) -> Dict[str, torch.Tensor]:
    """make(kind) as an attention backend with TPB // k-token kernel blocks gets it: k kernel
    blocks per manager block in the block dimension, one allocation for all layers."""
    shapes = {
        "cpu": (BLOCKS * k, HEADS, TPB // k, 2 * HEAD),
        "flash": (2, BLOCKS * k, TPB // k, HEADS, HEAD),
        "flashinfer": (BLOCKS * k, 2, TPB // k, HEADS, HEAD),
        "mla": (BLOCKS * k, TPB // k, HEAD),
    }
    whole = torch.zeros((LAYERS,) + shapes[kind])
    return {f"model.layers.{i}.self_attn.attn": whole[i] for i in range(LAYERS)}


def manager_block(t: torch.Tensor, kind: str, b: int, k: int = K) -> torch.Tensor:
    """Manager block b of a kernel-block tensor: kernel blocks [b*k, (b+1)*k) (vLLM's
    group_kernel_blocks)."""
    if kind == "flash":
        return t.unflatten(1, (BLOCKS, k))[:, b]
    return t.unflatten(0, (BLOCKS, k))[b]


@pytest.mark.parametrize("kind,planes", [("cpu", 1), ("flash", 2), ("mla", 1)])
def test_kernel_blocks_regroup_into_manager_blocks(kind: str, planes: int) -> None:
    caches = make_kernel_split(kind)
    d = describe_kv_caches(caches, TPB, HEADS, HEAD, num_blocks=BLOCKS)
    assert d.num_blocks == BLOCKS and d.layout.num_planes == planes
    plain = describe_kv_caches(make(kind), TPB, HEADS, HEAD)
    assert d.layout.chunk_bytes == plain.layout.chunk_bytes  # a block is a block
    assert d.namespace_tag == plain.namespace_tag + f"-k{K}"  # but its bytes are ordered apart
    for layer, name in enumerate(d.layer_names):
        t = caches[name]
        for plane in range(planes):
            base, stride = d.regions[layer * planes + plane]
            for b in (0, 3, BLOCKS - 1):
                view = manager_block(t, kind, b)
                if kind == "flash":
                    view = view[plane]
                assert view.data_ptr() == base + b * stride  # kernel block b * K
                assert view.numel() * view.element_size() == d.layout.chunk_bytes
                assert view.is_contiguous()
    # Without the manager's block count a kernel block passes for a block (every block would
    # get half of one's bytes): the connector must pass num_blocks.
    blind = describe_kv_caches(caches, TPB, HEADS, HEAD)
    assert blind.num_blocks == BLOCKS * K
    assert blind.regions[0][1] * K == d.regions[0][1]


@pytest.mark.parametrize("kind", ["cpu", "flash", "mla"])
def test_kernel_blocks_round_trip_through_the_manager(kind: str) -> None:
    src, dst = make_kernel_split(kind), make_kernel_split(kind)
    dd = describe_kv_caches(dst, TPB, HEADS, HEAD, num_blocks=BLOCKS)
    save_blocks, load_blocks = save_and_load(src, dst, dd, f"test-kernel-{kind}")
    for name in src:
        for i in range(4):
            s, d = save_blocks[i], load_blocks[i]
            assert torch.equal(manager_block(src[name], kind, s),
                               manager_block(dst[name], kind, d))
        for b in range(BLOCKS):
            if b not in load_blocks[:4]:
                assert not manager_block(dst[name], kind, b).any()


@pytest.mark.parametrize("layout_name", ["LBHNC", "LBNHC"])
def test_kernel_blocks_of_vllms_own_views(layout_name: str) -> None:
    """The per-layer views vLLM's allocator (create_kv_cache_views) makes when the attention
    backend splits each block into kernel blocks, regrouped and round-tripped byte for byte."""
    kv_iface = pytest.importorskip("vllm.v1.kv_cache_interface")
    from vllm.v1.kv_cache_layout import KVCacheLayout

    spec = kv_iface.FullAttentionSpec(block_size=TPB, num_kv_heads=HEADS, head_size=HEAD,
                                      dtype=torch.float32)
    page = spec.page_size_bytes
    names = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
    layout = KVCacheLayout[layout_name]

    def views() -> Dict[str, torch.Tensor]:
        tensor = kv_iface.KVCacheTensor(size=page * BLOCKS * LAYERS, layers=names,
                                        layer_stride=page * BLOCKS, block_stride=page)
        raw = torch.zeros(page * BLOCKS * LAYERS, dtype=torch.int8)
        return dict(zip(names, kv_iface.create_kv_cache_views(
            raw, spec, BLOCKS, layout, tensor, kernel_block_size=TPB // K)))

    src, dst = views(), views()
    assert src[names[0]].shape[0] == BLOCKS * K  # vLLM hands out kernel blocks
    dd = describe_kv_caches(dst, TPB, HEADS, HEAD, num_blocks=BLOCKS)
    assert dd.num_blocks == BLOCKS and dd.layout.chunk_bytes == page
    save_blocks, load_blocks = save_and_load(src, dst, dd, f"test-vllm-{layout_name}")
    for name in names:
        s_blocks = kv_iface.group_kernel_blocks(src[name], BLOCKS)
        d_blocks = kv_iface.group_kernel_blocks(dst[name], BLOCKS)
        for i in range(4):
            assert torch.equal(s_blocks[save_blocks[i]], d_blocks[load_blocks[i]])
        for b in range(BLOCKS):
            if b not in load_blocks[:4]:
                assert not d_blocks[b].any()


def test_kernel_blocks_that_are_not_one_range_are_refused() -> None:
    # [blocks, 2, ...] with kernel blocks: the other plane sits between a block's kernel blocks.
    caches = make_kernel_split("flashinfer")
    t0 = caches["model.layers.0.self_attn.attn"]
    shape, stride = tuple(t0.shape), tuple(t0.stride())
    with pytest.raises(ValueError) as e:
        describe_kv_caches(caches, TPB, HEADS, HEAD, num_blocks=BLOCKS)
    msg = str(e.value)
    for part in (f"shape {shape}", f"stride {stride}", f"{BLOCKS * K} kernel blocks",
                 f"manager's {BLOCKS} blocks", "not adjacent in memory"):
        assert part in msg, (part, msg)
    # Padding after each kernel block (a dense kernel block, 64 elements apart from the next).
    kernel = HEADS * (TPB // K) * 2 * HEAD
    flat = torch.zeros(LAYERS, BLOCKS * K * (kernel + 64))
    padded = {f"model.layers.{i}.self_attn.attn": flat[i].as_strided(
        (BLOCKS * K, HEADS, TPB // K, 2 * HEAD),
        (kernel + 64, (TPB // K) * 2 * HEAD, 2 * HEAD, 1)) for i in range(LAYERS)}
    with pytest.raises(ValueError, match=rf"kernel block stride {kernel + 64} elements, a "
                                         rf"kernel block {kernel} elements"):
        describe_kv_caches(padded, TPB, HEADS, HEAD, num_blocks=BLOCKS)
    # A block dimension that is not a multiple of the manager's blocks.
    with pytest.raises(ValueError, match=rf"has {BLOCKS} blocks in its block dimension \(dim 0\), "
                                         rf"which is neither the KV cache manager's 4 blocks"):
        describe_kv_caches(make("cpu"), TPB, HEADS, HEAD, num_blocks=4)
    with pytest.raises(ValueError, match="num_blocks = 0"):
        describe_kv_caches(make("cpu"), TPB, HEADS, HEAD, num_blocks=0)
    # The manager's own count: as without it.
    plain = make("cpu")
    given = describe_kv_caches(plain, TPB, HEADS, HEAD, num_blocks=BLOCKS)
    inferred = describe_kv_caches(plain, TPB, HEADS, HEAD)
    assert (given.regions, given.num_blocks, given.namespace_tag, given.layout.fingerprint) == \
        (inferred.regions, inferred.num_blocks, inferred.namespace_tag, inferred.layout.fingerprint)

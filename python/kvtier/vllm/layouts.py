"""vLLM's KV cache tensors described as kvtier layouts and G1 regions.

kvtier copies whole blocks, one chunk per (layer, plane), between vLLM's tensors and its own
tiers. This module finds, for each layer's tensor, where block b's chunk of each plane starts
and how far apart blocks are, from the tensor's shape and strides:

- the CPU backend: ``[num_blocks, num_kv_heads, block_size, 2 x head_size]`` per layer, K and
  V of a head side by side (one plane; the byte order inside a block depends on dtype and
  instruction set, which is why that goes into the key namespace);
- FlashAttention-style GPU layouts: ``[2, num_blocks, ...]`` (K and V in two planes, each a
  block-strided region);
- FlashInfer-style: ``[num_blocks, 2, ...]`` (K and V interleaved per block);
- MLA: ``[num_blocks, block_size, head_size]`` (one latent plane).

In every case a block's chunk of one plane must be dense (the dimensions after the block and
plane dimensions packed without gaps, in any order): kvtier moves it as one byte range.

Kernel blocks: an attention backend may take smaller blocks than vLLM's KV cache manager (its
kernel block size divides vLLM's block_size). vLLM then hands the connector per-layer views
whose block dimension counts kernel blocks, ``k = block_size / kernel_block_size`` per manager
block: manager block ``b`` is kernel blocks ``[b*k, (b+1)*k)`` (vLLM's own
``group_kernel_blocks``). Given the manager's ``num_blocks``, describe_kv_caches regroups them:
one chunk per manager block, ``k`` kernel blocks long, which is one byte range only when the
kernel blocks of a block are adjacent in memory (the block dimension outermost within a plane,
no padding between kernel blocks, as vLLM's layer-compact layouts place them); otherwise it
refuses, naming the shape, the strides and both block counts. Without ``num_blocks`` a kernel
block would pass for a manager block (wrong bytes in every block): the connector passes it.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Dict, List, Optional, Sequence, Tuple

import torch

import kvtier

_DTYPES = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float8_e4m3fn: "fp8",
    torch.float8_e5m2: "fp8",
    torch.uint8: "fp8",
}


@dataclasses.dataclass
class KvCacheLayout:
    layout: kvtier.Layout
    regions: List[Tuple[int, int]]  # (base address, block stride), per (layer, plane)
    num_blocks: int
    on_device: bool
    layer_names: List[str]  # in layer order: wait_for_layer_load(name) -> index
    namespace_tag: str  # what else the stored bytes depend on (device, ISA, dtype, order)


def _layer_order(name: str, fallback: int) -> Tuple[int, int]:
    nums = re.findall(r"\d+", name)
    return (int(nums[0]), fallback) if nums else (1 << 30, fallback)


def _dense(shape: Sequence[int], stride: Sequence[int]) -> bool:
    """True when these dimensions cover one gap-free range, in some order."""
    dims = sorted((st, sz) for sz, st in zip(shape, stride, strict=False) if sz != 1)
    expect = 1
    for st, sz in dims:
        if st != expect:
            return False
        expect *= sz
    return True


def _block_dims(shape: Sequence[int], stride: Sequence[int],
                num_blocks: int) -> Tuple[int, int, int, int]:
    """(planes, block dim, plane dim or -1, kernel blocks per manager block) of one layer's
    tensor, whose block dimension holds `num_blocks` manager blocks or a multiple of them."""
    candidates = []
    if len(shape) == 5 and shape[0] == 2:
        candidates.append((2, 1, 0))  # [2, blocks, ...]
    if len(shape) == 5 and shape[1] == 2:
        candidates.append((2, 0, 1))  # [blocks, 2, ...]
    if len(shape) in (3, 4):
        candidates.append((1, 0, -1))  # [blocks, ...]
    if not candidates:
        raise ValueError(
            f"kvtier: cannot read a KV cache tensor of shape {tuple(shape)} and stride "
            f"{tuple(stride)} with {num_blocks} blocks: expected [num_blocks, heads, block, dim] "
            f"(CPU), [2, num_blocks, ...], [num_blocks, 2, ...] or [num_blocks, block, dim] (MLA)")
    for planes, bdim, pdim in candidates:  # a dimension of exactly num_blocks first
        if shape[bdim] == num_blocks:
            return planes, bdim, pdim, 1
    for planes, bdim, pdim in candidates:
        if num_blocks > 0 and shape[bdim] > num_blocks and shape[bdim] % num_blocks == 0:
            return planes, bdim, pdim, shape[bdim] // num_blocks
    planes, bdim, pdim = candidates[0]
    raise ValueError(
        f"kvtier: a KV cache tensor of shape {tuple(shape)} and stride {tuple(stride)} has "
        f"{shape[bdim]} blocks in its block dimension (dim {bdim}), which is neither the KV "
        f"cache manager's {num_blocks} blocks nor a multiple of them (kernel blocks); kvtier "
        f"cannot tell which bytes hold a manager block")


def _plane_geometry(t: torch.Tensor,
                    num_blocks: int) -> Tuple[int, int, int, int, int, str]:
    """(planes, block dim, plane dim or -1, kernel blocks per block, elements per chunk, order
    tag) of one layer whose block dimension holds `num_blocks` blocks (or kernel blocks)."""
    shape, stride = list(t.shape), list(t.stride())
    planes, bdim, pdim, ratio = _block_dims(shape, stride, num_blocks)
    inner = [i for i in range(len(shape)) if i not in (bdim, pdim)]
    ishape, istride = [shape[i] for i in inner], [stride[i] for i in inner]
    if not _dense(ishape, istride):
        raise ValueError(
            f"kvtier: a block's KV is not one dense range in a tensor of shape {tuple(shape)} "
            f"and stride {tuple(stride)}; kvtier copies whole blocks")
    chunk = 1
    for s in ishape:
        chunk *= s
    if ratio > 1 and not _dense(ishape + [ratio], istride + [stride[bdim]]):
        raise ValueError(
            f"kvtier: a KV cache tensor of shape {tuple(shape)} and stride {tuple(stride)} has "
            f"{shape[bdim]} kernel blocks in dim {bdim} for the KV cache manager's {num_blocks} "
            f"blocks ({ratio} kernel blocks per block), and a block's {ratio} kernel blocks are "
            f"not adjacent in memory (kernel block stride {stride[bdim]} elements, a kernel "
            f"block {chunk} elements): kvtier copies a block as one byte range. Use a "
            f"layer-compact KV cache layout without padding, or a block size the attention "
            f"backend takes as it is")
    order = "".join(str(i) for i in sorted(range(len(shape)), key=lambda i: -stride[i]))
    # Kernel blocks reorder a block's bytes (for most layouts): other blocks in the key space.
    tag = f"{len(shape)}d{order}" + (f"-k{ratio}" if ratio > 1 else "")
    return planes, bdim, pdim, ratio, chunk * ratio, tag


def describe_kv_caches(kv_caches: Dict[str, torch.Tensor], block_size: int, num_kv_heads: int,
                       head_size: int, num_blocks: Optional[int] = None) -> KvCacheLayout:
    """The kvtier layout and G1 regions of vLLM's per-layer KV tensors. `num_blocks`: the KV
    cache manager's block count (vLLM's kv_cache_config.num_blocks), which tells kernel blocks
    from blocks; None takes the tensors' block dimension as it is. Raises ValueError saying what
    does not fit (mixed shapes or dtypes, a layout kvtier cannot copy, kernel blocks that are not
    adjacent, a block dimension that is not a multiple of num_blocks)."""
    if not kv_caches:
        raise ValueError("kvtier: vLLM registered no KV cache tensors")
    names = sorted(kv_caches, key=lambda n: _layer_order(n, list(kv_caches).index(n)))
    first = kv_caches[names[0]]
    dtype = _DTYPES.get(first.dtype)
    if dtype is None:
        raise ValueError(f"kvtier: KV cache dtype {first.dtype} is not supported "
                         f"(fp32, fp16, bf16, fp8)")
    if num_blocks is None:
        num_blocks = first.shape[1] if first.dim() == 5 and first.shape[0] == 2 else first.shape[0]
    elif num_blocks < 1:
        raise ValueError(f"kvtier: num_blocks = {num_blocks}; the KV cache has at least one block")
    planes, bdim, pdim, ratio, chunk, order = _plane_geometry(first, num_blocks)
    heads = num_kv_heads if chunk % (block_size * num_kv_heads) == 0 else 1
    if chunk % (block_size * heads) != 0:
        raise ValueError(f"kvtier: a block chunk of {chunk} elements does not split into "
                         f"{block_size} tokens")
    head_dim = chunk // (block_size * heads)
    elem = first.element_size()
    regions: List[Tuple[int, int]] = []
    for name in names:
        t = kv_caches[name]
        if t.shape != first.shape or t.stride() != first.stride() or t.dtype != first.dtype:
            raise ValueError(f"kvtier: layer {name} has shape {tuple(t.shape)}, stride "
                             f"{t.stride()}, dtype {t.dtype}; layer {names[0]} has "
                             f"{tuple(first.shape)}, {first.stride()}, {first.dtype}: "
                             f"kvtier needs one layout for every layer")
        base = t.data_ptr()
        block_stride = t.stride(bdim) * elem * ratio  # manager block b = kernel block b * ratio
        for p in range(planes):
            regions.append((base + (t.stride(pdim) * elem * p if pdim >= 0 else 0), block_stride))
    layout = kvtier.Layout(len(names), planes, heads, head_dim, block_size, dtype)
    if first.is_cuda:
        major, minor = torch.cuda.get_device_capability(first.device)
        device = f"cuda-sm{major}{minor}"
    else:
        device = f"cpu-{torch.backends.cpu.get_cpu_capability()}"
    return KvCacheLayout(layout=layout, regions=regions, num_blocks=int(num_blocks),
                         on_device=bool(first.is_cuda), layer_names=names,
                         namespace_tag=f"{device}-{order}")

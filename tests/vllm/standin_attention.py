"""Stand-in attention layers for tests that build vLLM's worker side without a model.

A real engine registers one attention module per layer in
``compilation_config.static_forward_context``; kvtier reads its backend and probes its byte
layout at registration (python/kvtier/vllm/layout_vouch.py). Without a model there is none,
and kvtier would refuse. ``install`` registers one ``StandInAttention`` per layer: its backend
is vLLM's real CPU backend class (``CPUAttentionBackend``: its name and declared layouts are
vLLM's own), but its impl is a STAND-IN written in Python, ``StandInCpuImpl``, which writes K
and V in the CPU kernels' byte order for the ISAs kvtier knows: "vec"/"vec16" (K of a head as
[head_size, block], V as [block, head_size], as vLLM 0.32's cpu_attn_reshape_and_cache writes
them: tests/vllm/test_layout_vouch.py compares the two where that kernel exists) and "amx"
(K as [block/16, head_size/2, 16, 2], V as [head_size/16, block/2, 16, 2], from
../shared/notes/vllm-on-cpu.md, not checked against the kernel here: no AMX on this machine).
So the probe runs the same Python under every vLLM version the tests run.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch


def cpu_backend() -> Any:
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    return CPUAttentionBackend


class StandInCpuImpl:
    """do_kv_cache_update in the CPU backend's byte order, in Python (a stand-in)."""

    kv_cache_dtype = "auto"

    def do_kv_cache_update(self, layer: Any, key: torch.Tensor, value: torch.Tensor,
                           kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        blocks, heads, n, c = kv_cache.shape
        d = c // 2
        # Per (block, head): the K region (n x d values), then the V region.
        kv = kv_cache.view(blocks, heads, 2, n * d)
        b = (slot_mapping // n).view(-1, 1, 1)
        t = (slot_mapping % n).view(-1, 1, 1)
        h = torch.arange(heads).view(1, -1, 1)
        j = torch.arange(d).view(1, 1, -1)
        kv[b, h, 0, _k_index(layer.isa, t, j, n, d)] = key.to(kv.dtype)
        kv[b, h, 1, _v_index(layer.isa, t, j, n, d)] = value.to(kv.dtype)


def _k_index(isa: str, t: torch.Tensor, j: torch.Tensor, n: int, d: int) -> torch.Tensor:
    if isa == "amx":  # [n/16, d/2, 16, 2]
        return ((t // 16 * (d // 2) + j // 2) * 16 + t % 16) * 2 + j % 2
    return j * n + t  # [d, n]


def _v_index(isa: str, t: torch.Tensor, j: torch.Tensor, n: int, d: int) -> torch.Tensor:
    if isa == "amx":  # [d/16, n/2, 16, 2]
        return ((j // 16 * (n // 2) + t // 2) * 16 + j % 16) * 2 + t % 2
    return t * d + j  # [n, d]


class StandInAttention:
    """What kvtier reads of vLLM's Attention module (compat.attention_layer_info)."""

    def __init__(self, layer_name: str, num_kv_heads: int, head_size: int,
                 isa: str = "vec", backend: Any = None, impl: Any = None,
                 kv_cache_dtype: str = "auto") -> None:
        self.layer_name = layer_name
        self.attn_backend = backend if backend is not None else cpu_backend()
        self.impl = impl if impl is not None else StandInCpuImpl()
        self.kv_cache_dtype = kv_cache_dtype
        self.num_kv_heads = num_kv_heads
        self.head_size = head_size
        self.head_size_v = head_size
        self.isa = isa
        self._k_scale_float = 1.0
        self._v_scale_float = 1.0

    def get_attn_backend(self) -> Any:
        return self.attn_backend


def install(vllm_config: Any, layer_names: List[str], num_kv_heads: int, head_size: int,
            isa: Optional[str] = None,
            layout: Optional[str] = "LBHNC") -> Dict[str, StandInAttention]:
    """Registers a stand-in per layer where vLLM's model would, and records the KV cache
    layout vLLM's engine core would have resolved for the CPU backend. isa: by default the one
    vLLM picks without AMX ("vec", or "vec16" for a block size that is not a multiple of 32)."""
    if isa is None:
        isa = "vec" if vllm_config.cache_config.block_size % 32 == 0 else "vec16"
    ctx = vllm_config.compilation_config.static_forward_context
    made = {}
    for name in layer_names:
        made[name] = ctx[name] = StandInAttention(name, num_kv_heads, head_size, isa)
    if layout is not None and hasattr(vllm_config.cache_config, "kv_cache_layout"):
        vllm_config.cache_config.kv_cache_layout = layout
    return made

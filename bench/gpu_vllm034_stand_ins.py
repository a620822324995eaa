"""What stands in, in bench/gpu_vllm034.py, for what its checks never run.

- HostExtensibleTensor (--cpu-stand-in only): vLLM 0.34's ExtensibleTensor interface over host
  memory, so that vLLM's own ExtensibleKVCache logic (segments, commits, committed views) and
  everything after it run on a machine without a GPU. It says nothing about CUDA's virtual
  memory API, which the real ExtensibleTensor drives.
- stand_in_for_unused_modules (GPU runs too): empty modules for compiled packages vLLM 0.34
  imports on the script's path but the script never calls, when they do not import.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any, List, Optional, Sequence, Tuple

# ---------------------------------------------------------------------------------------------
# A host stand-in for vLLM's ExtensibleTensor (--cpu-stand-in only)
# ---------------------------------------------------------------------------------------------

def _host_view(ptr: int, nbytes: int) -> Any:
    """A uint8 tensor over host memory at ptr whose storage is exactly nbytes (as vLLM's
    DLPack views over the reservation are)."""
    import torch

    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(ptr), dtype=torch.uint8)


class HostExtensibleTensor:
    """vLLM's ExtensibleTensor interface over one host allocation: the reservation is allocated
    whole, commits are bookkeeping (2 MiB granules, one "physical chunk" per segment per
    growth), views are built over raw pointers. Runs vLLM's ExtensibleKVCache logic on the CPU;
    says nothing about cuMem*."""

    GRANULE = 2 << 20

    def __init__(self, max_num_bytes: int, device: Any = None, num_segments: int = 1,
                 segment_capacities: Optional[Sequence[int]] = None,
                 export_handle_types: int = 0) -> None:
        import torch

        caps = list(segment_capacities or [max_num_bytes // num_segments] * num_segments)
        if sum(caps) != max_num_bytes:
            raise ValueError(f"segment capacities sum to {sum(caps)}, not {max_num_bytes}")
        self.device = torch.device("cpu")
        self._caps = caps
        self._offsets = [sum(caps[:i]) for i in range(len(caps))]
        self._committed = [0] * len(caps)
        self._chunks: List[Tuple[int, int]] = []  # (offset, size) per growth of a segment
        self._backing = torch.zeros(max_num_bytes, dtype=torch.uint8)
        self._base = self._backing.data_ptr()

    def full_view(self) -> Any:
        return _host_view(self._base, sum(self._caps))

    def segment_view(self, index: int) -> Any:
        return _host_view(self._base + self._offsets[index], self._committed[index])

    def resize_segments_(self, sizes: Sequence[int], zero_new: bool = False) -> None:
        for i, (old, new, cap) in enumerate(zip(self._committed, sizes, self._caps)):
            if new < old or new > cap:
                raise ValueError(f"segment {i}: {old} -> {new} bytes (capacity {cap})")
            if new > old:
                start = self._offsets[i] + old
                self._chunks.append((start, new - old))
                if zero_new:
                    self._backing[start:self._offsets[i] + new].zero_()
        self._committed = list(sizes)

    def release_physical(self) -> None:
        self._committed = [0] * len(self._caps)
        self._chunks = []

    def segments_backed_by_one_chunk(self, sizes: Sequence[int]) -> List[bool]:
        return [any(s <= off and off + n <= s + c for s, c in self._chunks)
                for off, n in zip(self._offsets, sizes)]

    @property
    def physical_bytes(self) -> int:
        g = self.GRANULE
        return sum(-(-c // g) * g for c in self._committed)

    @property
    def num_physical_chunks(self) -> int:
        return len(self._chunks)

    @property
    def granularity(self) -> int:
        return self.GRANULE

    @property
    def base_ptr(self) -> int:
        return self._base

    def free(self) -> None:
        self.release_physical()


# ---------------------------------------------------------------------------------------------
# Modules vLLM imports that the checks never call
# ---------------------------------------------------------------------------------------------

# Compiled modules vLLM 0.34 imports on this path but the check never calls, which the GPU
# image lacks and which cannot be carried: the grammar engines its request module names at
# import (its structured-output dataclasses evaluate xgrammar's and llguidance's class names),
# and its CUDA kernels' op registration (vllm._C_stable_libtorch, 89 MB, built for torch 2.14;
# the CUDA platform imports it). The check runs none of vLLM's kernels or grammars: when one
# does not import, an empty module stands in (any attribute is a placeholder class) and the
# results say so.
UNUSED_MODULES = ("xgrammar", "llguidance", "vllm._C_stable_libtorch")


class _Placeholder:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a stand-in of a grammar engine that is not installed was used")


def _placeholder(module: str, attr: str) -> type:
    if attr.startswith("__"):
        raise AttributeError(f"{module} (a stand-in) has no {attr}")
    return type(attr, (_Placeholder,), {"__module__": module})


def stand_in_for_unused_modules() -> List[str]:
    import importlib
    import importlib.util
    import types

    stood_in = []
    for name in UNUSED_MODULES:
        if name in sys.modules:
            continue
        if "." in name:  # a compiled part of a package: present is not enough, it must load
            try:
                importlib.import_module(name)
                continue
            except ImportError:
                pass
        elif importlib.util.find_spec(name) is not None:
            continue
        module = types.ModuleType(name)
        module.__getattr__ = (  # type: ignore[attr-defined]
            lambda attr, _n=name: _placeholder(_n, attr))
        sys.modules[name] = module
        stood_in.append(name)
    return stood_in

"""The KV layout at registration (python/kvtier/vllm/layout_vouch.py): vouching and the layout
fingerprint in the key namespace.

- What the stored bytes depend on gets another fingerprint, one field at a time (backend, dtype,
  cache dtype, stride order, shape, block size, ISA, device tag, the bytes the backend writes);
  what does not (a restart, another vLLM version, another ISA that writes the same bytes)
  keeps it. A pinned value shows the fingerprint is the same under every vLLM version the
  matrix runs (0.32, 0.33, 0.34).
- A layout outside kvtier's table is refused with what was seen, what kvtier knows and the last
  tested vLLM; with allow_unvouched_layout it runs, with a warning.
- Through the real connector (sched_harness.py, vLLM's real Scheduler): a restart loads what the
  first process saved, a layout with other bytes does not, and a refused layout stops
  registration.

The layers are stand-ins (standin_attention.py) whose backend is vLLM's real CPU backend class;
where vLLM's compiled CPU kernel exists (0.32), the stand-in is checked against it.
Run by tests/vllm/run.sh in the vLLM environment (ctest: the scheduler-level matrix).
"""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

import pytest
import torch

import standin_attention as sa
from kvtier.vllm import compat
from kvtier.vllm.layout_vouch import (
    KvLayoutNotVouched,
    probe_pattern,
    vouch_kv_layout,
    vouch_registered_caches,
)

LAYERS, BLOCKS, HEADS, HEAD, N = 3, 4, 2, 32, 32
NAMES = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
TAG = "cpu-AVX512-4d0123"
LBHNC, LBNHC = (0, 1, 2, 3), (0, 2, 1, 3)
# The fingerprint of the baseline layout below (fp32, vec, [4, 2, 32, 64], CPU_ATTN): pinned,
# so that the matrix shows it is the same under every vLLM version, and so that a change to
# the probe is seen (it would make every stored block unreachable: bump PROBE_FORMAT).
GOLDEN = "cpu-AVX512-4d0123-CPU_ATTN-p"
PINNED = "b3a7808f7d35f69a"


def caches(dtype: torch.dtype = torch.float32, order: Sequence[int] = LBHNC,
           heads: int = HEADS, n: int = N, c: int = 2 * HEAD,
           blocks: int = BLOCKS) -> Dict[str, torch.Tensor]:
    """Per-layer [blocks, heads, n, c] views of one allocation, in physical `order`."""
    shape = (blocks, heads, n, c)
    whole = torch.zeros((LAYERS,) + tuple(shape[i] for i in order), dtype=dtype)
    back = [0] + [1 + list(order).index(i) for i in range(4)]
    whole = whole.permute(back)
    return {name: whole[i] for i, name in enumerate(NAMES)}


def vouch(kv: Optional[Dict[str, torch.Tensor]] = None, *, isa: str = "vec",
          impl: Any = None, backend: Any = None, kv_cache_dtype: str = "auto",
          heads: int = HEADS, head: int = HEAD, resolved: Optional[str] = "LBHNC",
          model_dtype: Any = None, tag: str = TAG, allow: bool = False,
          version: Optional[str] = "0.32.0", n: int = N, blocks: int = BLOCKS,
          layers: Optional[Dict[str, Any]] = None) -> Any:
    kv = caches() if kv is None else kv
    if layers is None:
        layers = {name: sa.StandInAttention(name, heads, head, isa, backend=backend, impl=impl,
                                            kv_cache_dtype=kv_cache_dtype) for name in NAMES}
    first = next(iter(kv.values()))
    return vouch_kv_layout(layers=layers, kv_caches=kv, layer_names=NAMES, block_size=n,
                           num_blocks=blocks, resolved_layout=resolved,
                           model_dtype=model_dtype or first.dtype, base_tag=tag,
                           allow_unvouched=allow, version=version)


def named(name: str) -> Any:
    """vLLM's real CPU backend class under another name (a backend kvtier may not know)."""
    base = sa.cpu_backend()
    return type(f"{name}Backend", (base,), {"get_name": staticmethod(lambda: name)})


class TransposedVImpl(sa.StandInCpuImpl):
    """Writes V transposed too: the same shape, stride order and backend name, other bytes."""

    def do_kv_cache_update(self, layer: Any, key: torch.Tensor, value: torch.Tensor,
                           kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        super().do_kv_cache_update(layer, key, value, kv_cache, slot_mapping)
        blocks, heads, n, c = kv_cache.shape
        v = kv_cache.view(blocks, heads, 2, n * (c // 2))[:, :, 1]
        v.copy_(v.reshape(blocks, heads, n, c // 2).transpose(2, 3).reshape(blocks, heads, -1))


class MissingKernelImpl:
    """What the probe meets where vLLM's compiled op is absent (the 0.33/0.34 overlays)."""

    def do_kv_cache_update(self, layer: Any, key: torch.Tensor, value: torch.Tensor,
                           kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        raise AttributeError("'_OpNamespace' '_C' object has no attribute "
                             "'cpu_attn_reshape_and_cache'")


class LeakyImpl(sa.StandInCpuImpl):
    """Also writes into the block before the one it was given: not block-local."""

    def do_kv_cache_update(self, layer: Any, key: torch.Tensor, value: torch.Tensor,
                           kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        super().do_kv_cache_update(layer, key, value, kv_cache, slot_mapping)
        kv_cache[0, 0, 0, 0] = 1.0


# ---------------------------------------------------------------------------------------------
# What shares a fingerprint and what does not
# ---------------------------------------------------------------------------------------------


def test_a_restart_and_other_vllm_versions_keep_the_fingerprint() -> None:
    first = vouch()
    assert first.kind == "probe" and first.problems == []
    assert first.namespace_tag.startswith(GOLDEN), first.namespace_tag
    # A restart: new tensors at other addresses, new stand-ins.
    assert vouch().namespace_tag == first.namespace_tag
    # The probe's fingerprint holds no version: an upgrade that keeps the bytes keeps G3/G4.
    for version in ("0.33.0", "0.34.0", "0.34.1rc1+cu130"):
        assert vouch(version=version).namespace_tag == first.namespace_tag, version


def test_the_installed_vllm_gives_the_pinned_fingerprint() -> None:
    # The same value in every ctest entry of the matrix (vLLM 0.32, 0.33, 0.34): vLLM's own CPU
    # backend class and KVCacheLayout, kvtier's probe, the same bytes.
    got = vouch(version=None)
    assert got.namespace_tag == GOLDEN + PINNED, (got.namespace_tag, compat.vllm_version())


@pytest.mark.parametrize("field", ["backend", "dtype bf16", "dtype fp16", "cache dtype",
                                   "stride order", "kv heads", "head size", "block size",
                                   "isa amx", "device tag", "probe bytes", "no probe"])
def test_each_field_the_bytes_depend_on_gets_another_fingerprint(field: str) -> None:
    base = vouch()
    other = {
        "backend": lambda: vouch(backend=named("TRITON_ATTN")),
        "dtype bf16": lambda: vouch(caches(torch.bfloat16)),
        "dtype fp16": lambda: vouch(caches(torch.float16)),
        # A quantized cache (refused for CPU_ATTN; run anyway: a static fingerprint).
        "cache dtype": lambda: vouch(kv_cache_dtype="fp8_e4m3", allow=True),
        "stride order": lambda: vouch(caches(order=LBNHC), resolved="LBNHC", allow=True),
        "kv heads": lambda: vouch(caches(heads=4), heads=4),
        "head size": lambda: vouch(caches(c=2 * 64), head=64),
        "block size": lambda: vouch(caches(n=64, blocks=2), n=64, blocks=2),
        "isa amx": lambda: vouch(isa="amx"),
        "device tag": lambda: vouch(tag="cpu-AVX2-4d0123"),
        "probe bytes": lambda: vouch(impl=TransposedVImpl()),
        "no probe": lambda: vouch(impl=MissingKernelImpl()),
    }[field]()
    assert other.namespace_tag != base.namespace_tag, field


def test_all_fields_apart_from_each_other() -> None:
    tags = [vouch(backend=named("TRITON_ATTN")), vouch(caches(torch.bfloat16)),
            vouch(kv_cache_dtype="fp8_e4m3", allow=True), vouch(isa="amx"),
            vouch(impl=TransposedVImpl()), vouch(impl=MissingKernelImpl()),
            vouch(caches(order=LBNHC), resolved="LBNHC", allow=True)]
    names = [t.namespace_tag for t in tags]
    assert len(set(names)) == len(names), names


def test_isas_that_write_the_same_bytes_share() -> None:
    # vLLM picks "vec16" for blocks that are not a multiple of 32; it writes what "vec" writes
    # (checked against the kernel below), so the two share blocks.
    assert vouch(isa="vec16").namespace_tag == vouch(isa="vec").namespace_tag


def test_without_a_probe_the_fingerprint_is_static_and_says_so() -> None:
    static = vouch(impl=MissingKernelImpl())
    assert static.kind == "static" and "-CPU_ATTN-s" in static.namespace_tag
    assert any("cpu_attn_reshape_and_cache" in n for n in static.notes), static.notes
    assert vouch(impl=MissingKernelImpl()).namespace_tag == static.namespace_tag  # restart
    # A static descriptor cannot see an in-block order that changed under the same names: it
    # is not shared across vLLM release lines (the probe's is).
    assert vouch(impl=MissingKernelImpl(), version="0.33.0").namespace_tag \
        != static.namespace_tag
    assert vouch(impl=MissingKernelImpl(), version="0.32.5").namespace_tag \
        == static.namespace_tag
    # A quantized cache: the bytes depend on the layer's scales; no probe.
    fp8 = vouch(kv_cache_dtype="fp8_e4m3", allow=True)
    assert fp8.kind == "static" and any("scales" in n for n in fp8.notes)


def test_the_probe_pattern_is_distinct_and_exact() -> None:
    for dtype, count in ((torch.float32, 1 << 16), (torch.bfloat16, 65024),
                         (torch.float16, 61440)):
        p = probe_pattern(count, 0, dtype)
        bits = p.reshape(-1).view({4: torch.int32, 2: torch.int16}[p.element_size()])
        assert torch.unique(bits).numel() == count, dtype
        assert bool(torch.isfinite(p.float()).all()), dtype
    assert probe_pattern(4, 10, torch.float32).tolist() == [11.0, 12.0, 13.0, 14.0]


def _vllm_cpu_kernel() -> bool:
    try:  # registers torch.ops._C's kernels where they are compiled
        importlib.import_module("vllm._custom_ops")
    except Exception:
        return False
    return hasattr(torch.ops._C, "cpu_attn_reshape_and_cache")


@pytest.mark.parametrize("dtype,isa,n", [(torch.float32, "vec", 32), (torch.bfloat16, "vec", 32),
                                         (torch.float32, "vec16", 16)])
def test_the_stand_in_writes_what_vllms_cpu_kernel_writes(dtype: torch.dtype, isa: str,
                                                          n: int) -> None:
    if not _vllm_cpu_kernel():
        pytest.skip("vLLM's compiled CPU kernels are not in this environment (an overlay)")
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

    # vLLM's real do_kv_cache_update and kernel. Its constructor needs a running engine's
    # config; the method reads two fields, set here.
    real = CPUAttentionBackendImpl.__new__(CPUAttentionBackendImpl)
    real.attn_type, real.kv_cache_dtype = "decoder", "auto"
    kv = caches(dtype, n=n)
    got = vouch(kv, impl=real, isa=isa, n=n)
    assert got.kind == "probe", got.notes
    assert got.namespace_tag == vouch(kv, isa=isa, n=n).namespace_tag


# ---------------------------------------------------------------------------------------------
# Refusals, and running anyway
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case,expect", [
    ("backend", "attention backend MYSTERY_ATTN, which kvtier has not seen"),
    ("isa", "CPU_ATTN ISA neon"),
    ("dtype", "KV dtype float64 under CPU_ATTN"),
    ("cache dtype", "cache dtype fp8_e5m2 under CPU_ATTN"),
    ("stride order", "stride order (0, 2, 1, 3) (layout LBNHC/BLNHC) under CPU_ATTN"),
    ("heads", "2 heads in dim 1, the layer has 4 KV heads"),
    ("head size", "dim 3 holds 64 values, the layer's K+V is 48+48"),
    ("block size", "do not make 4 blocks of 64 tokens"),
    ("resolved layout", "is not vLLM's resolved layout LBNHC"),
    ("no module", "no attention module in vLLM's static_forward_context"),
    ("vllm enum", "vLLM's KVCacheLayout is"),
])
def test_an_unvouched_layout_is_refused_with_the_message_then_runs_when_allowed(
        case: str, expect: str, monkeypatch: pytest.MonkeyPatch) -> None:
    kwargs: Dict[str, Any] = {
        "backend": dict(backend=named("MYSTERY_ATTN")),
        "isa": dict(isa="neon"),
        "dtype": dict(kv=caches(torch.float64)),
        "cache dtype": dict(kv_cache_dtype="fp8_e5m2"),
        "stride order": dict(kv=caches(order=LBNHC), resolved=None),
        "heads": dict(heads=4),
        "head size": dict(head=48),
        "block size": dict(n=64),
        "resolved layout": dict(resolved="LBNHC"),
        "no module": dict(layers={NAMES[0]: sa.StandInAttention(NAMES[0], HEADS, HEAD)}),
        "vllm enum": {},
    }[case]
    if case == "vllm enum":  # a vLLM whose KVCacheLayout moved a member
        moved = dict(compat.kv_cache_layout_orders() or {"LBHNC": (0, 1, 2, 3, 4)})
        moved["LBHNC"] = (0, 1, 3, 2, 4)
        monkeypatch.setattr(compat, "kv_cache_layout_orders", lambda: moved)
    with pytest.raises(KvLayoutNotVouched) as refused:
        vouch(**kwargs)
    msg = str(refused.value)
    assert expect in msg, msg
    # What kvtier knows, the last tested vLLM, and what to do.
    assert "kvtier knows: " in msg and "CPU_ATTN" in msg
    assert f"last tested vLLM {compat.LAST_TESTED}" in msg
    assert "allow_unvouched_layout" in msg
    assert isinstance(refused.value, compat.VllmNotVouched)
    allowed = vouch(allow=True, **kwargs)
    assert any(expect in p for p in allowed.problems), allowed.problems


def test_a_layout_whose_blocks_are_not_their_own_bytes_is_refused_even_when_allowed() -> None:
    with pytest.raises(KvLayoutNotVouched, match="changed the bytes of block 0"):
        vouch(impl=LeakyImpl(), allow=True)


class CountingImpl(sa.StandInCpuImpl):
    def __init__(self) -> None:
        self.calls = 0

    def do_kv_cache_update(self, layer: Any, key: torch.Tensor, value: torch.Tensor,
                           kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        self.calls += 1
        super().do_kv_cache_update(layer, key, value, kv_cache, slot_mapping)


def test_no_kernel_runs_for_a_refused_layout_or_a_tensor_of_another_shape() -> None:
    # On a GPU a kernel handed a tensor it does not expect can take the device down.
    impl = CountingImpl()
    with pytest.raises(KvLayoutNotVouched):
        vouch(impl=impl, isa="neon")
    assert impl.calls == 0
    shape = vouch(impl=impl, heads=4, allow=True)
    assert impl.calls == 0 and shape.kind == "static"
    assert any("shape is not the layer's" in n for n in shape.notes), shape.notes
    isa = vouch(impl=impl, isa="neon", allow=True)  # the right shape: probed (twice)
    assert impl.calls == 2 and isa.kind == "probe"


def _config(version_layers: Dict[str, Any]) -> Any:
    """The two things vouch_registered_caches reads of a VllmConfig."""
    from types import SimpleNamespace

    return SimpleNamespace(
        compilation_config=SimpleNamespace(static_forward_context=version_layers),
        cache_config=SimpleNamespace(kv_cache_layout="LBHNC"),
        model_config=SimpleNamespace(dtype=torch.float32))


def test_untested_vllm_runs_when_every_check_passes_and_logs_them(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(compat, "vllm_version", lambda: "0.99.0")
    layers = {name: sa.StandInAttention(name, HEADS, HEAD) for name in NAMES}
    with caplog.at_level(logging.INFO, logger="kvtier.vllm"):
        got = vouch_registered_caches(_config(layers), None, caches(), NAMES, N, BLOCKS, TAG,
                                      False)
    assert not got.tested and got.kind == "probe"
    assert got.namespace_tag == vouch().namespace_tag  # the same bytes: the same blocks
    text = caplog.text
    assert "vLLM 0.99.0 is not a tested version (last tested: " in text, text
    assert "backend CPU_ATTN" in text and "byte probe (block-local" in text, text
    # ... and refuses when one does not.
    odd = {name: sa.StandInAttention(name, HEADS, HEAD, "neon") for name in NAMES}
    with pytest.raises(KvLayoutNotVouched, match=r"vLLM 0\.99\.0, not a tested version"):
        vouch_registered_caches(_config(odd), None, caches(), NAMES, N, BLOCKS, TAG, False)


def test_allowed_unvouched_layout_warns_loudly(caplog: pytest.LogCaptureFixture) -> None:
    odd = {name: sa.StandInAttention(name, HEADS, HEAD, "neon") for name in NAMES}
    with caplog.at_level(logging.WARNING, logger="kvtier.vllm"):
        got = vouch_registered_caches(_config(odd), None, caches(), NAMES, N, BLOCKS, TAG, True)
    assert got.problems
    assert "RUNNING ON A KV LAYOUT KVTIER HAS NOT VOUCHED FOR" in caplog.text
    assert "CPU_ATTN ISA neon" in caplog.text


# ---------------------------------------------------------------------------------------------
# Through the connector (vLLM's real Scheduler, kvtier's real worker side)
# ---------------------------------------------------------------------------------------------

MODEL = os.environ.get("KVTIER_TEST_VLLM_MODEL", "")
needs_model = pytest.mark.skipif(not MODEL or not Path(MODEL).is_dir(),
                                 reason="KVTIER_TEST_VLLM_MODEL is not a model folder; run "
                                        "tests/vllm/run.sh")
BS = 16


@pytest.fixture
def tmp() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="kvtier-vouch-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _g3(tmp: Path, **extra: Any) -> Dict[str, Any]:
    return {"g2.capacity_bytes": "96MiB", "g2.lock_memory": False, "g3.enabled": True,
            "g3.dir": str(tmp / "g3"), "g3.capacity_bytes": "192MiB", "g3.admit_min_seen": 1,
            **extra}


def _run(h: Any, rid: str, prompt: List[int]) -> int:
    from sched_harness import reference_output

    h.add(rid, prompt, max_tokens=2)
    h.run()
    assert h.outputs[rid] == reference_output(prompt, 2)
    h.worker.connector_worker._manager.wait_for_saves()
    return int(h.worker.connector_worker._manager.stats()["hit_blocks"]["G3"])


@needs_model
def test_a_restart_loads_what_was_saved_and_other_bytes_do_not(
        tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sched_harness import Harness

    prompt = [3000 + i for i in range(5 * BS + 1)]
    first = Harness(MODEL, _g3(tmp))
    tag = first.worker.connector_worker._layout_vouch.namespace_tag
    assert _run(first, "first", prompt) == 0
    first.shutdown()
    again = Harness(MODEL, _g3(tmp))
    assert _run(again, "again", prompt) >= 5, "a restart shares the blocks"
    again.shutdown()
    # The same shapes, backend and dtype, but the kernel ISA writes other bytes (amx): the
    # saved blocks are not offered.
    install = sa.install
    monkeypatch.setattr(sa, "install", lambda *a, **k: install(*a, **{**k, "isa": "amx"}))
    amx = Harness(MODEL, _g3(tmp))
    assert _run(amx, "amx", prompt) == 0, "another byte layout never loads these blocks"
    assert amx.worker.connector_worker._layout_vouch.namespace_tag != tag
    amx.shutdown()
    assert "-CPU_ATTN-p" in tag, tag


@needs_model
def test_the_connector_refuses_an_unvouched_layout_unless_allowed(
        tmp: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from sched_harness import Harness

    install = sa.install
    monkeypatch.setattr(sa, "install", lambda *a, **k: install(*a, **{**k, "isa": "neon"}))
    with pytest.raises(KvLayoutNotVouched, match="CPU_ATTN ISA neon"):
        Harness(MODEL, _g3(tmp))
    with pytest.raises(ValueError, match="allow_unvouched_layout must be true or false"):
        Harness(MODEL, _g3(tmp, allow_unvouched_layout="yes"))
    with caplog.at_level(logging.WARNING, logger="kvtier.vllm"):
        h = Harness(MODEL, _g3(tmp, allow_unvouched_layout=True))
    assert "RUNNING ON A KV LAYOUT KVTIER HAS NOT VOUCHED FOR" in caplog.text
    prompt = [7000 + i for i in range(3 * BS + 1)]
    _run(h, "runs", prompt)
    h.shutdown()

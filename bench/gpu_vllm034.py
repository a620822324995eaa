#!/usr/bin/env python3
"""vLLM 0.34's extensible KV cache handed to kvtier, on a GPU (bench/gpu.sh's vLLM step).

vLLM 0.34 on CUDA allocates the KV cache as an `ExtensibleKVCache`: one reserved virtual
address range, physical memory committed into it in segments (one per layer for the
layer-outermost layouts, padded to the driver's 2 MiB granule; one for block-outermost ones),
grown as warmup goes, then `extend_kv_cache` commits the final size and hands per-layer views
of the committed blocks to the KV connector's `register_kv_caches`. Only a GPU can show that
kvtier reads that memory right (CUDA's virtual memory API, kvtier's CUDA copy backend). This
script builds it through vLLM's own classes without a model, the way the V2 model runner and
GPU worker do (`get_kv_cache_config_from_groups`, `pad_kv_cache_segments`, `ExtensibleKVCache`,
`allocate_kv_cache` with its `allocate` hook, warmup commits, `extend_kv_cache` on a stand-in
of the runner's KV state), then for each KV cache layout:

1. describes the committed views with kvtier.vllm.layouts.describe_kv_caches and registers
   them with a kvtier.BlockManager exactly as KvtierConnector.register_kv_caches does, and
   checks that kvtier's layout is vLLM's: one region per layer at the view's address, vLLM's
   block stride, a block's chunk = vLLM's page, every block inside the committed storage;
2. writes a known pattern into blocks through vLLM's views (blocks on both sides of the
   boundary of two physical chunks, as warmup's commits leave them), saves them to G2,
   scribbles over G1, loads them into other blocks and checks every byte; neighbours must
   keep the scribble. For the two layouts where a block is one range per head (BHLNC,
   LHBNC), kvtier must refuse instead;
3. (the default layout, LBNHC, only) lets vLLM itself create KvtierConnector from a
   kv_transfer_config and register the views (a config.json-only Llama folder stands in for
   the model), and runs the same round trip through the connector's own BlockManager.

Exit status: 0 every check passed; 1 a check failed (the reasons are printed, and in the JSON);
2 usage error or missing inputs (vLLM 0.34, kvtier); 77 no GPU (skipped, said loudly).
--cpu-stand-in runs the same path on host memory, with a stand-in for vLLM's ExtensibleTensor
(no cuMem* calls) and vLLM's Triton check satisfied: for testing this script without a GPU
(tests/vllm/test_gpu_vllm034.py); it proves nothing about CUDA.

Usage: gpu_vllm034.py [--cpu-stand-in] [--json FILE] [--layouts L1,L2,...] [--no-connector]
(default: all six layouts and the connector; about 10 s after vLLM's import.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Tuple

from gpu_vllm034_stand_ins import HostExtensibleTensor, stand_in_for_unused_modules

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_SKIPPED = 0, 1, 2, 77
# A small model's KV: 4 layers x 8 KV heads x 128 dims, bf16, 16-token blocks (a 64 KiB page
# per layer and block: 32 blocks per 2 MiB granule).
LAYERS, KV_HEADS, HEAD_SIZE, BLOCK_SIZE = 4, 8, 128, 16
CAPACITY_BLOCKS = 160  # the reservation
WARMUP_BLOCKS = 8  # what warmup commits first (one granule per segment)
FINAL_BLOCKS = 96  # extend_kv_cache's final size: a second physical chunk per segment
# The first physical chunk of a segment is one 2 MiB granule: 32 blocks of a layer-outermost
# segment, 8 of the block-outermost one (a block of all 4 layers is 256 KiB). The saved blocks
# lie on both sides of both boundaries; they load into blocks of the second chunk.
SRC_BLOCKS = [6, 7, 8, 9, 30, 31, 32, 33]
DST_BLOCKS = [60, 61, 62, 63, 64, 65, 66, 67]
SAMPLED_BLOCKS = (0, 1, 7, 8, 31, 32, 33, FINAL_BLOCKS - 1)  # the layout check's
SCRIBBLE = 0xA5
# vLLM 0.34's KVCacheLayout names (vllm/v1/kv_cache_layout.py), in its default preference.
# The last two split a block into one range per head: kvtier must refuse them (it copies a
# block as one range), not copy wrong bytes.
LAYOUTS = ("LBNHC", "LBHNC", "BLNHC", "BLHNC", "BHLNC", "LHBNC")
REFUSED_LAYOUTS = ("BHLNC", "LHBNC")
LAYER_NAME = "model.layers.{}.self_attn.attn"


class CheckFailed(Exception):
    pass


def say(msg: str) -> None:
    print(f"gpu_vllm034: {msg}", flush=True)


# ---------------------------------------------------------------------------------------------
# vLLM's extensible KV cache, built as the V2 model runner builds it
# ---------------------------------------------------------------------------------------------

STOOD_IN: List[str] = []  # modules stand_in_for_unused_modules replaced


def import_vllm(stand_in: bool) -> Any:
    global STOOD_IN
    # The model is a local config.json; the GPU machines have no network to wait for.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    STOOD_IN = stand_in_for_unused_modules()
    if STOOD_IN:
        say(f"not importable here, stood in for (never called by the check): "
            f"{', '.join(STOOD_IN)}")
    try:
        import vllm
    except ImportError as e:
        raise SystemExit(_usage_exit(f"vLLM is not importable ({e}); bench/gpu.sh puts the "
                                     f"carried vLLM 0.34 Python files on PYTHONPATH"))
    if not str(vllm.__version__).startswith("0.34"):
        raise SystemExit(_usage_exit(f"this checks vLLM 0.34's extensible KV cache; vLLM "
                                     f"{vllm.__version__} from {vllm.__file__} was imported"))
    if stand_in:
        # vLLM 0.34's CPU platform asks for triton-cpu when VllmConfig is built; nothing here
        # runs a Triton kernel (tests/vllm/conftest.py does the same).
        import vllm.triton_utils as triton_utils

        triton_utils.HAS_TRITON = True
    return vllm


def _usage_exit(msg: str) -> int:
    say(f"CANNOT RUN: {msg}")
    return EXIT_USAGE


def write_model_dir(path: str) -> str:
    """A Llama configuration without weights: enough for vLLM's ModelConfig (KV heads, head
    size) and kvtier's model fingerprint. No network, no tokenizer."""
    os.makedirs(path, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "hidden_size": KV_HEADS * HEAD_SIZE, "intermediate_size": 2048,
              "num_attention_heads": KV_HEADS, "num_key_value_heads": KV_HEADS,
              "head_dim": HEAD_SIZE, "num_hidden_layers": LAYERS, "vocab_size": 32000,
              "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
              "torch_dtype": "bfloat16", "tie_word_embeddings": False}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return path


def make_vllm_config(layout_name: str, model_dir: str = "",
                     kvtier_extra: Optional[Dict[str, Any]] = None) -> Any:
    from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, VllmConfig
    from vllm.v1.attention.backends.utils import record_kv_cache_layout

    kwargs: Dict[str, Any] = {"cache_config": CacheConfig(block_size=BLOCK_SIZE)}
    if model_dir:
        kwargs["model_config"] = ModelConfig(model=model_dir, dtype="bfloat16",
                                             max_model_len=1024, skip_tokenizer_init=True)
    if kvtier_extra is not None:
        kwargs["kv_transfer_config"] = KVTransferConfig(
            kv_connector="KvtierConnector", kv_connector_module_path="kvtier.vllm",
            kv_role="kv_both", kv_connector_extra_config=kvtier_extra)
    config = VllmConfig(**kwargs)
    # The engine core resolves one layout from the attention backends' preferences and the
    # workers adopt it (GPUWorker.initialize_from_config): the same call.
    record_kv_cache_layout(config.cache_config, layout_name)
    return config


def build_extensible_cache(vllm_config: Any, device: Any, stand_in: bool) -> SimpleNamespace:
    """vLLM's own steps from GPUWorker.initialize_from_config to extend_kv_cache, with a
    stand-in for the model runner's KV state (no model, no attention backend: kernel blocks are
    the manager's blocks, no layers to bind). Returns the runner stand-in; its
    kv_caches_by_layer are the views vLLM hands the connector."""
    import torch
    import vllm.v1.worker.extensible_kv_cache as ekc
    from vllm.v1.core.kv_cache_planning import (create_kv_cache_group_specs,
                                                get_kv_cache_config_from_groups)
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    from vllm.v1.worker.utils import allocate_kv_cache

    layout = vllm_config.cache_config.get_resolved_kv_cache_layout()
    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=KV_HEADS,
                             head_size=HEAD_SIZE, dtype=torch.bfloat16)
    names = [LAYER_NAME.format(i) for i in range(LAYERS)]
    groups = create_kv_cache_group_specs({n: spec for n in names}, [names])
    config = get_kv_cache_config_from_groups(
        vllm_config, groups, CAPACITY_BLOCKS * LAYERS * spec.page_size_bytes)
    if stand_in:
        ekc.ExtensibleTensor = HostExtensibleTensor  # type: ignore[misc, assignment]
        granule = HostExtensibleTensor.GRANULE
    else:
        from vllm.utils.extensible_tensor import granule_size

        granule = granule_size(device.index or 0)
    config = ekc.pad_kv_cache_segments(config, layout, granule)
    cache = ekc.ExtensibleKVCache(config, device, layout)
    runner = SimpleNamespace(
        extensible_kv_cache=cache, kv_cache_config=config, vllm_config=vllm_config,
        cache_config=vllm_config.cache_config, device=device, kernel_block_sizes=None,
        compilation_config=SimpleNamespace(static_forward_context={}), attn_groups=[],
        speculator=None, spec=spec)
    runner.kv_caches_by_layer = allocate_kv_cache(config, device, layout, None,
                                                  allocate=cache.allocate)
    ekc.ensure_kv_cache_blocks(runner, WARMUP_BLOCKS)  # warmup's first commits
    ekc.extend_kv_cache(runner, config, FINAL_BLOCKS)
    return runner


# ---------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------

def byte_span(t: Any) -> Tuple[int, int, bool]:
    """(first byte, bytes spanned, dense) of a tensor view, from its shape and strides: dense
    when its elements cover [first, first + numel x size) with no gap and no overlap."""
    elem = t.element_size()
    dims = sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1)
    dense, expect = True, 1
    for st, sz in dims:
        dense = dense and st == expect
        expect = st * sz
    span = (sum((sz - 1) * st for sz, st in zip(t.shape, t.stride())) + 1) * elem
    return t.data_ptr(), span, dense and span == t.numel() * elem


def check_layout(runner: SimpleNamespace, desc: Any, on_device: bool) -> List[str]:
    """kvtier's description of the views against vLLM's own placement."""
    problems: List[str] = []
    views = runner.kv_caches_by_layer
    cfg = runner.kv_cache_config
    page = runner.spec.page_size_bytes
    layout = desc.layout
    if desc.num_blocks != cfg.num_blocks or cfg.num_blocks != FINAL_BLOCKS:
        problems.append(f"kvtier registers {desc.num_blocks} blocks, vLLM committed "
                        f"{cfg.num_blocks} (extend_kv_cache asked {FINAL_BLOCKS})")
    if desc.on_device != on_device:
        problems.append(f"on_device {desc.on_device}, the views are on "
                        f"{views[desc.layer_names[0]].device}")
    if layout.num_layers != LAYERS or len(desc.regions) != LAYERS * layout.num_planes:
        problems.append(f"{layout.num_layers} layers / {len(desc.regions)} regions for "
                        f"{LAYERS} layers")
    if layout.chunk_bytes * layout.num_planes != page:
        problems.append(f"kvtier's block of a layer is {layout.chunk_bytes} x {layout.num_planes} "
                        f"bytes, vLLM's page {page}")
    for li, name in enumerate(desc.layer_names):
        view = views[name]
        if name != LAYER_NAME.format(li):
            problems.append(f"layer {li} is {name}")
        base, stride = desc.regions[li * layout.num_planes]
        if base != view.data_ptr():
            problems.append(f"{name}: kvtier's region starts at {base:#x}, vLLM's view at "
                            f"{view.data_ptr():#x}")
        vllm_stride = view.stride(0) * view.element_size()
        if stride != vllm_stride:
            problems.append(f"{name}: kvtier's block stride {stride}, vLLM's {vllm_stride}")
        storage = view.untyped_storage()
        s_begin, s_end = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
        for b in SAMPLED_BLOCKS:
            first, span, dense = byte_span(view[b])
            if first != base + b * stride or span != layout.chunk_bytes * layout.num_planes:
                problems.append(f"{name} block {b}: vLLM's bytes [{first:#x}, +{span}), "
                                f"kvtier's [{base + b * stride:#x}, +{layout.chunk_bytes})")
            if not dense:
                problems.append(f"{name} block {b}: vLLM's view of a block is not one dense range")
            if first < s_begin or first + span > s_end:
                problems.append(f"{name} block {b} lies outside the view's storage "
                                f"[{s_begin:#x}, {s_end:#x}): kvtier would copy uncommitted memory")
    return problems


def summarize(problems: List[str], keep: int = 6) -> str:
    more = f" (and {len(problems) - keep} more)" if len(problems) > keep else ""
    return "; ".join(problems[:keep]) + more


def _pattern(layer: int, block: int, nbytes: int, device: Any) -> Any:
    import torch

    i = torch.arange(nbytes, dtype=torch.int64, device=device)
    return ((i * 7 + layer * 131 + block * 17) % 251).to(torch.uint8)


def _block_bytes(view: Any, b: int) -> Any:
    """Block b of a layer's view as bytes, in the view's logical order (its innermost
    dimension is contiguous in every layout)."""
    import torch

    return view[b].view(torch.uint8)


def round_trip(manager: Any, runner: SimpleNamespace, desc: Any, tag: str) -> Dict[str, Any]:
    """Saves SRC_BLOCKS (a pattern written through vLLM's views), scribbles G1, loads them
    into DST_BLOCKS; every byte checked, neighbours must keep the scribble."""
    import torch

    views = runner.kv_caches_by_layer
    device = views[desc.layer_names[0]].device
    cuda = device.type == "cuda"
    # The fills below are queued on this stream: kvtier's copies are ordered after them, as
    # KvtierConnector orders them after vLLM's stream. None (host G1): no ordering.
    stream = torch.cuda.current_stream().cuda_stream if cuda else None
    tokens = [(i * 7919 + 11) % 32000 for i in range(len(SRC_BLOCKS) * BLOCK_SIZE + 1)]
    nbytes = desc.layout.chunk_bytes * desc.layout.num_planes
    for li, name in enumerate(desc.layer_names):
        for b in SRC_BLOCKS:
            _block_bytes(views[name], b).copy_(_pattern(li, b, nbytes, device).view(
                _block_bytes(views[name], b).shape))
    rid = f"save-{tag}"
    n, _ = manager.lookup(rid, tokens, 0)
    if n != 0:
        raise CheckFailed(f"a fresh manager found {n} tokens before any save")
    manager.commit(rid, tokens, SRC_BLOCKS)
    manager.start_save(stream)
    manager.request_finished(rid)
    manager.wait_for_saves()
    saved = manager.stats()["saved_blocks"]
    if saved != len(SRC_BLOCKS):
        raise CheckFailed(f"{saved} blocks saved of {len(SRC_BLOCKS)} ({manager.stats()})")
    touched = sorted(set(SRC_BLOCKS) | set(DST_BLOCKS)
                     | {DST_BLOCKS[0] - 1, DST_BLOCKS[-1] + 1})
    for name in desc.layer_names:
        for b in touched:
            _block_bytes(views[name], b).fill_(SCRIBBLE)
    rid = f"load-{tag}"
    n, by_tier = manager.lookup(rid, tokens, 0)
    want = len(SRC_BLOCKS) * BLOCK_SIZE
    if n != want:
        raise CheckFailed(f"lookup after the save found {n} tokens, not {want} ({by_tier})")
    manager.prepare_load(rid, DST_BLOCKS, n)
    manager.start_load(stream)
    for layer in range(desc.layout.num_layers):
        err = manager.wait_layer(layer)
        if err is not None:
            raise CheckFailed(f"wait_layer({layer}): {err}")
    loaded = manager.loaded_tokens(rid)
    manager.request_finished(rid)
    if cuda:
        torch.cuda.synchronize()
    mismatched, scribble_lost = 0, 0
    for li, name in enumerate(desc.layer_names):
        for src, dst in zip(SRC_BLOCKS, DST_BLOCKS):
            got = _block_bytes(views[name], dst).reshape(-1)
            mismatched += int((got != _pattern(li, src, nbytes, device)).sum())
        for b in touched:
            if b not in DST_BLOCKS:
                scribble_lost += int((_block_bytes(views[name], b) != SCRIBBLE).sum())
    result = {"loaded_tokens": loaded, "by_tier": list(by_tier), "mismatched_bytes": mismatched,
              "overwritten_neighbour_bytes": scribble_lost,
              "bytes_checked": len(SRC_BLOCKS) * nbytes * len(desc.layer_names)}
    if loaded != want or mismatched or scribble_lost:
        raise CheckFailed(f"round trip: {result}")
    return result


def kvtier_config() -> Any:
    import kvtier

    return kvtier.load_config({"g2.capacity_bytes": "64MiB", "g2.lock_memory": False,
                               "g2.prefault_threads": 1, "g3.enabled": False},
                              file="", environment=False)


def inject_fault(desc: Any, fault: str) -> None:
    """--fault: a wrong description, to show that the checks catch one (tests only)."""
    if fault == "region":  # every region one block further on: a base kvtier got wrong
        desc.regions[:] = [(base + stride, stride) for base, stride in desc.regions]


def check_layout_and_round_trip(layout_name: str, device: Any, stand_in: bool,
                                fault: str = "") -> Dict[str, Any]:
    """Steps 1 and 2 for one layout: describe + register as register_kv_caches does. The
    round trip runs even when the layout check failed (both findings are reported)."""
    import kvtier
    from kvtier.vllm.layouts import describe_kv_caches

    runner = build_extensible_cache(make_vllm_config(layout_name), device, stand_in)
    cache = runner.extensible_kv_cache
    out: Dict[str, Any] = {"layout": layout_name,
                           "physical_chunks": cache.buffer.num_physical_chunks,
                           "physical_bytes": cache.physical_bytes}
    try:
        try:
            desc = describe_kv_caches(runner.kv_caches_by_layer, block_size=BLOCK_SIZE,
                                      num_kv_heads=KV_HEADS, head_size=HEAD_SIZE,
                                      num_blocks=runner.kv_cache_config.num_blocks)
        except ValueError as e:
            if layout_name not in REFUSED_LAYOUTS:
                raise
            out["refused"] = str(e)  # as it must: a block is not one range of bytes here
            return out
        if layout_name in REFUSED_LAYOUTS:
            raise CheckFailed(f"kvtier accepted {layout_name}, where a block is one range of "
                              f"bytes per head, not one range: {desc.layout}")
        out["kvtier_layout"] = str(desc.layout)
        out["namespace_tag"] = desc.namespace_tag
        inject_fault(desc, fault)
        problems = check_layout(runner, desc, device.type == "cuda")
        manager = kvtier.BlockManager(desc.layout, f"gpu-vllm034-{layout_name}", kvtier_config())
        try:
            manager.register_memory(desc.layout, desc.num_blocks, desc.regions, desc.on_device)
            out["round_trip"] = round_trip(manager, runner, desc, layout_name)
        except CheckFailed as e:
            problems.insert(0, str(e))  # the bytes first: the summary keeps it
        finally:
            manager.close()
        if problems:
            raise CheckFailed("kvtier's layout is not vLLM's: " + summarize(problems))
    finally:
        cache.free()
    return out


class _AttentionModule:
    """What kvtier reads of a model's attention module at registration
    (python/kvtier/vllm/layout_vouch.py): the backend that writes the layer's KV. There is no
    model here, so no real module: the backend is vLLM's own FlashAttention class (its name and
    declared layouts are vLLM's), with no impl, so kvtier cannot run its byte probe and keys
    the blocks under the static fingerprint (backend, dtypes, shape, stride order, vLLM line)."""

    def __init__(self, name: str, backend: Any) -> None:
        self.layer_name = name
        self.attn_backend = backend
        self.impl = None
        self.kv_cache_dtype = "auto"
        self.num_kv_heads = KV_HEADS
        self.head_size = HEAD_SIZE
        self.head_size_v = HEAD_SIZE

    def get_attn_backend(self) -> Any:
        return self.attn_backend


def install_attention_modules(vllm_config: Any) -> str:
    """Registers one attention module per layer where the model would
    (compilation_config.static_forward_context), so that kvtier vouches for the layout as it
    does in an engine. Returns the backend's name."""
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

    ctx = vllm_config.compilation_config.static_forward_context
    for i in range(LAYERS):
        name = LAYER_NAME.format(i)
        ctx[name] = _AttentionModule(name, FlashAttentionBackend)
    return FlashAttentionBackend.get_name()


def check_connector(device: Any, stand_in: bool, work: str) -> Dict[str, Any]:
    """Step 3: vLLM creates KvtierConnector (worker role) from kv_transfer_config in
    extend_kv_cache and registers the committed views; the connector's manager round-trips."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group
    from vllm.distributed.parallel_state import (ensure_model_parallel_initialized,
                                                 init_distributed_environment)

    layout_name = LAYOUTS[0]
    extra = {"g2.capacity_bytes": "64MiB", "g2.lock_memory": False, "g3.enabled": False}
    config = make_vllm_config(layout_name, write_model_dir(os.path.join(work, "model")), extra)
    # The worker's state: its configuration current (as GPUWorker sets it), and its
    # distributed groups (one rank): vLLM's connector set-up broadcasts the engine id over the
    # tensor-parallel group.
    out: Dict[str, Any] = {"layout": layout_name}
    out["attention"] = install_attention_modules(config)
    with set_current_vllm_config(config):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"file://{work}/dist-init")
        ensure_model_parallel_initialized(1, 1)
        runner = build_extensible_cache(config, device, stand_in)
    try:
        if not has_kv_transfer_group():
            raise CheckFailed("vLLM created no KV connector from kv_transfer_config")
        connector = get_kv_transfer_group()
        out["connector"] = type(connector).__name__
        # The connector's worker side (kvtier/vllm/worker.py) holds the manager.
        worker_side = getattr(connector, "connector_worker", None)
        manager = getattr(worker_side, "_manager", None)
        desc = getattr(worker_side, "_layout", None)
        if manager is None or desc is None:
            raise CheckFailed(f"{type(connector).__name__}.register_kv_caches left no kvtier "
                              f"manager (was it called with the committed views?)")
        out["kvtier_layout"] = str(desc.layout)
        problems = check_layout(runner, desc, device.type == "cuda")
        if problems:
            raise CheckFailed("the connector's layout is not vLLM's: " + summarize(problems))
        out["round_trip"] = round_trip(manager, runner, desc, "connector")
        return out
    finally:
        from vllm.distributed.kv_transfer.kv_transfer_state import ensure_kv_transfer_shutdown

        ensure_kv_transfer_shutdown()
        runner.extensible_kv_cache.free()


def run_check(name: str, results: Dict[str, Any], fn: Any, *args: Any) -> bool:
    t0 = time.perf_counter()
    try:
        results["checks"][name] = {"ok": True, **fn(*args)}
        say(f"PASS {name}: {json.dumps(results['checks'][name])}")
        ok = True
    except Exception as e:  # noqa: BLE001 - every failure is reported, then the next check runs
        detail = f"{type(e).__name__}: {e}"
        results["checks"][name] = {"ok": False, "error": detail,
                                   "traceback": traceback.format_exc()[-4000:]}
        say(f"FAIL {name}: {detail}")
        ok = False
    results["checks"][name]["seconds"] = round(time.perf_counter() - t0, 3)
    return ok


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu-stand-in", action="store_true",
                    help="host memory and a stand-in ExtensibleTensor (tests this script; "
                         "proves nothing about CUDA)")
    ap.add_argument("--json", default="", help="write the results there")
    ap.add_argument("--layouts", default=",".join(LAYOUTS),
                    help=f"comma-separated vLLM KV cache layouts (default {','.join(LAYOUTS)})")
    ap.add_argument("--no-connector", action="store_true",
                    help="skip step 3 (vLLM creating KvtierConnector)")
    ap.add_argument("--fault", choices=["", "region"], default="",
                    help="tests only: describe the memory wrongly (the checks must fail)")
    args = ap.parse_args(argv)
    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    bad = [x for x in layouts if x not in LAYOUTS]
    if bad or not layouts:
        say(f"unknown layout(s) {bad}; vLLM 0.34's are {list(LAYOUTS)}")
        return EXIT_USAGE
    import torch

    if not args.cpu_stand_in and not torch.cuda.is_available():
        say("SKIPPED: no usable GPU (torch.cuda.is_available() is False); nothing was checked. "
            "On a GPU machine this is a failure of the machine, not a pass.")
        return EXIT_SKIPPED
    vllm = import_vllm(args.cpu_stand_in)
    try:
        import kvtier  # noqa: F401
        from kvtier.vllm.layouts import describe_kv_caches  # noqa: F401
    except ImportError as e:
        say(f"CANNOT RUN: kvtier is not importable ({e}); bench/gpu-pack.sh packs it")
        return EXIT_USAGE
    results: Dict[str, Any] = {"vllm": vllm.__version__, "vllm_file": vllm.__file__,
                               "torch": torch.__version__, "stand_in": args.cpu_stand_in,
                               "stood_in_modules": STOOD_IN,
                               "checks": {}}
    if args.cpu_stand_in:
        device = torch.device("cpu")
    else:
        from vllm.utils.vmm_driver import vmm_unavailable_reason

        torch.cuda.set_device(0)
        device = torch.device("cuda", 0)
        results["gpu"] = torch.cuda.get_device_name(0)
        reason = vmm_unavailable_reason()
        if reason:
            say(f"FAIL: CUDA virtual memory management is unusable here ({reason}): vLLM "
                f"would not use its extensible KV cache, and nothing could be checked")
            results["checks"]["vmm"] = {"ok": False, "error": reason}
            _write(args.json, results)
            return EXIT_FAILED
    say(f"vLLM {vllm.__version__} ({vllm.__file__}), torch {torch.__version__}, "
        f"{results.get('gpu', 'CPU stand-in')}")
    ok = True
    for name in layouts:
        ok &= run_check(f"layout_{name}", results, check_layout_and_round_trip, name, device,
                        args.cpu_stand_in, args.fault)
    if not args.no_connector:
        with tempfile.TemporaryDirectory(prefix="gpu-vllm034-") as work:
            ok &= run_check("connector", results, check_connector, device, args.cpu_stand_in,
                            work)
    results["ok"] = ok
    _write(args.json, results)
    say("all checks passed" if ok else "FAILED (see above)")
    return EXIT_OK if ok else EXIT_FAILED


def _write(path: str, results: Dict[str, Any]) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())

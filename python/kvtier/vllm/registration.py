"""What a worker needs before it builds its BlockManager over vLLM's KV caches: their layout
(kvtier/vllm/layouts.py), kvtier's vouch for it (layout_vouch.py) and the model id that names
the key space; and the CPU cores kvtier's threads start on."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import time
from typing import TYPE_CHECKING, Any, Dict, Iterator

import torch
from vllm.logger import init_logger

from kvtier.vllm.deployment import Deployment
from kvtier.vllm.groups import check_aliasing
from kvtier.vllm.keys import model_fingerprint
from kvtier.vllm.layout_vouch import LayoutVouch, vouch_registered_caches
from kvtier.vllm.layouts import KvCacheLayout, describe_kv_caches

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger("kvtier.vllm")


@dataclasses.dataclass
class Registration:
    layout: KvCacheLayout
    vouch: LayoutVouch
    kv_caches: Dict[str, torch.Tensor]  # the layers kvtier reads (hybrid: the primary group's)
    model_id: str  # the model, its weights' fingerprint, the layout, the ranks, the groups
    fingerprint_s: float  # how long the weights' fingerprint took


def describe_registration(d: Deployment, vllm_config: "VllmConfig", kv_cache_config: Any,
                          kv_caches: Dict[str, torch.Tensor], rank: int,
                          pp_rank: int) -> Registration:
    """Describes and vouches for the KV caches vLLM registered on rank `rank` of stage
    `pp_rank`. Raises KvLayoutNotVouched for a layout kvtier has not seen (unless
    allow_unvouched_layout), ValueError for hybrid groups that do not share their memory."""
    groups = d.groups
    model_config = vllm_config.model_config
    # The KV cache manager's block count tells an attention backend's kernel blocks (a block
    # dimension k times longer) from vLLM's blocks; older vLLMs pass no config.
    groups_tag = ""
    if groups.hybrid:
        # The primary (first full-attention) group's layers stand for every group's: they view
        # the same memory (a state group's padded page is an attention page).
        primary = groups.groups[groups.primary]
        check_aliasing(groups.groups, kv_caches, primary.index)
        kv_caches = {n: kv_caches[n] for n in primary.layer_names}
        # Kinds and windows in clear, the layer lists as a hash: a model whose grouping changes
        # gets new keys, and the id stays short (every layer of every group spelled out passed
        # the daemon's model-id limit with 12 layers).
        layers = hashlib.sha256("|".join(
            "+".join(g.layer_names) for g in groups.groups).encode()).hexdigest()[:16]
        groups_tag = "|hma:" + ",".join(
            f"{g.kind}{g.window or ''}" for g in groups.groups) + ":" + layers
    layout = describe_kv_caches(
        kv_caches, block_size=d.block_size,
        num_kv_heads=model_config.get_num_kv_heads(vllm_config.parallel_config),
        head_size=model_config.get_head_size(),
        num_blocks=getattr(kv_cache_config, "num_blocks", None))
    # Refuses (KvLayoutNotVouched) a layout kvtier has not seen; fingerprints the block bytes'
    # real order for the namespace (kvtier/vllm/layout_vouch.py).
    vouch = vouch_registered_caches(
        vllm_config, kv_cache_config, kv_caches, layout.layer_names, d.block_size,
        layout.num_blocks, layout.namespace_tag, d.settings.allow_unvouched_layout)
    t0 = time.perf_counter()
    weights = model_fingerprint(vllm_config, d.settings.weights_id)
    took = time.perf_counter() - t0
    model_id = (f"{d.model_name}|w{weights}|{vouch.namespace_tag}"
                f"|tp{rank}of{d.tp_size}|pp{pp_rank}of{d.pp_size}{groups_tag}")
    return Registration(layout, vouch, kv_caches, model_id, took)


@contextlib.contextmanager
def off_vllm_cores() -> Iterator[None]:
    """Runs its body on the cores vLLM left free (all cores when it left none), then restores
    this thread's mask. vLLM's CPU worker pins this thread to its OpenMP cores, and threads
    inherit the mask: kvtier's copy, disk and lookup threads started in the body would
    otherwise compete with the model for the compute cores."""
    pinned = os.sched_getaffinity(0)
    everything = set(range(os.cpu_count() or 1))
    free = everything - pinned
    try:
        os.sched_setaffinity(0, free or everything)
    except OSError as e:  # a cgroup may refuse some cores: keep vLLM's mask
        logger.warning("kvtier: could not move its threads off vLLM's cores: %s", e)
    try:
        yield
    finally:
        os.sched_setaffinity(0, pinned)

"""What KvtierConnector's scheduler side sends its worker side each step, in the connector
metadata vLLM already carries from the engine core to every model worker (connector.py's module
docstring has the rules these fields keep)."""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional, Tuple

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

# A lookup's answer by tier (G1, G2, G3, G4 blocks) when nothing is offered.
NO_HIT: Tuple[int, int, int, int] = (0, 0, 0, 0)


@dataclasses.dataclass
class LoadSpec:
    key: str  # the request's id in kvtier: vLLM's id and its preemption count
    block_ids: List[int]  # the request's whole G1 block table
    num_tokens: int  # tokens to load past num_computed_tokens
    num_computed_tokens: int  # what vLLM's own prefix cache supplied
    is_async: bool
    # Hybrid models (kvtier/vllm/groups.py): every group's whole table, and the lookup's
    # (tokens, salt, lora, extras, load_tiers, store_tiers) for the sliding groups, whose loads
    # start at the window (the worker looks them up again from there).
    group_block_ids: Optional[List[List[int]]] = None
    query: Optional[Tuple[Any, ...]] = None


@dataclasses.dataclass
class SaveSpec:
    key: str
    token_start: int  # the absolute position of tokens[0] in the request
    tokens: List[int]  # real token ids (whole blocks only)
    block_start: int  # the absolute index of block_ids[0] in the request's block table
    block_ids: List[int]
    group_block_ids: Optional[List[List[int]]] = None  # hybrid: every group's, from block_start
    # hybrid with state (mamba) groups: (group, block index, G1 block id) of each state vLLM
    # handed over at a boundary this save keys (SchedulerOutput.kv_connector_block_state).
    state_blocks: List[Tuple[int, int, int]] = dataclasses.field(default_factory=list)


# How a finished request is reported back (rule 3 of connector.py's module docstring).
REPORT_NONE, REPORT_SENDING, REPORT_RECVING = "none", "sending", "recving"


@dataclasses.dataclass
class FinishSpec:
    key: str
    report: str  # REPORT_NONE | REPORT_SENDING | REPORT_RECVING


@dataclasses.dataclass
class KvtierMetadata(KVConnectorMetadata):  # type: ignore[misc]  # vLLM's class: Any to mypy
    loads: List[LoadSpec] = dataclasses.field(default_factory=list)
    saves: List[SaveSpec] = dataclasses.field(default_factory=list)
    finished: List[FinishSpec] = dataclasses.field(default_factory=list)
    preempted: List[str] = dataclasses.field(default_factory=list)  # kvtier keys


def vllm_id(key: str) -> str:
    """vLLM's request id of a kvtier key (the key less its "#<preemptions>")."""
    return key.rsplit("#", 1)[0]

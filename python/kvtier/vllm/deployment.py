"""What both sides of KvtierConnector know of the engine they serve, read once from vLLM's
configuration when the connector is built: kvtier's own settings, the block size, the parallel
layout, the KV cache groups and the names the lookup channel goes by."""

from __future__ import annotations

import dataclasses
import logging
from typing import Set

import kvtier
from kvtier.vllm.daemon_lookup import instance_name
from kvtier.vllm.groups import GroupPlan
from kvtier.vllm.settings import ConnectorSettings


@dataclasses.dataclass(frozen=True)
class Deployment:
    settings: ConnectorSettings
    block_size: int  # vLLM's (scheduler) block size, in tokens
    engine_id: str  # vLLM's kv_transfer_config.engine_id
    tp_size: int
    pp_size: int
    dp_rank: int
    dp_size: int
    groups: GroupPlan  # which KV cache groups kvtier moves (kvtier/vllm/groups.py)
    model_name: str  # the model id's first part: settings.model_id, else vLLM's model
    kv_role: str  # vLLM's kv_role (disaggregated prefill/decode: docs/pd.md)

    def instance(self, pp_rank: int) -> str:
        """The lookup channel's name: one per engine instance, DP rank and PP stage."""
        return f"{self.engine_id}-dp{self.dp_rank}-pp{pp_rank}"

    def service_instance(self, config: kvtier.Config, pp_rank: int, tp_rank: int) -> str:
        """Attached mode: the daemon's name for one worker (the scheduler looks up under it)."""
        return instance_name(config.get("service.instance"), self.engine_id, self.dp_rank,
                             pp_rank, tp_rank)


def warn_once(logger: logging.Logger, warned: Set[str], what: str, message: str) -> None:
    """Logs `message` the first time `what` is seen in `warned` (which it then holds)."""
    if what not in warned:
        warned.add(what)
        logger.warning(message)

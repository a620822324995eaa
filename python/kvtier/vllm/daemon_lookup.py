"""The scheduler's lookups straight to `kvtier serve` (attached mode, docs/service.md).

With ``service.socket`` set, vLLM's workers are attached to the per-host daemon and the
daemon holds the index. The scheduler then asks the daemon itself, through
:class:`kvtier.ServiceLookup` under each worker's instance name, instead of asking its workers
over the lookup channel (:mod:`kvtier.vllm.lookup`): no hop through a worker that may be busy
in a forward pass, and no channel socket per rank. :class:`DaemonLookupClient` has
:class:`~kvtier.vllm.lookup.LookupClient`'s interface, so the connector drives both alike.

A lookup is one blocking call, bounded by ``service.call_timeout_ms``; a daemon that is gone
or an instance that has not attached answers 0 tokens (a miss), never an error or a hang.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

import kvtier
from kvtier.vllm.lookup import LookupClient, LookupRequest


def instance_name(base: str, engine_id: str, dp_rank: int, pp_rank: int, tp_rank: int) -> str:
    """The daemon's name for one worker: the scheduler and the worker compute the same one.
    `base` is the configured service.instance ("" for vLLM's engine id)."""
    return f"{base or 'vllm-' + engine_id}-dp{dp_rank}-pp{pp_rank}-tp{tp_rank}"


class DaemonLookupClient:
    """One worker's lookups, answered by kvtier serve. Not thread-safe (vLLM's scheduler calls
    it from one thread); never raises."""

    PENDING, OK, FAILED = LookupClient.PENDING, LookupClient.OK, LookupClient.FAILED

    def __init__(self, config: kvtier.Config, instance: str) -> None:
        self.instance = instance
        self._lookup = kvtier.ServiceLookup(config, instance)
        self._seq = 0
        self._answers: Dict[int, Tuple[str, Any]] = {}

    def submit(self, request: LookupRequest) -> int:
        key, tokens, num_computed, salt, lora, extras = request[:6]
        load_tiers = request[6] if len(request) > 6 else ""
        store_tiers = request[7] if len(request) > 7 else ""
        self._seq += 1
        try:
            answer = self._lookup.lookup(key, tokens, num_computed, cache_salt=salt,
                                         adapter_id=lora, block_extra=extras,
                                         load_tiers=load_tiers, store_tiers=store_tiers)
            self._answers[self._seq] = (self.OK, answer)
        except kvtier.KvtierError as e:  # the daemon refused this request (a bad one)
            self._answers[self._seq] = (self.FAILED, str(e))
        return self._seq

    def result(self, seq: int, wait_s: float) -> Tuple[str, Any]:
        return self._answers.get(seq, (self.FAILED, "the lookup was given up"))

    def forget(self, seq: int) -> None:
        self._answers.pop(seq, None)

    def stats(self) -> Dict[str, Any]:
        return dict(self._lookup.stats())

    def close(self) -> None:
        self._answers.clear()

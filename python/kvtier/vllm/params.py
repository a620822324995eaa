"""Per-request controls, from a request's ``kv_transfer_params`` (vLLM passes
``SamplingParams.extra_args["kv_transfer_params"]`` through to the connector)::

    {"kvtier": {"save": false,             # do not save this request's blocks
                "load": false,             # do not load (compute the whole prompt)
                "max_load_tokens": 4096,   # load at most this many tokens
                "load_tiers": ["G2", "G3"],# load only from these tiers (default: all)
                "store_tiers": ["G2"],     # store only in these (default: all); without
                                           # G2 nothing is stored, G2 leads to the others
                "expect_tokens": 4096      # disaggregated decode: a producer saved this many
               }}                          # prompt tokens; wait (pd_wait_ms) for them

A producer (``kv_role`` "kv_producer", or a request with vLLM's ``do_remote_decode``) returns
``{"kvtier": {"expect_tokens": N}}`` from ``request_finished``; a P/D proxy (``kvtier router
--pd``) hands it to the consumer, which waits a bounded time for those blocks to arrive
(docs/pd.md). vLLM's own P/D keys (``do_remote_prefill``, ``do_remote_decode``, ...) sit
beside "kvtier" and are read by the connector, not refused.

A control kvtier does not know, or a value of the wrong type, makes kvtier leave the request
alone (no load, no save) and says why once: a typo never silently changes what is cached.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional

_TIERS = ("G2", "G3", "G4")


@dataclasses.dataclass(frozen=True)
class RequestControls:
    save: bool = True
    load: bool = True
    max_load_tokens: Optional[int] = None
    load_tiers: str = ""  # "" = every tier; else e.g. "G2,G3"
    store_tiers: str = ""  # the same, for where the request's blocks may be stored
    expect_tokens: int = 0  # P/D: prompt tokens the producer saved (0: none announced)
    remote_prefill: bool = False  # vLLM's do_remote_prefill: this request is a P/D consumer's
    remote_decode: bool = False  # vLLM's do_remote_decode: this request is a P/D producer's
    error: str = ""  # why the controls were refused (the request is then left alone)

    @staticmethod
    def parse(params: Optional[Mapping[str, Any]]) -> "RequestControls":
        if not params:
            return RequestControls()
        flags: Dict[str, bool] = {}
        for name, field in (("do_remote_prefill", "remote_prefill"),
                            ("do_remote_decode", "remote_decode")):
            value = params.get(name, False)
            if not isinstance(value, bool):
                return RequestControls(error=f"kv_transfer_params.{name} must be true or false, "
                                             f"not {value!r}")
            flags[field] = value
        if "kvtier" not in params:
            return RequestControls(remote_prefill=flags["remote_prefill"],
                                   remote_decode=flags["remote_decode"])
        raw = params["kvtier"]
        if not isinstance(raw, Mapping):
            return RequestControls(error=f"kv_transfer_params.kvtier must be an object, not "
                                         f"{type(raw).__name__}")
        known = {"save", "load", "max_load_tokens", "load_tiers", "store_tiers", "expect_tokens"}
        unknown = sorted(set(raw) - known)
        if unknown:
            return RequestControls(error=f"unknown kv_transfer_params.kvtier key(s) "
                                         f"{', '.join(map(str, unknown))}; allowed: "
                                         f"{', '.join(sorted(known))}")
        for flag in ("save", "load"):
            if flag in raw and not isinstance(raw[flag], bool):
                return RequestControls(error=f"kv_transfer_params.kvtier.{flag} must be true or "
                                             f"false, not {raw[flag]!r}")
        cap = raw.get("max_load_tokens")
        if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 0):
            return RequestControls(error=f"kv_transfer_params.kvtier.max_load_tokens must be a "
                                         f"non-negative integer, not {cap!r}")
        expect = raw.get("expect_tokens", 0)
        if not isinstance(expect, int) or isinstance(expect, bool) or expect < 0:
            return RequestControls(error=f"kv_transfer_params.kvtier.expect_tokens must be a "
                                         f"non-negative integer, not {expect!r}")
        lists = {}
        for name in ("load_tiers", "store_tiers"):
            tiers = raw.get(name)
            lists[name] = ""
            if tiers is not None:
                if (not isinstance(tiers, (list, tuple)) or not tiers
                        or any(t not in _TIERS for t in tiers)):
                    return RequestControls(error=f"kv_transfer_params.kvtier.{name} must be a "
                                                 f"non-empty list of {', '.join(_TIERS)}, not "
                                                 f"{tiers!r}")
                lists[name] = ",".join(t for t in _TIERS if t in tiers)
        return RequestControls(save=raw.get("save", True), load=raw.get("load", True),
                               max_load_tokens=cap, load_tiers=lists["load_tiers"],
                               store_tiers=lists["store_tiers"], expect_tokens=expect,
                               remote_prefill=flags["remote_prefill"],
                               remote_decode=flags["remote_decode"])

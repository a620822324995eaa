"""`kvtier router --pd`: disaggregated prefill and decode (docs/pd.md).

Every request goes first to a prefill worker (``role=prefill``: a vLLM with kv_role
"kv_producer"), as vLLM's P/D proxies send it: max_tokens 1, not streamed, and
``kv_transfer_params: {"do_remote_decode": true}``. The producer saves the prompt's KV in kvtier
and answers with the ``kv_transfer_params`` that a consumer needs:
``{"do_remote_prefill": true, "kvtier": {"expect_tokens": N}}``. The request then goes to a
decode worker (``role=decode``: kv_role "kv_consumer") with those params merged into its own.
The decode worker loads the prompt from kvtier: from the shared G2 on the producer's host, or
from G4 on another host. Its stream goes back to the client.

The decode worker is chosen by the router's tier-aware TTFT estimate, which knows from the
workers' KV events where the producer's blocks are. A prefill that fails, or takes longer than
``--pd-prefill-timeout`` (a slow or stuck prefill worker), is not an error. The request is
then served colocated on a decode worker, which computes the prompt itself. The fallback is
counted, and logged in the decision. A decode worker that cannot be reached is retried on
another, as any routed request is (proxy.Router.forward).
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING, Any, Dict, List, Tuple

if TYPE_CHECKING:
    from kvtier.router.proxy import Router

log = logging.getLogger("kvtier.router")

PREFILL_ROLES = ("prefill", "both")


def prefill_body(body: Dict[str, Any], chat: bool) -> Dict[str, Any]:
    """The producer's request: one token, not streamed, vLLM's do_remote_decode."""
    out = dict(body)
    out["max_tokens"] = 1
    if chat:
        out["max_completion_tokens"] = 1
    out["stream"] = False
    out.pop("stream_options", None)
    out["n"] = 1
    params = dict(body.get("kv_transfer_params") or {})
    params["do_remote_decode"] = True
    out["kv_transfer_params"] = params
    return out


def decode_body(body: Dict[str, Any], produced: Dict[str, Any]) -> Dict[str, Any]:
    """The consumer's request: the client's, with the producer's kv_transfer_params merged in
    (its "kvtier" controls and the client's own merged key by key, the producer's winning)."""
    out = dict(body)
    params = dict(body.get("kv_transfer_params") or {})
    mine = dict(params.get("kvtier") or {})
    for k, v in produced.items():
        if k == "kvtier" and isinstance(v, dict):
            mine.update(v)
        else:
            params[k] = v
    if mine:
        params["kvtier"] = mine
    params.pop("do_remote_decode", None)
    out["kv_transfer_params"] = params
    return out


async def disaggregate(router: "Router", request: Any, body: Dict[str, Any],
                       tokens: List[int]) -> Tuple[bytes, Dict[str, Any]]:
    """Runs the prefill half. Returns the body to send to a decode worker and the decision's
    P/D entry (the prefill worker, its time, or why it fell back)."""
    import aiohttp

    entry: Dict[str, Any] = {}
    original = json.dumps(body).encode()
    if body.get("n", 1) not in (1, None):
        entry["fallback"] = "n > 1 is served colocated"
        router.counters["pd_fallbacks"] += 1
        return original, entry
    worker, why = router.choose(tokens, body, roles=PREFILL_ROLES)
    if worker is None:
        entry["fallback"] = "no prefill worker is up"
        router.counters["pd_fallbacks"] += 1
        return original, entry
    chat = request.path.endswith("/chat/completions")
    rid = -1 - router.counters["pd_prefills"]  # prefills' in-flight ids: negative, never reused
    router.counters["pd_prefills"] += 1
    entry["prefill_worker"] = worker.id
    est = why["chosen"]["ttft_s"]
    worker.inflight[rid] = (time.monotonic(), est)
    worker.active += 1
    worker.requests += 1
    t0 = time.monotonic()
    produced: Any = None
    try:
        async with router._session.post(
                worker.spec.url + request.path, json=prefill_body(body, chat),
                timeout=aiohttp.ClientTimeout(total=router.s.pd_prefill_timeout_s)) as up:
            text = await up.text()
            if up.status != 200:
                raise ValueError(f"prefill worker {worker.id} answered {up.status}: {text[:200]}")
            produced = json.loads(text).get("kv_transfer_params")
            if not isinstance(produced, dict):
                raise ValueError(f"prefill worker {worker.id} returned no kv_transfer_params "
                                 f"(is it a vLLM with kv_role kv_producer and kvtier?)")
    except asyncio.TimeoutError:
        entry["fallback"] = (f"prefill worker {worker.id} took over "
                             f"{router.s.pd_prefill_timeout_s:g} s")
    except (aiohttp.ClientError, OSError) as exc:
        router._set_up(worker, False)
        worker.errors += 1
        entry["fallback"] = f"prefill worker {worker.id} failed: {exc}"
    except ValueError as exc:
        worker.errors += 1
        entry["fallback"] = str(exc)
    finally:
        worker.inflight.pop(rid, None)
        worker.active -= 1
    entry["prefill_s"] = time.monotonic() - t0
    if "fallback" in entry:
        log.warning("P/D: %s; serving the request colocated on a decode worker",
                    entry["fallback"])
        router.counters["pd_fallbacks"] += 1
        return original, entry
    entry["kv_transfer_params"] = produced
    return json.dumps(decode_body(body, produced)).encode(), entry

"""`kvtier router`: an OpenAI-compatible HTTP proxy in front of N `vllm serve` workers.

For each completion request it tokenizes the prompt (the worker's own /tokenize, so the chat
template and tokenizer are exactly the engine's; or a local Hugging Face tokenizer), computes the
prompt's block keys in the router's namespace, asks KvRouter (the C++ prefix index and TTFT
estimate, include/kvtier/router.h) which worker would answer first, and streams that worker's
response through. docs/router.md has the design.
"""
from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from kvtier import _kvtier
from kvtier.router.events import EventTranslator, RouterEvent, StreamState, subscribe

log = logging.getLogger("kvtier.router")

POLICIES = ("kvtier", "round-robin", "least-loaded")

# Headers a proxy must not pass through (RFC 9110 section 7.6.1) plus the ones aiohttp sets.
_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
        "trailer", "transfer-encoding", "upgrade", "content-length", "content-encoding",
        "host"}


class WorkersUnavailable(Exception):
    """No worker could serve a step of the request (tokenizing it): 503, not the client's
    fault."""


ROLES = ("both", "prefill", "decode")


@dataclass
class WorkerSpec:
    url: str                       # http://host:port of a `vllm serve`
    events: List[str] = field(default_factory=list)   # ZMQ PUB endpoints it publishes on
    replay: List[str] = field(default_factory=list)   # matching ROUTER replay endpoints ("" none)
    role: str = "both"             # --pd: "prefill" (kv_producer), "decode" (kv_consumer), both

    @staticmethod
    def parse(text: str) -> "WorkerSpec":
        """``URL[,events=EP][,replay=EP]...[,role=R]`` (events/replay may repeat, paired in
        order)."""
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts or not parts[0].startswith(("http://", "https://")):
            raise ValueError(f"--worker '{text}': expected URL[,events=tcp://H:P[,replay=tcp://H:P]]"
                             " with an http:// URL first")
        spec = WorkerSpec(url=parts[0].rstrip("/"))
        for p in parts[1:]:
            k, sep, v = p.partition("=")
            if k == "role" and sep:
                if v not in ROLES:
                    raise ValueError(f"--worker '{text}': role={v} is none of {', '.join(ROLES)}")
                spec.role = v
                continue
            if not sep or k not in ("events", "replay") or not v.startswith(("tcp://", "ipc://")):
                raise ValueError(f"--worker '{text}': '{p}' is not events=ENDPOINT, "
                                 "replay=ENDPOINT (tcp:// or ipc://) or role=prefill|decode|both")
            if k == "events":
                spec.events.append(v)
                spec.replay.append("")
            else:
                if not spec.events or spec.replay[-1]:
                    raise ValueError(f"--worker '{text}': replay= must follow its events=")
                spec.replay[-1] = v
        return spec


@dataclass
class Worker:
    id: int
    spec: WorkerSpec
    up: bool = True
    was_down: bool = False
    inflight: Dict[int, Tuple[float, float]] = field(default_factory=dict)  # id -> (t0, est_s)
    active: int = 0
    requests: int = 0
    errors: int = 0
    streams: List[StreamState] = field(default_factory=list)
    translators: List[EventTranslator] = field(default_factory=list)

    def queue_s(self, now: float) -> float:
        """Work ahead of a new request: what is left of the in-flight prefills' estimates."""
        return sum(max(0.0, est - (now - t0)) for t0, est in self.inflight.values())


@dataclass
class RouterSettings:
    model_id: str = "router"
    tokens_per_block: int = 16
    block_bytes: int = 0
    prefill_tokens_per_s: float = 1000.0
    load_gbps: Tuple[float, float, float, float] = (0.0, 12.0, 2.0, 1.25)
    queue_weight: float = 1.0
    policy: str = "kvtier"
    tokenizer: str = "worker"      # "worker" (POST /tokenize) or a local tokenizer path
    health_interval_s: float = 1.0
    request_timeout_s: float = 600.0
    topic: str = ""
    log_decisions: int = 1000      # decisions kept for GET /router/decisions
    pd: bool = False               # disaggregated: prefill worker first, then decode (pd.py)
    pd_prefill_timeout_s: float = 30.0  # a prefill slower than this falls back to colocated


class Router:
    """The proxy's state: workers, the C++ KvRouter, the subscriptions, the decision log."""

    def __init__(self, settings: RouterSettings, workers: Sequence[WorkerSpec]) -> None:
        if settings.policy not in POLICIES:
            raise ValueError(f"--policy {settings.policy}: expected one of {', '.join(POLICIES)}")
        if not workers:
            raise ValueError("at least one --worker is needed")
        if settings.block_bytes <= 0:
            raise ValueError("--block-bytes must be > 0 (the bytes of one block's KV, all layers)")
        self.s = settings
        self.index = _kvtier.KvRouter(settings.tokens_per_block, settings.block_bytes,
                                      settings.prefill_tokens_per_s, list(settings.load_gbps),
                                      settings.queue_weight)
        self.workers: List[Worker] = []
        for i, spec in enumerate(workers):
            self.index.add_worker(i)
            w = Worker(id=i, spec=spec)
            for ep, rep in zip(spec.events, spec.replay, strict=False):
                w.streams.append(StreamState(endpoint=ep, replay_endpoint=rep or None,
                                             topic=settings.topic))
                w.translators.append(EventTranslator(settings.model_id, settings.tokens_per_block))
            self.workers.append(w)
        self._hashers: Dict[Tuple[str, str], Any] = {}
        self._rr = itertools.count()
        self._ids = itertools.count()
        self.decisions: List[Dict[str, Any]] = []
        self.counters: Dict[str, int] = {"requests": 0, "retries": 0, "no_worker": 0,
                                         "tokenize_failures": 0, "bad_requests": 0,
                                         "pd_prefills": 0, "pd_fallbacks": 0}
        if settings.pd:
            roles = {w.role for w in workers}
            if not roles & {"prefill", "both"} or not roles & {"decode", "both"}:
                raise ValueError("--pd needs a worker for each side: role=prefill (or both) and "
                                 "role=decode (or both)")
        self.tokenize_s = 0.0
        self._stop = asyncio.Event()
        self._tasks: List[asyncio.Task[Any]] = []
        self._session: Any = None
        self._local_tok: Any = None

    # ---------------- keys ----------------
    def hasher(self, cache_salt: str, lora: str) -> Any:
        k = (cache_salt, lora)
        h = self._hashers.get(k)
        if h is None:
            h = _kvtier.BlockHasher(self.s.model_id, self.s.tokens_per_block, cache_salt, lora)
            self._hashers[k] = h
        return h

    # ---------------- events ----------------
    def _apply(self, worker: Worker, events: List[RouterEvent], cleared: bool) -> None:
        if cleared:
            # vLLM's AllBlocksCleared (reset_prefix_cache) or a restarted publisher: what the
            # worker held in its own memory is gone; G3 survives a restart and G4 is shared.
            self.index.clear(worker.id, ["G1", "G2"])
        if events:
            self.index.apply(worker.id, events)

    async def _health(self) -> None:
        import aiohttp

        while not self._stop.is_set():
            for w in self.workers:
                ok = False
                try:
                    timeout = aiohttp.ClientTimeout(total=max(0.5, self.s.health_interval_s))
                    async with self._session.get(w.spec.url + "/health", timeout=timeout) as r:
                        ok = r.status == 200
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                    ok = False
                self._set_up(w, ok)
            try:
                await asyncio.wait_for(self._stop.wait(), self.s.health_interval_s)
            except asyncio.TimeoutError:
                pass

    def _set_up(self, w: Worker, ok: bool) -> None:
        if ok == w.up:
            return
        w.up = ok
        self.index.set_up(w.id, ok)
        if not ok:
            w.was_down = True
            log.warning("worker %d (%s) is down", w.id, w.spec.url)
            # A worker that went down lost its G1 and G2 (process memory).
            self.index.clear(w.id, ["G1", "G2"])
        else:
            log.warning("worker %d (%s) is up again", w.id, w.spec.url)
            for st in w.streams:
                st.resync = True  # it may be a new process: read its events from the start

    async def start(self) -> None:
        import aiohttp

        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.s.request_timeout_s),
            connector=aiohttp.TCPConnector(limit=0))
        if self.s.tokenizer != "worker":
            from transformers import AutoTokenizer  # optional: only for a local tokenizer

            self._local_tok = AutoTokenizer.from_pretrained(self.s.tokenizer)
        for w in self.workers:
            for st, tr in zip(w.streams, w.translators, strict=False):
                self._tasks.append(asyncio.create_task(subscribe(
                    st, tr, functools.partial(self._apply, w), self._stop)))
        self._tasks.append(asyncio.create_task(self._health()))

    async def stop(self) -> None:
        self._stop.set()
        for t in self._tasks:
            try:
                await asyncio.wait_for(t, 2.0)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                t.cancel()
        if self._session is not None:
            await self._session.close()

    # ---------------- requests ----------------
    async def tokenize(self, path: str, body: Dict[str, Any]) -> List[int]:
        import aiohttp

        t0 = time.perf_counter()
        try:
            if path.endswith("/completions") and not path.endswith("/chat/completions"):
                prompt = body.get("prompt")
                if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                    return list(prompt)
                if not isinstance(prompt, str):
                    raise ValueError("'prompt' must be a string or a list of token ids "
                                     "(batched prompts are not routed)")
                if self._local_tok is not None:
                    return list(self._local_tok.encode(prompt))
                req = {"model": body.get("model"), "prompt": prompt}
            else:
                messages = body.get("messages")
                if not isinstance(messages, list):
                    raise ValueError("'messages' must be a list")
                agp = body.get("add_generation_prompt", True)
                if self._local_tok is not None:
                    return list(self._local_tok.apply_chat_template(
                        messages, add_generation_prompt=agp, tokenize=True))
                req = {"model": body.get("model"), "messages": messages,
                       "add_generation_prompt": agp}
            last: Optional[Exception] = None
            for w in self._up_workers() or self.workers:
                try:
                    async with self._session.post(w.spec.url + "/tokenize", json=req) as r:
                        if r.status != 200:
                            raise ValueError(f"/tokenize on worker {w.id} answered {r.status}: "
                                             f"{(await r.text())[:200]}")
                        return list((await r.json())["tokens"])
                except (aiohttp.ClientConnectionError, asyncio.TimeoutError, OSError) as exc:
                    self._set_up(w, False)  # refused or gone: down until its health is back
                    last = exc
                except Exception as exc:  # an answer we cannot use: try the next worker
                    last = exc
            raise WorkersUnavailable(f"no worker is up to tokenize the prompt ({last})")
        finally:
            self.tokenize_s += time.perf_counter() - t0

    def _up_workers(self) -> List[Worker]:
        return [w for w in self.workers if w.up]

    def choose(self, tokens: List[int], body: Dict[str, Any],
               exclude: Sequence[int] = (),
               roles: Sequence[str] = ROLES) -> Tuple[Optional[Worker], Dict[str, Any]]:
        """The worker for a request among those of `roles`, and why (the decision log
        entry)."""
        exclude = list(exclude) + [w.id for w in self.workers if w.spec.role not in roles]
        now = time.monotonic()
        for w in self.workers:
            self.index.set_queue(w.id, w.queue_s(now))
        salt = body.get("cache_salt") or ""
        lora = ""  # LoRA routing: the adapter name would go here (not served by the workers)
        keys = self.hasher(salt, lora).keys(tokens)
        decision = self.index.route(keys, len(tokens)) if self._up_workers() else None
        cands = [c for c in (decision or {}).get("candidates", [])
                 if c["up"] and c["worker"] not in exclude]
        if not cands:
            return None, {"reason": "no worker is up"}
        if self.s.policy == "kvtier":
            # Near-equal estimates (a new conversation nobody holds; sequential requests that
            # leave no queue) go to the worker with fewer requests in flight, then fewer routed
            # so far: new chats spread instead of piling onto the lowest id.
            low = min(c["ttft_s"] for c in cands)
            near = [c for c in cands if c["ttft_s"] <= low + max(0.001, 0.02 * low)]
            best = min(near, key=lambda c: (self.workers[c["worker"]].active,
                                            self.workers[c["worker"]].requests, c["worker"]))
        elif self.s.policy == "least-loaded":
            best = min(cands, key=lambda c: (c["queue_s"], c["worker"]))
        else:
            ups = [c for c in cands]
            best = ups[next(self._rr) % len(ups)]
        return self.workers[best["worker"]], {"blocks": len(keys), "tokens": len(tokens),
                                              "candidates": cands, "chosen": best}

    async def proxy(self, request: Any) -> Any:
        from aiohttp import web

        self.counters["requests"] += 1
        raw = await request.read()
        if not self._up_workers():
            self.counters["no_worker"] += 1
            return web.json_response({"error": {"message": "kvtier router: no worker is up",
                                                "type": "ServiceUnavailable"}}, status=503)
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("the request body must be a JSON object")
            tokens = await self.tokenize(request.path, body)
        except WorkersUnavailable as exc:
            self.counters["tokenize_failures"] += 1
            return web.json_response({"error": {"message": f"kvtier router: {exc}",
                                                "type": "ServiceUnavailable"}}, status=503)
        except (ValueError, KeyError, json.JSONDecodeError) as exc:
            self.counters["bad_requests"] += 1
            return web.json_response({"error": {"message": f"kvtier router: {exc}",
                                                "type": "BadRequest"}}, status=400)
        if self.s.pd:
            from kvtier.router.pd import disaggregate

            raw, pd_entry = await disaggregate(self, request, body, tokens)
        else:
            pd_entry = None
        return await self.forward(request, raw, body, tokens,
                                  roles=("decode", "both") if self.s.pd else ROLES,
                                  pd_entry=pd_entry)

    async def forward(self, request: Any, raw: bytes, body: Dict[str, Any], tokens: List[int],
                      roles: Sequence[str] = ROLES,
                      pd_entry: Optional[Dict[str, Any]] = None) -> Any:
        """Streams the response of the best worker of `roles` to the client; a worker that
        cannot be reached before any byte went out is retried on another."""
        from aiohttp import ClientError, web

        tried: List[int] = []
        while True:
            worker, why = self.choose(tokens, body, exclude=tried, roles=roles)
            if worker is None:
                self.counters["no_worker"] += 1
                return web.json_response({"error": {"message": "kvtier router: no worker is up",
                                                    "type": "ServiceUnavailable"}}, status=503)
            rid = next(self._ids)
            est = why["chosen"]["ttft_s"]
            worker.inflight[rid] = (time.monotonic(), est)
            worker.active += 1
            worker.requests += 1
            entry = {"id": rid, "path": request.path, "worker": worker.id,
                     "est_ttft_s": est, "blocks_by_tier": why["chosen"]["blocks_by_tier"],
                     "tokens": why["tokens"], "policy": self.s.policy,
                     "user": body.get("user")}
            if pd_entry is not None:
                entry["pd"] = pd_entry
            self.decisions.append(entry)
            del self.decisions[:-self.s.log_decisions]
            t0 = time.monotonic()
            resp: Optional[web.StreamResponse] = None
            try:
                headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
                async with self._session.post(worker.spec.url + request.path, data=raw,
                                              headers=headers) as up:
                    resp = web.StreamResponse(status=up.status)
                    for k, v in up.headers.items():
                        if k.lower() not in _HOP:
                            resp.headers[k] = v
                    resp.headers["x-kvtier-worker"] = str(worker.id)
                    resp.headers["x-kvtier-est-ttft-ms"] = f"{est * 1000:.1f}"
                    await resp.prepare(request)
                    first = True
                    async for chunk in up.content.iter_any():
                        if first:
                            entry["ttft_s"] = time.monotonic() - t0
                            worker.inflight.pop(rid, None)
                            first = False
                        await resp.write(chunk)
                    await resp.write_eof()
                    entry["status"] = up.status
                    return resp
            except (ClientError, asyncio.TimeoutError, OSError) as exc:
                worker.errors += 1
                if resp is not None:
                    # Bytes already went to the client: the response cannot be moved.
                    log.warning("worker %d failed mid-response: %s", worker.id, exc)
                    entry["status"] = "broken"
                    return resp
                log.warning("worker %d unreachable (%s); trying another", worker.id, exc)
                self._set_up(worker, False)
                self.counters["retries"] += 1
                tried.append(worker.id)
                entry["status"] = "retried"
            finally:
                worker.inflight.pop(rid, None)
                worker.active -= 1

    async def forward_get(self, request: Any) -> Any:
        """GET /v1/models and the like: any worker that is up answers."""
        from aiohttp import ClientError, web

        for w in self._up_workers():
            try:
                async with self._session.get(w.spec.url + request.path_qs) as up:
                    return web.Response(status=up.status, body=await up.read(),
                                        content_type=up.content_type)
            except (ClientError, asyncio.TimeoutError, OSError):
                self._set_up(w, False)
        return web.json_response({"error": {"message": "kvtier router: no worker is up"}},
                                 status=503)

    def state(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"policy": self.s.policy, "counters": dict(self.counters),
                               "tokenize_seconds": self.tokenize_s, "workers": []}
        for w in self.workers:
            out["workers"].append({
                "id": w.id, "url": w.spec.url, "up": w.up, "requests": w.requests,
                "errors": w.errors, "active": w.active,
                "blocks": {t: self.index.block_count(w.id, t) for t in _kvtier.TIER_NAMES},
                "streams": [{"endpoint": st.endpoint, "batches": st.batches,
                             "last_seq": st.last_seq, "gaps": st.gaps, "replayed": st.replayed,
                             "restarts": st.restarts, "decode_errors": st.decode_errors,
                             "translator": vars(tr.stats)}
                            for st, tr in zip(w.streams, w.translators, strict=False)],
            })
        return out

    def metrics_text(self) -> str:
        lines = ["# HELP kvtier_router_requests_total Requests routed, by worker.",
                 "# TYPE kvtier_router_requests_total counter"]
        for w in self.workers:
            lines.append(f'kvtier_router_requests_total{{worker="{w.id}"}} {w.requests}')
        lines += ["# HELP kvtier_router_worker_up Whether the worker answers its health check.",
                  "# TYPE kvtier_router_worker_up gauge"]
        for w in self.workers:
            lines.append(f'kvtier_router_worker_up{{worker="{w.id}"}} {int(w.up)}')
        lines += ["# HELP kvtier_router_indexed_blocks Blocks the router knows a worker holds.",
                  "# TYPE kvtier_router_indexed_blocks gauge"]
        for w in self.workers:
            for t in _kvtier.TIER_NAMES:
                lines.append(f'kvtier_router_indexed_blocks{{worker="{w.id}",tier="{t}"}} '
                             f"{self.index.block_count(w.id, t)}")
        lines += ["# HELP kvtier_router_retries_total Requests moved after a worker failed.",
                  "# TYPE kvtier_router_retries_total counter",
                  f"kvtier_router_retries_total {self.counters['retries']}",
                  "# HELP kvtier_router_tokenize_seconds_total Time spent tokenizing prompts.",
                  "# TYPE kvtier_router_tokenize_seconds_total counter",
                  f"kvtier_router_tokenize_seconds_total {self.tokenize_s:.6f}"]
        return "\n".join(lines) + "\n"


def make_app(router: Router) -> Any:
    from aiohttp import web

    app = web.Application(client_max_size=64 << 20)

    async def on_start(_: Any) -> None:
        await router.start()

    async def on_stop(_: Any) -> None:
        await router.stop()

    async def health(_: Any) -> Any:
        return web.json_response({"up": len(router._up_workers())},
                                 status=200 if router._up_workers() else 503)

    async def state(_: Any) -> Any:
        return web.json_response(router.state())

    async def decisions(_: Any) -> Any:
        return web.json_response(router.decisions)

    async def metrics(_: Any) -> Any:
        return web.Response(text=router.metrics_text(),
                            content_type="text/plain", charset="utf-8")

    app.on_startup.append(on_start)
    app.on_cleanup.append(on_stop)
    app.router.add_post("/v1/completions", router.proxy)
    app.router.add_post("/v1/chat/completions", router.proxy)
    app.router.add_get("/v1/models", router.forward_get)
    app.router.add_get("/health", health)
    app.router.add_get("/router/state", state)
    app.router.add_get("/router/decisions", decisions)
    app.router.add_get("/metrics", metrics)
    return app

"""A stand-in for `vllm serve`, for the router's fast tests (tests/python/test_router.py): the
same HTTP endpoints the router uses (/health, /tokenize, /v1/completions, /v1/chat/completions,
/v1/models) and a ZMQ publisher of KV events in vLLM's wire format (PUB: topic, 8-byte
big-endian sequence number, msgpack EventBatch; ROUTER replay socket answering a start sequence
number with the buffered batches and END_SEQ), with an LRU prefix cache of `--capacity` blocks.

It is a test double for vLLM's engine only; the real vLLM runs behind the router in
tests/vllm/test_router_vllm.py. Its tokenizer is one token per byte of text, so a test can reason
about blocks exactly.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import threading
import time
from collections import OrderedDict, deque
from typing import Any, Deque, Dict, List, Optional, Tuple

import msgpack
import zmq
from aiohttp import web

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def tokenize_text(text: str) -> List[int]:
    return list(text.encode("utf-8"))


def chat_tokens(messages: List[Dict[str, str]], add_generation_prompt: bool) -> List[int]:
    text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
    if add_generation_prompt:
        text += "<assistant>"
    return tokenize_text(text)


class Publisher:
    """vLLM's ZmqEventPublisher protocol, on its own thread."""

    def __init__(self, endpoint: str, replay_endpoint: Optional[str], topic: str) -> None:
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.bind(endpoint)
        self.replay = None
        if replay_endpoint:
            self.replay = self.ctx.socket(zmq.ROUTER)
            self.replay.bind(replay_endpoint)
        self.topic = topic.encode()
        self.seq = 0
        self.buffer: Deque[Tuple[int, bytes]] = deque(maxlen=10000)
        self.lock = threading.Lock()
        self.queue: "Deque[bytes]" = deque()
        self.wake = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def publish(self, events: List[Dict[str, Any]]) -> None:
        payload = msgpack.packb([time.time(), events, None], use_bin_type=True)
        with self.lock:
            self.queue.append(payload)
        self.wake.set()

    def _run(self) -> None:
        while True:
            self.wake.wait(0.05)
            self.wake.clear()
            if self.replay is not None and self.replay.poll(0):
                client, _, start = self.replay.recv_multipart()
                s = int.from_bytes(start, "big")
                for seq, buf in list(self.buffer):
                    if seq >= s:
                        self.replay.send_multipart(
                            [client, b"", self.topic, seq.to_bytes(8, "big"), buf])
                self.replay.send_multipart([client, b"", b"", END_SEQ, b""])
            while True:
                with self.lock:
                    if not self.queue:
                        break
                    payload = self.queue.popleft()
                seq = self.seq
                self.seq += 1
                self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
                self.buffer.append((seq, payload))


class PrefixCache:
    """Blocks named like vLLM names them: a hash chained from the parent, here SHA-1 bytes."""

    def __init__(self, capacity: int, block_size: int, medium: str, pub: Publisher) -> None:
        self.capacity = capacity
        self.bs = block_size
        self.medium = medium
        self.pub = pub
        self.blocks: "OrderedDict[bytes, None]" = OrderedDict()

    def _hashes(self, tokens: List[int]) -> List[bytes]:
        out, parent = [], b""
        for i in range(len(tokens) // self.bs):
            parent = hashlib.sha1(parent + bytes(json.dumps(tokens[i * self.bs:(i + 1) * self.bs]),
                                                 "ascii")).digest()
            out.append(parent)
        return out

    def cached_tokens(self, tokens: List[int]) -> int:
        n = 0
        for h in self._hashes(tokens):
            if h not in self.blocks:
                break
            n += self.bs
        return n

    def store(self, tokens: List[int], salt: str) -> None:
        hashes = self._hashes(tokens)
        events: List[Dict[str, Any]] = []
        parent: Optional[bytes] = None
        for i, h in enumerate(hashes):
            if h in self.blocks:
                self.blocks.move_to_end(h)
            else:
                self.blocks[h] = None
                ev: Dict[str, Any] = {
                    "type": "BlockStored", "block_hashes": [h], "parent_block_hash": parent,
                    "token_ids": tokens[i * self.bs:(i + 1) * self.bs], "block_size": self.bs,
                    "lora_id": None, "medium": self.medium, "lora_name": None}
                if i == 0 and salt:
                    ev["extra_keys"] = [(salt,)]
                events.append(ev)
            parent = h
        while len(self.blocks) > self.capacity:
            victim, _ = self.blocks.popitem(last=False)
            events.append({"type": "BlockRemoved", "block_hashes": [victim],
                           "medium": self.medium})
        if events:
            self.pub.publish(events)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--events", required=True)
    p.add_argument("--replay", default="")
    p.add_argument("--topic", default="")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--capacity", type=int, default=1000)
    p.add_argument("--medium", default="GPU")
    p.add_argument("--ms-per-token", type=float, default=0.0, help="prefill time per token")
    p.add_argument("--name", default="w")
    a = p.parse_args()

    pub = Publisher(a.events, a.replay or None, a.topic)
    cache = PrefixCache(a.capacity, a.block_size, a.medium, pub)
    served: List[Dict[str, Any]] = []

    async def health(_: web.Request) -> web.Response:
        return web.Response(text=a.name)  # the test can tell its own worker from another

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    async def tokenize(req: web.Request) -> web.Response:
        body = await req.json()
        if "messages" in body:
            toks = chat_tokens(body["messages"], body.get("add_generation_prompt", True))
        else:
            toks = tokenize_text(body["prompt"])
        return web.json_response({"tokens": toks, "count": len(toks), "max_model_len": 1 << 20})

    async def complete(req: web.Request) -> web.StreamResponse:
        body = await req.json()
        if req.path.endswith("/chat/completions"):
            toks = chat_tokens(body["messages"], body.get("add_generation_prompt", True))
        else:
            prompt = body["prompt"]
            toks = list(prompt) if isinstance(prompt, list) else tokenize_text(prompt)
        hit = cache.cached_tokens(toks)
        await asyncio.sleep((len(toks) - hit) * a.ms_per_token / 1000.0)
        cache.store(toks, body.get("cache_salt") or "")
        params = body.get("kv_transfer_params")
        served.append({"tokens": len(toks), "hit": hit, "user": body.get("user"),
                       "max_tokens": body.get("max_tokens"), "stream": bool(body.get("stream")),
                       "kv_transfer_params": params})
        # A P/D producer's answer (vLLM with kv_role kv_producer and kvtier) carries what the
        # consumer needs.
        produced = None
        if isinstance(params, dict) and params.get("do_remote_decode"):
            produced = {"do_remote_prefill": True,
                        "kvtier": {"expect_tokens": len(toks) // a.block_size * a.block_size}}
        resp = web.StreamResponse(headers={"x-fake-worker": a.name,
                                           "x-fake-hit-tokens": str(hit)})
        resp.content_type = "text/event-stream" if body.get("stream") else "application/json"
        await resp.prepare(req)
        if body.get("stream"):
            for piece in ("one", "two", "three"):
                await resp.write(f"data: {json.dumps({'text': piece, 'worker': a.name})}\n\n"
                                 .encode())
                await asyncio.sleep(0.01)
            await resp.write(b"data: [DONE]\n\n")
        else:
            answer: Dict[str, Any] = {"choices": [{"text": "ok"}], "worker": a.name,
                                      "hit_tokens": hit}
            if produced is not None:
                answer["kv_transfer_params"] = produced
            await resp.write(json.dumps(answer).encode())
        await resp.write_eof()
        return resp

    async def stats(_: web.Request) -> web.Response:
        return web.json_response(served)

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/v1/completions", complete)
    app.router.add_post("/v1/chat/completions", complete)
    app.router.add_get("/fake/served", stats)
    print(f"fake worker {a.name} on {a.port}", flush=True)
    web.run_app(app, host="127.0.0.1", port=a.port, print=None)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()

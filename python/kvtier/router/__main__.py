"""python -m kvtier.router --worker URL[,events=EP[,replay=EP]] ... [--port 8000]"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import List, Optional


def _model_block_bytes(path: str, tokens_per_block: int, dtype_bytes: int) -> int:
    """Bytes of one block's KV from a Hugging Face config.json (K and V, every layer)."""
    with open(os.path.join(path, "config.json")) as f:
        c = json.load(f)
    layers = int(c["num_hidden_layers"])
    heads = int(c.get("num_key_value_heads", c["num_attention_heads"]))
    head_dim = int(c.get("head_dim", c["hidden_size"] // c["num_attention_heads"]))
    return 2 * layers * heads * head_dim * tokens_per_block * dtype_bytes


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="kvtier router",
        description="OpenAI-compatible proxy that routes each request to the worker with the "
                    "lowest estimated TTFT, from the workers' KV events (docs/router.md).")
    p.add_argument("--worker", action="append", default=[],
                   metavar="URL[,events=EP[,replay=EP]][,role=prefill|decode|both]",
                   help="a vllm serve worker and the ZMQ endpoints of its KV events; repeat")
    p.add_argument("--pd", action="store_true",
                   help="disaggregated prefill/decode: each request is prefilled on a "
                        "role=prefill worker, then decoded on a role=decode worker (docs/pd.md)")
    p.add_argument("--pd-prefill-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="--pd: a prefill slower than this is served colocated instead")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--policy", default="kvtier", help="kvtier | round-robin | least-loaded")
    p.add_argument("--block-size", type=int, default=16, help="tokens per block (vLLM's)")
    p.add_argument("--block-bytes", type=int, default=0,
                   help="bytes of one block's KV, all layers (or give --model)")
    p.add_argument("--model", default="", help="a model directory (config.json) to size blocks")
    p.add_argument("--dtype-bytes", type=int, default=2, help="KV element size for --model")
    p.add_argument("--prefill-tokens-per-s", type=float, default=1000.0,
                   help="one worker's prefill speed, for the tokens it must compute")
    p.add_argument("--load-gbps", default="0,12,2,1.25",
                   help="G1,G2,G3,G4 load bandwidths in GB/s (G1 0 = free)")
    p.add_argument("--queue-weight", type=float, default=1.0)
    p.add_argument("--tokenizer", default="worker",
                   help="'worker' (POST /tokenize on a worker) or a local tokenizer path")
    p.add_argument("--topic", default="", help="the workers' KV event topic")
    p.add_argument("--health-interval", type=float, default=1.0, help="seconds")
    p.add_argument("--log-level", default="WARNING")
    a = p.parse_args(argv)

    logging.basicConfig(level=a.log_level.upper(), format="kvtier router: %(message)s")
    from kvtier.router.proxy import Router, RouterSettings, WorkerSpec, make_app

    try:
        workers = [WorkerSpec.parse(w) for w in a.worker]
        gbps = tuple(float(x) for x in a.load_gbps.split(","))
        if len(gbps) != 4:
            raise ValueError(f"--load-gbps '{a.load_gbps}': expected 4 numbers, G1..G4")
        block_bytes = a.block_bytes
        if block_bytes <= 0 and a.model:
            block_bytes = _model_block_bytes(a.model, a.block_size, a.dtype_bytes)
        settings = RouterSettings(tokens_per_block=a.block_size, block_bytes=block_bytes,
                                  prefill_tokens_per_s=a.prefill_tokens_per_s,
                                  load_gbps=gbps, queue_weight=a.queue_weight,
                                  policy=a.policy, tokenizer=a.tokenizer, topic=a.topic,
                                  health_interval_s=a.health_interval, pd=a.pd,
                                  pd_prefill_timeout_s=a.pd_prefill_timeout)
        router = Router(settings, workers)
    except (ValueError, OSError, KeyError) as exc:
        print(f"kvtier router: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # KvtierError from the C++ options check
        print(f"kvtier router: {exc}", file=sys.stderr)
        return 2

    from aiohttp import web

    mode = " (P/D)" if a.pd else ""
    print(f"kvtier router: {a.policy}{mode} over {len(workers)} workers on "
          f"http://{a.host}:{a.port}", file=sys.stderr, flush=True)
    try:
        web.run_app(make_app(router), host=a.host, port=a.port, print=None,
                    handle_signals=True)
    except OSError as exc:
        print(f"kvtier router: cannot listen on {a.host}:{a.port}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

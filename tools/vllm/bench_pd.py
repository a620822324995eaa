"""kvtier bench pd: disaggregated prefill/decode through kvtier against colocated vLLM, on a
mixed workload (long prompts arriving while other requests decode), on this machine's CPU.

Run by `kvtier bench pd` (tools/bench/bench_vllm.cc -> tools/vllm/run_bench_pd.sh) in the
vLLM-for-CPU environment (scripts/setup-vllm.sh). Every vLLM is vLLM's OpenAI-compatible server
(python -m vllm.entrypoints.openai.api_server), every request a streamed /v1/completions with
the token ids of each chunk, so each token's arrival is timed. Configurations, one after the
other, the same requests at the same offsets in each:

- colocated: one vLLM, no KV connector;
- colocated_kvtier: one vLLM with KvtierConnector embedded (G2 only);
- pd_one_host: one `kvtier serve` (G2 only, G3 off); a producer vLLM (kv_role kv_producer)
  and a consumer vLLM (kv_consumer), both attached to it;
- pd_two_hosts: two `kvtier serve` daemons ("hosts" A and B) with no G2 or G3 in common,
  sharing a Redis G4 (a redis-server on 127.0.0.1 started here) that both write through to;
  the producer is attached to A, the consumer to B.

In the P/D configurations this program is the P/D proxy, as `kvtier router --pd` is
(kvtier/router/pd.py, whose prefill_body and decode_body it uses): the prefill goes to the
producer with max_tokens 1, not streamed, kv_transfer_params {"do_remote_decode": true}; the
request then goes to the consumer, streamed, with the producer's kv_transfer_params merged in.
Short requests take the same path.

After the mixed workload, each configuration runs quiet probes (one long prompt at a time,
nothing else in flight): the colocated TTFT of a probe is the time to recompute its KV; on
the P/D consumer, the time from the decode request to its first token, less one decode step,
is the time kvtier took to move the KV in (the producer's prefill is timed beside it).

Then the same workload under a cost model of an H200 serving Llama-3-8B (the constants of
tools/replay/replay_cost.h, plus a decode step time), printed with its formulas; every modelled
figure is labelled "modelled". docs/pd.md has the design and the last full run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_vllm import cpu_info  # noqa: E402

BLOCK = 32
MAX_MODEL_LEN = 2048
BATCH_TOKENS = 2048  # vLLM's max_num_batched_tokens here: a long prompt prefills in one step
CONFIGS = ("colocated", "colocated_kvtier", "pd_one_host", "pd_two_hosts")
MODEL_NAME = "bench"
# G2 of each kvtier (embedded or daemon): the whole run's prompts (~45 blocks of 1.4 MiB each
# per long prompt) fit several times over.
G2_BYTES = "512MiB"


def log(msg: str) -> None:
    print(f"bench pd: {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------
# Child processes: each in its own process group, every one stopped on exit (errors, Ctrl-C).


class Children:
    def __init__(self) -> None:
        self.procs: List[Tuple[str, "subprocess.Popen[bytes]"]] = []

    def start(self, name: str, argv: List[str], env: Dict[str, str],
              log_path: Path) -> "subprocess.Popen[bytes]":
        with open(log_path, "wb") as f:
            proc = subprocess.Popen(argv, env=env, stdout=f, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append((name, proc))
        return proc

    @staticmethod
    def _stop(proc: "subprocess.Popen[bytes]", grace_s: float = 20.0) -> None:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        # The group too: vLLM's engine core outlives its API server for a moment.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log(f"pid {proc.pid} did not exit after SIGKILL")

    def stop(self, proc: "subprocess.Popen[bytes]") -> None:
        self._stop(proc)
        self.procs = [(n, p) for n, p in self.procs if p is not proc]

    def stop_all(self) -> None:
        for _, proc in reversed(self.procs):
            self._stop(proc)
        self.procs = []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log_tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


class Server:
    """One vLLM OpenAI-compatible server."""

    def __init__(self, kids: Children, tmp: Path, name: str, args: argparse.Namespace,
                 core: str, kv_config: Optional[Dict[str, Any]]) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"{name}.log"
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                "--model", args.model, "--served-model-name", MODEL_NAME,
                "--host", "127.0.0.1", "--port", str(self.port), "--dtype", "float32",
                "--enforce-eager", "--max-model-len", str(MAX_MODEL_LEN),
                "--block-size", str(BLOCK), "--max-num-batched-tokens", str(BATCH_TOKENS),
                "--seed", "0"]
        if kv_config is not None:
            argv += ["--kv-transfer-config", json.dumps(kv_config)]
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND=core,
                   VLLM_CPU_NUM_OF_RESERVED_CPU="1" if (os.cpu_count() or 1) > 1 else "0")
        self.proc = kids.start(name, argv, env, self.log)

    def wait_ready(self, deadline: float) -> None:
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name}: vLLM exited {self.proc.returncode} while "
                                   f"starting; see {self.log}:\n{log_tail(self.log)}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: vLLM not healthy in time; see {self.log}:\n"
                                   f"{log_tail(self.log)}")
            time.sleep(1.0)

    def metrics(self) -> Dict[str, float]:
        """vLLM's /metrics: the vllm:kvtier_* counters and a few of vLLM's, summed over labels."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as r:
            text = r.read().decode()
        out: Dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.startswith("vllm:"):
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name.endswith("_created"):
                continue
            name = name[:-len("_total")] if name.endswith("_total") else name
            if not (name.startswith("vllm:kvtier_") or name in (
                    "vllm:prefix_cache_hits", "vllm:prompt_tokens",
                    "vllm:external_prefix_cache_hits")):
                continue
            try:
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            except ValueError:
                continue
        return out


def wait_socket(path: Path, proc: "subprocess.Popen[bytes]", log_path: Path, what: str,
                timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited {proc.returncode}; see {log_path}:\n"
                               f"{log_tail(log_path)}")
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(path))
            return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not listen on {path} in {timeout_s:.0f} s")
        time.sleep(0.05)


def start_daemon(kids: Children, tmp: Path, name: str, cli: str,
                 redis_port: Optional[int]) -> Tuple["subprocess.Popen[bytes]", str]:
    """`kvtier serve` with G2 only (G3 off); with redis_port, G4 on that Redis, written
    through."""
    d = tmp / name
    d.mkdir(mode=0o700)
    sock = d / "kvtier.sock"
    env = dict(os.environ, KVTIER_G2_CAPACITY_BYTES=G2_BYTES, KVTIER_G3_ENABLED="false",
               KVTIER_G2_LOCK_MEMORY="false", KVTIER_LOG_LEVEL="info")
    if redis_port is not None:
        env.update(KVTIER_G4_BACKEND="redis", KVTIER_G4_ENDPOINTS=f"127.0.0.1:{redis_port}",
                   KVTIER_G4_WRITE_THROUGH="true")
    log_path = tmp / f"{name}.log"
    proc = kids.start(name, [cli, "serve", "--socket", str(sock)], env, log_path)
    wait_socket(sock, proc, log_path, f"kvtier serve ({name})")
    return proc, str(sock)


def start_redis(kids: Children, tmp: Path) -> Tuple["subprocess.Popen[bytes]", int]:
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server is not installed (scripts/install-deps.sh installs it); "
                           "pd_two_hosts needs it for the shared G4")
    port = free_port()
    log_path = tmp / "redis.log"
    proc = kids.start("redis", [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                "--appendonly", "no"], dict(os.environ), log_path)
    deadline = time.monotonic() + 15
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited {proc.returncode}:\n{log_tail(log_path)}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, port
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not listen in 15 s")
            time.sleep(0.05)


def kvtier_config(role: str, extra: Dict[str, Any]) -> Dict[str, Any]:
    return {"kv_connector": "KvtierConnector", "kv_connector_module_path": "kvtier.vllm",
            "kv_role": role, "kv_connector_extra_config": extra}


# ----------------------------------------------------------------------------------------------
# The workload.


@dataclass
class Req:
    rid: str
    kind: str  # "short" (decoding), "long" (long prompt), "probe" (quiet, after the workload)
    prompt: List[int]
    max_tokens: int
    arrival_s: float


def make_workload(tokenizer: Any, args: argparse.Namespace) -> Tuple[List[Req], List[Req]]:
    """Seeded: the same token ids in every configuration."""
    rng = random.Random(args.seed)
    topics = ["a lighthouse keeper", "a comet", "an old clock", "a mountain village",
              "a river barge", "a lost robot", "a desert garden", "a night train",
              "a glass factory", "a winter market", "a deep sea cable", "a paper kite"]
    names = ["copper", "maple", "harbor", "falcon", "velvet", "glacier", "orchard", "lantern",
             "signal", "canyon", "meadow", "anchor"]

    def document(i: int, n_tokens: int) -> List[int]:
        lines = [f"Document {i} ({rng.randrange(10**6)}): inventory of warehouse {i}."]
        j = 0
        ids: List[int] = []
        while len(ids) < n_tokens:
            lines.append(f"Row {i}-{j}: shelf {rng.randrange(1000)} holds "
                         f"{rng.randrange(1, 500)} {rng.choice(names)} crates, checked on day "
                         f"{rng.randrange(1, 366)}.")
            j += 1
            if j % 16 == 0:
                ids = tokenizer.encode(" ".join(lines), add_special_tokens=False)
        question = tokenizer.encode(f"\nQuestion: which shelf of warehouse {i} holds the "
                                    f"most crates? Answer:", add_special_tokens=False)
        return ids[:n_tokens - len(question)] + question

    shorts = [Req(f"short{i}", "short",
                  tokenizer.encode(f"Request {i}: tell a long story about "
                                   f"{topics[i % len(topics)]}, in detail.",
                                   add_special_tokens=False),
                  args.short_tokens, i * args.short_every) for i in range(args.shorts)]
    longs = [Req(f"long{i}", "long",
                 document(i, rng.randrange(args.long_min, args.long_max + 1)),
                 args.long_tokens, args.long_start + i * args.long_every)
             for i in range(args.longs)]
    probes = [Req(f"probe{i}", "probe",
                  document(100 + i, rng.randrange(args.long_min, args.long_max + 1)),
                  args.probe_tokens, 0.0) for i in range(args.probes)]
    return sorted(shorts + longs, key=lambda r: r.arrival_s), probes


@dataclass
class Result:
    rid: str
    kind: str
    prompt_tokens: int
    tokens: List[int] = field(default_factory=list)
    ttft_s: float = 0.0
    token_times_s: List[float] = field(default_factory=list)  # from the request's arrival
    prefill_s: Optional[float] = None  # P/D: the producer's answer
    consumer_first_s: Optional[float] = None  # P/D: decode request sent -> first token
    end_s: float = 0.0  # from the workload's start


def body_of(req: Req) -> Dict[str, Any]:
    return {"model": MODEL_NAME, "prompt": req.prompt, "max_tokens": req.max_tokens,
            "temperature": 0.0, "ignore_eos": True, "stream": True, "return_token_ids": True}


async def stream(session: Any, url: str, body: Dict[str, Any],
                 timeout_s: float) -> List[Tuple[float, List[int]]]:
    """(arrival time, token ids) of each streamed chunk that carries tokens."""
    import aiohttp

    chunks: List[Tuple[float, List[int]]] = []
    async with session.post(url + "/v1/completions", json=body,
                            timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
        if r.status != 200:
            raise RuntimeError(f"{url} answered {r.status}: {(await r.text())[:300]}")
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            msg = json.loads(line[6:])
            if "error" in msg:
                raise RuntimeError(f"{url}: {msg['error']}")
            for c in msg.get("choices") or []:
                ids = c.get("token_ids") or []
                if ids:
                    chunks.append((time.perf_counter(), [int(t) for t in ids]))
    return chunks


async def prefill(session: Any, url: str, body: Dict[str, Any],
                  timeout_s: float) -> Dict[str, Any]:
    """The producer's half, as kvtier router --pd sends it; returns its kv_transfer_params."""
    import aiohttp
    from kvtier.router.pd import prefill_body

    async with session.post(url + "/v1/completions", json=prefill_body(body, chat=False),
                            timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
        text = await r.text()
        if r.status != 200:
            raise RuntimeError(f"producer {url} answered {r.status}: {text[:300]}")
    produced = json.loads(text).get("kv_transfer_params")
    if not isinstance(produced, dict):
        raise RuntimeError(f"producer {url} returned no kv_transfer_params (is it a vLLM with "
                           f"kv_role kv_producer and KvtierConnector?): {text[:300]}")
    return produced


class Target:
    """Where a configuration's requests go: one server, or a producer and a consumer."""

    def __init__(self, serve: "Server", producer: Optional["Server"] = None) -> None:
        self.serve = serve  # the server that streams the answer (the consumer in P/D)
        self.producer = producer

    async def run(self, session: Any, req: Req, t_arrival: float, t0: float,
                  timeout_s: float) -> Result:
        from kvtier.router.pd import decode_body

        body = body_of(req)
        res = Result(req.rid, req.kind, len(req.prompt))
        t_send = t_arrival
        if self.producer is not None:
            produced = await prefill(session, self.producer.url, body, timeout_s)
            t_send = time.perf_counter()
            res.prefill_s = t_send - t_arrival
            body = decode_body(body, produced)
        chunks = await stream(session, self.serve.url, body, timeout_s)
        if not chunks:
            raise RuntimeError(f"{req.rid}: {self.serve.name} streamed no token")
        for t, ids in chunks:
            for tok in ids:
                res.tokens.append(tok)
                res.token_times_s.append(t - t_arrival)  # tokens of one chunk arrive together
        res.ttft_s = res.token_times_s[0]
        if self.producer is not None:
            res.consumer_first_s = chunks[0][0] - t_send
        res.end_s = chunks[-1][0] - t0
        return res


async def run_requests(target: Target, reqs: List[Req], timeout_s: float,
                       sequential: bool) -> Tuple[List[Result], float]:
    """The workload's requests at their arrival offsets (or, sequential, one after another).
    Returns the results and the wall time from the first arrival to the last token."""
    import aiohttp

    async with aiohttp.ClientSession() as session:
        t0 = time.perf_counter()
        if sequential:
            out = []
            for r in reqs:
                out.append(await target.run(session, r, time.perf_counter(), t0, timeout_s))
            return out, time.perf_counter() - t0

        async def one(r: Req) -> Result:
            await asyncio.sleep(max(0.0, t0 + r.arrival_s - time.perf_counter()))
            return await target.run(session, r, time.perf_counter(), t0, timeout_s)

        out = await asyncio.wait_for(asyncio.gather(*(one(r) for r in reqs)),
                                     timeout=timeout_s)
        return list(out), max(r.end_s for r in out)


# ----------------------------------------------------------------------------------------------
# One configuration.


def pct(values: List[float], p: float) -> float:
    """Percentile p (0..1) by linear interpolation (bench_vllm's)."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def stats_ms(values_s: List[float]) -> Dict[str, float]:
    v = [1000.0 * x for x in values_s]
    if not v:
        return {"n": 0}
    return {"n": len(v), "mean_ms": statistics.fmean(v), "p50_ms": pct(v, 0.5),
            "p90_ms": pct(v, 0.9), "max_ms": max(v)}


def itls(results: List[Result]) -> List[float]:
    gaps: List[float] = []
    for r in results:
        gaps += [b - a for a, b in zip(r.token_times_s, r.token_times_s[1:])]
    return gaps


def delta(after: Dict[str, float], before: Dict[str, float]) -> Dict[str, float]:
    return {k[len("vllm:"):]: v - before.get(k, 0.0) for k, v in sorted(after.items())
            if v - before.get(k, 0.0)}


def measure(name: str, target: Target, reqs: List[Req], probes: List[Req], warm: List[Req],
            args: argparse.Namespace) -> Dict[str, Any]:
    asyncio.run(run_requests(target, warm, args.request_timeout, sequential=True))
    time.sleep(1.0)
    m0 = target.serve.metrics()
    p0 = target.producer.metrics() if target.producer else {}
    results, wall = asyncio.run(run_requests(target, reqs, args.request_timeout,
                                             sequential=False))
    time.sleep(1.0)  # the last step's connector stats reach /metrics
    m1 = target.serve.metrics()
    p1 = target.producer.metrics() if target.producer else {}
    probe_results, _ = asyncio.run(run_requests(target, probes, args.request_timeout,
                                                sequential=True))
    time.sleep(1.0)
    m2 = target.serve.metrics()
    longs = [r for r in results if r.kind == "long"]
    shorts = [r for r in results if r.kind == "short"]
    out_tokens = sum(len(r.tokens) for r in results)
    prompt_tokens = sum(r.prompt_tokens for r in results)
    kv_w = delta(m1, m0)
    kv_p = delta(m2, m1)
    rep: Dict[str, Any] = {
        "ttft_long": stats_ms([r.ttft_s for r in longs]),
        "ttft_short": stats_ms([r.ttft_s for r in shorts]),
        "itl_decoding": stats_ms(itls(shorts)),
        "wall_s": wall,
        "output_tokens_per_s": out_tokens / wall,
        "tokens_per_s": (out_tokens + prompt_tokens) / wall,
        "kvtier_hit_blocks": {t: kv_w.get(f"kvtier_hit_blocks_{t}", 0.0)
                              for t in ("g2", "g3", "g4")},
        "kvtier_miss_blocks": kv_w.get("kvtier_miss_blocks", 0.0),
        "answering_instance_counters": kv_w,
        "producer_counters": delta(p1, p0) if target.producer else None,
        "outputs": {r.rid: r.tokens for r in results + probe_results},
        "requests": [{"rid": r.rid, "kind": r.kind, "prompt_tokens": r.prompt_tokens,
                      "ttft_ms": 1000 * r.ttft_s,
                      "prefill_ms": None if r.prefill_s is None else 1000 * r.prefill_s,
                      "consumer_first_ms": (None if r.consumer_first_s is None
                                            else 1000 * r.consumer_first_s)}
                     for r in results],
    }
    if target.producer is not None:
        rep["prefill_long"] = stats_ms([r.prefill_s or 0.0 for r in longs])
        rep["consumer_first_long"] = stats_ms([r.consumer_first_s or 0.0 for r in longs])
    # Quiet probes: one long prompt at a time.
    probes_out = []
    for r in probe_results:
        step = statistics.median(itls([r])) if len(r.token_times_s) > 1 else 0.0
        p: Dict[str, Any] = {"rid": r.rid, "prompt_tokens": r.prompt_tokens,
                             "ttft_ms": 1000 * r.ttft_s, "decode_step_ms": 1000 * step}
        if r.prefill_s is not None and r.consumer_first_s is not None:
            p["prefill_ms"] = 1000 * r.prefill_s
            p["consumer_first_ms"] = 1000 * r.consumer_first_s
            p["kv_move_ms"] = 1000 * max(0.0, r.consumer_first_s - step)
        probes_out.append(p)
    rep["probes"] = probes_out
    rep["probe_counters"] = kv_p
    log(f"{name}: TTFT long mean {rep['ttft_long'].get('mean_ms', 0):.0f} ms, ITL p90 "
        f"{rep['itl_decoding'].get('p90_ms', 0):.0f} ms, wall {wall:.1f} s")
    return rep


def run_group(names: List[str], kids: Children, tmp: Path, args: argparse.Namespace,
              reqs: List[Req], probes: List[Req], warm: List[Req]) -> Dict[str, Any]:
    """Starts the processes of `names` together (start-up is most of the time), then measures
    each configuration in turn, its processes stopped when it is done."""
    ncpu = os.cpu_count() or 1
    c0, c1 = "0", ("1" if ncpu > 1 else "0")
    g2 = {"g2.capacity_bytes": G2_BYTES, "g3.enabled": False, "g2.lock_memory": False}
    setups: Dict[str, Tuple[Target, List["subprocess.Popen[bytes]"]]] = {}
    t_start = time.monotonic()
    for name in names:
        own: List["subprocess.Popen[bytes]"] = []
        if name == "colocated":
            s = Server(kids, tmp, name, args, c0, None)
            setups[name] = (Target(s), [s.proc])
        elif name == "colocated_kvtier":
            s = Server(kids, tmp, name, args, c0, kvtier_config("kv_both", dict(g2)))
            setups[name] = (Target(s), [s.proc])
        elif name in ("pd_one_host", "pd_two_hosts"):
            redis_port = None
            if name == "pd_two_hosts":
                redis, redis_port = start_redis(kids, tmp)
                own.append(redis)
            da, sock_a = start_daemon(kids, tmp, f"{name}-serve-a", args.cli, redis_port)
            own.append(da)
            sock_b = sock_a
            if name == "pd_two_hosts":
                db, sock_b = start_daemon(kids, tmp, f"{name}-serve-b", args.cli, redis_port)
                own.append(db)
            common = {"service.reattach_ms": 200, "pd_wait_ms": args.pd_wait_ms}
            p = Server(kids, tmp, f"{name}-producer", args, c0, kvtier_config(
                "kv_producer", dict(common, **{"service.socket": sock_a,
                                               "service.instance": "producer"})))
            d = Server(kids, tmp, f"{name}-consumer", args, c1, kvtier_config(
                "kv_consumer", dict(common, **{"service.socket": sock_b,
                                               "service.instance": "consumer"})))
            setups[name] = (Target(d, producer=p), [p.proc, d.proc] + own)
        else:
            raise SystemExit(f"unknown configuration {name!r} (one of {', '.join(CONFIGS)})")
    deadline = time.monotonic() + args.start_timeout
    for name in names:
        tgt = setups[name][0]
        for s in ([tgt.producer] if tgt.producer else []) + [tgt.serve]:
            s.wait_ready(deadline)
    log(f"{', '.join(names)}: up in {time.monotonic() - t_start:.0f} s")
    out: Dict[str, Any] = {}
    for name in names:
        tgt, procs = setups[name]
        t1 = time.monotonic()
        out[name] = measure(name, tgt, reqs, probes, warm, args)
        out[name]["measure_s"] = time.monotonic() - t1
        for proc in procs:  # vLLMs first, then the daemons, then Redis
            kids.stop(proc)
    return out


# ----------------------------------------------------------------------------------------------
# The H200 cost model, extended to P/D.


@dataclass
class H200:
    """tools/replay/replay_cost.h's constants (Llama-3-8B, BF16, one H200) and a decode step."""

    prefill_tokens_per_s: float = 20000.0
    kv_bytes_per_token: int = 131072
    g2_bytes_per_s: float = 50e9
    g4_bytes_per_s: float = 1.25e9
    decode_step_s: float = 0.008  # assumed; see FORMULAS
    batch_tokens: int = BATCH_TOKENS
    block_tokens: int = BLOCK


FORMULAS = """\
H200 cost model (modelled, not measured): Llama-3-8B BF16 on one H200 per engine.
  R  = 20,000 prefill tokens/s; b = 131,072 KV bytes/token; B2 = 50 GB/s (G2, host DRAM over
       PCIe Gen5); B4 = 1.25 GB/s (G4, 10 GbE): tools/replay/replay_cost.h's constants.
  td = 8 ms: one decode step of a small batch (an assumption, --decode-step-ms: reading the
       16 GB of weights from 4.8 TB/s HBM is a ~3.4 ms floor; the rest allows for kernels and
       the engine's per-step overhead).
  A step that holds d decoding requests and c prefill tokens takes  td + c/R  (decode cost is
  taken as flat in d for a small batch; c <= 2048 tokens per step, vLLM's token budget here,
  so a long prompt prefills in one step). Every request in the step gets its token at its end.
  colocated:   one engine runs both; a long prompt of L tokens adds L/R to the step it shares
               with the decoding requests (their ITL for that step is td + L/R).
  1P1D:        the producer runs the prefills (step td + c/R), the consumer the decodes.
               KV move of L tokens, after the producer's step:
                 one host     (G2):  save L*b/B2, then the consumer loads L*b/B2 inside its step
                                     (layer-pipelined G2 load: that step is td + L*b/B2 + t/R)
                 across hosts (G4):  save L*b/B2 + write-through L*b/B4 + load L*b/B4 (vLLM's
                                     asynchronous load, between steps; the step is td + t/R)
               t = the tokens past the prompt's last full block, computed by the consumer.
               Transfers and compute are added, not overlapped (replay_cost.h's conservative
               side); queueing is simulated step by step, HTTP and scheduling are not.
  Arrivals: the measured workload's offsets, scaled by td / (the colocated run's measured
  median ITL), so as many decode steps pass between arrivals as on this CPU.
  KV move vs recompute for L tokens: G2 2*L*b/B2, G4 L*b/B2 + 2*L*b/B4, recompute L/R."""


@dataclass
class SimReq:
    rid: str
    kind: str
    prompt: int
    out: int
    arrival: float
    ready: float = 0.0  # P/D: when the consumer may take it
    times: List[float] = field(default_factory=list)


def simulate_engine(reqs: List[SimReq], m: H200, mode: str) -> None:
    """One engine, step by step. mode: "colocated" (prefill whole prompts, then decode),
    "producer" (prefill only; stamps ready), "consumer_g2"/"consumer_g4" (decode requests whose
    KV was moved; the first step computes the partial block, G2 loads inside the step)."""
    pending = sorted(reqs, key=lambda r: (r.ready if mode.startswith("consumer") else r.arrival))
    waiting: List[Tuple[SimReq, int]] = []  # (request, prefill tokens left)
    decoding: List[Tuple[SimReq, int]] = []  # (request, tokens left)
    loaded: Set[str] = set()
    t = 0.0
    i = 0

    def avail(r: SimReq) -> float:
        return r.ready if mode.startswith("consumer") else r.arrival

    while i < len(pending) or waiting or decoding:
        while i < len(pending) and avail(pending[i]) <= t + 1e-12:
            r = pending[i]
            i += 1
            if mode.startswith("consumer"):
                tail = r.prompt - ((r.prompt - 1) // m.block_tokens) * m.block_tokens
                waiting.append((r, tail))
            else:
                waiting.append((r, r.prompt))
        if not waiting and not decoding:
            t = avail(pending[i])
            continue
        budget = m.batch_tokens - len(decoding)
        step_prefill = 0
        finished_prefill: List[SimReq] = []
        load_s = 0.0
        keep: List[Tuple[SimReq, int]] = []
        for r, left in waiting:
            if budget <= 0:
                keep.append((r, left))
                continue
            c = min(left, budget)
            budget -= c
            step_prefill += c
            if mode == "consumer_g2" and r.rid not in loaded:  # the in-step G2 load
                loaded.add(r.rid)
                load_s += (r.prompt - left) * m.kv_bytes_per_token / m.g2_bytes_per_s
            if c == left:
                finished_prefill.append(r)
            else:
                keep.append((r, left - c))
        waiting = keep
        t += m.decode_step_s + step_prefill / m.prefill_tokens_per_s + load_s
        nxt: List[Tuple[SimReq, int]] = []
        for r, left in decoding:
            r.times.append(t)
            if left > 1:
                nxt.append((r, left - 1))
        for r in finished_prefill:
            if mode == "producer":
                kv = r.prompt * m.kv_bytes_per_token
                r.ready = t + kv / m.g2_bytes_per_s  # the save into G2
            else:
                r.times.append(t)
                if r.out > 1:
                    nxt.append((r, r.out - 1))
        decoding = nxt


def model_report(reqs: List[Req], scale: float, m: H200) -> Dict[str, Any]:
    def fresh() -> List[SimReq]:
        return [SimReq(r.rid, r.kind, len(r.prompt), r.max_tokens, r.arrival_s * scale)
                for r in reqs]

    def summarize(rs: List[SimReq]) -> Dict[str, Any]:
        longs = [r for r in rs if r.kind == "long"]
        shorts = [r for r in rs if r.kind == "short"]
        gaps = [b - a for r in shorts for a, b in zip(r.times, r.times[1:])]
        end = max(r.times[-1] for r in rs)
        toks = sum(len(r.times) for r in rs)
        return {"ttft_long": stats_ms([r.times[0] - r.arrival for r in longs]),
                "ttft_short": stats_ms([r.times[0] - r.arrival for r in shorts]),
                "itl_decoding": stats_ms(gaps), "output_tokens_per_s": toks / end}

    out: Dict[str, Any] = {}
    rs = fresh()
    simulate_engine(rs, m, "colocated")
    out["colocated"] = summarize(rs)
    for name, tier in (("pd_one_host", "g2"), ("pd_two_hosts", "g4")):
        rs = fresh()
        simulate_engine(rs, m, "producer")  # stamps ready = producer step end + save to G2
        for r in rs:
            if tier == "g4":
                kv = r.prompt * m.kv_bytes_per_token
                r.ready += 2 * kv / m.g4_bytes_per_s  # write-through, then the async load
            r.times = []
        simulate_engine(rs, m, f"consumer_{tier}")
        out[name] = summarize(rs)
    longs = [len(r.prompt) for r in reqs if r.kind == "long"]
    L = statistics.fmean(longs) if longs else 0.0
    kv = L * m.kv_bytes_per_token
    out["kv_move_vs_recompute"] = {
        "mean_long_prompt_tokens": L,
        "recompute_ms": 1000 * L / m.prefill_tokens_per_s,
        "move_g2_ms": 1000 * 2 * kv / m.g2_bytes_per_s,
        "move_g4_ms": 1000 * (kv / m.g2_bytes_per_s + 2 * kv / m.g4_bytes_per_s)}
    out["assumptions"] = asdict(m)
    out["arrival_scale"] = scale
    return out


# ----------------------------------------------------------------------------------------------
# Report.


def compare_outputs(results: Dict[str, Any]) -> Dict[str, Any]:
    ref_name = "colocated" if "colocated" in results else next(iter(results))
    ref = results[ref_name]["outputs"]
    out: Dict[str, Any] = {"reference": ref_name}
    for name, r in results.items():
        diffs = []
        for rid, toks in r["outputs"].items():
            want = ref.get(rid)
            if want != toks:
                first = next((k for k, (a, b) in enumerate(zip(want or [], toks)) if a != b),
                             min(len(want or []), len(toks)))
                diffs.append({"rid": rid, "first_difference_at_token": first})
        out[name] = {"equal": not diffs, "differences": diffs}
    return out


def fmt3(s: Dict[str, Any]) -> str:
    if not s.get("n"):
        return "-"
    return f"{s['mean_ms']:.0f}/{s['p50_ms']:.0f}/{s['p90_ms']:.0f}"


def print_report(rep: Dict[str, Any]) -> None:
    c = rep["cpu"]
    w = rep["workload"]
    print(f"cpu: {c['model']} ({c['isa']}, {c['cores']} cores), dtype fp32, "
          f"model {Path(w['model']).name}")
    print(f"cores: {w['cores']}")
    print(f"workload: {w['shorts']} decoding requests ({w['short_prompt_tokens']} prompt "
          f"tokens, {w['short_tokens']} out, every {w['short_every_s']} s) and {w['longs']} long "
          f"prompts ({w['long_prompt_tokens_min']}-{w['long_prompt_tokens_max']} tokens, "
          f"{w['long_tokens']} out, every {w['long_every_s']} s from {w['long_start_s']} s); "
          f"greedy, ignore_eos; {w['probes']} quiet probes after")
    print("measured on this machine (ms: mean/p50/p90):")
    hdr = (f"{'config':<18}{'TTFT long':>20}{'TTFT short':>20}{'ITL decoding':>16}"
           f"{'ITL max':>9}{'out tok/s':>10}{'equal':>7}  kvtier hits (blocks)")
    print(hdr)
    for name, r in rep["configs"].items():
        hits = ", ".join(f"{t}={v:.0f}" for t, v in r["kvtier_hit_blocks"].items() if v) or "-"
        if name.startswith("pd_"):
            hits = "consumer: " + hits
        print(f"{name:<18}{fmt3(r['ttft_long']):>20}{fmt3(r['ttft_short']):>20}"
              f"{fmt3(r['itl_decoding']):>16}{r['itl_decoding'].get('max_ms', 0):>9.0f}"
              f"{r['output_tokens_per_s']:>10.1f}{str(rep['outputs'][name]['equal']):>7}  "
              f"{hits}")
    for name, o in rep["outputs"].items():
        if name != "reference" and not o["equal"]:
            print(f"  {name}: outputs differ from {rep['outputs']['reference']}: "
                  f"{o['differences']}")
    for name, r in rep["configs"].items():
        if name.startswith("pd_"):
            c = r["answering_instance_counters"]
            print(f"  {name}: consumer waited for the producer's blocks "
                  f"{c.get('kvtier_pd_waited_microseconds', 0) / 1000:.0f} ms in "
                  f"{c.get('kvtier_pd_waits', 0):.0f} waits, missing tokens "
                  f"{c.get('kvtier_pd_missing_tokens', 0):.0f}, G4 lookup time-outs "
                  f"{c.get('kvtier_g4_lookup_timeouts', 0):.0f}; long prompts: producer "
                  f"prefill {fmt3(r['prefill_long'])}, consumer first token "
                  f"{fmt3(r['consumer_first_long'])} ms")
    print("KV move vs recompute, quiet probes (measured, ms):")
    ref = {p["rid"]: p for p in rep["configs"].get("colocated", {}).get("probes", [])}
    for name, r in rep["configs"].items():
        for p in r["probes"]:
            line = (f"  {name:<18}{p['rid']} ({p['prompt_tokens']} tokens): TTFT "
                    f"{p['ttft_ms']:.0f}, decode step {p['decode_step_ms']:.0f}")
            if "kv_move_ms" in p:
                rc = ref.get(p["rid"], {}).get("ttft_ms")
                line += (f"; producer prefill {p['prefill_ms']:.0f}, consumer first token "
                         f"{p['consumer_first_ms']:.0f}, KV move (first token less one step) "
                         f"{p['kv_move_ms']:.0f}")
                if rc:
                    line += f" vs recompute (colocated TTFT) {rc:.0f}"
            print(line)
        pc = r.get("probe_counters") or {}
        if name.startswith("pd_"):
            print(f"  {name:<18}consumer during probes: hits "
                  f"g2={pc.get('kvtier_hit_blocks_g2', 0):.0f} "
                  f"g4={pc.get('kvtier_hit_blocks_g4', 0):.0f}, bytes loaded "
                  f"{pc.get('kvtier_bytes_loaded', 0) / 1e6:.1f} MB, waited for the producer "
                  f"{pc.get('kvtier_pd_waited_microseconds', 0) / 1000:.0f} ms in "
                  f"{pc.get('kvtier_pd_waits', 0):.0f} waits, missing tokens "
                  f"{pc.get('kvtier_pd_missing_tokens', 0):.0f}")
    mdl = rep.get("h200_model")
    if mdl:
        print()
        td_ms = 1000 * mdl["assumptions"]["decode_step_s"]
        print(FORMULAS.replace("td = 8 ms", f"td = {td_ms:g} ms"))
        print(f"  (this run: arrival scale {mdl['arrival_scale']:.4f})")
        print("modelled, H200 + Llama-3-8B, same workload (ms: mean/p50/p90):")
        print(f"{'config':<18}{'TTFT long':>20}{'TTFT short':>20}{'ITL decoding':>16}"
              f"{'ITL max':>9}")
        for name in ("colocated", "pd_one_host", "pd_two_hosts"):
            r = mdl[name]
            print(f"{name:<18}{fmt3(r['ttft_long']):>20}{fmt3(r['ttft_short']):>20}"
                  f"{fmt3(r['itl_decoding']):>16}{r['itl_decoding'].get('max_ms', 0):>9.1f}")
        k = mdl["kv_move_vs_recompute"]
        print(f"KV move vs recompute (modelled, {k['mean_long_prompt_tokens']:.0f} tokens): "
              f"G2 {k['move_g2_ms']:.1f} ms, G4 {k['move_g4_ms']:.1f} ms, recompute "
              f"{k['recompute_ms']:.1f} ms")
    print(f"wall: {rep['wall_s']:.0f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the converted model folder (fp32)")
    ap.add_argument("--cli", default=os.environ.get("BENCH_KVTIER_CLI", ""),
                    help="the kvtier binary, for kvtier serve (default: $BENCH_KVTIER_CLI)")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--quick", action="store_true", help="a smoke run: fewer, shorter requests")
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    ap.add_argument("--out", default="", help="also write the JSON report to this file")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--shorts", type=int, help="decoding requests (default 6; quick 3)")
    ap.add_argument("--short-tokens", type=int, help="tokens each generates (64; quick 48)")
    ap.add_argument("--short-every", type=float, help="seconds between them (2.0; quick 2.0)")
    ap.add_argument("--longs", type=int, help="long prompts (4; quick 2)")
    ap.add_argument("--long-min", type=int, help="shortest long prompt, tokens (1200)")
    ap.add_argument("--long-max", type=int, help="longest long prompt, tokens (1600)")
    ap.add_argument("--long-tokens", type=int, help="tokens each long prompt generates (8)")
    ap.add_argument("--long-start", type=float, help="first long prompt's arrival, s (1.0)")
    ap.add_argument("--long-every", type=float, help="seconds between long prompts (3.0)")
    ap.add_argument("--probes", type=int, help="quiet probes after the workload (2; quick 1)")
    ap.add_argument("--probe-tokens", type=int, default=8)
    ap.add_argument("--pd-wait-ms", type=int, default=5000,
                    help="the consumer's pd_wait_ms (how long it waits for a producer's blocks)")
    ap.add_argument("--decode-step-ms", type=float, default=8.0,
                    help="the H200 model's decode step (assumed)")
    ap.add_argument("--start-timeout", type=float, default=900.0)
    ap.add_argument("--request-timeout", type=float, default=600.0)
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    ap.add_argument("--table", default="", metavar="JSON",
                    help="print the table of a report saved with --out, and run nothing")
    args = ap.parse_args()
    if args.table:
        print_report(json.loads(Path(args.table).read_text()))
        return 0
    quick = {"shorts": 3, "short_tokens": 48, "short_every": 2.0, "longs": 2, "long_min": 1200,
             "long_max": 1400, "long_tokens": 8, "long_start": 1.0, "long_every": 3.0,
             "probes": 1}
    full = {"shorts": 6, "short_tokens": 64, "short_every": 2.0, "longs": 4, "long_min": 1200,
            "long_max": 1600, "long_tokens": 8, "long_start": 1.0, "long_every": 3.0,
            "probes": 2}
    for k, v in (quick if args.quick else full).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    names = [n for n in args.configs.split(",") if n]
    for n in names:
        if n not in CONFIGS:
            raise SystemExit(f"bench pd: unknown configuration {n!r} (one of {', '.join(CONFIGS)})")
    if any(n.startswith("pd_") for n in names) and not (args.cli and os.access(args.cli,
                                                                               os.X_OK)):
        raise SystemExit(f"bench pd: the P/D configurations need the kvtier binary for kvtier "
                         f"serve (--cli or BENCH_KVTIER_CLI; got {args.cli!r})")
    if args.long_max + 64 > MAX_MODEL_LEN:
        raise SystemExit(f"bench pd: --long-max must leave room in max_model_len "
                         f"{MAX_MODEL_LEN}")

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    reqs, probes = make_workload(tokenizer, args)
    warm = [Req(f"warm{i}", "short", tokenizer.encode(f"Warm-up {i}: say hello.",
                                                       add_special_tokens=False), 4, 0.0)
            for i in range(2)]

    ncpu = os.cpu_count() or 1
    cores = (f"each vLLM computes on one core (VLLM_CPU_OMP_THREADS_BIND): colocated and "
             f"colocated_kvtier on core 0; P/D producer on core 0, consumer on core "
             f"{1 if ncpu > 1 else 0} (P/D computes on {min(2, ncpu)} cores, colocated on 1); "
             f"API servers, kvtier serve, redis-server and this client are not pinned")
    t_all = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="kvtier-bench-pd-"))
    kids = Children()

    def on_signal(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    results: Dict[str, Any] = {}
    try:
        groups: List[List[str]] = []
        colo = [n for n in names if n.startswith("colocated")]
        if colo:
            groups.append(colo)  # two single servers: started together
        # One P/D configuration at a time: four vLLMs at once do not fit in 24 GB beside
        # another workload (the kernel's OOM killer took a worker in a trial run).
        groups += [[n] for n in names if n.startswith("pd_")]
        for g in groups:
            results.update(run_group(g, kids, tmp, args, reqs, probes, warm))
    except KeyboardInterrupt:
        log("interrupted; stopping every process it started")
        kids.stop_all()
        log(f"logs kept in {tmp}")
        return 130
    except RuntimeError as e:
        log(f"error: {e}")
        kids.stop_all()
        log(f"logs kept in {tmp}")
        return 1
    finally:
        kids.stop_all()
    results = {n: results[n] for n in names}

    short_lens = [len(r.prompt) for r in reqs if r.kind == "short"]
    long_lens = [len(r.prompt) for r in reqs if r.kind == "long"]
    rep: Dict[str, Any] = {
        "cpu": cpu_info(),
        "workload": {"model": args.model, "dtype": "fp32", "quick": args.quick,
                     "seed": args.seed, "block_tokens": BLOCK,
                     "max_num_batched_tokens": BATCH_TOKENS, "shorts": args.shorts,
                     "short_prompt_tokens": f"{min(short_lens)}-{max(short_lens)}",
                     "short_tokens": args.short_tokens, "short_every_s": args.short_every,
                     "longs": args.longs, "long_prompt_tokens": long_lens,
                     "long_prompt_tokens_min": min(long_lens),
                     "long_prompt_tokens_max": max(long_lens),
                     "long_tokens": args.long_tokens, "long_start_s": args.long_start,
                     "long_every_s": args.long_every, "probes": args.probes,
                     "probe_prompt_tokens": [len(p.prompt) for p in probes],
                     "pd_wait_ms": args.pd_wait_ms, "cores": cores},
        "configs": results,
        "outputs": compare_outputs(results),
    }
    ref = results.get("colocated") or next(iter(results.values()))
    cpu_step = ref["itl_decoding"].get("p50_ms", 0.0) / 1000.0
    if cpu_step > 0:
        m = H200(decode_step_s=args.decode_step_ms / 1000.0)
        rep["h200_model"] = model_report(reqs, m.decode_step_s / cpu_step, m)
        rep["h200_model"]["formulas"] = FORMULAS.replace("td = 8 ms",
                                                         f"td = {args.decode_step_ms:g} ms")
    rep["wall_s"] = time.monotonic() - t_all
    for r in results.values():
        r.pop("outputs", None)  # compared above; the ids themselves are not reported
    text = json.dumps(rep, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.json:
        print(text)
    else:
        print_report(rep)
    if args.keep:
        log(f"work directory kept: {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

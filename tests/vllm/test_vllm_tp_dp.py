"""KvtierConnector under tensor parallelism of 2 and data parallelism of 2, on vLLM's CPU backend
(issue 40).

vLLM 0.32's CPU backend runs tensor_parallel_size=2 on this 2-core machine: one worker process per
rank, OpenMP threads bound by VLLM_CPU_OMP_THREADS_BIND ("0|1": vLLM's "auto" binding wants a
NUMA node per rank and stops with "Not enough allowed NUMA nodes"), ranks joined by gloo.
SmolLM2-135M cannot be split in two (9 attention heads: vLLM
refuses tensor_parallel_size=2), so the model is a dense Llama with 4 query and 2 KV heads and
seeded random weights made offline (tools/vllm/make_hybrid_model.py --kind llama; init std 0.1,
at which its greedy outputs depend on the prompt).

- Embedded: vLLM with TP=2, kvtier in each rank's worker; a second round after vLLM's own cache
  is reset loads every repeated prefix from G2 on both ranks; each rank keeps its own G3
  directory (g3.dir/tp0, g3.dir/tp1).
- Attached: `vllm serve --data-parallel-size 2 --tensor-parallel-size 2` (two engine cores, four
  workers) on one `kvtier serve` whose service.max_pools is 2: the two TP ranks get a pool each
  (their G3 IDENTITY files hold model ids that differ in `|tp0of2` / `|tp1of2`), and the two
  DP replicas share them (a third pool would be refused), under four instance names
  (`...-dpD-pp0-tpT`). Requests are sent to one replica or the other (vLLM's
  X-data-parallel-rank header): replica 1's repeats of replica 0's prompts load from the shared
  G2 on both of its ranks.

Every output equals vLLM alone with TP=2 (greedy, fp32), computed once per build directory
(KVTIER_TEST_VLLM_CACHE) like test_vllm_connector.py's baseline.

Run by tests/vllm/run.sh (ctest: vllm_tp_dp_test).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

from driver_result import counters, metric, outputs
from serve_util import ServeDaemon, free_port
from vllm_under_test import cache_identity

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DRIVER = ROOT / "tools" / "vllm" / "driver.py"
MAKER = ROOT / "tools" / "vllm" / "make_hybrid_model.py"
TP = 2
BLOCK = 128  # vLLM's default block size on the CPU
G1_BLOCKS = 12  # vLLM's own KV space (per rank): 1,536 tokens
SYSTEMS = 2  # shared prefixes in the workload
FULL_BLOCKS = 4  # full blocks of each shared prefix (520 tokens)
START_S = 600.0  # a TP=2 vLLM takes 90-170 s to start on the shared 2-core machine

if not os.environ.get("KVTIER_TEST_VLLM_MODEL"):
    pytest.skip("KVTIER_TEST_VLLM_MODEL is not set; run tests/vllm/run.sh", allow_module_level=True)


def _env(bind: str) -> Dict[str, str]:
    e = dict(os.environ)
    e.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # One core per worker (a list per rank, replicas after one another); "auto" needs a NUMA
    # node per rank.
    e["VLLM_CPU_OMP_THREADS_BIND"] = bind
    return e


def prompts() -> List[Dict[str, Any]]:
    """SYSTEMS shared prefixes of 520 seeded random tokens (4 full blocks and a tail), each
    followed by two questions of 20 tokens: [s0q0, s0q1, s1q0, s1q1]."""
    rng = random.Random(40)
    out = []
    for _ in range(SYSTEMS):
        shared = [rng.randrange(100, 40000) for _ in range(520)]
        for _ in range(2):
            out.append({"tokens": shared + [rng.randrange(100, 40000) for _ in range(20)]})
    return out


@pytest.fixture(scope="module")
def tmp() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="kvtier-tp-dp-"))
    yield d
    if not os.environ.get("KEEP_VLLM_TMP"):
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def model() -> Path:
    cache = Path(os.environ.get("KVTIER_CACHE", str(Path.home() / ".cache" / "kvtier")))
    out = cache.expanduser() / "models" / "llama-tiny-random-fp32"
    r = subprocess.run([sys.executable, str(MAKER), "--kind", "llama", "--out", str(out),
                        "--tokenizer", os.environ["KVTIER_TEST_VLLM_MODEL"]],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        pytest.fail(f"make_hybrid_model.py --kind llama failed:\n{r.stdout}\n{r.stderr}")
    return out


def run_vllm(tmp: Path, name: str, model: Path, steps: List[Dict[str, Any]],
             kvtier: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """One offline vLLM with TP=2 (vLLM's own engine-core and worker processes)."""
    plan = {"model": str(model), "kvtier": kvtier, "num_gpu_blocks": G1_BLOCKS,
            "max_model_len": 1024, "steps": steps, "tensor_parallel_size": TP}
    plan_path, out_path = tmp / f"{name}.plan.json", tmp / f"{name}.out.json"
    plan_path.write_text(json.dumps(plan))
    log = tmp / f"{name}.log"
    with open(log, "w") as f:
        try:
            rc = subprocess.run([sys.executable, str(DRIVER), str(plan_path), str(out_path)],
                                stdout=f, stderr=subprocess.STDOUT, env=_env("0|1"),
                                timeout=START_S + 300).returncode
        except subprocess.TimeoutExpired:
            pytest.fail(f"vLLM run {name!r} did not finish (hang); log: {log}")
    if rc != 0:
        pytest.fail(f"vLLM run {name!r} exited {rc}; last lines of {log}:\n"
                    f"{log.read_text()[-6000:]}")
    out = json.loads(out_path.read_text())
    out["log"] = log.read_text(errors="replace")
    return out


@pytest.fixture(scope="module")
def alone(tmp: Path, model: Path) -> List[List[int]]:
    """vLLM alone with TP=2: the reference greedy tokens, computed once per build directory."""
    import fcntl
    import hashlib

    steps = [{"name": "all", "generate": prompts(), "max_tokens": 8}]
    files = sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns)
                   for f in model.iterdir() if f.is_file())
    key = hashlib.sha256(json.dumps([str(model), files, cache_identity(), steps, G1_BLOCKS,
                                     TP]).encode()).hexdigest()[:20]
    cache = Path(os.environ.get("KVTIER_TEST_VLLM_CACHE", "") or tmp / "cache")
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"tp{TP}-alone-{key}.json"
    with open(cache / "baseline.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            out = outputs(run_vllm(tmp, "alone", model, steps, kvtier=None))
            path.write_text(json.dumps(out))
    ref = json.loads(path.read_text())
    # Equality means something only if the outputs depend on the prompt.
    assert len({tuple(o) for o in ref}) == len(ref), ref
    return ref


def test_tp2_embedded_same_outputs_and_both_ranks_hit(tmp: Path, model: Path,
                                                      alone: List[List[int]]) -> None:
    g3 = tmp / "g3-embedded"
    config = {"g2.capacity_bytes": "128MiB", "g2.lock_memory": False, "g3.dir": str(g3),
              "g3.capacity_bytes": "128MiB", "g3.admit_min_seen": 1}
    steps = [{"name": "round1", "generate": prompts(), "max_tokens": 8},
             {"reset_prefix_cache": True},
             {"name": "round2", "generate": prompts(), "max_tokens": 8}]
    t0 = time.monotonic()
    r = run_vllm(tmp, "embedded", model, steps, config)
    print(f"embedded TP=2 run: {time.monotonic() - t0:.0f} s", flush=True)
    assert outputs(r, 0) == alone
    assert outputs(r, 1) == alone
    # Round 2 (vLLM's cache reset): each prefix's 4 full blocks come from G2, on each rank
    # (vLLM sums its workers' counters); each second question then hits vLLM's own cache.
    assert metric(r, "hit_blocks_g2") == TP * FULL_BLOCKS * SYSTEMS, counters(r)
    assert metric(r, "load_error_blocks") == 0, counters(r)
    assert r["metrics"]["vllm:external_prefix_cache_hits"] >= FULL_BLOCKS * BLOCK * SYSTEMS
    # Each rank's own manager and G3 directory.
    assert sorted(p.name for p in g3.iterdir() if p.is_dir()) == ["tp0", "tp1"], \
        list(g3.iterdir())


def _complete(port: int, tokens: List[int], dp_rank: int) -> List[int]:
    body = json.dumps({"model": "m", "prompt": tokens, "max_tokens": 8, "temperature": 0,
                       "return_token_ids": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json",
                                          "X-data-parallel-rank": str(dp_rank)})
    with urllib.request.urlopen(req, timeout=300) as r:
        reply = json.loads(r.read())
    return list(reply["choices"][0]["token_ids"])


def _kvtier_metrics(port: int) -> Dict[str, Dict[str, float]]:
    """vLLM's vllm:kvtier_* and external-hit counters by engine (DP replica)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    out: Dict[str, Dict[str, float]] = {}
    for line in text.splitlines():
        m = re.match(r'(vllm:(?:kvtier_\w+|external_prefix_cache_hits)_total)\{[^}]*'
                     r'engine="(\d+)"[^}]*\} (\S+)$', line)
        if m:
            out.setdefault(m.group(2), {})[m.group(1)] = float(m.group(3))
    return out


def test_dp2_tp2_on_one_kvtier_serve(tmp: Path, model: Path, alone: List[List[int]]) -> None:
    sock = tmp / "run" / "kvtier.sock"
    g3 = tmp / "g3-serve"
    daemon = ServeDaemon(tmp / "serve.log", sock, g2_bytes="256MiB", KVTIER_SERVICE_MAX_POOLS="2",
                         KVTIER_G3_ENABLED="true", KVTIER_G3_DIR=str(g3),
                         KVTIER_G3_CAPACITY_BYTES="128MiB")
    port = free_port()
    config = {"kv_connector": "KvtierConnector", "kv_connector_module_path": "kvtier.vllm",
              "kv_role": "kv_both",
              "kv_connector_extra_config": {"service.socket": str(sock),
                                            "service.reattach_ms": 200}}
    log_path = tmp / "vllm-serve.log"
    log = open(log_path, "w")
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
         "--port", str(port), "--host", "127.0.0.1", "--dtype", "float32", "--enforce-eager",
         "--max-model-len", "1024", "--num-gpu-blocks-override", str(G1_BLOCKS),
         "--served-model-name", "m", "--seed", "0",
         "--data-parallel-size", "2", "--tensor-parallel-size", str(TP),
         "--kv-transfer-config", json.dumps(config)],
        stdout=log, stderr=subprocess.STDOUT, env=_env("0|1|0|1"), start_new_session=True)
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited {proc.returncode}: "
                            f"{log_path.read_text(errors='replace')[-5000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() - t0 > START_S:
                pytest.fail(f"vllm serve did not become healthy in {START_S} s")
            time.sleep(1)
        print(f"vllm serve DP=2 TP=2 healthy after {time.monotonic() - t0:.0f} s", flush=True)

        ps = [p["tokens"] for p in prompts()]
        # Replica 0 computes each prefix's first question; replica 1 then asks the very same
        # prompt (a repeat) and the second question of each prefix: their prefixes load from
        # the G2 that replica 0 filled.
        got = {0: _complete(port, ps[0], 0), 2: _complete(port, ps[2], 0)}
        before = _kvtier_metrics(port)
        again0 = _complete(port, ps[0], 1)
        got[1] = _complete(port, ps[1], 1)
        got[3] = _complete(port, ps[3], 1)
        after = _kvtier_metrics(port)
        assert again0 == alone[0]
        assert [got[i] for i in range(4)] == alone

        def grew(engine: str, name: str) -> float:
            return (after.get(engine, {}).get(name, 0.0)
                    - before.get(engine, {}).get(name, 0.0))

        # Replica 1: ps[0]'s 4 blocks and ps[3]'s prefix (ps[1] then hits vLLM's own cache),
        # each on both of its ranks.
        hits = grew("1", "vllm:kvtier_hit_blocks_g2_total")
        assert hits == TP * FULL_BLOCKS * SYSTEMS, (before, after)
        assert grew("1", "vllm:kvtier_load_error_blocks_total") == 0, after
        assert grew("1", "vllm:external_prefix_cache_hits_total") >= \
            FULL_BLOCKS * BLOCK * SYSTEMS, after

        # Four workers attached, each under its own name: DP replica and TP rank.
        text = log_path.read_text(errors="replace")
        names = set(re.findall(r"attached to kvtier serve at \S+ as instance \d+ \('([^']+)'\)",
                               text))
        tails = sorted(re.sub(r"^.*-(dp\d-pp\d-tp\d)$", r"\1", n) for n in names)
        assert tails == ["dp0-pp0-tp0", "dp0-pp0-tp1", "dp1-pp0-tp0", "dp1-pp0-tp1"], names
        # Two pools, one per TP rank, shared by the replicas (service.max_pools=2: a pool per
        # replica would have been refused).
        serve_log = daemon.log_path.read_text(errors="replace")
        pools = set(re.findall(r"kvtier serve: pool (\S+) \(", serve_log))
        assert len(pools) == 2, serve_log[-3000:]
        assert "has no G2 share" not in text + serve_log
        identities = [(g3 / p / "IDENTITY").read_text(errors="replace") for p in pools]
        ranks = sorted(m.group(1) for m in (re.search(r"\|tp(\d)of2\|pp0of1", i)
                                            for i in identities) if m)
        assert ranks == ["0", "1"], identities
        print(f"DP=2 TP=2 attached: {time.monotonic() - t0:.0f} s", flush=True)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        daemon.stop()

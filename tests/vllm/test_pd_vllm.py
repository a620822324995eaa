"""Disaggregated prefill/decode through kvtier on real vLLM processes (CPU backend; docs/pd.md).

Two "hosts": host A's `kvtier serve` and host B's, each with its own G2, sharing only a Redis
G4 (a real redis-server on loopback) that both write through to. Three vLLM processes
(tools/vllm/driver.py in serve mode): P, a prefill instance (kv_role kv_producer) on host A;
D1, a decode instance (kv_consumer) on host A; D2, a decode instance on host B. The test plays
the P/D proxy's part, as `kvtier router --pd` does (tests/python/test_router_pd.py tests that
proxy): prefill on P with max_tokens 1 and do_remote_decode, then decode with the producer's
kv_transfer_params.

Checked, with every output equal to colocated vLLM's (the same vLLM computing the whole prompt,
kvtier told not to load or save, greedy fp32):
- one host: D1 loads every full prompt block from the shared G2 (hit_blocks_g2), computing
  only the last partial block and the generated tokens;
- across hosts: D2 loads them from G4 and none from G2;
- a producer's blocks corrupted at rest in G4: D2 recomputes (kvtier counts the corrupt blocks);
- Redis killed between prefill and decode: D2 waits pd_wait_ms, then computes;
- P killed with -9 mid-request: the request is served colocated on D1, and D1 still loads.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest

MODEL = os.environ.get("KVTIER_TEST_VLLM_MODEL", "")
CLI = os.environ.get("KVTIER_TEST_CLI", "")
if not MODEL or not Path(MODEL).is_dir() or not CLI:
    pytest.skip("KVTIER_TEST_VLLM_MODEL / KVTIER_TEST_CLI unset; run tests/vllm/run.sh",
                allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "vllm"))
from bench_instances import Instance  # noqa: E402
from redis_util import redis_cli, start_redis  # noqa: E402
from vllm_under_test import check_instance  # noqa: E402

BLOCK = 32
PD_WAIT_MS = 1500


@pytest.fixture(scope="module")
def tmp() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="kvtier-pd-vllm-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def start_daemon(tmp: Path, name: str, redis_port: int) -> subprocess.Popen:
    d = tmp / name
    d.mkdir(mode=0o700)
    sock = d / "sock" / "kvtier.sock"
    env = dict(os.environ, KVTIER_G2_CAPACITY_BYTES="256MiB", KVTIER_G3_ENABLED="false",
               KVTIER_G2_LOCK_MEMORY="false", KVTIER_G4_BACKEND="redis",
               KVTIER_G4_ENDPOINTS=f"127.0.0.1:{redis_port}", KVTIER_G4_WRITE_THROUGH="true",
               # The hits asserted must not depend on Redis answering within the default 20 ms.
               KVTIER_G4_LOOKUP_DEADLINE_MS="2000",
               KVTIER_LOG_LEVEL="info")
    proc = subprocess.Popen([CLI, "serve", "--socket", str(sock)], env=env,
                            stdout=open(d / "serve.log", "w"), stderr=subprocess.STDOUT)
    proc.socket = str(sock)  # type: ignore[attr-defined]
    deadline = time.monotonic() + 20
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"kvtier serve {name}: {(d / 'serve.log').read_text()[-2000:]}")
        time.sleep(0.05)
    return proc


def vllm(tmp: Path, name: str, role: str, sock: str, core: int) -> Instance:
    plan = {"model": MODEL, "kv_role": role, "block_size": BLOCK, "max_model_len": 2048,
            "num_gpu_blocks": 96, "in_process": True,
            "kvtier": {"service.socket": sock, "service.instance": name,
                       "service.reattach_ms": 200, "pd_wait_ms": PD_WAIT_MS}}
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND=str(core))
    return Instance(tmp, name, plan, env)


def kv(inst: Instance) -> Dict[str, float]:
    m = inst.call({"metrics": True}, 60.0)["metrics"]
    return {k[len("vllm:kvtier_"):]: v for k, v in m.items() if k.startswith("vllm:kvtier_")}


def grew(before: Dict[str, float], after: Dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def text(i: int) -> Dict[str, Any]:
    facts = " ".join(f"Record {i}-{j}: the {j}th shelf of room {i} holds {j * 7 + i} jars."
                     for j in range(24))
    return {"text": f"Inventory {i}. {facts} Question: which shelf holds the most jars?"}


def prefill(p: Instance, prompt: Dict[str, Any]) -> Dict[str, Any]:
    r = p.call({"prompt": prompt, "max_tokens": 1,
                "kv_transfer_params": {"do_remote_decode": True}}, 300.0)
    params = r["kv_transfer_params"]
    assert params and params["do_remote_prefill"] is True, r
    assert params["kvtier"]["expect_tokens"] == r["prompt_tokens"] // BLOCK * BLOCK, r
    return params


def decode(d: Instance, prompt: Dict[str, Any], params: Any) -> Dict[str, Any]:
    return d.call({"prompt": prompt, "max_tokens": 8, "kv_transfer_params": params}, 300.0)


def disaggregate(p: Instance, d: Instance,
                 prompts: List[Dict[str, Any]]) -> Tuple[List[List[int]], int]:
    """Each prompt prefilled on P, then decoded on D with P's params: D's outputs, and the full
    prompt blocks D should have loaded (all but the block holding the last prompt token)."""
    outs, want_blocks = [], 0
    for prompt in prompts:
        r = decode(d, prompt, prefill(p, prompt))
        outs.append(r["output"])
        want_blocks += (r["prompt_tokens"] - 1) // BLOCK
    return outs, want_blocks


COLOCATED = {"kvtier": {"load": False, "save": False}}


def test_prefill_on_one_instance_decode_on_another_same_host_and_across_hosts(tmp: Path) -> None:
    redis = start_redis()
    redis_port = redis.port  # type: ignore[attr-defined]
    a = start_daemon(tmp, "host-a", redis_port)
    b = start_daemon(tmp, "host-b", redis_port)
    procs: List[Any] = []
    try:
        p = vllm(tmp, "prefill", "kv_producer", a.socket, 0)
        d1 = vllm(tmp, "decode-a", "kv_consumer", a.socket, 1)
        d2 = vllm(tmp, "decode-b", "kv_consumer", b.socket, 1)
        procs += [p, d1, d2]
        for inst in procs:
            inst.wait_ready(600)
            check_instance(inst)

        # One host: P's blocks reach D1 through host A's G2.
        before = kv(d1)
        same = [text(i) for i in range(3)]
        outs_d1, want_blocks = disaggregate(p, d1, same)
        after = kv(d1)
        assert grew(before, after, "hit_blocks_g2") == want_blocks, after
        assert grew(before, after, "pd_missing_tokens") == 0, after

        # Across hosts: D2 on host B has none of it in G2; it loads from G4.
        before = kv(d2)
        other = [text(10 + i) for i in range(2)]
        outs_d2, want_blocks = disaggregate(p, d2, other)
        after = kv(d2)
        assert grew(before, after, "hit_blocks_g4") == want_blocks, after
        assert grew(before, after, "hit_blocks_g2") == 0, after
        # Fetched by D2's worker straight into its KV cache (g4.direct_to_g1): the bytes moved
        # G4 -> G1 and none went through host B's G2.
        assert grew(before, after, "bytes_g4_to_g1") > 0, after
        assert grew(before, after, "bytes_g4_to_g2") == 0, after

        # A producer's blocks corrupted at rest in G4: verification fails, D2 recomputes.
        corrupt = text(20)
        params = prefill(p, corrupt)
        time.sleep(0.5)  # the write-through lands
        names = [n for n in redis_cli(redis_port, "--scan").split() if n]
        for n in names:
            redis_cli(redis_port, "SETRANGE", n, "5000", "corrupt-bytes-corrupt-bytes")
        before = kv(d2)
        out_corrupt = decode(d2, corrupt, params)["output"]
        after = kv(d2)
        assert grew(before, after, "g4_corrupt_blocks") + grew(before, after, "corrupt_blocks") > 0, \
            after

        # Redis killed between prefill and decode: D2 waits its bounded time, then computes.
        gone = text(30)
        params = prefill(p, gone)
        redis.kill()
        redis.wait()
        before = kv(d2)
        t0 = time.monotonic()
        out_gone = decode(d2, gone, params)["output"]
        took = time.monotonic() - t0
        after = kv(d2)
        assert grew(before, after, "pd_missing_tokens") > 0, after
        assert took < PD_WAIT_MS / 1000 + 60, took

        # P killed with -9 mid-request: the proxy serves the request colocated on D1.
        late = text(40)
        assert p.proc.stdin is not None
        p.proc.stdin.write(json.dumps({"prompt": late, "max_tokens": 1,
                                       "kv_transfer_params": {"do_remote_decode": True}}) + "\n")
        p.proc.stdin.flush()
        p.kill()
        out_late = d1.call({"prompt": late, "max_tokens": 8}, 300.0)["output"]
        assert a.poll() is None, "host A's daemon died with its producer"
        assert d1.call({"reset_prefix_cache": True}, 60.0)["reset"]  # vLLM's own cache: empty
        before = kv(d1)
        again = decode(d1, same[0], {"do_remote_prefill": True, "kvtier": {"expect_tokens": 0}})
        assert grew(before, kv(d1), "hit_blocks_g2") > 0, "host A's G2 lost P's blocks"
        assert again["output"] == outs_d1[0]

        # Colocated vLLM: each prompt computed whole by the other decode instance.
        for prompt, out in zip(same, outs_d1):
            assert d2.call({"prompt": prompt, "max_tokens": 8,
                            "kv_transfer_params": COLOCATED})["output"] == out
        for prompt, out in zip(other, outs_d2):
            assert d1.call({"prompt": prompt, "max_tokens": 8,
                            "kv_transfer_params": COLOCATED})["output"] == out
        for prompt, out in ((corrupt, out_corrupt), (gone, out_gone)):
            assert d1.call({"prompt": prompt, "max_tokens": 8,
                            "kv_transfer_params": COLOCATED})["output"] == out
        assert d2.call({"prompt": late, "max_tokens": 8,
                        "kv_transfer_params": COLOCATED})["output"] == out_late
    finally:
        # The daemons and Redis go first: nothing a failing close() raises leaves them behind.
        for proc in (a, b, redis):
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        errors: List[BaseException] = []
        for inst in procs:
            try:
                inst.close()
            except Exception as exc:  # noqa: BLE001: every instance is closed, errors shown
                errors.append(exc)
                try:
                    inst.kill()
                except ProcessLookupError:
                    pass
        if errors:
            raise errors[0]

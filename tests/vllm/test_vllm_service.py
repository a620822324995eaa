"""Real vLLM processes attached to one `kvtier serve` (docs/service.md).

Each vLLM is its own process (tools/vllm/driver.py in serve mode: one request per line, so two
stay up at once and a test can kill one with -9 between or in the middle of its saves); the
daemon is the real `kvtier serve` binary, started, killed with -9 and restarted here. The
workload and the reference outputs (vLLM alone) are test_vllm_connector.py's.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

from test_vllm_connector import (  # noqa: F401  (fixtures are found by name)
    G1_BLOCKS,
    MODEL,
    SYSTEMS,
    baseline,
    counters,
    metric,
    outputs,
    prompts,
    run_vllm,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "tools" / "vllm"))
from bench_instances import Instance  # noqa: E402  (tools/vllm: the serve-mode driver's client)
from serve_util import ServeDaemon  # noqa: E402
from vllm_under_test import check_instance  # noqa: E402

LEASE_MS = 2000  # the daemon's service.lease_ms here


@pytest.fixture(scope="module")
def tmp() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="kvtier-vllm-svc-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


class Daemon(ServeDaemon):
    """A `kvtier serve` process on `sock`, G2 only, its lease LEASE_MS."""

    def __init__(self, tmp: Path, sock: Path) -> None:
        super().__init__(tmp / "serve.log", sock, KVTIER_SERVICE_LEASE_MS=str(LEASE_MS))


def attached(sock: Path, instance: str) -> Dict[str, Any]:
    return {"service.socket": str(sock), "service.instance": instance,
            "service.reattach_ms": 200}


def start(tmp: Path, name: str, sock: Path, instance: str,
          env: Optional[Dict[str, str]] = None, processes: bool = False) -> Instance:
    """A vLLM attached as `instance`; not yet ready. The engine core and the worker run in one
    process, or with `processes` in vLLM's own layout: an engine-core process whose scheduler
    looks up in the daemon directly (attached mode has no lookup channel to the worker)."""
    plan = {"model": MODEL, "kvtier": attached(sock, instance), "num_gpu_blocks": G1_BLOCKS,
            "max_model_len": 1024, "in_process": not processes}
    e = dict(os.environ, **(env or {}))
    e.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return Instance(tmp, name, plan, e)


def ask(inst: Instance, ps: List[Dict[str, Any]]) -> List[List[int]]:
    return [inst.call({"prompt": p, "max_tokens": 8}, 300.0)["output"] for p in ps]


def kv(inst: Instance) -> Dict[str, float]:
    m = inst.call({"metrics": True}, 60.0)["metrics"]
    return {k[len("vllm:kvtier_"):]: v for k, v in m.items() if k.startswith("vllm:kvtier_")}


def grew(before: Dict[str, float], after: Dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def wait_for_log(path: Path, text: str, count: int, timeout_s: float) -> float:
    """Seconds until `text` is in the daemon's log `count` times; fails after timeout_s."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if path.read_text(errors="replace").count(text) >= count:
            return time.monotonic() - t0
        time.sleep(0.05)
    pytest.fail(f"{text!r} not in {path} within {timeout_s} s:\n"
                + path.read_text(errors="replace")[-3000:])


def test_two_live_vllms_share_g2_through_kills_and_restarts(tmp: Path,
                                                            baseline: List[List[int]]) -> None:
    """Two vLLM processes up at once on one daemon: B loads what A computed; A restarted keeps
    its G2 hits; A killed -9 in the middle of its saves leaves B right and the daemon up; the
    daemon killed -9 leaves B answering right, and B reuses again once it is back."""
    sock = tmp / "run" / "kvtier.sock"
    t0 = time.monotonic()

    def phase(what: str) -> None:  # shown with -s, and in a failure's captured output
        print(f"[{time.monotonic() - t0:6.1f} s] {what}", flush=True)

    daemon = Daemon(tmp, sock)
    insts: List[Instance] = []
    try:
        a = start(tmp, "svc-a1", sock, "vllm-a")
        b = start(tmp, "svc-b", sock, "vllm-b", processes=True)
        insts += [a, b]
        a.wait_ready(300.0)
        b.wait_ready(300.0)
        check_instance(a)
        check_instance(b)
        phase("both up")
        assert ask(a, prompts()) == baseline
        # B never saw these prompts: its first requests load A's prefixes from the shared G2.
        b0 = kv(b)
        assert ask(b, prompts()) == baseline
        b1 = kv(b)
        assert grew(b0, b1, "hit_blocks_g2") >= 4 * SYSTEMS, b1
        assert grew(b0, b1, "load_error_blocks") == 0, b1

        phase("B loaded A's prefixes")
        # A restarted under the same name keeps its G2 hits. This life's saves stall (each
        # block waits 400 ms), so that the kill below lands in the middle of them.
        a.close()
        insts.remove(a)
        a = start(tmp, "svc-a2", sock, "vllm-a", {"KVTIER_TEST_ATTACHED_COPY_STALL_MS": "400"})
        insts.append(a)
        a.wait_ready(300.0)
        check_instance(a)
        phase("A restarted")
        a0 = kv(a)
        assert ask(a, prompts()) == baseline
        a1 = kv(a)
        assert grew(a0, a1, "hit_blocks_g2") >= 4 * SYSTEMS, a1
        novel = prompts(salt="after-a-kill")  # new keys, the same outputs
        assert ask(a, novel[:2]) == baseline[:2]
        phase("A2 hits checked, novel asked")
        ended = daemon.log_path.read_text(errors="replace").count(" ended (")
        a.kill()  # its saves of novel[:2] (several blocks, 400 ms each) are in flight
        insts.remove(a)
        took = wait_for_log(daemon.log_path, " ended (", ended + 1, LEASE_MS / 1000.0 + 3.0)
        assert daemon.proc.poll() is None, "kvtier serve died with an engine"
        phase("A killed, its end logged")
        # B is unaffected, and whatever of A's saves was committed is right (any half-written
        # block B loaded would change its greedy tokens, or be a load error).
        b2 = kv(b)
        assert ask(b, novel) == baseline, f"A's end took {took:.1f} s"
        b3 = kv(b)
        assert grew(b2, b3, "load_error_blocks") == 0, b3

        phase("B right after A's kill")
        # The daemon killed -9: B keeps answering right (misses), then reuses once it is back.
        daemon.proc.kill()
        assert daemon.proc.wait(timeout=10) == -9
        assert b.call({"reset_prefix_cache": True}, 60.0)["reset"]
        assert ask(b, prompts()) == baseline
        phase("B right with the daemon gone")
        daemon.stop()
        daemon = Daemon(tmp, sock)
        time.sleep(0.5)  # past service.reattach_ms
        phase("daemon restarted")
        again = prompts(salt="after-daemon-restart")
        assert ask(b, again) == baseline  # computed, saved to the new daemon
        assert b.call({"reset_prefix_cache": True}, 60.0)["reset"]
        b4 = kv(b)
        assert ask(b, again) == baseline
        b5 = kv(b)
        assert grew(b4, b5, "hit_blocks_g2") >= 4 * SYSTEMS, b5
        phase("B reused from the new daemon")
        assert daemon.proc.poll() is None, "kvtier serve died"
    finally:
        for inst in insts:
            inst.kill()
        daemon.stop()

"""Two real vLLM processes attached to one `kvtier serve` (docs/service.md).

Each vLLM run is its own process (tools/vllm/driver.py); the daemon is the real `kvtier serve`
binary, started here and killed with -9 by one run. The workload and the reference outputs
(vLLM alone) are test_vllm_connector.py's.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from test_vllm_connector import (  # noqa: F401  (fixtures are found by name)
    SYSTEMS,
    baseline,
    counters,
    metric,
    outputs,
    prompts,
    run_vllm,
)

CLI = os.environ.get("KVTIER_TEST_CLI", "")


@pytest.fixture(scope="module")
def tmp() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="kvtier-vllm-svc-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


class Daemon:
    """A `kvtier serve` process on `sock`, G2 only."""

    def __init__(self, tmp: Path, sock: Path) -> None:
        if not CLI or not Path(CLI).exists():
            pytest.fail(f"KVTIER_TEST_CLI ({CLI!r}) is not the kvtier binary; run tests/vllm/run.sh")
        env = dict(os.environ, KVTIER_G2_CAPACITY_BYTES="256MiB", KVTIER_G3_ENABLED="false",
                   KVTIER_G2_LOCK_MEMORY="false")
        self.log = open(tmp / "serve.log", "a")
        self.proc = subprocess.Popen([CLI, "serve", "--socket", str(sock)], env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(str(sock))
                return
            except OSError:
                time.sleep(0.05)
        self.proc.kill()
        pytest.fail(f"kvtier serve did not listen on {sock} within 20 s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.log.close()


def attached(sock: Path, instance: str) -> Dict[str, Any]:
    return {"service.socket": str(sock), "service.instance": instance,
            "service.reattach_ms": 200}


def test_second_vllm_loads_what_the_first_computed(tmp: Path,
                                                   baseline: List[List[int]]) -> None:
    sock = tmp / "run" / "kvtier.sock"
    daemon = Daemon(tmp, sock)
    try:
        steps = [{"name": "first", "generate": prompts(), "max_tokens": 8}]
        a = run_vllm(tmp, "svc-a", steps, attached(sock, "vllm-a"))
        assert outputs(a) == baseline
        # A process that never saw these prompts: its first requests load A's prefixes from
        # the daemon's G2 (and so would A itself, restarted: a new process is a new instance).
        b = run_vllm(tmp, "svc-b", steps, attached(sock, "vllm-b"))
        assert outputs(b) == baseline
        assert metric(b, "hit_blocks_g2") >= 4 * SYSTEMS, counters(b)
        assert metric(b, "load_error_blocks") == 0, counters(b)
        assert daemon.proc.poll() is None, "kvtier serve died"
    finally:
        daemon.stop()


def test_daemon_killed_mid_run_outputs_stay_right(tmp: Path,
                                                  baseline: List[List[int]]) -> None:
    sock = tmp / "run2" / "kvtier.sock"
    daemon = Daemon(tmp, sock)
    try:
        steps = [{"name": "before", "generate": prompts(), "max_tokens": 8},
                 {"signal": daemon.proc.pid, "signum": 9},
                 {"reset_prefix_cache": True},
                 {"name": "after", "generate": prompts(), "max_tokens": 8}]
        r = run_vllm(tmp, "svc-kill", steps, attached(sock, "vllm-c"))
        # Every answer right: before the kill from vLLM (and kvtier), after it with kvtier's
        # calls turned into misses.
        assert outputs(r, 0) == baseline
        assert outputs(r, 1) == baseline
        assert daemon.proc.wait(timeout=10) == -9
    finally:
        daemon.stop()

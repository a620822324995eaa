"""A real `kvtier serve` daemon for the vLLM tests (the binary in KVTIER_TEST_CLI)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServeDaemon:
    """`kvtier serve` on `sock`, G2 only (no G3, G2 not locked), its output appended to
    `log_path`; listening within 20 s, or the test fails with the log's end. `env` adds or
    overrides KVTIER_* settings (these defaults included)."""

    def __init__(self, log_path: Path, sock: Path, g2_bytes: str = "256MiB",
                 **env: str) -> None:
        cli = os.environ.get("KVTIER_TEST_CLI", "")
        if not cli or not Path(cli).exists():
            pytest.fail(f"KVTIER_TEST_CLI ({cli!r}) is not the kvtier binary; run tests/vllm/run.sh")
        full_env = dict(os.environ, KVTIER_G2_CAPACITY_BYTES=g2_bytes, KVTIER_G3_ENABLED="false",
                        KVTIER_G2_LOCK_MEMORY="false", KVTIER_LOG_LEVEL="info")
        full_env.update(env)  # may override the defaults above (KVTIER_G3_ENABLED="true")
        self.log_path = log_path
        self.log = open(log_path, "a")
        self.proc = subprocess.Popen([cli, "serve", "--socket", str(sock)], env=full_env,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(str(sock))
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        pytest.fail(f"kvtier serve did not listen on {sock} within 20 s:\n"
                    f"{log_path.read_text(errors='replace')[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.log.close()

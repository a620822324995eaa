"""A real redis-server on a free 127.0.0.1 port for the vLLM tests' G4, and redis-cli."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time

import pytest


def start_redis() -> subprocess.Popen:
    """redis-server without persistence on a free loopback port (proc.port), up within 10 s;
    fails the test when it is not installed or does not answer."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("redis-server is not installed (scripts/install-deps.sh installs it)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            proc.port = port  # type: ignore[attr-defined]
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    pytest.fail("redis-server did not start")


def redis_cli(port: int, *args: str) -> str:
    return subprocess.run(["redis-cli", "-p", str(port), *args], check=True,
                          capture_output=True, text=True, timeout=30).stdout

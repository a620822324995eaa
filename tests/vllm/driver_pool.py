"""run_driver(): tools/vllm/driver.py runs, each in a new process forked from a zygote that
imported vLLM once (tools/vllm/zygote.py), instead of a new interpreter that imports it again.

Each run is still its own process with its own engine and kvtier manager; only the import is
shared. One zygote per test process, started at the first run and ended at exit. Without it
(it fails to start, or KVTIER_TEST_NO_ZYGOTE=1), runs are plain subprocesses, as before.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

TOOLS = Path(__file__).resolve().parent.parent.parent / "tools" / "vllm"
DRIVER = TOOLS / "driver.py"
ZYGOTE = TOOLS / "zygote.py"
_START_TIMEOUT_S = 300.0


class DriverTimeout(Exception):
    pass


class _Zygote:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(ZYGOTE)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, bufsize=1)
        self.seq = 0
        msg = self._read(time.monotonic() + _START_TIMEOUT_S)
        if msg is None or "ready" not in msg:
            self.close()
            raise RuntimeError("the vLLM zygote did not start")

    def _read(self, deadline: float) -> Optional[Dict[str, Any]]:
        assert self.proc.stdout is not None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                line = self.proc.stdout.readline()
                if not line:
                    raise RuntimeError("the vLLM zygote exited")
                return json.loads(line)

    def run(self, args: List[str], log: Path, env: Dict[str, str], timeout: float) -> int:
        assert self.proc.stdin is not None
        self.seq += 1
        me = self.seq
        self.proc.stdin.write(json.dumps({"id": me, "args": args, "log": str(log),
                                          "env": env, "cwd": os.getcwd()}) + "\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        pid = None
        while True:
            msg = self._read(deadline)
            if msg is None:
                if pid is not None:
                    try:
                        os.killpg(pid, signal.SIGKILL)  # the child and what vLLM started
                    except ProcessLookupError:
                        pass
                    # Its rc line comes; read it so the next run's lines are its own.
                    while True:
                        m = self._read(time.monotonic() + 30)
                        if m is None or (m.get("id") == me and "rc" in m):
                            break
                raise DriverTimeout(f"driver run did not finish in {timeout} s")
            if msg.get("id") != me:
                continue
            if "pid" in msg:
                pid = int(msg["pid"])
            elif "rc" in msg:
                return int(msg["rc"])

    def close(self) -> None:
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


_zygote: Optional[_Zygote] = None
_failed = False


def _get() -> Optional[_Zygote]:
    global _zygote, _failed
    if _zygote is None and not _failed and os.environ.get("KVTIER_TEST_NO_ZYGOTE") != "1":
        try:
            _zygote = _Zygote()
            atexit.register(_zygote.close)
        except (OSError, RuntimeError) as e:
            print(f"driver_pool: no zygote ({e}); plain subprocesses", file=sys.stderr)
            _failed = True
    return _zygote


def run_driver(args: List[str], log: Path, env: Optional[Dict[str, str]] = None,
               timeout: float = 600) -> int:
    """driver.py ARGS with stdout and stderr into `log`; its exit code. DriverTimeout when it
    runs past `timeout` seconds (it is killed, with its process group)."""
    env = dict(os.environ if env is None else env)
    z = _get()
    if z is not None:
        return z.run([str(a) for a in args], log, env, timeout)
    with open(log, "w") as f:
        try:
            return subprocess.run([sys.executable, str(DRIVER), *map(str, args)], stdout=f,
                                  stderr=subprocess.STDOUT, env=env, timeout=timeout).returncode
        except subprocess.TimeoutExpired as e:
            raise DriverTimeout(f"driver run did not finish in {timeout} s") from e

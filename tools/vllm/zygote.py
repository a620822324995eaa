"""A process that imports vLLM once and forks a fresh child for each driver.py run.

Importing torch, transformers and vLLM takes 7-18 s on the project machines, more than a small
test run's engine start and work together. The vLLM tests start ~30 engines, each a new
process, so that import was most of their time. The zygote pays it once: each run is still a
new process (its own engine, connector, kvtier manager, G2; a "restart" is a restart), a child
forked from this one after the imports and before any engine or thread pool exists.

Protocol (one JSON object per line): the zygote prints {"ready": pid} once imported; then for
each request on stdin {"id": N, "args": [PLAN, OUT], "log": PATH, "env": {...}, "cwd": DIR}
it forks a child that runs driver.main() with sys.argv = [driver.py, *args], the environment
`env`, stdout and stderr into `log`, in its own session (so the caller can kill the child and
whatever vLLM started with one killpg), and prints {"id": N, "pid": P}; when the child exits it
prints {"id": N, "rc": RC} (RC negative: killed by that signal). End of stdin ends the zygote.
The caller is tests/vllm/driver_pool.py; driver.py itself is unchanged and runs alone too.
"""

from __future__ import annotations

import json
import os
import select
import sys
import traceback
from typing import Any, Dict

HERE = os.path.dirname(os.path.abspath(__file__))


def _child(req: Dict[str, Any]) -> None:
    """In the forked child: never returns."""
    rc = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # not the zygote's request pipe
        os.close(null)
        fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        # Fresh stream objects on the new descriptors (the parent's may hold a lock).
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req.get("cwd") or HERE)
        sys.argv = [os.path.join(HERE, "driver.py"), *req["args"]]
        import driver

        rc = int(driver.main() or 0)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - report anything, then exit
        traceback.print_exc()
        rc = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(rc)


def _say(msg: Dict[str, Any]) -> None:
    sys.__stdout__.write(json.dumps(msg) + "\n")
    sys.__stdout__.flush()


def main() -> int:
    sys.path.insert(0, HERE)
    import torch  # noqa: F401
    import transformers  # noqa: F401
    from vllm import LLM, SamplingParams  # noqa: F401

    import driver  # noqa: F401

    _say({"ready": os.getpid()})
    children: Dict[int, int] = {}  # pid -> request id
    stdin_open = True
    while stdin_open or children:
        # One thread only (a fork from a threaded process is not safe): poll stdin, reap.
        if stdin_open:
            ready, _, _ = select.select([sys.stdin], [], [], 0.05)
        else:
            ready = []
        if ready:
            line = sys.stdin.readline()
            if not line:
                stdin_open = False
            elif line.strip():
                req = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _child(req)
                children[pid] = req["id"]
                _say({"id": req["id"], "pid": pid})
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            if pid in children:
                _say({"id": children.pop(pid), "rc": os.waitstatus_to_exitcode(status)})
        if not stdin_open and children:
            pid, status = os.waitpid(-1, 0)
            if pid in children:
                _say({"id": children.pop(pid), "rc": os.waitstatus_to_exitcode(status)})
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Round-trip time of the vLLM connector's lookup channel (python/kvtier/vllm/lookup.py): a
LookupServer in a child process, one LookupClient, N sequential submit() + result() calls of
one prompt of T token ids (drawn below 150,000, like a real vocabulary's). Not a test; by hand:

    PYTHONPATH=build/python python3 tests/python/lookup_rtt.py [N] [T] [LOOKUP_PY]

LOOKUP_PY: another version of lookup.py to measure instead (a self-contained one, such as the
pickle channel before the binary format: git show 3fe6785:python/kvtier/vllm/lookup.py).
The channel's directory is a fresh private XDG_RUNTIME_DIR, removed afterwards.
"""

import importlib.util
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any, List, Tuple


def load(path: str) -> Any:
    if not path:
        from kvtier.vllm import lookup
        return lookup
    spec = importlib.util.spec_from_file_location("lookup_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def answer(key: str, tokens: List[int], num_computed: int, salt: str,
           lora: str) -> Tuple[int, Tuple[int, int, int, int]]:
    return len(tokens) - 1, (0, len(tokens) // 16, 0, 0)


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        load(sys.argv[3]).LookupServer(sys.argv[2], 0, answer)
        print("ready", flush=True)
        sys.stdin.read()
        return
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    ntok = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
    path = sys.argv[3] if len(sys.argv) > 3 else ""
    runtime = tempfile.mkdtemp(prefix="kvt-rtt-")
    os.environ["XDG_RUNTIME_DIR"] = runtime
    instance = str(uuid.uuid4())
    server = subprocess.Popen([sys.executable, __file__, "--serve", instance, path],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        client = load(path).LookupClient(instance, 0)
        rng = random.Random(1)
        request = ("req-1", [rng.randrange(150000) for _ in range(ntok)], 0, "", "")
        times = []
        for i in range(200 + n):
            t0 = time.perf_counter()
            seq = client.submit(request)
            status, value = client.result(seq, 5)
            if i >= 200:  # the first calls connect and warm up
                times.append(time.perf_counter() - t0)
            assert status == "ok", value
            client.forget(seq)
        times.sort()
        print(f"{path or 'kvtier.vllm.lookup'}: {ntok} tokens, {n} calls: median "
              f"{statistics.median(times) * 1e6:.0f} us, p90 {times[n * 9 // 10] * 1e6:.0f} us, "
              f"p99 {times[n * 99 // 100] * 1e6:.0f} us")
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait()
        shutil.rmtree(runtime, ignore_errors=True)


if __name__ == "__main__":
    main()

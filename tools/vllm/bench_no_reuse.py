"""overhead_no_reuse for `kvtier bench vllm`: what kvtier costs when nothing is reused (issue 25).

Unique prompts (distinct from the first token) go to vLLM alone and to vLLM with kvtier. The
two engines are alive side by side, each a served driver (tools/vllm/driver.py, "serve": true),
and get the same prompts in turns of two requests, the sides alternating A K K A A K ...: each
pair of turns is adjacent in time, so a drift in a shared machine's speed (which moved the old
protocol, separate processes minutes apart, by up to 0.10 in one run) hits both sides alike.

- Only one engine computes at a time: the other waits on its stdin (vLLM's OpenMP threads
  sleep), and a turn starts `GAP_S` after the previous one ended, so kvtier's saves of its last
  turn have landed before vLLM alone's turn starts and do not slow it. Within a turn the second
  request runs while the first one's saves are copied, as in a steady stream.
- Each side's first turn is a warm-up and is not measured.
- overhead_no_reuse = the median over adjacent pairs of turns of (kvtier turn's TTFT sum /
  vLLM alone turn's TTFT sum) - 1. The ratio of the two sides' TTFT medians is reported too.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

TURN = 2  # requests per turn
GAP_S = 0.3  # between turns: the previous side's saves land first


class ServedDriver:
    """One vLLM engine in its own process (driver.py in serve mode): a request per line on its
    stdin, a JSON reply per line in a file this class reads as it grows."""

    def __init__(self, driver: Path, tmp: Path, name: str, plan: Dict[str, Any],
                 env: Dict[str, str]) -> None:
        self.name = name
        self.reply_path = tmp / f"{name}.replies.jsonl"
        self.log_path = tmp / f"{name}.log"
        plan_path = tmp / f"{name}.plan.json"
        plan_path.write_text(json.dumps(dict(plan, serve=True)))
        self.reply_path.write_text("")
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, str(driver), str(plan_path), str(self.reply_path)],
            stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT,
            env=dict(os.environ, **env), text=True)
        self._offset = 0
        self._pending = ""

    def next_reply(self, timeout: float) -> Dict[str, Any]:
        """The next reply line; RuntimeError (with the log's tail) when the process exits or
        `timeout` seconds pass first."""
        deadline = time.monotonic() + timeout
        while True:
            with open(self.reply_path) as f:
                f.seek(self._offset)
                chunk = f.read()
                self._offset = f.tell()
            self._pending += chunk
            if "\n" in self._pending:
                line, self._pending = self._pending.split("\n", 1)
                return json.loads(line)
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name}: vLLM exited {self.proc.returncode}; see "
                                   f"{self.log_path}:\n{self.log_path.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: no reply in {timeout:.0f} s; see "
                                   f"{self.log_path}")
            time.sleep(0.005)

    def ask(self, msg: Dict[str, Any], timeout: float) -> Dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        return self.next_reply(timeout)

    def close(self, timeout: float = 120) -> None:
        """EOF on stdin ends the engine (its connector shut down too); killed if it hangs."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=timeout)
        except (subprocess.TimeoutExpired, BrokenPipeError):
            self.proc.kill()
            self.proc.wait()
        finally:
            self._log.close()


def measure(driver: Path, tmp: Path, base_plan: Dict[str, Any], kvtier: Dict[str, Any],
            prompts: List[Dict[str, Any]], env: Dict[str, str], timeout: float,
            log: Callable[[str], None], gap_s: float = GAP_S) -> Dict[str, Any]:
    """Runs `prompts` (the first TURN of them a warm-up) through vLLM alone and through vLLM
    with kvtier (`kvtier`: its extra config), as described above. Returns the figures."""
    sides = {"alone": ServedDriver(driver, tmp, "noreuse_alone", base_plan, env),
             "kvtier": ServedDriver(driver, tmp, "noreuse_kvtier",
                                    dict(base_plan, kvtier=kvtier), env)}
    t0 = time.perf_counter()
    ok = False
    try:
        for s in sides.values():  # both start at once; wait for each to be up
            ready = s.next_reply(timeout)
            if not ready.get("ready"):
                raise RuntimeError(f"{s.name}: expected the ready line, got {ready}")
        log(f"no-reuse engines up: {time.perf_counter() - t0:.0f} s")
        turns = [prompts[i:i + TURN] for i in range(0, len(prompts), TURN)]
        ttft: Dict[str, List[List[float]]] = {"alone": [], "kvtier": []}
        for t, turn in enumerate(turns):
            order = ("alone", "kvtier") if t % 2 == 0 else ("kvtier", "alone")
            for side in order:
                times = []
                for p in turn:
                    r = sides[side].ask({"prompt": p, "max_tokens": 1}, timeout)
                    if r.get("ttft_s") is None:
                        raise RuntimeError(f"{side}: no TTFT in the reply {r}")
                    times.append(float(r["ttft_s"]))
                ttft[side].append(times)
                time.sleep(gap_s)
        hits = sides["kvtier"].ask({"metrics": True}, timeout)["metrics"].get(
            "vllm:kvtier_hit_blocks_g2", 0.0)
        ok = True
    finally:
        # After a failure an engine may be stuck: a short wait, then it is killed.
        for s in sides.values():
            s.close(120 if ok else 5)
    # Turn 0 of each side is the warm-up.
    pairs = [sum(k) / sum(a) for a, k in zip(ttft["alone"][1:], ttft["kvtier"][1:])]
    alone = [x for turn in ttft["alone"][1:] for x in turn]
    kv = [x for turn in ttft["kvtier"][1:] for x in turn]
    a50, k50 = statistics.median(alone), statistics.median(kv)
    return {
        "overhead": statistics.median(pairs) - 1.0,
        "pair_ratios": pairs,
        "p50_ratio": k50 / a50 - 1.0,
        "vllm_alone_ttft_p50_ms": 1000 * a50,
        "kvtier_ttft_p50_ms": 1000 * k50,
        "requests_per_side": len(alone),
        "ttft_ms": {side: [[round(1000 * x, 1) for x in turn] for turn in turns]
                    for side, turns in ttft.items()},
        "kvtier_hit_blocks": hits,
        "wall_s": time.perf_counter() - t0,
    }


def predict_s(start_s: float, requests: int, request_s: float) -> float:
    """What measure() takes: two starts at once on a small machine (taken as 1.5 starts), both
    sides' requests and warm-ups, and the gaps."""
    turns = -(-requests // TURN) + 1
    return 1.5 * start_s + 2 * (requests + TURN) * request_s + 2 * turns * GAP_S


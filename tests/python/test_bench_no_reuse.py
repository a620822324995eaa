"""tools/vllm/bench_no_reuse.py: how `kvtier bench vllm` measures overhead_no_reuse (issue 25).

The protocol runs two served drivers side by side. Here each is a stand-in engine (a small
Python script speaking driver.py's serve protocol; vLLM itself is what the benchmark runs, at
minutes per run): its TTFT is a base time times a machine speed that drifts with the wall clock
(shared by both processes, as a shared machine's is), times 1.05 on the kvtier side. What is
checked: the measure recovers the 5% through a drift of the machine's speed that is larger
than it; the warm-up turn is not counted; the sides alternate in turns; a process that dies or
stops answering fails the measure with a clear error, and no process is left behind.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "vllm"))

import bench_no_reuse as nr  # noqa: E402

FAKE = r'''
import json, os, sys, time
plan = json.load(open(sys.argv[1]))
reply = open(sys.argv[2], "w", buffering=1)
side = "kvtier" if plan.get("kvtier") else "alone"
f = plan["fake"]
reply.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
n = 0
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("metrics"):
        reply.write(json.dumps({"metrics": {"vllm:kvtier_hit_blocks_g2": 0.0}}) + "\n")
        continue
    n += 1
    if side in f.get("die_side", "") and n == f.get("die_at"):
        os._exit(5)
    if side in f.get("hang_side", "") and n == f.get("hang_at"):
        time.sleep(3600)
    # The machine's speed drifts with the wall clock, the same for both processes.
    speed = 1.0 + f["drift_per_s"] * (time.time() - f["epoch"])
    ttft = f["base_s"] * speed * (f["kvtier_factor"] if side == "kvtier" else 1.0)
    if n == 1:
        ttft *= 10  # a cold first request: the warm-up turn must not count
    with open(f["order"], "a") as o:
        o.write(side + "\n")
    time.sleep(0.01)
    reply.write(json.dumps({"output": [1], "ttft_s": ttft, "prompt_tokens": 10}) + "\n")
'''


def run(tmp_path: Path, requests: int = 8, **fake: Any) -> Dict[str, Any]:
    driver = tmp_path / "fake_driver.py"
    driver.write_text(FAKE)
    order = tmp_path / "order.txt"
    spec = {"base_s": 0.5, "drift_per_s": 1.0, "epoch": time.time(), "kvtier_factor": 1.05,
            "order": str(order)}
    spec.update(fake)
    prompts = [{"text": f"p{i}"} for i in range(nr.TURN + requests)]
    logs: List[str] = []
    out = nr.measure(driver, tmp_path, {"fake": spec}, {"g2.capacity_bytes": "1GiB"}, prompts,
                     {}, timeout=fake.get("timeout", 30.0), log=logs.append, gap_s=0.1)
    out["order"] = order.read_text().split()
    return out


def alive(tmp_path: Path) -> List[str]:
    """The command lines of processes still running a driver from `tmp_path`."""
    found = []
    for d in Path("/proc").iterdir():
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
        if str(tmp_path / "fake_driver.py") in cmd:
            found.append(cmd)
    return found


def test_the_overhead_is_recovered_through_a_drift_larger_than_it(tmp_path: Path) -> None:
    # The machine's speed changes by ~4% between two adjacent turns and by ~50% over the run,
    # ten times the 5% to be measured: the pairs' errors alternate in sign (A K, then K A).
    out = run(tmp_path, drift_per_s=0.3)
    assert out["overhead"] == pytest.approx(0.05, abs=0.015), out
    assert len(out["pair_ratios"]) == 4
    assert out["requests_per_side"] == 8
    assert max(out["pair_ratios"]) - min(out["pair_ratios"]) > 0.02, out  # the drift was felt
    assert alive(tmp_path) == []  # EOF ended both


def test_the_warm_up_turn_is_not_counted_and_the_sides_take_turns(tmp_path: Path) -> None:
    out = run(tmp_path, drift_per_s=0.0)
    # Each process's first request is 10x slower; were it counted, a pair would show it.
    assert max(out["pair_ratios"]) < 1.1 and min(out["pair_ratios"]) > 1.0, out
    assert out["overhead"] == pytest.approx(0.05, abs=1e-6)
    # Turns of two, the sides alternating A K K A A K ...
    turns = [out["order"][i:i + nr.TURN] for i in range(0, len(out["order"]), nr.TURN)]
    assert all(len(set(t)) == 1 for t in turns), out["order"]
    sides = [t[0] for t in turns]
    assert sides == ["alone", "kvtier", "kvtier", "alone", "alone", "kvtier", "kvtier",
                     "alone", "alone", "kvtier"], sides


def test_an_engine_that_dies_fails_the_measure_clearly(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"noreuse_kvtier: vLLM exited 5; see .*\.log"):
        run(tmp_path, die_side="kvtier", die_at=3)
    assert time.monotonic() - started < 20
    assert alive(tmp_path) == []
    for name in ("noreuse_alone", "noreuse_kvtier"):
        assert (tmp_path / f"{name}.log").exists()


def test_an_engine_that_stops_answering_times_out_and_is_killed(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"noreuse_alone: no reply in 2 s"):
        run(tmp_path, hang_side="alone", hang_at=4, timeout=2.0)
    # After the error the stuck engine gets 5 s to end on EOF, then it is killed.
    assert time.monotonic() - started < 30
    assert alive(tmp_path) == []


def test_predict_grows_with_requests_and_start() -> None:
    assert nr.predict_s(10, 12, 1.0) > nr.predict_s(10, 6, 1.0)
    assert nr.predict_s(20, 12, 1.0) > nr.predict_s(10, 12, 1.0)
    # Both sides' requests and warm-ups, one start and a half.
    assert nr.predict_s(10, 12, 1.0) >= 15 + 2 * 14

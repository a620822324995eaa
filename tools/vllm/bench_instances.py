"""kvtier bench vllm --instances 2: two vLLM instances on this host behind round-robin routing.

Run by tools/vllm/bench_vllm.py when --instances is 2. The workload is bench_vllm's multi-round
chat; request (user u, round r) goes to instance (u + r) % 2, so every follow-up lands on the
other instance than the user's last turn: what a router without session affinity (round-robin,
least-loaded) does in the worst case. Requests run one at a time, in the same order, in every
configuration. Each configuration starts its own two vLLM processes (tools/vllm/driver.py in
serve mode), both up at once:

- vllm_alone: each instance with its own prefix cache only;
- kvtier_per_instance: each instance with its own embedded kvtier (a private G2 that holds the
  whole working set): a follow-up finds only what that instance computed itself;
- kvtier_shared: both attached to one `kvtier serve` (service.socket): a follow-up finds the
  prefix the other instance computed, in the shared G2.

The must-show ratio is kvtier_shared / kvtier_per_instance mean TTFT (issue 22: <= 0.8), with
every configuration's outputs equal.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "driver.py"


def log(msg: str) -> None:
    print(f"bench vllm --instances: {msg}", file=sys.stderr, flush=True)


class Instance:
    """One vLLM process in driver.py's serve mode: requests on stdin, replies on a FIFO."""

    def __init__(self, tmp: Path, name: str, plan: Dict[str, Any], env: Dict[str, str]) -> None:
        self.name = name
        plan_path = tmp / f"{name}.plan.json"
        plan_path.write_text(json.dumps(dict(plan, serve=True)))
        self.fifo = tmp / f"{name}.replies"
        if self.fifo.exists():
            self.fifo.unlink()
        os.mkfifo(self.fifo)
        self.log_path = tmp / f"{name}.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen([sys.executable, str(DRIVER), str(plan_path),
                                      str(self.fifo)], stdin=subprocess.PIPE,
                                     stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     text=True, start_new_session=True)
        # Non-blocking: a driver that dies before it opens the FIFO cannot hang this open.
        self._fd = os.open(self.fifo, os.O_RDONLY | os.O_NONBLOCK)
        self._buf = b""
        self.pid = 0
        self.vllm: Dict[str, str] = {}

    def _fail(self, what: str) -> RuntimeError:
        self._log.flush()
        tail = self.log_path.read_text(errors="replace")[-3000:]
        return RuntimeError(f"{self.name}: {what}; see {self.log_path}:\n{tail}")

    def read(self, timeout_s: float) -> Dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._fail(f"no reply within {timeout_s:.0f} s")
            ready, _, _ = select.select([self._fd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(self._fd, 1 << 16)
                if chunk:
                    self._buf += chunk
                    continue
                # EOF: the writer closed (or has not opened yet: a FIFO reads EOF then).
                if self.proc.poll() is not None:
                    raise self._fail(f"vLLM exited {self.proc.returncode}")
                time.sleep(0.05)
            elif self.proc.poll() is not None:
                raise self._fail(f"vLLM exited {self.proc.returncode}")
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def wait_ready(self, timeout_s: float) -> None:
        msg = self.read(timeout_s)
        if not msg.get("ready"):
            raise self._fail(f"unexpected first line {msg!r}")
        self.pid = int(msg["pid"])
        self.vllm = dict(msg.get("vllm") or {})  # the vLLM its engine imported

    def call(self, msg: Dict[str, Any], timeout_s: float = 900.0) -> Dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        return self.read(timeout_s)

    def kill(self) -> None:
        """kill -9 of the whole vLLM (its process group: engine core and workers too)."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()
        os.close(self._fd)
        self._log.close()


class Daemon:
    """`kvtier serve` on a socket in the work directory, G2 only."""

    def __init__(self, cli: str, tmp: Path, g2_bytes: str) -> None:
        self.sock = tmp / "serve" / "kvtier.sock"
        env = dict(os.environ, KVTIER_G2_CAPACITY_BYTES=g2_bytes, KVTIER_G3_ENABLED="false",
                   KVTIER_G2_LOCK_MEMORY="false")
        self._log = open(tmp / "serve.log", "w")
        self.proc = subprocess.Popen([cli, "serve", "--socket", str(self.sock)], env=env,
                                     stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvtier serve exited {self.proc.returncode}; see "
                                   f"{tmp / 'serve.log'}")
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(str(self.sock))
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"kvtier serve did not listen on {self.sock} within 30 s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def run_config(tmp: Path, name: str, base: Dict[str, Any], kvtier: List[Optional[Dict[str, Any]]],
               requests: List[Dict[str, Any]], max_tokens: int,
               env: Dict[str, str]) -> Dict[str, Any]:
    """Both instances up, then every request in order on instance (user + round) % 2."""
    t0 = time.perf_counter()
    insts = [Instance(tmp, f"{name}-{i}", dict(base, kvtier=kvtier[i]), env) for i in range(2)]
    try:
        for inst in insts:
            inst.wait_ready(900.0)
        log(f"{name}: both instances up in {time.perf_counter() - t0:.0f} s")
        outputs: List[List[int]] = []
        ttft_ms: List[float] = []
        prompt_tokens: List[int] = []
        t1 = time.perf_counter()
        for req in requests:
            inst = insts[(req["user"] + req["round"]) % 2]
            r = inst.call({"prompt": {"chat": req["chat"]}, "max_tokens": max_tokens})
            outputs.append(r["output"])
            ttft_ms.append(1000.0 * (r["ttft_s"] or 0.0))
            prompt_tokens.append(int(r["prompt_tokens"]))
        wall = time.perf_counter() - t1
        metrics: Dict[str, float] = {}
        per_instance = []
        for inst in insts:
            m = inst.call({"metrics": True}, 60.0)["metrics"]
            per_instance.append(m)
            for k, v in m.items():
                metrics[k] = metrics.get(k, 0.0) + v
    finally:
        for inst in insts:
            inst.close()
    log(f"{name}: {time.perf_counter() - t0:.0f} s")
    return {"outputs": outputs, "ttft_ms": ttft_ms, "prompt_tokens": prompt_tokens,
            "wall_s": wall, "metrics": metrics, "metrics_per_instance": per_instance}


def main(args: Any, tmp: Path, requests: List[Dict[str, Any]], base: Dict[str, Any],
         threads_env: Dict[str, str], block: int, pct: Any) -> Dict[str, Any]:
    if args.instances != 2:
        raise SystemExit("--instances: only 2 is built (two instances, round-robin)")
    cli = args.cli or os.environ.get("BENCH_KVTIER_CLI", "")
    if not cli or not os.access(cli, os.X_OK):
        raise SystemExit(f"--instances 2 needs the kvtier binary for kvtier serve (--cli or "
                         f"BENCH_KVTIER_CLI; got {cli!r})")
    env = dict(os.environ, **threads_env)
    g2 = {"g2.capacity_bytes": "1GiB", "g3.enabled": False, "g2.lock_memory": False}
    results: Dict[str, Dict[str, Any]] = {}
    for name in args.configs.split(","):
        if name == "vllm_alone":
            kvtier: List[Optional[Dict[str, Any]]] = [None, None]
            results[name] = run_config(tmp, name, base, kvtier, requests, args.max_tokens, env)
        elif name == "kvtier_per_instance":
            results[name] = run_config(tmp, name, base, [dict(g2), dict(g2)], requests,
                                       args.max_tokens, env)
        elif name == "kvtier_shared":
            daemon = Daemon(cli, tmp, "1GiB")
            try:
                kv = [dict(g2, **{"service.socket": str(daemon.sock),
                                  "service.instance": f"bench-{i}"}) for i in range(2)]
                results[name] = run_config(tmp, name, base, kv, requests, args.max_tokens,
                                           env)
            finally:
                daemon.stop()
        else:
            raise SystemExit(f"unknown config {name!r} for --instances 2 (vllm_alone, "
                             f"kvtier_per_instance, kvtier_shared)")

    configs: Dict[str, Any] = {}
    for name, r in results.items():
        t = r["ttft_ms"]
        m = r["metrics"]
        tokens = sum(r["prompt_tokens"]) + sum(len(o) for o in r["outputs"])
        by_round: Dict[int, List[float]] = {}
        for req, v in zip(requests, t):
            by_round.setdefault(req["round"], []).append(v)
        configs[name] = {
            "requests": len(t), "ttft_mean_ms": statistics.fmean(t),
            "ttft_p50_ms": pct(t, 0.5), "ttft_p90_ms": pct(t, 0.9),
            "throughput_tokens_per_s": tokens / r["wall_s"], "wall_s": r["wall_s"],
            "hit_tokens": {"vllm_g1": m.get("vllm:prefix_cache_hits", 0.0),
                           "external": m.get("vllm:external_prefix_cache_hits", 0.0),
                           "kvtier_g2": block * m.get("vllm:kvtier_hit_blocks_g2", 0.0)},
            "prompt_tokens": m.get("vllm:prompt_tokens", 0.0),
            "ttft_by_round_ms": {str(k): statistics.fmean(v) for k, v in sorted(by_round.items())},
        }
    outs = [r["outputs"] for r in results.values()]
    report: Dict[str, Any] = {
        "mode": "instances",
        "workload": {"instances": 2, "routing": "(user + round) % 2: every follow-up on the "
                     "other instance", "users": args.users, "rounds": args.rounds,
                     "requests": len(requests), "max_tokens": args.max_tokens,
                     "block_tokens": block, "vllm_kv_blocks_per_instance": args.g1_blocks,
                     "model": args.model, "threads_env": threads_env},
        "configs": configs,
        "outputs_equal": all(o == outs[0] for o in outs),
    }
    if "kvtier_shared" in configs and "kvtier_per_instance" in configs:
        report["shared_vs_per_instance_ttft_mean"] = (
            configs["kvtier_shared"]["ttft_mean_ms"]
            / configs["kvtier_per_instance"]["ttft_mean_ms"])
    for name in ("kvtier_shared", "kvtier_per_instance"):
        if name in configs and "vllm_alone" in configs:
            report[f"{name}_vs_vllm_alone_ttft_mean"] = (
                configs[name]["ttft_mean_ms"] / configs["vllm_alone"]["ttft_mean_ms"])
    return report


def print_report(report: Dict[str, Any]) -> None:
    w = report["workload"]
    print(f"workload: 2 instances, {w['users']} users x {w['rounds']} rounds, "
          f"{w['requests']} requests, follow-ups on the other instance")
    print(f"{'config':<22}{'TTFT mean':>11}{'p50':>9}{'p90':>9}{'tok/s':>9}  hit tokens")
    for name, c in report["configs"].items():
        hits = ", ".join(f"{k}={v:.0f}" for k, v in c["hit_tokens"].items() if v)
        print(f"{name:<22}{c['ttft_mean_ms']:>9.1f}ms{c['ttft_p50_ms']:>7.1f}ms"
              f"{c['ttft_p90_ms']:>7.1f}ms{c['throughput_tokens_per_s']:>9.0f}  {hits}")
    print(f"outputs_equal: {report['outputs_equal']}")
    for key in ("shared_vs_per_instance_ttft_mean", "kvtier_shared_vs_vllm_alone_ttft_mean",
                "kvtier_per_instance_vs_vllm_alone_ttft_mean"):
        if key in report:
            print(f"{key}: {report[key]:.3f}")

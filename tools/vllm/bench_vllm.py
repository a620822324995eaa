"""kvtier bench vllm: vLLM on this machine's CPU, alone and with KV connectors, on a multi-round
chat whose KV is several times vLLM's own KV space.

Run by `kvtier bench vllm` (tools/bench/bench_vllm.cc -> tools/vllm/run_bench.sh), which makes the
environment with scripts/setup-vllm.sh. Each configuration is a fresh vLLM process
(tools/vllm/driver.py) running the same requests in the same order, one at a time, with
vLLM's engine core and worker in the driver's process (--processes: their own processes, as
in a deployment, where kvtier's lookups cross its socket; each start then costs an import of
vLLM more, ~25 s on 2 cores):

- vllm_alone: vLLM with its own prefix cache;
- example_connector: vLLM's ExampleConnector (whole-prompt files on disk; the only peer
  connector that runs on the CPU backend);
- kvtier_g2: KvtierConnector with G2 large enough for the working set, no G3;
- kvtier_g2_g3: KvtierConnector with G2 at a quarter of the working set and G3 behind it;
- vllm_unbounded: vLLM alone with a KV space that holds the whole working set, so every reuse
  is a vLLM prefix-cache (G1) hit: the limit a multi-tier cache is measured against (issue 25).
  Its KV space is sized from the working set the first configuration measured.

Workload (in the spirit of LMCache's multi-round QA and vLLM's prefix_repetition dataset):
U users x R rounds; every user shares one system prompt; round r of user u sends the system
prompt, u's r earlier turns (a question and a fixed answer each, so every configuration sees
the same prompts whatever it generates) and a new question. Requests go round-robin over the
users, so between two turns of one user the other users' prompts pass through vLLM's cache.

Also measured: the floor (one long prompt cold, then as a vLLM prefix-cache hit and as a
kvtier G2 hit after vLLM's cache is reset; medians of --reps repetitions), quiet and again with
a CPU-bound neighbour process running beside vLLM (a busy loop, not pinned: the load a shared
machine puts beside an engine), in one vLLM process; and overhead_no_reuse (unique prompts,
kvtier on vs vLLM alone, two engines side by side taking turns, tools/vllm/bench_no_reuse.py:
the cost of lookups and saves when nothing hits).

Sizing (issue 25): the floor runs first and measures this machine (prefill tokens/s, a vLLM
process's start, a hit's cost). Users, rounds and no-reuse requests that were not given are then
sized (tools/vllm/bench_sizing.py) so that the whole run takes about --budget-min minutes (10):
the largest shape up to 10 users x 6 rounds (12 no-reuse requests) that is predicted to fit,
with every configuration; else vllm_alone, kvtier_g2 and vllm_unbounded only; else with every
text and vLLM's KV space shortened to 0.75, 0.5, 0.35, then 0.25. The working set stays >= 3x vLLM's KV
space, so vLLM alone keeps evicting and kvtier keeps reloading. --budget-min 0 runs the
largest shape (about 18 minutes on a 2-core AVX-512 machine). The JSON's "sizing" says what was
measured, chosen and predicted.

--quick is a smoke run (4 users x 3 rounds, vllm_alone, kvtier_g2 and vllm_unbounded, 2 floor
repetitions, no neighbour floor, 4 no-reuse requests a side), not sized; its ratios are
noisier than the full run's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import bench_no_reuse  # tools/vllm, beside this file
import bench_sizing

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "driver.py"
BLOCK = 128
LAYERS, KV_HEADS, HEAD_DIM, DTYPE_BYTES = 30, 3, 64, 4  # SmolLM2-135M in fp32
BLOCK_BYTES = LAYERS * 2 * KV_HEADS * HEAD_DIM * BLOCK * DTYPE_BYTES


# The same CPU threads for every configuration. vLLM on the CPU binds its worker's OpenMP
# threads itself and leaves one core to the other processes, but with a KV connector
# configured it reserves two, and on a 2-core machine it then gives the worker every core:
# the connector runs would compute on twice the cores of vLLM alone. Pinned here: every core
# but one for the worker, whatever the configuration.
_CPUS = os.cpu_count() or 1
THREADS_ENV = {
    "VLLM_CPU_OMP_THREADS_BIND": "0" if _CPUS <= 2 else f"0-{_CPUS - 2}",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "1" if _CPUS >= 2 else "0",
}


def cpu_info() -> Dict[str, Any]:
    """The CPU the figures come from: vLLM's fp32 prefill is ~5x slower on AVX2 alone than with
    AVX-512 and AMX, so a ratio is read with the instruction set beside it."""
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and not model:
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    if "amx_tile" in flags and "avx512f" in flags:
        isa = "avx512+amx"
    elif "avx512f" in flags:
        isa = "avx512"
    elif "avx2" in flags:
        isa = "avx2"
    else:
        isa = "unknown" if not flags else "pre-avx2"
    return {"model": model, "isa": isa, "cores": os.cpu_count() or 0}


def print_cpu(c: Dict[str, Any]) -> None:
    print(f"cpu: {c['model']} ({c['isa']}, {c['cores']} cores), dtype fp32")


def log(msg: str) -> None:
    print(f"bench vllm: {msg}", file=sys.stderr, flush=True)


def words(seed: int, n: int) -> str:
    """n pseudo-words, deterministic in seed (distinct text without a data set)."""
    vocab = ["river", "stone", "garden", "window", "signal", "copper", "harbor", "lantern",
             "meadow", "engine", "silver", "pocket", "canyon", "ladder", "mirror", "orchard",
             "thunder", "velvet", "anchor", "bridge", "candle", "falcon", "glacier", "island"]
    x = seed * 2654435761 % (1 << 32)
    out = []
    for _ in range(n):
        x = (x * 1103515245 + 12345) % (1 << 31)
        out.append(vocab[x % len(vocab)])
    return " ".join(out)


def chat_workload(users: int, rounds: int, system_words: int, answer_words: int,
                  question_words: int) -> List[Dict[str, Any]]:
    system = "You are a careful assistant. Background: " + words(1, system_words)
    out = []
    for r in range(rounds):
        for u in range(users):
            messages = [{"role": "system", "content": system}]
            for k in range(r):
                messages.append({"role": "user",
                                 "content": f"User {u} asks {k}: " + words(1000 + u * 50 + k,
                                                                         question_words)})
                messages.append({"role": "assistant",
                                 "content": words(5000 + u * 50 + k, answer_words)})
            messages.append({"role": "user", "content": f"User {u} asks {r}: "
                             + words(1000 + u * 50 + r, question_words)})
            out.append({"chat": messages, "round": r, "user": u})
    return out


def run_driver(tmp: Path, name: str, plan: Dict[str, Any], timeout: float,
               env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    plan_path, out_path, log_path = (tmp / f"{name}.plan.json", tmp / f"{name}.out.json",
                                     tmp / f"{name}.log")
    plan_path.write_text(json.dumps(plan))
    t0 = time.perf_counter()
    with open(log_path, "w") as f:
        rc = subprocess.run([sys.executable, str(DRIVER), str(plan_path), str(out_path)],
                            stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                            env=dict(os.environ, **THREADS_ENV, **(env or {}))).returncode
    if rc != 0:
        raise RuntimeError(f"{name}: vLLM exited {rc}; see {log_path}:\n"
                           + log_path.read_text()[-3000:])
    wall = time.perf_counter() - t0
    log(f"{name}: {wall:.0f} s")
    out = json.loads(out_path.read_text())
    out["process_wall_s"] = wall
    return out


def pct(values: List[float], p: float) -> float:
    s = sorted(values)
    k = (len(s) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarize(result: Dict[str, Any], step: int = 0) -> Dict[str, Any]:
    s = result["steps"][step]
    ttft_ms = [1000.0 * (t if t is not None else 0.0) for t in s["ttft_s"]]
    tokens = sum(s["prompt_tokens"]) + sum(len(o) for o in s["outputs"])
    m = result["metrics"]
    return {
        "requests": len(ttft_ms),
        "ttft_mean_ms": statistics.fmean(ttft_ms),
        "ttft_p50_ms": pct(ttft_ms, 0.5),
        "ttft_p90_ms": pct(ttft_ms, 0.9),
        "throughput_tokens_per_s": tokens / s["wall_s"],
        "wall_s": s["wall_s"],
        "hit_tokens": {
            "vllm_g1": m.get("vllm:prefix_cache_hits", 0.0),
            "external": m.get("vllm:external_prefix_cache_hits", 0.0),
            "kvtier_g2": BLOCK * m.get("vllm:kvtier_hit_blocks_g2", 0.0),
            "kvtier_g3": BLOCK * m.get("vllm:kvtier_hit_blocks_g3", 0.0),
            "kvtier_g4": BLOCK * m.get("vllm:kvtier_hit_blocks_g4", 0.0),
        },
        "prompt_tokens": m.get("vllm:prompt_tokens", 0.0),
        # The scheduler's lookup over the channel to the worker, mean per vLLM lookup call.
        "kvtier_lookup_us_mean": (m.get("vllm:kvtier_lookup_microseconds", 0.0)
                                  / max(1.0, m.get("vllm:kvtier_lookups", 0.0))),
        "ttft_by_round_ms": {},
    }


def bench_instances(args: Any, tmp: Path, requests: List[Dict[str, Any]],
                    base: Dict[str, Any]) -> int:
    sys.path.insert(0, str(HERE))
    import bench_instances as bi

    if args.configs == DEFAULT_CONFIGS:
        args.configs = "vllm_alone,kvtier_per_instance,kvtier_shared"
    try:
        report = bi.main(args, tmp, requests, base, THREADS_ENV, BLOCK, pct)
        report["cpu"] = cpu_info()
        report["workload"]["dtype"] = "fp32"
    finally:
        if not args.keep:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
        else:
            log(f"work directory kept: {tmp}")
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_cpu(report["cpu"])
        bi.print_report(report)
    return 0


DEFAULT_CONFIGS = "vllm_alone,example_connector,kvtier_g2,kvtier_g2_g3,vllm_unbounded"
QUICK_CONFIGS = "vllm_alone,kvtier_g2,vllm_unbounded"


def measure_floor(tmp: Path, name: str, base: Dict[str, Any], reps: int, floor_tokens: int,
                  timeout: float, neighbour: bool
                  ) -> Tuple[Dict[str, Any], Optional[Dict[str, Any]]]:
    """One long prompt computed cold once, then `reps` times a vLLM G1 hit and, after vLLM's
    cache is reset, a kvtier G2 hit (which puts the prefix back in vLLM's cache for the next
    G1 hit); with `neighbour`, the same repetitions again in the same process beside a
    CPU-bound process. The medians and every repetition (ms), quiet and beside the neighbour.
    One process and one cold prefill, not one per repetition: on an AVX2 machine a cold
    1,900-token prefill takes ~25 s and a vLLM start ~20 s."""
    text = "Document 0. " + words(9000, int(floor_tokens * 0.8))
    p = [{"text": text}]
    floor_steps: List[Dict[str, Any]] = [{"name": "cold", "generate": p, "max_tokens": 1}]
    phases = [""] + (["busy-"] if neighbour else [])
    for phase in phases:
        if phase:
            floor_steps.append({"neighbour": "start"})
        for i in range(reps):
            floor_steps += [{"name": f"{phase}g1hit{i}", "generate": p, "max_tokens": 1},
                            {"reset_prefix_cache": True},
                            {"name": f"{phase}g2hit{i}", "generate": p, "max_tokens": 1}]
    if neighbour:
        floor_steps.append({"neighbour": "stop"})
    floor = run_driver(tmp, name, dict(base, steps=floor_steps, kvtier={
        "g2.capacity_bytes": "2GiB", "g3.enabled": False, "g2.lock_memory": False}), timeout)
    ttft = {s["name"]: 1000.0 * (s["ttft_s"][0] or 0.0) for s in floor["steps"]}
    results = []
    for phase in phases:
        out: Dict[str, Any] = {"prompt_tokens": floor["steps"][0]["prompt_tokens"][0],
                               "reps": reps, "prompt_words": int(floor_tokens * 0.8) + 2,
                               "process_wall_s": floor["process_wall_s"],
                               "steps_wall_s": floor["steps_s"]}
        # The cold prefill ran once, quiet; the neighbour phase has none.
        out["cold_ms"] = [] if phase else [ttft["cold"]]
        out["cold_median_ms"] = None if phase else ttft["cold"]
        for key, step in (("g1_hit", "g1hit"), ("kvtier_g2_hit", "g2hit")):
            out[f"{key}_ms"] = [ttft[f"{phase}{step}{i}"] for i in range(reps)]
            out[f"{key}_median_ms"] = statistics.median(out[f"{key}_ms"])
        out["kvtier_g2_hit_vs_g1_hit"] = out["kvtier_g2_hit_median_ms"] / out["g1_hit_median_ms"]
        results.append(out)
    return results[0], (results[1] if neighbour else None)


def machine_of(floor: Dict[str, Any]) -> "bench_sizing.Machine":
    """What the quiet floor run measured about this machine, for sizing the rest."""
    return bench_sizing.Machine(
        rate_tps=floor["prompt_tokens"] / max(1e-3, floor["cold_median_ms"] / 1000.0),
        hit_s=floor["g1_hit_median_ms"] / 1000.0,
        start_s=max(0.0, floor["process_wall_s"] - floor["steps_wall_s"]),
        tokens_per_word=floor["prompt_tokens"] / max(1, floor["prompt_words"]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the converted model folder (fp32)")
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    ap.add_argument("--users", type=int, default=None,
                    help="users (default: up to 10, sized to --budget-min)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="rounds per user (default: up to 6, sized to --budget-min)")
    ap.add_argument("--system-words", type=int, default=420)
    ap.add_argument("--answer-words", type=int, default=170)
    ap.add_argument("--question-words", type=int, default=30)
    ap.add_argument("--max-tokens", type=int, default=4, help="tokens generated per request")
    ap.add_argument("--g1-blocks", type=int, default=17,
                    help="vLLM's own KV space in 128-token blocks (one is vLLM's null block; "
                         "17 serves max_model_len 2048)")
    ap.add_argument("--reps", type=int, default=5, help="repetitions of each floor timing")
    ap.add_argument("--no-reuse-requests", type=int, default=None,
                    help="unique prompts per no-reuse process (4 processes; default: up to 12, "
                         "sized to --budget-min)")
    ap.add_argument("--budget-min", type=float, default=10.0,
                    help="size the workload (users, rounds, no-reuse requests not given) from "
                         "this machine's measured prefill speed so that the run takes about "
                         "this long; 0: the largest shape (10 users x 6 rounds, 12)")
    ap.add_argument("--plot", default="bench-vllm-ttft.png", help="TTFT per round (PNG)")
    ap.add_argument("--configs", default=DEFAULT_CONFIGS)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 4 users x 3 rounds, 3 configurations, 2 floor repetitions, "
                         "no neighbour floor, 4 no-reuse requests a side")
    ap.add_argument("--processes", action="store_true",
                    help="run vLLM's engine core and worker in their own processes, as a "
                         "deployment does (kvtier's lookups cross its socket); default: in the "
                         "driver's process, which starts faster")
    ap.add_argument("--no-neighbour", action="store_true",
                    help="skip the floor measured beside a CPU-bound process")
    ap.add_argument("--instances", type=int, default=1,
                    help="2: two vLLM instances, round-robin, follow-ups on the other one "
                         "(vllm_alone, kvtier_per_instance, kvtier_shared; "
                         "tools/vllm/bench_instances.py)")
    ap.add_argument("--cli", default="", help="the kvtier binary (kvtier serve), for "
                                              "--instances 2 (default: $BENCH_KVTIER_CLI)")
    args = ap.parse_args()
    given = {k: getattr(args, k) for k in ("users", "rounds", "no_reuse_requests")}
    if args.quick:
        args.users, args.rounds, args.reps, args.no_reuse_requests = 4, 3, 2, 4
        if args.configs == DEFAULT_CONFIGS:
            args.configs = QUICK_CONFIGS
    most = bench_sizing.Shape(args.users or 10, args.rounds or 6, args.no_reuse_requests or 12)
    args.users, args.rounds, args.no_reuse_requests = (most.users, most.rounds,
                                                       most.no_reuse_requests)
    started = time.perf_counter()

    tmp = Path(tempfile.mkdtemp(prefix="kvtier-bench-vllm-"))
    base: Dict[str, Any] = {"model": args.model, "num_gpu_blocks": args.g1_blocks,
                            "max_model_len": (args.g1_blocks - 1) * BLOCK,
                            "in_process": not args.processes}
    if args.instances != 1:
        requests = chat_workload(args.users, args.rounds, args.system_words,
                                 args.answer_words, args.question_words)
        return bench_instances(args, tmp, requests, dict(base, in_process=False))
    timeout = 3600.0

    # The floor first: one long prompt, cold / vLLM G1 hit / kvtier G2 hit after a reset. It
    # also measures this machine (prefill speed, a process's start), which sizes the rest.
    floor_tokens = (args.g1_blocks - 2) * BLOCK - 8
    neighbour = not args.no_neighbour and not args.quick
    floor, floor_busy = measure_floor(tmp, "floor", base, args.reps, floor_tokens, timeout,
                                      neighbour)
    machine = machine_of(floor)
    config_names = args.configs.split(",")
    sizing: Dict[str, Any] = {"machine": vars(machine), "budget_s": 60.0 * args.budget_min,
                              "sized": False}
    no_reuse_words = bench_sizing.NO_REUSE_WORDS
    free = [k for k, v in given.items() if v is None]
    if args.budget_min > 0 and not args.quick and free:
        w = {"system": args.system_words, "answer": args.answer_words,
             "question": args.question_words}
        # 90% of what is left: a margin for the estimate
        left = 0.9 * (60.0 * args.budget_min - (time.perf_counter() - started))
        least = bench_sizing.Shape(
            *(given[k] if given[k] is not None else m for k, m in (
                ("users", bench_sizing.MIN_USERS), ("rounds", bench_sizing.MIN_ROUNDS),
                ("no_reuse_requests", bench_sizing.MIN_NO_REUSE))))
        pick = bench_sizing.choose(machine, left, config_names, w, args.g1_blocks, most, least,
                                   drop_configs=args.configs == DEFAULT_CONFIGS)
        shape = pick["shape"]
        for k in free:
            setattr(args, k, shape[k])
        config_names = shape["configs"] or config_names
        scaled = bench_sizing.scaled_words(w, shape["scale"])
        args.system_words, args.answer_words, args.question_words = (
            scaled["system"], scaled["answer"], scaled["question"])
        args.g1_blocks = bench_sizing.scaled_g1_blocks(args.g1_blocks, shape["scale"])
        base = dict(base, num_gpu_blocks=args.g1_blocks,
                    max_model_len=(args.g1_blocks - 1) * BLOCK)
        no_reuse_words = int(round(no_reuse_words * shape["scale"]))
        sizing.update(pick, sized=True, sized_keys=free, left_after_floor_s=left)
        log(f"sized to {args.users} users x {args.rounds} rounds, {args.no_reuse_requests} "
            f"no-reuse requests, text x{shape['scale']}, {','.join(config_names)}: predicted "
            f"{pick['predicted_s']:.0f} s of {left:.0f} s left (prefill "
            f"{machine.rate_tps:.0f} tokens/s, vLLM start {machine.start_s:.0f} s)"
            + ("" if pick["fits"] else "; the smallest meaningful shape does not fit"))
    requests = chat_workload(args.users, args.rounds, args.system_words, args.answer_words,
                             args.question_words)
    gen = [{"chat": r["chat"]} for r in requests]
    step = {"name": "chat", "generate": gen, "max_tokens": args.max_tokens}

    configs: Dict[str, Dict[str, Any]] = {}
    results: Dict[str, Dict[str, Any]] = {}
    working_blocks: Optional[int] = None
    for name in config_names:
        plan = dict(base, steps=[step])
        env: Dict[str, str] = {}
        configs_extra: Dict[str, Any] = {}
        if name == "example_connector":
            plan["example_connector"] = str(tmp / "example-store")
        elif name == "kvtier_g2":
            plan["kvtier"] = {"g2.capacity_bytes": "3GiB", "g3.enabled": False,
                              "g2.lock_memory": False}
        elif name == "kvtier_g2_g3":
            g2_blocks = max(8, (working_blocks or 128) // 4)
            plan["kvtier"] = {"g2.capacity_bytes": g2_blocks * (BLOCK_BYTES + 4096),
                              "g2.lock_memory": False, "g3.dir": str(tmp / "g3"),
                              "g3.capacity_bytes": "3GiB", "g3.admit_min_seen": 1}
        elif name == "vllm_unbounded":
            # vLLM's own KV space holds the whole working set (and one longest prompt more):
            # every reuse is a G1 hit. Before any configuration has measured the working set,
            # 64 blocks per user stand in for it.
            blocks = (working_blocks or 64 * args.users) + args.g1_blocks
            plan["num_gpu_blocks"] = blocks
            env["VLLM_CPU_KVCACHE_SPACE"] = str(-(-blocks * BLOCK_BYTES * 11 // 10 // 2**30))
            configs_extra = {"vllm_kv_blocks": blocks}
        elif name != "vllm_alone":
            raise SystemExit(f"unknown config {name!r}")
        results[name] = run_driver(tmp, name, plan, timeout, env)
        configs[name] = summarize(results[name])
        configs[name].update(configs_extra)
        if working_blocks is None:
            # Distinct prompt KV: the last round of each user holds every earlier block.
            last = results[name]["steps"][0]["prompt_tokens"][-args.users:]
            working_blocks = sum(n // BLOCK for n in last)
        by_round: Dict[int, List[float]] = {}
        for req, ttft in zip(requests, results[name]["steps"][0]["ttft_s"]):
            by_round.setdefault(req["round"], []).append(1000.0 * (ttft or 0.0))
        configs[name]["ttft_by_round_ms"] = {str(r): statistics.fmean(v)
                                             for r, v in sorted(by_round.items())}
        log(f"{name}: TTFT mean {configs[name]['ttft_mean_ms']:.1f} ms, "
            f"p90 {configs[name]['ttft_p90_ms']:.1f} ms")

    outs = [results[n]["steps"][0]["outputs"] for n in results]
    outputs_equal = all(o == outs[0] for o in outs)

    cold, g1, g2 = (floor["cold_median_ms"], floor["g1_hit_median_ms"],
                    floor["kvtier_g2_hit_median_ms"])
    floor_prompt = floor["prompt_tokens"]

    # No reuse: unique prompts (distinct from the first token), vLLM alone and kvtier side by
    # side in turns (tools/vllm/bench_no_reuse.py): the cost of lookups and saves when nothing
    # hits. The first turn of each side is a warm-up.
    prompts = [{"text": f"Unrelated request {20000 + i}: " + words(20000 + i, no_reuse_words)}
               for i in range(bench_no_reuse.TURN + args.no_reuse_requests)]
    no_reuse = bench_no_reuse.measure(
        DRIVER, tmp, base, {"g2.capacity_bytes": "2GiB", "g2.lock_memory": False,
                            "g3.dir": str(tmp / "g3-nr"), "g3.capacity_bytes": "1GiB"},
        prompts, THREADS_ENV, timeout, log)
    overhead = no_reuse["overhead"]
    log(f"no reuse: {no_reuse['wall_s']:.0f} s, pair ratios "
        + " ".join(f"{r:.3f}" for r in no_reuse["pair_ratios"]))

    report = {
        "cpu": cpu_info(),
        "workload": {"users": args.users, "rounds": args.rounds, "requests": len(requests),
                     "max_tokens": args.max_tokens, "block_tokens": BLOCK,
                     "block_bytes": BLOCK_BYTES, "working_set_blocks": working_blocks,
                     "vllm_kv_blocks": args.g1_blocks,
                     "vllm_kv_fraction_of_working_set":
                         args.g1_blocks / working_blocks if working_blocks else None,
                     "system_words": args.system_words, "answer_words": args.answer_words,
                     "question_words": args.question_words,
                     "no_reuse_requests": args.no_reuse_requests,
                     "no_reuse_words": no_reuse_words, "floor_reps": args.reps,
                     "dtype": "fp32", "model": args.model, "threads_env": THREADS_ENV,
                     "engine_in_process": not args.processes},
        "configs": configs,
        "outputs_equal": outputs_equal,
        "floor": floor,
        "floor_neighbour": floor_busy,
        "cold_ttft_ms": cold,
        "g1_hit_ttft_ms": g1,
        "kvtier_g2_hit_ttft_ms": g2,
        "kvtier_g2_hit_vs_g1_hit": g2 / g1,
        "kvtier_g2_hit_vs_g1_hit_neighbour":
            floor_busy["kvtier_g2_hit_vs_g1_hit"] if floor_busy else None,
        "overhead_no_reuse": overhead,
        "no_reuse": no_reuse,
    }
    if "vllm_alone" in configs and "kvtier_g2" in configs:
        report["kvtier_g2_vs_vllm_alone"] = (configs["kvtier_g2"]["ttft_mean_ms"]
                                            / configs["vllm_alone"]["ttft_mean_ms"])
    if "vllm_unbounded" in configs and "kvtier_g2" in configs:
        # The limit: vLLM whose own KV space holds the working set (issue 25: <= 1.15).
        report["kvtier_g2_vs_vllm_unbounded_ttft_mean"] = (
            configs["kvtier_g2"]["ttft_mean_ms"] / configs["vllm_unbounded"]["ttft_mean_ms"])
        report["kvtier_g2_vs_vllm_unbounded_throughput"] = (
            configs["kvtier_g2"]["throughput_tokens_per_s"]
            / configs["vllm_unbounded"]["throughput_tokens_per_s"])
    if "example_connector" in configs and "kvtier_g2" in configs:
        report["kvtier_g2_vs_example_connector"] = (
            configs["kvtier_g2"]["ttft_mean_ms"] / configs["example_connector"]["ttft_mean_ms"])

    if args.plot:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            fig, ax = plt.subplots(figsize=(7, 4))
            for name, c in configs.items():
                rounds = sorted(int(r) for r in c["ttft_by_round_ms"])
                ax.plot(rounds, [c["ttft_by_round_ms"][str(r)] for r in rounds], marker="o",
                        label=name)
            ax.set_xlabel("round")
            ax.set_ylabel("mean TTFT (ms)")
            ax.set_title(f"vLLM on CPU, SmolLM2-135M fp32, {args.users} users; vLLM KV = "
                         f"{args.g1_blocks} blocks", fontsize=9)
            ax.grid(alpha=0.3)
            ax.legend()
            fig.tight_layout()
            fig.savefig(args.plot, dpi=110)
            report["plot"] = str(Path(args.plot).resolve())
        except Exception as e:  # the figures stand without the picture
            log(f"no plot: {e}")

    report["wall_s"] = time.perf_counter() - started
    report["quick"] = bool(args.quick)
    report["sizing"] = sizing
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_cpu(report["cpu"])
        print(f"workload: {args.users} users x {args.rounds} rounds, {len(requests)} requests, "
              f"working set {working_blocks} blocks, vLLM KV {args.g1_blocks} blocks")
        print(f"{'config':<20}{'TTFT mean':>11}{'p50':>9}{'p90':>9}{'tok/s':>9}  hit tokens")
        for name, c in configs.items():
            hits = ", ".join(f"{k}={v:.0f}" for k, v in c["hit_tokens"].items() if v)
            print(f"{name:<20}{c['ttft_mean_ms']:>9.1f}ms{c['ttft_p50_ms']:>7.1f}ms"
                  f"{c['ttft_p90_ms']:>7.1f}ms{c['throughput_tokens_per_s']:>9.0f}  {hits}")
        print(f"outputs_equal: {outputs_equal}")
        for key in ("kvtier_g2_vs_vllm_alone", "kvtier_g2_vs_example_connector",
                    "kvtier_g2_vs_vllm_unbounded_ttft_mean",
                    "kvtier_g2_vs_vllm_unbounded_throughput"):
            if key in report:
                print(f"{key}: {report[key]:.3f}")
        print(f"floor ({floor_prompt} tokens): cold {cold:.1f} ms, vLLM G1 hit {g1:.1f} ms, "
              f"kvtier G2 hit {g2:.1f} ms (x{g2 / g1:.2f} of G1)")
        if floor_busy is not None:
            print(f"floor beside a CPU-bound neighbour: vLLM G1 hit "
                  f"{floor_busy['g1_hit_median_ms']:.1f} ms, kvtier G2 hit "
                  f"{floor_busy['kvtier_g2_hit_median_ms']:.1f} ms "
                  f"(x{floor_busy['kvtier_g2_hit_vs_g1_hit']:.2f} of G1)")
        print(f"overhead_no_reuse: {overhead:+.3f} (median of {len(no_reuse['pair_ratios'])} "
              f"adjacent turn pairs; TTFT p50 {no_reuse['kvtier_ttft_p50_ms']:.1f} vs "
              f"{no_reuse['vllm_alone_ttft_p50_ms']:.1f} ms)")
        print(f"wall: {report['wall_s']:.0f} s"
              + (f" (sized: predicted {sizing['predicted_s']:.0f} s after the first floor, "
                 f"budget {sizing['budget_s']:.0f} s)" if sizing["sized"] else ""))
    if not args.keep:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    else:
        log(f"work directory kept: {tmp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

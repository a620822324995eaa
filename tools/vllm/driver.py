"""Runs one vLLM engine (offline LLM class) through a plan and prints what happened as JSON.

Used by tests/vllm/test_vllm_connector.py and tools/vllm/bench_vllm.py (kvtier bench vllm), each vLLM instance in its
own process (vLLM spawns its engine core and worker processes; a fresh process per instance
keeps runs independent). Usage:

    python driver.py PLAN.json OUT.json

PLAN: {"model": DIR, "kvtier": {extra config} | null, "example_connector": DIR | null,
       "num_gpu_blocks": N | null, "max_model_len": 2048,
       "steps": [{"generate": [PROMPT, ...], "max_tokens": 8, "name": "..."},
                 {"reset_prefix_cache": true, "reset_connector": false},
                 {"signal": PID, "signum": 9}, {"neighbour": "start" | "stop"}, ...]}
       ("neighbour": a CPU-bound process beside the engine, one busy thread, not pinned)
PROMPT: {"tokens": [ids]} or {"text": "..."} or {"chat": [messages]} or
        {"embeds_seed": S, "embeds_len": N} (N prompt embeddings drawn from a seeded generator
        at the scale of the model's own embeddings; the plan needs "prompt_embeds": true),
        optional "cache_salt".
Optional plan keys: "dtype" ("float32"), "block_size", "prompt_embeds",
"max_num_batched_tokens", "tensor_parallel_size" (vLLM's own worker processes, one per rank:
not with "in_process"; on the CPU set VLLM_CPU_OMP_THREADS_BIND per rank, e.g. "0|1"),
"hma" (true: vLLM's hybrid KV cache manager must stay on; a connector
that is not a SupportsHMA then fails at start), "disable_hma" (true: turned off), "logprobs" (K: each output's top-K logprobs
per token in "logprobs": [[{token id: logprob}]]).
With "in_process": OUT has "engine": {"hma": bool, "groups": [spec class names],
"num_blocks": N} read from vLLM's own configuration.

OUT: {"steps": [{"name", "outputs": [[token ids]], "texts": [...], "ttft_s": [...],
       "wall_s"}], "metrics": {name: value}, "block_size": N, "vllm": {"version", "file"}}
       where metrics are vLLM's counters whose names start with vllm:kvtier_ (kvtier's
       connector stats in vLLM's own Prometheus metrics), block_size is the one vLLM ran with
       (its cache_config's) and vllm the vLLM this process imported; "steps_s": the
       seconds all the steps took (resets included), so a caller can tell start-up from work.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional


def _embeds(spec: Dict[str, Any], model_dir: str) -> Any:
    import torch

    hidden = json.load(open(os.path.join(model_dir, "config.json")))["hidden_size"]
    g = torch.Generator().manual_seed(int(spec["embeds_seed"]))
    return torch.randn(int(spec["embeds_len"]), hidden, generator=g) * 0.05


def _prompt(spec: Dict[str, Any], tokenizer: Any, model_dir: str = "") -> Dict[str, Any]:
    if "embeds_seed" in spec:
        p: Dict[str, Any] = {"prompt_embeds": _embeds(spec, model_dir)}
    elif "tokens" in spec:
        p: Dict[str, Any] = {"prompt_token_ids": list(spec["tokens"])}
    elif "chat" in spec:
        ids = tokenizer.apply_chat_template(spec["chat"], add_generation_prompt=True,
                                            tokenize=True)
        if hasattr(ids, "keys"):  # newer transformers return a BatchEncoding
            ids = ids["input_ids"]
        p = {"prompt_token_ids": [int(t) for t in ids]}
    else:
        p = {"prompt": spec["text"]}
    if spec.get("cache_salt"):
        p["cache_salt"] = spec["cache_salt"]
    return p


def _bind_like_vllms_worker() -> None:
    """vLLM binds its OpenMP threads to VLLM_CPU_OMP_THREADS_BIND's cores only in the worker
    processes its multiprocessing executor starts: an engine in this process would compute on
    every core, and kvtier's connector, which starts its threads on the cores vLLM left free,
    would find none. The same binding here, before torch is imported: OpenMP's team and this
    process's threads on those cores (the connector then moves its own to the others). A list
    of one rank only ("0", "0-2"); "auto", "nobind" or none: nothing is done."""
    spec = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "")
    if not spec or "|" in spec or not spec[0].isdigit():
        return
    cores: List[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        cores.extend(range(int(lo), int(hi or lo) + 1))
    os.environ["OMP_NUM_THREADS"] = str(len(cores))
    os.environ["GOMP_CPU_AFFINITY"] = " ".join(str(c) for c in cores)
    os.sched_setaffinity(0, cores)


def main() -> int:
    plan = json.load(open(sys.argv[1]))
    # vLLM's KV space on the CPU, in GiB (without it vLLM sizes it from a memory fraction
    # that a shared 24 GiB machine rarely has free); num_gpu_blocks caps it further.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if plan.get("in_process"):
        # The engine core and the model worker in this process (no two child processes that
        # import vLLM again: ~20 s less per run). The scheduler's connector then reaches the
        # worker's in this process, not over the lookup socket.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        _bind_like_vllms_worker()
    from vllm import LLM, SamplingParams

    kwargs: Dict[str, Any] = dict(
        model=plan["model"], dtype=plan.get("dtype", "float32"), enforce_eager=True,
        max_model_len=plan.get("max_model_len", 2048), enable_prefix_caching=True,
        disable_log_stats=False, seed=0)
    if plan.get("in_process"):
        kwargs["distributed_executor_backend"] = "uni"
    if plan.get("block_size"):
        kwargs["block_size"] = int(plan["block_size"])
    if plan.get("prompt_embeds"):
        kwargs["enable_prompt_embeds"] = True
    if plan.get("num_gpu_blocks"):
        kwargs["num_gpu_blocks_override"] = int(plan["num_gpu_blocks"])
    if plan.get("max_num_batched_tokens"):
        kwargs["max_num_batched_tokens"] = int(plan["max_num_batched_tokens"])
    if int(plan.get("tensor_parallel_size", 1) or 1) > 1:
        if plan.get("in_process"):
            raise SystemExit("driver: tensor_parallel_size > 1 needs vLLM's worker processes "
                             "(not \"in_process\")")
        kwargs["tensor_parallel_size"] = int(plan["tensor_parallel_size"])
    if plan.get("hma"):
        kwargs["disable_hybrid_kv_cache_manager"] = False
    elif plan.get("disable_hma"):
        kwargs["disable_hybrid_kv_cache_manager"] = True
    if plan.get("kvtier") is not None:
        kwargs["kv_transfer_config"] = {
            "kv_connector": "KvtierConnector", "kv_connector_module_path": "kvtier.vllm",
            "kv_role": plan.get("kv_role", "kv_both"),
            "kv_connector_extra_config": plan["kvtier"]}
    elif plan.get("example_connector"):
        kwargs["kv_transfer_config"] = {
            "kv_connector": "ExampleConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"shared_storage_path": plan["example_connector"]}}
    llm = LLM(**kwargs)
    tokenizer = llm.get_tokenizer()
    if plan.get("serve"):
        return _serve(llm, tokenizer, plan)
    out: Dict[str, Any] = {"steps": [], "vllm": _vllm_identity()}
    if plan.get("in_process"):
        out["engine"] = _engine(llm)
    logprobs = int(plan.get("logprobs", 0) or 0)
    neighbour: Optional["subprocess.Popen[bytes]"] = None
    atexit.register(lambda: neighbour is not None and neighbour.kill())
    steps_started = time.perf_counter()
    for step in plan["steps"]:
        if step.get("reset_prefix_cache"):
            if not _reset(llm, bool(step.get("reset_connector", False))):
                print("driver: vLLM refused reset_prefix_cache for 30 s", file=sys.stderr)
                return 3
            continue
        if "signal" in step:
            os.kill(int(step["signal"]), int(step.get("signum", signal.SIGKILL)))
            continue
        if "sleep" in step:
            time.sleep(float(step["sleep"]))
            continue
        if "neighbour" in step:
            # A CPU-bound process beside this engine (one busy thread, not pinned) from
            # "start" to "stop" (or this process's end).
            if step["neighbour"] == "start" and neighbour is None:
                neighbour = subprocess.Popen(
                    [sys.executable, "-c", "while True: pass"],
                    # not the cores vLLM pinned this process's threads to
                    preexec_fn=lambda: os.sched_setaffinity(0, range(os.cpu_count() or 1)))
            elif step["neighbour"] == "stop":
                neighbour = _stop(neighbour)
            continue
        prompts = [_prompt(p, tokenizer, plan["model"]) for p in step["generate"]]
        sp = SamplingParams(temperature=0.0, max_tokens=int(step.get("max_tokens", 8)),
                            ignore_eos=bool(step.get("ignore_eos", False)),
                            logprobs=logprobs or None)
        record: Dict[str, Any] = {"name": step.get("name", ""), "outputs": [], "texts": [],
                                  "ttft_s": [], "prompt_tokens": [], "logprobs": []}
        t0 = time.perf_counter()
        if step.get("one_by_one", True):
            results = []
            for p in prompts:
                results.extend(llm.generate([p], sp, use_tqdm=False))
        else:
            results = llm.generate(prompts, sp, use_tqdm=False)
        record["wall_s"] = time.perf_counter() - t0
        for r in results:
            record["outputs"].append(list(r.outputs[0].token_ids))
            if logprobs:
                record["logprobs"].append([{str(t): float(lp.logprob) for t, lp in pos.items()}
                                           for pos in (r.outputs[0].logprobs or [])])
            record["texts"].append(r.outputs[0].text)
            record["prompt_tokens"].append(len(r.prompt_token_ids or []))
            m = r.metrics
            ttft = None
            if m is not None:
                first = getattr(m, "first_token_latency", None)
                if first:
                    ttft = float(first)
            record["ttft_s"].append(ttft)
        out["steps"].append(record)
    out["steps_s"] = time.perf_counter() - steps_started  # every step, resets included
    out["metrics"] = _metrics(llm)
    out["block_size"] = int(llm.llm_engine.vllm_config.cache_config.block_size)
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)
    _stop(neighbour)
    _end(llm)
    return 0


def _vllm_identity() -> Dict[str, str]:
    """The vLLM this process imported (with "in_process", the engine's own): tests run with a
    newer vLLM's Python laid over the CPU environment check that it is the one that ran."""
    import vllm

    return {"version": str(vllm.__version__), "file": str(vllm.__file__)}


def _stop(proc: Optional["subprocess.Popen[bytes]"]) -> None:
    if proc is not None:
        proc.kill()
        proc.wait()


def _end(llm: Any) -> None:
    """Shuts the engine down now: its workers, and the KV connector with them (kvtier's flush
    of G2 to G3 and its snapshot). Then __main__ skips the interpreter's own teardown
    (os._exit), which took ~2 s per run after everything that matters had ended."""
    llm.llm_engine.engine_core.shutdown()
    del llm


def _engine(llm: Any) -> Dict[str, Any]:
    """vLLM's own view of its KV cache (an engine in this process only)."""
    vc = llm.llm_engine.vllm_config
    core = llm.llm_engine.engine_core.engine_core
    kcc = core.scheduler.kv_cache_config
    return {"hma": vc.scheduler_config.disable_hybrid_kv_cache_manager is False,
            "groups": [type(g.kv_cache_spec).__name__ for g in kcc.kv_cache_groups],
            "num_blocks": int(kcc.num_blocks)}


def _reset(llm: Any, reset_connector: bool) -> bool:
    """vLLM's reset_prefix_cache, retried for up to 30 s. vLLM refuses while blocks are still
    held (a finished request whose saves have not been reported yet). Its engine core's busy
    loop reports them by itself; an engine in this process only when stepped: step it."""
    ok = llm.reset_prefix_cache(reset_connector=reset_connector)
    deadline = time.monotonic() + 30
    while not ok and time.monotonic() < deadline:
        llm.llm_engine.step()
        time.sleep(0.01)
        ok = llm.reset_prefix_cache(reset_connector=reset_connector)
    return bool(ok)


def _metrics(llm: Any) -> Dict[str, float]:
    metrics: Dict[str, float] = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:kvtier_") or metric.name in (
                "vllm:prefix_cache_hits", "vllm:prefix_cache_queries",
                "vllm:prompt_tokens", "vllm:external_prefix_cache_hits"):
            value = getattr(metric, "value", None)
            if value is not None:
                metrics[metric.name] = metrics.get(metric.name, 0.0) + float(value)
    return metrics


def _serve(llm: Any, tokenizer: Any, plan: Dict[str, Any]) -> int:
    """Serve mode ("serve": true): one request per line of stdin, one JSON reply per line on
    OUT (a file the caller reads as a stream: a FIFO). Lines: {"prompt": PROMPT, "max_tokens":
    N[, "kv_transfer_params": {...}]} -> {"output": [ids], "ttft_s": T, "prompt_tokens": N,
    "kv_transfer_params": what the connector returned}; {"metrics": true} -> {"metrics":
    {...}}; {"reset_prefix_cache": true} -> {"reset": ok}. {"ready": true} is written once the engine is up; EOF on stdin ends the process."""
    from vllm import SamplingParams

    reply = open(sys.argv[2], "w", buffering=1)

    def send(obj: Dict[str, Any]) -> None:
        reply.write(json.dumps(obj) + "\n")
        reply.flush()

    send({"ready": True, "pid": os.getpid(), "vllm": _vllm_identity()})
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        if msg.get("metrics"):
            send({"metrics": _metrics(llm)})
            continue
        if msg.get("reset_prefix_cache"):
            send({"reset": _reset(llm, bool(msg.get("reset_connector", False)))})
            continue
        prompt = _prompt(msg["prompt"], tokenizer, plan["model"])
        extra = ({"kv_transfer_params": msg["kv_transfer_params"]}
                 if msg.get("kv_transfer_params") else None)
        sp = SamplingParams(temperature=0.0, max_tokens=int(msg.get("max_tokens", 8)),
                            extra_args=extra)
        r = llm.generate([prompt], sp, use_tqdm=False)[0]
        m = r.metrics
        first = getattr(m, "first_token_latency", None) if m is not None else None
        send({"output": list(r.outputs[0].token_ids),
              "ttft_s": float(first) if first else None,
              "prompt_tokens": len(r.prompt_token_ids or []),
              "kv_transfer_params": getattr(r, "kv_transfer_params", None)})
    reply.close()
    _end(llm)
    return 0


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)

"""kvtier bench vllm --hybrid: a hybrid model (sliding-window + global attention, vLLM's hybrid
memory allocator on) on a multi-round chat whose prompts are many windows long, vLLM alone
against vLLM + kvtier.

Run by `kvtier bench vllm --hybrid` (tools/vllm/run_bench.sh). The model is the seeded
random-weight Gemma-3-style model of tools/vllm/make_hybrid_model.py (12 layers: 10 sliding
with a 128-token window, 2 global; fp32; `--size small`, 240 M parameters, by default, so that a
prefill costs what it does on a real model; `--quick` takes the 28 M tiny one); vLLM gives it 6
KV cache groups over one block pool. The default chat: 4 users x 6 rounds, a 300-word system
prompt, 60-word answers (prompts up to ~850 tokens, 6 windows).
Each configuration is a fresh vLLM process (tools/vllm/driver.py, in-process engine) running
the same requests in the same order, one at a time:

- vllm_alone: vLLM with its own prefix cache, HMA on, its KV pool capped (--g1-blocks) below
  the working set, so it evicts;
- kvtier_g2: the same vLLM with KvtierConnector (G2 large enough for the working set);
- vllm_unbounded: vLLM alone whose own KV pool holds the whole working set (the whole KV space,
  1 GiB), so every reuse is a G1 hit with nothing to load: the floor any cache below G1 can
  approach, measured in the same run (its TTFT / vLLM alone's bounds the achievable ratio);
- vllm_alone_hma_off: vLLM alone with HMA turned off, for the KV memory per request only
  (what a connector that is not a SupportsHMA costs: vLLM then turns HMA off).

It reports TTFT (mean, p50, p90) over every request and over the requests after round 0, the
ratio kvtier / vLLM alone (bar: <= 0.5), whether every output equals vLLM alone's, and vLLM's
own figures of KV memory per request ("Maximum concurrency" for max_model_len tokens, the KV
pool's blocks) in each configuration (bar: kvtier's equal to vLLM alone's with HMA on).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_vllm import chat_workload, cpu_info, pct, run_driver  # noqa: E402

CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
KV_TOKENS = re.compile(r"KV cache size: ([\d,]+) tokens")


def log(msg: str) -> None:
    print(f"bench vllm --hybrid: {msg}", file=sys.stderr, flush=True)


def make_model(tokenizer: str, size: str) -> Path:
    r = subprocess.run([sys.executable, str(HERE / "make_hybrid_model.py"), "--kind", "gemma3",
                        "--size", size, "--tokenizer", tokenizer], capture_output=True,
                       text=True, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"make_hybrid_model.py failed:\n{r.stdout}\n{r.stderr}")
    m = re.search(rf"(/\S+gemma3-{size}-random-fp32)", r.stdout + r.stderr)
    if m:
        return Path(m.group(1))
    import os
    cache = Path(os.environ.get("KVTIER_CACHE", str(Path.home() / ".cache" / "kvtier")))
    return cache.expanduser() / "models" / f"gemma3-{size}-random-fp32"


def memory_figures(log_text: str) -> Dict[str, Any]:
    c = CONCURRENCY.search(log_text)
    k = KV_TOKENS.search(log_text)
    return {"max_concurrency": float(c.group(2)) if c else None,
            "kv_cache_tokens": int(k.group(1).replace(",", "")) if k else None}


def ttft_stats(values_ms: List[float]) -> Dict[str, float]:
    return {"mean": statistics.fmean(values_ms), "p50": pct(values_ms, 0.5),
            "p90": pct(values_ms, 0.9)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="the converted SmolLM2 folder (tokenizer)")
    ap.add_argument("--hybrid", action="store_true", help="(selects this benchmark)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: the tiny model, 3 users x 3 rounds")
    ap.add_argument("--model-size", default=None, choices=("tiny", "small"),
                    help="the Gemma-3-style model: small (default; hidden 1024, 240 M parameters, "
                         "a prefill costs what it costs on a real model) or tiny (hidden 256, "
                         "28 M; vLLM's fixed per-step costs dominate its TTFT)")
    ap.add_argument("--users", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--system-words", type=int, default=300)
    ap.add_argument("--answer-words", type=int, default=60)
    ap.add_argument("--g1-blocks", type=int, default=40,
                    help="vLLM's KV pool in blocks (every group's blocks come from it)")
    ap.add_argument("--max-num-batched-tokens", type=int, default=256)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.users, args.rounds = 3, 3
        args.model_size = args.model_size or "tiny"
    args.model_size = args.model_size or "small"
    model = make_model(args.model, args.model_size)
    requests = chat_workload(args.users, args.rounds, args.system_words, args.answer_words, 20)
    tmp = Path(tempfile.mkdtemp(prefix="kvtier-bench-hybrid-"))
    base = {"model": str(model), "max_model_len": 2048, "in_process": True, "hma": True,
            "num_gpu_blocks": args.g1_blocks,
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "steps": [{"name": "chat", "generate": [{"chat": r["chat"]} for r in requests],
                       "max_tokens": 4}]}
    kvtier = {"g2.capacity_bytes": "2GiB", "g2.lock_memory": False, "g3.enabled": False}
    configs = {
        "vllm_alone": dict(base, kvtier=None),
        "kvtier_g2": dict(base, kvtier=kvtier),
        "vllm_unbounded": dict(base, kvtier=None, num_gpu_blocks=None),
    }
    # KV memory per request: vLLM's own figures with the whole KV space (VLLM_CPU_KVCACHE_SPACE,
    # 1 GiB; no block-count override, which would make pools of different block bytes look
    # alike): "Maximum concurrency for max_model_len tokens per request".
    tiny = {"name": "one", "generate": [{"tokens": list(range(100, 400))}], "max_tokens": 1}
    memory_configs = {
        "vllm_alone": dict(base, kvtier=None, num_gpu_blocks=None, steps=[tiny]),
        "kvtier_g2": dict(base, kvtier=kvtier, num_gpu_blocks=None, steps=[tiny]),
        "vllm_alone_hma_off": dict(base, kvtier=None, hma=False, disable_hma=True,
                                   num_gpu_blocks=None, steps=[tiny]),
    }
    memory: Dict[str, Any] = {}
    for name, plan in memory_configs.items():
        r = run_driver(tmp, f"memory-{name}", plan, timeout=900)
        memory[name] = dict(memory_figures((tmp / f"memory-{name}.log").read_text()),
                            num_blocks=r.get("engine", {}).get("num_blocks"),
                            hma=r.get("engine", {}).get("hma"))
    results: Dict[str, Any] = {}
    outs: Dict[str, List[List[int]]] = {}
    prompt_tokens: List[int] = [0]
    for name, plan in configs.items():
        r = run_driver(tmp, name, plan, timeout=1800)
        s = r["steps"][0]
        ttft = [1000.0 * (t or 0.0) for t in s["ttft_s"]]
        later = [t for t, q in zip(ttft, requests) if q["round"] > 0]
        m = r["metrics"]
        results[name] = {
            "ttft_ms": ttft_stats(ttft), "ttft_after_round0_ms": ttft_stats(later),
            "wall_s": s["wall_s"], "engine": r.get("engine", {}),
            "kvtier": {k[len("vllm:kvtier_"):]: v for k, v in sorted(m.items())
                       if k.startswith("vllm:kvtier_") and v},
            "vllm_prefix_cache_hits": m.get("vllm:prefix_cache_hits", 0.0),
            "external_prefix_cache_hits": m.get("vllm:external_prefix_cache_hits", 0.0),
        }
        outs[name] = s["outputs"]
        prompt_tokens = s["prompt_tokens"]
    a, k, u = results["vllm_alone"], results["kvtier_g2"], results["vllm_unbounded"]
    summary = {
        "cpu": cpu_info(), "dtype": "float32", "model": str(model),
        "requests": len(requests), "users": args.users, "rounds": args.rounds,
        "prompt_tokens_max": max(prompt_tokens),
        "outputs_equal": outs["kvtier_g2"] == outs["vllm_alone"],
        "unbounded_outputs_equal": outs["vllm_unbounded"] == outs["vllm_alone"],
        # Different prompts give different outputs (the equality above means something).
        "distinct_outputs": len({tuple(o) for o in outs["vllm_alone"]}),
        "model_size": args.model_size, "answer_words": args.answer_words,
        "system_words": args.system_words,
        "ttft_mean_ratio": k["ttft_ms"]["mean"] / a["ttft_ms"]["mean"],
        "ttft_mean_ratio_after_round0": (k["ttft_after_round0_ms"]["mean"]
                                         / a["ttft_after_round0_ms"]["mean"]),
        # The floor: vLLM whose own pool holds everything, every reuse a G1 hit.
        "ttft_floor_ratio": u["ttft_ms"]["mean"] / a["ttft_ms"]["mean"],
        "ttft_floor_ratio_after_round0": (u["ttft_after_round0_ms"]["mean"]
                                          / a["ttft_after_round0_ms"]["mean"]),
        "kvtier_vs_unbounded": k["ttft_ms"]["mean"] / u["ttft_ms"]["mean"],
        "hma_on_with_kvtier": bool(k["engine"].get("hma")),
        "kv_memory_per_request_equal": memory["kvtier_g2"] == memory["vllm_alone"],
        "memory": memory,
        "configs": results,
    }
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        c = summary["cpu"]
        print(f"cpu: {c['model']} ({c['isa']}, {c['cores']} cores), dtype fp32, model "
              f"{args.model_size}; {len(requests)} requests ({args.users} users x {args.rounds} "
              f"rounds), {summary['distinct_outputs']} distinct outputs")
        for name, r in results.items():
            t, t1 = r["ttft_ms"], r["ttft_after_round0_ms"]
            print(f"{name:20s} TTFT mean {t['mean']:7.1f} ms  p50 {t['p50']:7.1f}  "
                  f"p90 {t['p90']:7.1f}  | after round 0: mean {t1['mean']:7.1f}  "
                  f"| HMA {r['engine'].get('hma')}")
        for name, mem in memory.items():
            print(f"KV memory, {name:20s}: {mem['num_blocks']} blocks in 1 GiB, "
                  f"{mem['kv_cache_tokens']} tokens, max concurrency at 2048 tokens "
                  f"{mem['max_concurrency']}x (HMA {mem['hma']})")
        print(f"outputs equal: {summary['outputs_equal']}; kvtier / vLLM alone TTFT mean: "
              f"{summary['ttft_mean_ratio']:.2f} (after round 0: "
              f"{summary['ttft_mean_ratio_after_round0']:.2f}; bar 0.5); the floor, vLLM whose "
              f"pool holds everything / vLLM alone: {summary['ttft_floor_ratio']:.2f} (after "
              f"round 0: {summary['ttft_floor_ratio_after_round0']:.2f}); kvtier / that floor: "
              f"{summary['kvtier_vs_unbounded']:.2f}; HMA on with kvtier: "
              f"{summary['hma_on_with_kvtier']}; KV memory per request equal: "
              f"{summary['kv_memory_per_request_equal']}")
    if not args.keep:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if summary["outputs_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The hit-density policy's study (docs/policy-study.md, section 8.8): cross-validation of its
settings and its figures against the baselines.

Runs `kvtier sim --policy all --json` once per trace and capacity (baselines, credit-lru,
adaptive, hit-density with its defaults), then `kvtier sim --policy hit-density --hit-density
K=V ... --json` for every setting of GRID. A fold's pick maximizes its geometric-mean gain over
LRU at 5%, then its minimum ratio to the best of lru, arc, w-tinylfu; each pick is reported on
the other fold. Only the standard library.

  python3 lab/studies/hit_density_study.py --trace-dir /tmp/lhd [--grid] [--jobs 2]
"""
import argparse
import concurrent.futures as cf
import json
import math
import os
import subprocess

PRESETS = ["sysprompt-few", "sysprompt-many", "chat-multiturn", "chat-deep-bursty",
           "rag-shared-docs", "agent-loop", "oneoff-long", "mixed-bursty"]
FRACTIONS = [0.02, 0.05, 0.1, 0.2]
BASELINES = ["lru", "arc", "w-tinylfu"]
FOLD_A = ["sysprompt-many", "chat-multiturn", "rag-shared-docs", "agent-loop"]
FOLD_B = ["sysprompt-few", "chat-deep-bursty", "oneoff-long", "mixed-bursty", "conversation"]
# Settings tried: the features mask (1 uses, 2 ended, 4 long follow-up, 8 depth), the EWMA
# decay, the refresh period and the sample count. Each entry: dict of --hit-density settings.
GRID = [{"features": f, "max_age": m} for m in (8, 32) for f in (0, 1, 3, 7, 11, 15)] + [
    {"features": 3, "max_age": 32, "decay": 0.5},
    {"features": 3, "max_age": 32, "decay": 0.98},
    {"features": 3, "max_age": 32, "samples": 64},
]


def run_json(cmd):
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def label(setting):
    return ",".join(f"{k}={v}" for k, v in setting.items()) or "defaults"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvtier", default="build/kvtier")
    ap.add_argument("--conversation", default="/work/shared/data/mooncake/conversation_trace.jsonl")
    ap.add_argument("--trace-dir", required=True)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--grid", action="store_true", help="cross-validate the GRID settings")
    ap.add_argument("--policies", default="all", help="--policy of the base runs")
    a = ap.parse_args()
    traces = {p: os.path.join(a.trace_dir, p + ".jsonl") for p in PRESETS}
    traces["conversation"] = a.conversation
    for p, path in traces.items():
        if not os.path.exists(path):
            subprocess.run([a.kvtier, "gen-trace", "--preset", p, "--seed", "1", "--out", path],
                           check=True, capture_output=True)

    cache_path = os.path.join(a.trace_dir, "hit_density_study.json")
    cache = json.load(open(cache_path)) if os.path.exists(cache_path) else {}

    def job(name, f, setting):
        key = f"{name}|{f}|{label(setting) if setting is not None else 'all'}"
        if key in cache:
            return key, cache[key]
        cmd = [a.kvtier, "sim", "--trace", traces[name], "--capacity-fraction", str(f), "--json"]
        if setting is None:
            cmd += ["--policy", "all"]
        else:
            cmd += ["--policy", "hit-density"]
            for k, v in setting.items():
                cmd += ["--hit-density", f"{k}={v}"]
        out = {n: p["hit_ratio"] for n, p in run_json(cmd)["policies"].items()}
        if setting is None:  # adaptive with hit-density as a fifth candidate
            cmd = cmd[:-2] + ["--policy", "adaptive", "--adaptive", "with_hit_density=1"]
            out["adaptive-hd"] = run_json(cmd)["policies"]["adaptive"]["hit_ratio"]
        return key, out

    jobs = [(n, f, None) for n in traces for f in FRACTIONS]
    if a.grid:
        jobs += [(n, f, s) for s in GRID for n in traces for f in FRACTIONS]
    with cf.ThreadPoolExecutor(a.jobs) as ex:
        for key, value in ex.map(lambda j: job(*j), jobs):
            cache[key] = value
    json.dump(cache, open(cache_path, "w"), indent=1)

    def base(n, f):
        return cache[f"{n}|{f}|all"]

    def best(n, f):
        return max(base(n, f)[b] for b in BASELINES)

    def hd(n, f, setting):
        if setting is None:
            return base(n, f)["hit-density"]
        return cache[f"{n}|{f}|{label(setting)}"]["hit-density"]

    names = list(traces)
    print("| trace | capacity | best baseline | lru | credit-lru | adaptive | hit-density "
          "| hit-density / best | hit-density / lru | credit-lru / lru |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for n in names:
        for f in FRACTIONS:
            b = base(n, f)
            bb = max(BASELINES, key=lambda x: b[x])
            h = b["hit-density"]
            print(f"| {n} | {f:g} | {bb} | {b['lru']:.4f} | {b['credit-lru']:.4f} | "
                  f"{b['adaptive']:.4f} | {h:.4f} | {h / b[bb]:.3f} | {h / b['lru']:.3f} | "
                  f"{b['credit-lru'] / b['lru']:.3f} |")
    for pol in ["hit-density", "credit-lru", "adaptive"] + [
            p for p in ("adaptive-hd",) if p in base(names[0], 0.05)]:
        for f in FRACTIONS:
            g = geomean([base(n, f)[pol] / base(n, f)["lru"] for n in names])
            m = min(base(n, f)[pol] / best(n, f) for n in names)
            print(f"{pol} at {f:g}: geomean gain over lru {g:.4f}, min vs best {m:.4f}")

    if not a.grid:
        return

    def score(fold, setting):
        g = geomean([hd(n, 0.05, setting) / base(n, 0.05)["lru"] for n in fold])
        m = min(hd(n, f, setting) / best(n, f) for n in fold for f in FRACTIONS)
        return g, m

    print("\n| setting | fold A: geomean gain over lru at 5% | fold A: min / best | "
          "fold B: geomean at 5% | fold B: min / best |")
    print("| --- | --- | --- | --- | --- |")
    for s in GRID:
        ga, ma = score(FOLD_A, s)
        gb, mb = score(FOLD_B, s)
        print(f"| {label(s)} | {ga:.4f} | {ma:.4f} | {gb:.4f} | {mb:.4f} |")
    for tune, report, tname in ((FOLD_A, FOLD_B, "A"), (FOLD_B, FOLD_A, "B")):
        pick = max(GRID, key=lambda s: score(tune, s))
        g, m = score(report, pick)
        print(f"Tuned on fold {tname}: {label(pick)}; reported on the other fold: "
              f"geomean gain over lru at 5% {g:.4f}, min / best {m:.4f}")


if __name__ == "__main__":
    main()

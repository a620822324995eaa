#!/usr/bin/env python3
"""policy_bound.py: how many prefix hits can ANY eviction policy that decides from a block's
features keep in one tier of a given size, on a Mooncake-format trace?

Usage:
  lab/studies/policy_bound.py --trace FILE [--fractions 0.05,0.1] [--features SETS] [--no-placebo]
                        [--seed N] [--json]

The bound (docs/policy-study.md section 5). Each block reference starts an *interval* that ends
at the block's next reference (a reuse) or never. A policy that sees only a class c of features
of the block at its reference (and the block's age since then) can do no better than hold the
block for some time T_c and then evict it: it keeps the reuse when the interval is at most T_c
and pays min(interval, T_c) of tier space-time. The bound picks every T_c (randomized between
two values where that helps) *knowing the whole trace's intervals*, so that the space-time spent
is at most capacity x trace length, and maximizes the reuses kept. It is optimistic for the
policy in four ways: the T_c are tuned on the answer; capacity only has to hold on average, not
at every request; a block counts as a hit even when an earlier block of its request missed; and
the use count is known exactly (a real policy must remember it, e.g. in a ghost table). So no
online policy seeing those features keeps more hits than the bound on this trace.

Time is counted in requests (one tick per request). Capacity = ceil(fraction x distinct blocks).
Hit ratio = kept reuses / all block references, the same denominator as `kvtier sim`; with
unlimited capacity it is `unbounded_hit_ratio`. On the Mooncake conversation trace Belady reaches
the unbounded ratio from 5% on, so there ratio_to_unbounded is the ratio to Belady.

Features, each known when the block is referenced (online):
  u      uses of the block so far, this one included: 1, 2, 3+
  last   the block is its request's last block (Mooncake hashes the partial last block)
  nb     log2 bucket of the request's length in blocks
  turn   conversation turn: 1 + the turn of the latest earlier request whose blocks (but its
         last) are a prefix of this one (1..6+)
  depth  log2 bucket of the block's position in its request
  out    log2 bucket of the request's output_length (known when the request ends)
  pg     log2 bucket of seconds since the previous turn (0: first turn)

Finer classes make a bound that has seen the answer go up by itself (each class's T_c fits its
few intervals). The placebo rows show how much: `out` and `pg` are shuffled between requests,
which keeps their distribution and class sizes but destroys any link to reuse. A feature whose
real row is not above its placebo row carries no usable signal.

Exit status: 0, or 2 with a message naming the line and field for a malformed trace or a bad flag.
"""

import argparse
import collections
import json
import math
import random
import sys

FEATURES = ("u", "last", "nb", "turn", "depth", "out", "pg")
DEFAULT_SETS = "none;u;u,last;u,last,nb;u,last,nb,turn;u,last,nb,turn,depth;" \
    "u,last,nb,turn,depth,out;u,last,nb,turn,depth,out,pg"


class UsageError(Exception):
    pass


def log2_bucket(x, cap):
    return min(int(math.log2(x + 1)), cap)


def parse_trace(path):
    """Returns a list of (timestamp_ms, output_length, hash_ids); UsageError on bad input."""
    requests = []
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        raise UsageError(f"cannot open trace {path}: {e.strerror}; pass an existing Mooncake JSONL file")
    with f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise UsageError(f"trace line {lineno}, column {e.colno}: not JSON ({e.msg}); "
                                 "each line must be one Mooncake request object")
            if not isinstance(obj, dict):
                raise UsageError(f"trace line {lineno}: expected an object with hash_ids")
            ids = obj.get("hash_ids")
            if not isinstance(ids, list) or not ids:
                raise UsageError(f"trace line {lineno}: hash_ids must be a non-empty array of "
                                 "non-negative integers")
            for k, h in enumerate(ids):
                if isinstance(h, bool) or not isinstance(h, int) or h < 0 or h >= 2**64 - 1:
                    raise UsageError(f"trace line {lineno}: hash_ids[{k}] must be a non-negative "
                                     f"integer below 2^64 - 1, found {h!r}")
            ts = obj.get("timestamp", 0)
            out = obj.get("output_length", 0)
            for name, v in (("timestamp", ts), ("output_length", out)):
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                        or v < 0:
                    raise UsageError(f"trace line {lineno}: {name} must be a finite non-negative "
                                     f"number, found {v!r}")
            requests.append((float(ts), float(out), ids))
    if not requests:
        raise UsageError(f"trace {path} has no requests")
    return requests


def build_intervals(requests):
    """Per block reference: (tick, next_tick or None, features dict)."""
    n = len(requests)
    by_prefix = {}
    parent = [-1] * n
    for i, (_, _, ids) in enumerate(requests):
        for k in range(len(ids), 1, -1):
            p = by_prefix.get(tuple(ids[:k]))
            if p is not None:
                parent[i] = p
                break
        if len(ids) >= 2:
            by_prefix[tuple(ids[:-1])] = i
    turn = [0] * n
    for i in range(n):
        turn[i] = turn[parent[i]] + 1 if parent[i] >= 0 else 1
    ticks, nexts, feats = [], [], []
    last_ref = {}
    uses = collections.Counter()
    for i, (ts, out, ids) in enumerate(requests):
        gap = 0 if parent[i] < 0 else 1 + log2_bucket(max(0.0, ts - requests[parent[i]][0]) / 1000, 10)
        for pos, b in enumerate(ids):
            j = len(ticks)
            if b in last_ref:
                nexts[last_ref[b]] = i
            last_ref[b] = j
            uses[b] += 1
            ticks.append(i)
            nexts.append(None)
            feats.append({"u": min(uses[b], 3), "last": int(pos == len(ids) - 1),
                          "nb": log2_bucket(len(ids), 7), "turn": min(turn[i], 6),
                          "depth": log2_bucket(pos, 6), "out": log2_bucket(out, 11), "pg": gap})
    return ticks, nexts, feats, len(last_ref)


def bound(ticks, nexts, feats, keys, budget):
    """Most reuses kept by per-class holding times whose total space-time is <= budget."""
    classes = collections.defaultdict(list)
    for t, nx, f in zip(ticks, nexts, feats):
        classes[tuple(f[k] for k in keys)].append(None if nx is None else nx - t)
    prepared = []
    for ds in classes.values():
        finite = sorted(d for d in ds if d is not None)
        prefix = [0]
        for d in finite:
            prefix.append(prefix[-1] + d)
        prepared.append((finite, prefix, len(ds)))

    def solve(lam):
        # Per class, the holding time T = the t-th smallest interval maximizes t - lam x cost.
        kept, cost = 0, 0
        for finite, prefix, m in prepared:
            best = (0.0, 0, 0)
            for t in range(1, len(finite) + 1):
                c = prefix[t] + (m - t) * finite[t - 1]
                v = t - lam * c
                if v > best[0]:
                    best = (v, t, c)
            kept += best[1]
            cost += best[2]
        return kept, cost

    kept0, cost0 = solve(0.0)
    if cost0 <= budget:
        return kept0
    lo, hi = 0.0, 1.0
    while solve(hi)[1] > budget:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        if solve(mid)[1] > budget:
            lo = mid
        else:
            hi = mid
    k_hi, c_hi = solve(hi)
    k_lo, c_lo = solve(lo)
    if c_lo <= c_hi:
        return k_hi
    # Randomize between the two holding-time choices at the breakpoint to use the whole budget.
    return k_hi + (k_lo - k_hi) * (budget - c_hi) / (c_lo - c_hi)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--fractions", default="0.05,0.1")
    ap.add_argument("--features", default=DEFAULT_SETS,
                    help="feature sets separated by ';', features by ','; 'none' = no feature")
    ap.add_argument("--no-placebo", action="store_true")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    try:
        fractions = []
        for s in args.fractions.split(","):
            try:
                f = float(s)
            except ValueError:
                raise UsageError(f"--fractions: '{s}' is not a number; give e.g. 0.05,0.1")
            if not (0 < f <= 1):
                raise UsageError(f"--fractions: {s} must be in (0, 1]")
            fractions.append(f)
        sets = []
        for s in args.features.split(";"):
            keys = [] if s.strip() in ("", "none") else [k.strip() for k in s.split(",")]
            for k in keys:
                if k not in FEATURES:
                    raise UsageError(f"--features: unknown feature '{k}'; known: "
                                     + ", ".join(FEATURES))
            sets.append(keys)
        requests = parse_trace(args.trace)
    except UsageError as e:
        print(f"policy_bound: {e}", file=sys.stderr)
        return 2

    ticks, nexts, feats, distinct = build_intervals(requests)
    total = len(ticks)
    unbounded = sum(1 for x in nexts if x is not None) / total
    rows = []

    def run(label, keys, placebo):
        for f in fractions:
            cap = math.ceil(f * distinct)
            b = bound(ticks, nexts, feats, keys, cap * len(requests)) / total
            rows.append({"features": ",".join(keys) or "none", "placebo": placebo, "fraction": f,
                         "capacity_blocks": cap, "bound_hit_ratio": round(b, 4),
                         "ratio_to_unbounded": round(b / unbounded, 4) if unbounded else 0.0})

    for keys in sets:
        run(",".join(keys), keys, False)
    if not args.no_placebo and any(k in ("out", "pg") for keys in sets for k in keys):
        rng = random.Random(args.seed)
        first = {}
        j = 0
        for i, (_, _, ids) in enumerate(requests):
            first[i] = (feats[j]["out"], feats[j]["pg"])
            j += len(ids)
        perm = list(range(len(requests)))
        rng.shuffle(perm)
        j = 0
        for i, (_, _, ids) in enumerate(requests):
            out, pg = first[perm[i]]
            for _ in ids:
                feats[j]["out"], feats[j]["pg"] = out, pg
                j += 1
        for keys in sets:
            if any(k in ("out", "pg") for k in keys):
                run(",".join(keys), keys, True)

    if args.json:
        print(json.dumps({"requests": len(requests), "references": total,
                          "distinct_blocks": distinct, "unbounded_hit_ratio": round(unbounded, 4),
                          "bounds": rows}, indent=1))
    else:
        print(f"{len(requests)} requests, {total} block references, {distinct} distinct blocks; "
              f"unbounded hit ratio {unbounded:.4f}")
        print(f"{'features':<34} {'placebo':<8} {'fraction':>8} {'capacity':>9} "
              f"{'bound':>7} {'x unbounded':>11}")
        for r in rows:
            print(f"{r['features']:<34} {'yes' if r['placebo'] else 'no':<8} {r['fraction']:>8} "
                  f"{r['capacity_blocks']:>9} {r['bound_hit_ratio']:>7.4f} "
                  f"{r['ratio_to_unbounded']:>11.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

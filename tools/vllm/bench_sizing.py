"""How big a `kvtier bench vllm` workload fits a time budget on this machine (issue 25).

vLLM's fp32 prefill on the CPU runs ~5x slower on an AVX2-only machine than with AVX-512, so a
fixed workload that takes 15 minutes on one takes over an hour on the other. The benchmark
therefore measures the machine first (the quiet floor run: one cold prefill of a long prompt,
then prefix hits) and sizes the chat workload and the no-reuse runs from what it measured:

- `rate_tps`: the cold prefill's tokens per second;
- `hit_s`: what a request costs beyond its prefill (a G1 hit's TTFT: the last partial block,
  sampling, scheduling);
- `start_s`: one vLLM process's start and exit (the floor process's wall time less its steps);
- `tokens_per_word`: the tokenizer's rate on the benchmark's pseudo-words.

The ratios stay meaningful because the shape is kept, only the size changes: every
configuration runs the same requests, the working set stays at least `MIN_WORKING_RATIO` times
vLLM's own KV space (so vLLM alone must evict and recompute, and kvtier must reload), every user
keeps at least `MIN_ROUNDS` rounds, and each side of the no-reuse measure keeps at least
`MIN_NO_REUSE` requests. Users go first, then rounds, then no-reuse requests. When even the smallest shape
does not fit, the smallest is used and `fits` is false.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import bench_no_reuse  # tools/vllm, beside this file

BLOCK = 128
MIN_USERS = 4
MIN_ROUNDS = 3
# 6 adjacent pairs of turns (bench_no_reuse): a median of 4 moved by 0.02 with one hiccup of the
# machine in a run (pairs 0.99 0.97 0.84 1.06); 8 pairs of the same protocol kept 0.995-1.029.
MIN_NO_REUSE = 12
MIN_WORKING_RATIO = 3.0
TEMPLATE_TOKENS = 8  # a chat message's template tokens (role markers)
NO_REUSE_WORDS = 700  # bench_vllm's unique prompts, at scale 1
SCALES = (1.0, 0.75, 0.5, 0.35, 0.25)
# What issue 25's ratios need: vLLM alone, kvtier on G2, and vLLM with room for everything.
ESSENTIAL = ("vllm_alone", "kvtier_g2", "vllm_unbounded")


@dataclass
class Machine:
    rate_tps: float  # cold prefill tokens per second
    hit_s: float  # a request's cost beyond its prefill
    start_s: float  # one vLLM process's start and exit
    tokens_per_word: float


@dataclass
class Shape:
    users: int
    rounds: int
    no_reuse_requests: int
    scale: float = 1.0  # text lengths and vLLM's KV space, relative to the defaults
    configs: List[str] = field(default_factory=list)  # empty: the configurations asked for


def scaled_words(w: Dict[str, int], scale: float) -> Dict[str, int]:
    return {k: max(1, int(round(v * scale))) for k, v in w.items()}


def scaled_g1_blocks(g1_blocks: int, scale: float) -> int:
    """vLLM's KV space at `scale` (one block is vLLM's null block)."""
    return 1 + max(2, int(round((g1_blocks - 1) * scale)))


def prompt_tokens(m: Machine, shape_round: int, system_words: int, answer_words: int,
                  question_words: int) -> int:
    """Tokens of round r's prompt: the system prompt, r earlier turns and the new question."""
    words = system_words + shape_round * (question_words + answer_words) + question_words
    messages = 2 + 2 * shape_round
    return int(m.tokens_per_word * words + TEMPLATE_TOKENS * messages)


def working_blocks(m: Machine, users: int, rounds: int, w: Dict[str, int]) -> int:
    """Distinct KV blocks of the workload: the shared system prompt once, and each user's last
    prompt beyond it (that prompt holds every earlier turn)."""
    system = int(m.tokens_per_word * w["system"] + 2 * TEMPLATE_TOKENS) // BLOCK
    last = prompt_tokens(m, rounds - 1, w["system"], w["answer"], w["question"]) // BLOCK
    return system + users * max(0, last - system)


def predict_s(m: Machine, shape: Shape, configs: List[str], w: Dict[str, int]) -> float:
    """Seconds the run takes after the floor process (which measured the neighbour floor too):
    each configuration's process (`shape.configs` when given) and the no-reuse pair of engines
    (bench_no_reuse.predict_s). `w` holds the unscaled word counts."""
    ws = scaled_words(w, shape.scale)
    all_tokens = 0  # a configuration that recomputes every prompt (vLLM's KV space is small)
    new_tokens = 0  # one that keeps every prefix: each request computes past its last turn
    for r in range(shape.rounds):
        p = prompt_tokens(m, r, ws["system"], ws["answer"], ws["question"])
        before = prompt_tokens(m, r - 1, ws["system"], ws["answer"], ws["question"]) if r else 0
        all_tokens += shape.users * p
        new_tokens += shape.users * (p - (before // BLOCK) * BLOCK)
    requests = shape.users * shape.rounds
    total = 0.0
    for name in shape.configs or configs:
        reuses = name in ("kvtier_g2", "kvtier_g2_g3", "vllm_unbounded")
        tokens = new_tokens if reuses else all_tokens
        total += m.start_s + tokens / m.rate_tps + requests * m.hit_s
    nr_tokens = int(m.tokens_per_word * NO_REUSE_WORDS * shape.scale) + 16
    total += bench_no_reuse.predict_s(m.start_s, shape.no_reuse_requests,
                                      nr_tokens / m.rate_tps + m.hit_s)
    return total


def choose(m: Machine, budget_s: float, configs: List[str], w: Dict[str, int],
           g1_blocks: int, most: Shape,
           least: Optional[Shape] = None, drop_configs: bool = True) -> Dict[str, Any]:
    """The largest shape up to `most` whose predicted time fits `budget_s` (seconds left after
    the quiet floor), keeping the minimums above. Tried in this order: every configuration at
    full length; the essential configurations (ESSENTIAL: what issue 25's ratios need) at full
    length; then the essential ones with every text and vLLM's KV space scaled by 0.75, 0.5,
    0.35, then 0.25 (the working set stays the same multiple of vLLM's KV space). `most` itself when it
    fits; the smallest meaningful shape, with `fits` false, when nothing does. `least` holds
    the smallest users, rounds and no-reuse requests allowed (a value the user gave is both
    `most` and `least`); `drop_configs` false keeps every configuration."""
    lo = least or Shape(MIN_USERS, MIN_ROUNDS, MIN_NO_REUSE)
    essential = [c for c in configs if c in ESSENTIAL] if drop_configs else list(configs)
    levels: List[Tuple[float, List[str]]] = [(1.0, list(configs))]
    if essential != list(configs):
        levels.append((1.0, essential))
    levels += [(f, essential) for f in SCALES[1:]]
    smallest: Shape = most
    for scale, names in levels:
        ws = scaled_words(w, scale)
        need = MIN_WORKING_RATIO * scaled_g1_blocks(g1_blocks, scale)
        candidates: List[Shape] = []
        for nr in range(most.no_reuse_requests, lo.no_reuse_requests - 1, -2):
            for rounds in range(most.rounds, lo.rounds - 1, -1):
                for users in range(most.users, lo.users - 1, -1):
                    candidates.append(Shape(users, rounds, nr, scale, names))
        # Most requests first (the TTFT means rest on them), then the deeper chat, then the
        # no-reuse requests.
        candidates.sort(key=lambda s: (s.users * s.rounds, s.rounds, s.no_reuse_requests),
                        reverse=True)
        for s in candidates:
            if working_blocks(m, s.users, s.rounds, ws) < need:
                continue
            smallest = s
            t = predict_s(m, s, configs, w)
            if t <= budget_s:
                return {"shape": asdict(s), "predicted_s": t, "fits": True}
    return {"shape": asdict(smallest),
            "predicted_s": predict_s(m, smallest, configs, w),
            "fits": False}

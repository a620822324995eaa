"""tools/vllm/bench_sizing.py: how `kvtier bench vllm` sizes its workload to a time budget
from what it measured about the machine (issue 25). Pure arithmetic, no vLLM."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "vllm"))

import bench_sizing as bs  # noqa: E402

WORDS = {"system": 420, "answer": 170, "question": 30}  # bench_vllm's defaults
CONFIGS = ["vllm_alone", "example_connector", "kvtier_g2", "kvtier_g2_g3", "vllm_unbounded"]
MOST = bs.Shape(10, 6, 12)
# Measured on the AVX-512 machine (2026-12-04): the 1,904-token floor prompt cold in 4.8 s, a
# G1 hit 0.47 s, a vLLM process's start and exit ~17 s, 1.25 tokens per pseudo-word.
FAST = bs.Machine(rate_tps=400.0, hit_s=0.47, start_s=17.0, tokens_per_word=1.25)
# An AVX2 machine: prefill ~5x slower, start a little slower (a guess: none was measured).
SLOW = bs.Machine(rate_tps=80.0, hit_s=1.5, start_s=22.0, tokens_per_word=1.25)


def test_the_largest_shape_when_the_budget_allows_it() -> None:
    pick = bs.choose(FAST, 1e6, CONFIGS, WORDS, 17, MOST)
    assert pick["fits"]
    assert pick["shape"] == {"users": 10, "rounds": 6, "no_reuse_requests": 12, "scale": 1.0,
                             "configs": CONFIGS}


def _meaningful(m: bs.Machine, s: bs.Shape) -> None:
    assert s.users >= bs.MIN_USERS and s.rounds >= bs.MIN_ROUNDS
    assert s.no_reuse_requests >= bs.MIN_NO_REUSE
    ws = bs.scaled_words(WORDS, s.scale)
    assert (bs.working_blocks(m, s.users, s.rounds, ws)
            >= bs.MIN_WORKING_RATIO * bs.scaled_g1_blocks(17, s.scale))
    assert set(bs.ESSENTIAL) <= set(s.configs)


def test_nine_minutes_on_this_machine_keep_full_length_and_the_essential_configs() -> None:
    budget = 540.0  # what is left after the floor process
    full = bs.predict_s(FAST, MOST, CONFIGS, WORDS)
    assert full > budget  # the old fixed default took ~18 min here
    pick = bs.choose(FAST, budget, CONFIGS, WORDS, 17, MOST)
    s = bs.Shape(**pick["shape"])
    assert pick["fits"] and pick["predicted_s"] <= budget
    assert s.scale == 1.0 and s.users * s.rounds < MOST.users * MOST.rounds
    _meaningful(FAST, s)
    # And it is the largest such shape: one more user does not fit (or passes the maximum).
    bigger = bs.Shape(s.users + 1, s.rounds, s.no_reuse_requests, s.scale, s.configs)
    assert (bigger.users > MOST.users
            or bs.predict_s(FAST, bigger, CONFIGS, WORDS) > budget)


def test_a_slower_machine_gets_shorter_texts_and_a_smaller_kv_space() -> None:
    # Half this machine's prefill speed; the floor process (with its neighbour phase) is over.
    slower = bs.Machine(rate_tps=200.0, hit_s=0.8, start_s=18.0, tokens_per_word=1.25)
    pick = bs.choose(slower, 480.0, CONFIGS, WORDS, 17, MOST)
    s = bs.Shape(**pick["shape"])
    assert pick["fits"] and pick["predicted_s"] <= 480.0
    assert s.scale < 1.0 and s.configs == list(bs.ESSENTIAL)
    _meaningful(slower, s)
    # The scaled prompts still fit the scaled max_model_len ((blocks - 1) x 128).
    ws = bs.scaled_words(WORDS, s.scale)
    longest = bs.prompt_tokens(slower, s.rounds - 1, ws["system"], ws["answer"], ws["question"])
    assert longest < (bs.scaled_g1_blocks(17, s.scale) - 1) * bs.BLOCK


def test_the_guessed_avx2_machine_fits_ten_minutes_at_a_quarter_length() -> None:
    # SLOW's speeds with the tokenizer's rate measured on 2026-12-05 (the floor prompt: 1,533
    # tokens for 1,531 words). Its floor process (the cold prefill at 80 tokens/s, 20 hits, a
    # start, 30 s spare) takes ~106 s; 90% of the rest is left for the run.
    avx2 = bs.Machine(rate_tps=80.0, hit_s=1.5, start_s=22.0, tokens_per_word=1.0)
    budget = 0.9 * (600.0 - (1533 / 80.0 + 20 * avx2.hit_s + avx2.start_s + 30))
    pick = bs.choose(avx2, budget, CONFIGS, WORDS, 17, MOST)
    s = bs.Shape(**pick["shape"])
    assert pick["fits"] and pick["predicted_s"] <= budget
    assert s.scale in bs.SCALES[3:]  # shorter than the half length, which did not fit
    _meaningful(avx2, s)
    ws = bs.scaled_words(WORDS, s.scale)
    longest = bs.prompt_tokens(avx2, s.rounds - 1, ws["system"], ws["answer"], ws["question"])
    assert longest < (bs.scaled_g1_blocks(17, s.scale) - 1) * bs.BLOCK


def test_given_values_are_kept_and_configs_kept_when_asked() -> None:
    most = bs.Shape(6, 6, 12)
    least = bs.Shape(6, bs.MIN_ROUNDS, bs.MIN_NO_REUSE)
    pick = bs.choose(FAST, 480.0, CONFIGS, WORDS, 17, most, least,
                     drop_configs=False)
    assert pick["shape"]["users"] == 6 and pick["shape"]["configs"] == CONFIGS


def test_when_nothing_fits_the_smallest_meaningful_shape_is_used_and_said() -> None:
    crawl = bs.Machine(rate_tps=5.0, hit_s=5.0, start_s=60.0, tokens_per_word=1.25)
    pick = bs.choose(crawl, 300.0, CONFIGS, WORDS, 17, MOST)
    assert not pick["fits"] and pick["predicted_s"] > 300.0
    s = bs.Shape(**pick["shape"])
    assert s.scale == bs.SCALES[-1] and s.no_reuse_requests == bs.MIN_NO_REUSE
    _meaningful(crawl, s)
    # one user fewer would leave vLLM's own KV space holding too much of the working set
    ws = bs.scaled_words(WORDS, s.scale)
    assert (bs.working_blocks(crawl, s.users - 1, s.rounds, ws)
            < bs.MIN_WORKING_RATIO * bs.scaled_g1_blocks(17, s.scale))


def test_predictions_grow_with_the_workload_and_with_slower_prefill() -> None:
    a = bs.predict_s(FAST, bs.Shape(4, 3, 6), CONFIGS, WORDS)
    b = bs.predict_s(FAST, bs.Shape(8, 3, 6), CONFIGS, WORDS)
    c = bs.predict_s(FAST, bs.Shape(8, 5, 6), CONFIGS, WORDS)
    d = bs.predict_s(SLOW, bs.Shape(8, 5, 6), CONFIGS, WORDS)
    assert a < b < c < d
    # Reusing configurations compute less than the recomputing ones.
    alone = bs.predict_s(FAST, MOST, ["vllm_alone"], WORDS)
    g2 = bs.predict_s(FAST, MOST, ["kvtier_g2"], WORDS)
    assert g2 < alone


def test_the_token_estimate_matches_what_vllm_measured_for_the_default_workload() -> None:
    # The full default run's vLLM counted 120 distinct blocks (docs/vllm.md) and a last-round
    # prompt of ~1,900 tokens (just under max_model_len 2,048).
    assert 100 <= bs.working_blocks(FAST, 10, 6, WORDS) <= 140
    assert 1700 <= bs.prompt_tokens(FAST, 5, 420, 170, 30) < 2048

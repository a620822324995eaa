#!/usr/bin/env python3
"""Smoke test for the vLLM-for-CPU environment made by scripts/setup-vllm.sh.

Runs vLLM offline on the converted SmolLM2-135M-Instruct folder (fp32, eager, prefix caching
on), generates greedily for two chat prompts, prints the answers, and checks that they are
sensible: the first must name Paris, the second must name a colour, and generating the first
prompt again (now a prefix-cache hit) must give exactly the same text (fp32 is exact on the
CPU backend). Usage, with the environment from setup-vllm.sh:

    eval "$(scripts/setup-vllm.sh)"
    "$KVTIER_VLLM_PYTHON" scripts/check-vllm.py --model "$KVTIER_VLLM_MODEL"

(--model defaults to $KVTIER_VLLM_MODEL when that is exported.) The answers go to stdout; note
that vLLM's own log lines go to stdout too unless its logging is configured otherwise.

Exit status: 0 when all checks pass, 1 when one fails (stderr says which), 2 on bad arguments.
vLLM spawns its engine core and worker as separate processes, hence the __main__ guard.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Sequence

PROMPTS: tuple[str, ...] = (
    "What is the capital of France? Answer in one sentence.",
    "Name three colours of the rainbow.",
)
COLOURS: tuple[str, ...] = ("red", "orange", "yellow", "green", "blue", "indigo", "violet")
# A system message long enough (over one 128-token block, the CPU backend's default block size)
# that repeating a prompt gives vLLM's prefix cache whole blocks to hit.
SYSTEM: str = (
    "You are SmolLM, a small, friendly and helpful assistant. You answer questions about "
    "geography, science, history, language and everyday life. Your answers are short, correct "
    "and clear: one or two sentences unless the user asks for more. When you are not sure of a "
    "fact you say so instead of guessing. You do not repeat the question, you do not add "
    "greetings or sign-offs, and you do not use lists unless the user asks for a list. You "
    "write in plain English, avoid jargon, and prefer common words. Names of places, people "
    "and things are spelled the usual English way. Numbers under ten are written as words. "
    "If a question has several good answers, you give the most common one first."
)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="vLLM-for-CPU smoke test on the converted model.")
    parser.add_argument("--model", type=Path, default=os.environ.get("KVTIER_VLLM_MODEL"),
                        help="Hugging Face model folder (default: $KVTIER_VLLM_MODEL)")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per answer (32)")
    parser.add_argument("--kv-space-gib", default="1",
                        help="VLLM_CPU_KVCACHE_SPACE unless already set (default: 1)")
    args = parser.parse_args(argv)
    if args.model is None:
        parser.error("no model: pass --model or set KVTIER_VLLM_MODEL (scripts/setup-vllm.sh)")
    if not (args.model / "config.json").is_file():
        parser.error(f"{args.model} is not a Hugging Face model folder (no config.json)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", args.kv_space_gib)

    started = time.monotonic()
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(args.model), dtype="float32", enforce_eager=True, max_model_len=2048,
              enable_prefix_caching=True)
    print(f"check-vllm: engine up in {time.monotonic() - started:.1f} s", file=sys.stderr)

    tokenizer = llm.get_tokenizer()
    prompts = [tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM},
                                              {"role": "user", "content": p}], tokenize=False,
                                             add_generation_prompt=True) for p in PROMPTS]
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)

    t0 = time.monotonic()
    outputs = llm.generate(prompts, greedy)
    texts = [o.outputs[0].text for o in outputs]
    print(f"check-vllm: generated {len(texts)} answers in {time.monotonic() - t0:.2f} s",
          file=sys.stderr)
    for question, text in zip(PROMPTS, texts):
        print(f"Q: {question}\nA: {text.strip()}\n")

    again = llm.generate([prompts[0]], greedy)[0]
    failures: list[str] = []
    if "paris" not in texts[0].lower():
        failures.append(f"answer 1 does not name Paris: {texts[0]!r}")
    if not any(c in texts[1].lower() for c in COLOURS):
        failures.append(f"answer 2 names no colour of the rainbow: {texts[1]!r}")
    if again.outputs[0].text != texts[0]:
        failures.append(f"prompt 1 again (prefix-cache hit) gave different text: "
                        f"{again.outputs[0].text!r} vs {texts[0]!r}")
    if not again.num_cached_tokens:
        failures.append("prompt 1 again got no prefix-cache hit (num_cached_tokens = 0)")
    for f in failures:
        print(f"check-vllm: FAIL: {f}", file=sys.stderr)
    if failures:
        return 1
    print(f"check-vllm: ok (prefix-cache hit of {again.num_cached_tokens} tokens gave the same "
          f"text; {time.monotonic() - started:.1f} s in all)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

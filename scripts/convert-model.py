#!/usr/bin/env python3
"""Converts a GGUF model into a Hugging Face folder that vLLM can load.

The project's model (SmolLM2-135M-Instruct, Q4_1 GGUF, from scripts/fetch-model.sh) has no
Hugging Face folder anywhere reachable, and vLLM's CPU backend runs unquantized weights. This
program follows the recipe in the shared notes (vllm-on-cpu.md):

1. load model and tokenizer with transformers `from_pretrained(dir, gguf_file=...)` (needs the
   `gguf` package; the weights come back dequantized);
2. `save_pretrained` refuses a model loaded that way ("quantized with QuantizationMethod.GGUF
   and is not serializable"), so take its state_dict, drop `quantization_config` from the
   config, build a fresh model `from_config`, load the state_dict into it and cast it;
3. `save_pretrained` the model and the tokenizer (which keeps the GGUF's chat template), then
   reload the tokenizer from the output to check the chat template survived.

Usage: convert-model.py --gguf models/X.gguf --out DIR [--dtype float32|bfloat16|float16]

Exit status: 0 on success, 1 on any failure (one line on stderr says what failed), 2 on bad
arguments. DIR must not exist yet unless --force is given; callers that want an atomic result
convert into a temporary folder and rename it (as scripts/setup-vllm.sh does).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Sequence

DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")


class ConversionError(Exception):
    """A failure with a message meant for the user."""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Convert a GGUF model to a Hugging Face folder (unquantized) for vLLM.")
    parser.add_argument("--gguf", required=True, type=Path, help="the .gguf file to convert")
    parser.add_argument("--out", required=True, type=Path, help="output folder (created)")
    parser.add_argument("--dtype", default="float32", choices=DTYPES,
                        help="dtype of the saved weights (default: float32)")
    parser.add_argument("--force", action="store_true",
                        help="replace the output folder if it exists")
    return parser.parse_args(argv)


def progress(message: str) -> None:
    print(f"convert-model: {message}", file=sys.stderr, flush=True)


def convert(gguf: Path, out: Path, dtype_name: str) -> None:
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        raise ConversionError(f"missing Python package ({e}); run scripts/setup-vllm.sh") from e
    try:
        import gguf as _gguf  # noqa: F401  (transformers needs it to read .gguf files)
    except ImportError as e:
        raise ConversionError("the 'gguf' package is not installed; transformers needs it "
                              "to read .gguf files") from e

    dtype: torch.dtype = getattr(torch, dtype_name)
    folder, name = str(gguf.parent), gguf.name
    started = time.monotonic()
    progress(f"loading {gguf} with transformers {transformers.__version__}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    except Exception as e:  # transformers raises many types here; report them all the same way
        raise ConversionError(f"transformers could not load {gguf}: {type(e).__name__}: {e}") from e

    config = loaded.config
    state = loaded.state_dict()
    # The GGUF loader records a quantization_config that makes save_pretrained refuse; the
    # tensors themselves are already dequantized.
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    fresh = AutoModelForCausalLM.from_config(config)
    result = fresh.load_state_dict(state, strict=False)
    # Tied embeddings: lm_head.weight may be absent from one side; that is expected.
    missing = [k for k in result.missing_keys if k != "lm_head.weight"]
    unexpected = [k for k in result.unexpected_keys if k != "lm_head.weight"]
    if missing or unexpected:
        raise ConversionError(f"state_dict does not fit the rebuilt model: missing {missing[:5]}"
                              f", unexpected {unexpected[:5]}")
    if getattr(config, "tie_word_embeddings", False):
        fresh.tie_weights()
    fresh = fresh.to(dtype)
    fresh.eval()
    del loaded, state

    chat_template = getattr(tokenizer, "chat_template", None)
    if not chat_template:
        raise ConversionError(f"{gguf} carries no chat template (tokenizer.chat_template is empty)")

    progress(f"saving {dtype_name} weights and tokenizer to {out}")
    out.mkdir(parents=True)
    try:
        fresh.save_pretrained(str(out))
        tokenizer.save_pretrained(str(out))
    except Exception as e:
        raise ConversionError(f"save_pretrained into {out} failed: {type(e).__name__}: {e}") from e

    # Check what a consumer (vLLM) will see: the chat template and the weights' dtype.
    reloaded = AutoTokenizer.from_pretrained(str(out))
    if reloaded.chat_template != chat_template:
        raise ConversionError(f"the chat template did not survive save_pretrained into {out}")
    if not any(out.glob("*.safetensors")):
        raise ConversionError(f"no .safetensors file was written into {out}")
    params = sum(p.numel() for p in fresh.parameters())
    progress(f"done in {time.monotonic() - started:.1f} s: {type(fresh).__name__}, "
             f"{config.num_hidden_layers} layers, {params / 1e6:.1f} M parameters, {dtype_name}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    gguf: Path = args.gguf.resolve()
    out: Path = args.out.resolve()
    try:
        if not gguf.is_file():
            raise ConversionError(f"{gguf} does not exist (scripts/fetch-model.sh fetches it)")
        if out.exists():
            if not args.force:
                raise ConversionError(f"{out} exists; pass --force to replace it")
            shutil.rmtree(out)
        try:
            convert(gguf, out, args.dtype)
        except BaseException:
            shutil.rmtree(out, ignore_errors=True)  # never leave a half-written folder behind
            raise
    except ConversionError as e:
        print(f"convert-model: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Makes small hybrid reference models offline, with seeded random weights, for the vLLM tests.

Issue 24 (hybrid models: vLLM's hybrid memory allocator, HMA) needs models whose KV cache vLLM
splits into several KV cache groups. No such model is reachable offline, and only equality with
vLLM alone is checked (not quality), so this program builds one from a real architecture's
configuration with `transformers`, with random weights drawn from a seeded generator, and saves
it in the Hugging Face format vLLM loads by architecture (config.json's "architectures"):

- ``gemma3``: Gemma3ForCausalLM (model_type gemma3_text), sliding-window and global layers in
  Gemma 3's 5:1 pattern (12 layers: 10 sliding, 2 global), sliding_window 128 by default. vLLM
  0.32 (CPU, fp32) runs it with HMA: 6 KV cache groups of 2 layers (5 SlidingWindowSpec, 1
  FullAttentionSpec), block size 128 (any multiple of 32 works, e.g. 96).
- ``lfm2``: Lfm2ForCausalLM (Liquid LFM2: short-convolution layers, a MambaSpec state, and
  full-attention layers), 6 layers. Runs in fp32 with HMA and prefix caching (mamba_cache_mode
  "align"): 2 MambaSpec groups + 1 FullAttentionSpec group, block size 128.
- ``qwen3next``: Qwen3NextForCausalLM (Gated DeltaNet linear attention, a MambaSpec state, and
  gated full attention, 3:1, small MoE), 4 layers. vLLM's CPU GDN kernel needs bf16 and head
  dims of 128: runs in bf16 only, with HMA, prefix caching and a block size of 384.
- ``granitehybrid``: GraniteMoeHybridForCausalLM (Granite 4.0 "H": Mamba2 + attention, dense),
  6 layers. vLLM 0.32's CPU backend runs it only without prefix caching (its CPU Mamba2 scan
  ignores return_intermediate_states, which prefix caching's checkpoints need).
- ``gemma2``: Gemma2ForCausalLM, sliding and global layers alternating (a fallback).
- ``llama``: LlamaForCausalLM, dense (not hybrid), 4 layers, 4 query heads and 2 KV heads of 64,
  so that tensor parallelism of 2 splits it (SmolLM2's 9 heads cannot be split in two: vLLM
  refuses tensor_parallel_size=2 for it). For tests/vllm/test_vllm_tp_dp.py; init std 0.1
  (at 0.02 its greedy output is one token repeated).
- ``bamba`` / ``jamba``: kept to show the failures: vLLM 0.32 removed its Bamba implementation
  (the Transformers fallback refuses the model) and has no CPU Mamba1 prefill kernel
  (selective_scan_fwd).

docs/wip/hma-plan.md records what each one does in vLLM, with and without kvtier.

Every model takes the SmolLM2-135M-Instruct tokenizer (vocabulary 49,152, its chat template and
special tokens) from the converted SmolLM2 folder, so prompts tokenize as in the other tests.
The sizes are small (hidden 256, fp32) so that vLLM on two CPU cores prefills 1-2k tokens in
well under a second to a few seconds. `--size small` (gemma3 only; for the benchmark): hidden
1024, 8 heads of 128, MLP 4096, the same 12 layers (~240 M parameters, ~1 GB in fp32), so
that a prefill costs what it does on a real model and not vLLM's fixed per-step costs.

Usage:
    make_hybrid_model.py --kind gemma3 [--size tiny|small] [--out DIR] [--seed 0]
                         [--sliding-window 128] [--tokenizer DIR] [--dtype float32]
                         [--init-std 0.02] [--force]

DIR defaults to ${KVTIER_CACHE:-~/.cache/kvtier}/models/<kind>-<size>-random-fp32 (next to the
SmolLM2 conversion). The folder is written to DIR.tmp and renamed, with a marker file
(.kvtier-make-complete) holding the recipe's parameters; an existing complete folder with the
same parameters is kept unless --force. Exit status: 0 on success, 1 on failure (one line on
stderr), 2 on bad arguments. Run it with the vLLM environment's Python (scripts/setup-vllm.sh
prints KVTIER_VLLM_PYTHON), which has torch and transformers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Sequence

MAKE_VERSION = 2  # bump when a recipe changes: the marker then no longer matches
KINDS: tuple[str, ...] = ("gemma3", "gemma2", "granitehybrid", "lfm2", "qwen3next", "bamba",
                          "jamba", "llama")
DTYPES: tuple[str, ...] = ("float32", "bfloat16")

# The SmolLM2 tokenizer's ids (its tokenizer_config / the converted config.json).
VOCAB = 49152
BOS, EOS, PAD = 1, 2, 2


class MakeError(Exception):
    """A failure with a message meant for the user."""


def cache_root() -> Path:
    return Path(os.environ.get("KVTIER_CACHE", str(Path.home() / ".cache" / "kvtier"))).expanduser()


def default_out(kind: str, dtype: str, size: str = "tiny") -> Path:
    suffix = "fp32" if dtype == "float32" else "bf16"
    return cache_root() / "models" / f"{kind}-{size}-random-{suffix}"


def default_tokenizer() -> Path:
    return cache_root() / "models" / "smollm2-135m-instruct-fp32"


def _common(args: argparse.Namespace) -> Dict[str, Any]:
    return dict(vocab_size=VOCAB, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD,
                initializer_range=args.init_std, max_position_embeddings=8192,
                tie_word_embeddings=True)


def gemma3_config(args: argparse.Namespace) -> Any:
    from transformers import Gemma3TextConfig

    n = 12
    layer_types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                   for i in range(n)]
    if args.size == "small":
        dims = dict(hidden_size=1024, intermediate_size=4096, num_attention_heads=8,
                    num_key_value_heads=4, head_dim=128, query_pre_attn_scalar=128)
    else:
        dims = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=64, query_pre_attn_scalar=64)
    return Gemma3TextConfig(
        **_common(args), **dims, num_hidden_layers=n, sliding_window=args.sliding_window,
        layer_types=layer_types, architectures=["Gemma3ForCausalLM"])


def gemma2_config(args: argparse.Namespace) -> Any:
    from transformers import Gemma2Config

    n = 6
    layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    return Gemma2Config(
        **_common(args), hidden_size=256, intermediate_size=512, num_hidden_layers=n,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, query_pre_attn_scalar=64,
        sliding_window=args.sliding_window, layer_types=layer_types,
        architectures=["Gemma2ForCausalLM"])


def bamba_config(args: argparse.Namespace) -> Any:
    from transformers import BambaConfig

    # Mamba2: n_heads x d_head = expand x hidden. State per layer (fp32): ssm 8 x 64 x 64 x 4 B
    # = 128 KiB, conv 3 x (512 + 2 x 64) x 4 B = 7.5 KiB.
    return BambaConfig(
        **_common(args), hidden_size=256, intermediate_size=512, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, attn_layer_indices=[2, 5],
        mamba_n_heads=8, mamba_d_head=64, mamba_n_groups=1, mamba_d_state=64, mamba_d_conv=4,
        mamba_expand=2, mamba_chunk_size=64, architectures=["BambaForCausalLM"])


def granitehybrid_config(args: argparse.Namespace) -> Any:
    from transformers import GraniteMoeHybridConfig

    # IBM Granite 4.0 "H" (Bamba's successor in vLLM): Mamba2 layers and full-attention layers
    # (NoPE, as the real H models), dense (no experts: a shared MLP only). Mamba2 state per
    # layer (fp32): ssm 8 heads x 64 x 64 x 4 B = 128 KiB, conv 3 x (512 + 2 x 64) x 4 B.
    n = 6
    layer_types = ["full_attention" if i in (2, 5) else "linear_attention" for i in range(n)]
    return GraniteMoeHybridConfig(
        **_common(args), hidden_size=256, intermediate_size=512, num_hidden_layers=n,
        num_attention_heads=4, num_key_value_heads=2, layer_types=layer_types,
        num_local_experts=0, num_experts_per_tok=0, shared_intermediate_size=512,
        position_embedding_type="nope", mamba_n_heads=8, mamba_d_head=64, mamba_n_groups=1,
        mamba_d_state=64, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=64,
        architectures=["GraniteMoeHybridForCausalLM"])


def lfm2_config(args: argparse.Namespace) -> Any:
    from transformers import Lfm2Config

    # Liquid LFM2: gated short-convolution layers (a conv state of L_cache - 1 = 2 columns per
    # layer, vLLM's ShortConv: a MambaSpec) and full-attention layers.
    n = 6
    layer_types = ["full_attention" if i in (2, 5) else "conv" for i in range(n)]
    return Lfm2Config(
        **_common(args), hidden_size=256, intermediate_size=512, num_hidden_layers=n,
        num_attention_heads=4, num_key_value_heads=2, layer_types=layer_types,
        full_attn_idxs=[i for i, t in enumerate(layer_types) if t == "full_attention"],
        conv_L_cache=3, block_multiple_of=256, block_auto_adjust_ff_dim=False,
        # Keys of the released LFM2 config.json that transformers' Lfm2Config no longer
        # declares and vLLM's lfm2.py still reads (kept as plain config attributes).
        conv_dim=256, conv_dim_out=256, block_dim=256, block_ff_dim=512,
        architectures=["Lfm2ForCausalLM"])


def qwen3next_config(args: argparse.Namespace) -> Any:
    from transformers import Qwen3NextConfig

    # Qwen3-Next: Gated DeltaNet linear-attention layers (vLLM's GDN: a MambaSpec with a conv
    # and a recurrent state) and gated full-attention layers in a 3:1 pattern; a small MoE.
    n = 4
    layer_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                   for i in range(n)]
    common = _common(args)
    # As the released Qwen3-Next: an untied LM head (vLLM's qwen3_next.py leaves a tied one
    # unloaded, so every logit is 0).
    common["tie_word_embeddings"] = False
    return Qwen3NextConfig(
        **common, hidden_size=256, intermediate_size=512, num_hidden_layers=n,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, layer_types=layer_types,
        # vLLM's CPU GDN kernel takes head dims of 128 only, and bf16 activations only.
        linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_num_key_heads=1, linear_num_value_heads=2, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=128, shared_expert_intermediate_size=128,
        decoder_sparse_step=1, architectures=["Qwen3NextForCausalLM"])


def llama_config(args: argparse.Namespace) -> Any:
    from transformers import LlamaConfig

    # Dense, with head counts that tensor parallelism of 2 divides (1 KV head per rank).
    return LlamaConfig(
        **_common(args), hidden_size=256, intermediate_size=512, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        architectures=["LlamaForCausalLM"])


def jamba_config(args: argparse.Namespace) -> Any:
    from transformers import JambaConfig

    return JambaConfig(
        **_common(args), hidden_size=256, intermediate_size=512, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, attn_layer_period=2, attn_layer_offset=1,
        expert_layer_period=1, expert_layer_offset=0, num_experts=1, num_experts_per_tok=1,
        mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=16,
        use_mamba_kernels=False, architectures=["JambaForCausalLM"])


# Random weights at 0.02 (transformers' default) give LFM2 and Qwen3-Next a greedy output that is
# one token repeated whatever the prompt; at 0.05 their outputs depend on the prompt.
INIT_STD: Dict[str, float] = {"lfm2": 0.05, "qwen3next": 0.05, "llama": 0.1}

RECIPES: Dict[str, Callable[[argparse.Namespace], Any]] = {
    "gemma3": gemma3_config, "gemma2": gemma2_config, "granitehybrid": granitehybrid_config,
    "lfm2": lfm2_config, "qwen3next": qwen3next_config,
    "bamba": bamba_config,
    "jamba": jamba_config,
    "llama": llama_config,
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Make a small hybrid model with seeded random "
                                            "weights for kvtier's vLLM tests.")
    p.add_argument("--kind", required=True, choices=KINDS)
    p.add_argument("--size", default="tiny", choices=("tiny", "small"),
                   help="tiny (tests; hidden 256) or small (gemma3 only, the benchmark's; "
                        "hidden 1024, ~240 M parameters)")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: <cache>/models/<kind>-<size>-random-fp32)")
    p.add_argument("--seed", type=int, default=0, help="torch seed for the weights")
    p.add_argument("--sliding-window", type=int, default=128,
                   help="sliding window of the sliding layers (gemma2/gemma3), in tokens")
    p.add_argument("--init-std", type=float, default=None,
                   help="std of the random weights (transformers' initializer_range; default: "
                        "the kind's, chosen so that greedy outputs depend on the prompt)")
    p.add_argument("--dtype", default="float32", choices=DTYPES)
    p.add_argument("--tokenizer", type=Path, default=None,
                   help="tokenizer folder (default: the converted SmolLM2 folder)")
    p.add_argument("--force", action="store_true", help="remake even if the folder is current")
    args = p.parse_args(argv)
    if args.sliding_window < 1:
        p.error("--sliding-window must be positive")
    if args.init_std is None:
        args.init_std = INIT_STD.get(args.kind, 0.02)
    if args.init_std <= 0:
        p.error("--init-std must be positive")
    if args.size != "tiny" and args.kind != "gemma3":
        p.error(f"--size {args.size} is made for --kind gemma3 only")
    args.out = args.out or default_out(args.kind, args.dtype, args.size)
    args.tokenizer = args.tokenizer or default_tokenizer()
    return args


def progress(message: str) -> None:
    print(f"make-hybrid-model: {message}", file=sys.stderr, flush=True)


def marker_text(args: argparse.Namespace) -> str:
    fields = {"make_version": MAKE_VERSION, "kind": args.kind, "seed": args.seed,
              "sliding_window": args.sliding_window, "init_std": args.init_std,
              "dtype": args.dtype}
    if args.size != "tiny":  # tiny folders made before --size keep their marker
        fields["size"] = args.size
    return json.dumps(fields, sort_keys=True)


def make(args: argparse.Namespace) -> Path:
    out: Path = args.out
    marker = out / ".kvtier-make-complete"
    if not args.force and marker.is_file() and marker.read_text() == marker_text(args):
        progress(f"{out} is current (remove it or pass --force to remake)")
        return out
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        raise MakeError(f"missing Python package ({e}); use the vLLM environment's Python "
                        f"(scripts/setup-vllm.sh)") from e
    if not (args.tokenizer / "tokenizer.json").is_file():
        raise MakeError(f"no tokenizer at {args.tokenizer} (scripts/setup-vllm.sh converts "
                        f"SmolLM2 there); pass --tokenizer")
    started = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer))
    if len(tokenizer) > VOCAB:
        raise MakeError(f"the tokenizer at {args.tokenizer} has {len(tokenizer)} tokens; the "
                        f"recipes have a vocabulary of {VOCAB}")
    config = RECIPES[args.kind](args)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(args.seed)
    # Build in fp32 on the CPU (the initializers draw from torch's global generator, seeded
    # above), then cast.
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model = model.to(dtype)
    model.config.dtype = args.dtype
    nparams = sum(p.numel() for p in model.parameters())
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(str(tmp), safe_serialization=True)
    tokenizer.save_pretrained(str(tmp))
    gen = tmp / "generation_config.json"
    if gen.is_file():  # from_config models get transformers' defaults: keep them plain
        cfg = json.loads(gen.read_text())
        cfg.update(bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)
        gen.write_text(json.dumps(cfg, indent=2) + "\n")
    # A quick check that the saved folder loads back and generates deterministically.
    check = AutoModelForCausalLM.from_pretrained(str(tmp), dtype=dtype)
    ids = tokenizer("The quick brown fox", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = check(ids).logits
    if not torch.isfinite(logits).all():
        raise MakeError("the model's logits are not finite (lower --init-std)")
    (tmp / ".kvtier-make-complete").write_text(marker_text(args))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    progress(f"{args.kind}: {config.architectures[0]}, {nparams / 1e6:.1f} M parameters, "
             f"{args.dtype}, seed {args.seed}, transformers {transformers.__version__}: {out} "
             f"({time.monotonic() - started:.1f} s)")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        out = make(args)
    except MakeError as e:
        print(f"make-hybrid-model: {e}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

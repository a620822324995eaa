"""KvtierConnector on a hybrid model with vLLM's hybrid memory allocator (HMA) on.

The reference model is a Gemma-3-style mix (10 sliding-window layers with a 128-token window,
2 global layers) with seeded random weights, made offline by tools/vllm/make_hybrid_model.py
from Gemma 3's real configuration class (cached next to the SmolLM2 conversion). vLLM gives it
6 KV cache groups (5 sliding-window, 1 full attention) over one block pool.

Every run is compared with vLLM alone, greedy in fp32: the tokens, and the top-5 logprobs of
every generated token within 1e-4 (random weights barely use early context, so a wrong block
could leave the argmax alone; a prefix hit in vLLM itself moves them by < 2e-6). vLLM's KV
space is capped so that its own prefix cache evicts and kvtier brings the prefixes back.

The same rounds also run attached to a `kvtier serve` daemon (every group through its G2).

A state-space hybrid (LFM2: short-conv layers + attention) reuses its prefixes with HMA on: the
attention blocks and the mamba state at the longest boundary kvtier holds, from G2 and from G3
after a restart, with vLLM's own answers.

Run by tests/vllm/run.sh (ctest: vllm_hybrid_test).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

from driver_result import counters, metric
from serve_util import ServeDaemon
from vllm_under_test import check_engine_log, expected_version

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DRIVER = ROOT / "tools" / "vllm" / "driver.py"
MAKER = ROOT / "tools" / "vllm" / "make_hybrid_model.py"
BLOCK = 128
WINDOW = 128
G1_BLOCKS = 100  # vLLM's own pool (all groups share it): below the workload's
TOLERANCE = 1e-4


def _make_model(kind: str) -> Path:
    cache = Path(os.environ.get("KVTIER_CACHE", str(Path.home() / ".cache" / "kvtier")))
    out = cache.expanduser() / "models" / f"{kind}-tiny-random-fp32"
    cmd = [sys.executable, str(MAKER), "--kind", kind, "--out", str(out)]
    if os.environ.get("KVTIER_TEST_VLLM_MODEL"):  # SmolLM2's tokenizer, converted by run.sh
        cmd += ["--tokenizer", os.environ["KVTIER_TEST_VLLM_MODEL"]]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        pytest.fail(f"make_hybrid_model.py --kind {kind} failed:\n{r.stdout}\n{r.stderr}")
    return out


@pytest.fixture(scope="module")
def tmp() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="kvtier-hybrid-"))
    yield d
    if not os.environ.get("KEEP_HYBRID_TMP"):
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def gemma3() -> Path:
    return _make_model("gemma3")


def run_vllm(tmp: Path, name: str, model: Path, steps: List[Dict[str, Any]],
             kvtier: Optional[Dict[str, Any]], timeout: float = 600,
             **plan_extra: Any) -> Dict[str, Any]:
    plan = {"model": str(model), "kvtier": kvtier, "num_gpu_blocks": G1_BLOCKS,
            "max_model_len": 1536, "steps": steps, "in_process": True, "hma": True,
            "logprobs": 5, **plan_extra}
    plan_path, out_path = tmp / f"{name}.plan.json", tmp / f"{name}.out.json"
    plan_path.write_text(json.dumps(plan))
    log = tmp / f"{name}.log"
    with open(log, "w") as f:
        try:
            rc = subprocess.run([sys.executable, str(DRIVER), str(plan_path), str(out_path)],
                                stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            pytest.fail(f"vLLM run {name!r} did not finish in {timeout} s (hang); log: {log}")
    if rc != 0:
        pytest.fail(f"vLLM run {name!r} exited {rc}; last lines of {log}:\n"
                    f"{log.read_text()[-6000:]}")
    out = json.loads(out_path.read_text())
    out["log"] = log.read_text()
    check_engine_log(out["log"], f"vLLM run {name!r}")
    if expected_version():  # "in_process": the driver's process is the engine's
        assert out["vllm"]["version"].startswith(expected_version()), (name, out["vllm"])
    return out


def kvtier_config(tmp: Path, **extra: Any) -> Dict[str, Any]:
    c: Dict[str, Any] = {"g2.capacity_bytes": "512MiB", "g2.lock_memory": False,
                         "g3.dir": str(tmp / "g3"), "g3.capacity_bytes": "1GiB",
                         "g3.admit_min_seen": 1}
    c.update(extra)
    return c


def prompts(lengths: List[int], seed: int = 7) -> List[Dict[str, Any]]:
    """Seeded random token prompts of the given lengths."""
    import random

    rng = random.Random(seed)
    out = []
    for n in lengths:
        base = [rng.randrange(100, 40000) for _ in range(n)]
        out.append({"tokens": base})
    return out


def assert_same(got: Dict[str, Any], want: Dict[str, Any], step: int, what: str,
                want_step: Optional[int] = None) -> None:
    """Step `step` of `got` against step `want_step` (default the same) of `want`."""
    g = got["steps"][step]
    w = want["steps"][step if want_step is None else want_step]
    assert g["outputs"] == w["outputs"], f"{what}: tokens differ from vLLM alone"
    worst = 0.0
    for lp_g, lp_w in zip(g["logprobs"], w["logprobs"]):
        for pos_g, pos_w in zip(lp_g, lp_w):
            for tok, v in pos_w.items():
                assert tok in pos_g, f"{what}: top-5 differs from vLLM alone at a token"
                worst = max(worst, abs(pos_g[tok] - v))
    assert worst <= TOLERANCE, f"{what}: a top-5 logprob differs by {worst:.2e} from vLLM alone"


def rounds(first: List[Dict[str, Any]], second: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [{"name": "round1", "generate": first, "max_tokens": 6},
            {"reset_prefix_cache": True},
            {"name": "round2", "generate": second, "max_tokens": 6}]


def two_rounds() -> List[Dict[str, Any]]:
    # Prompts 3-8 windows long; round 2 asks for the same prompts and for longer ones that
    # extend them (a chat's next turn), after vLLM's own cache was reset.
    first = prompts([430, 700, 1030])
    second = [{"tokens": p["tokens"] + [1000 + i] * 150} for i, p in enumerate(first)] + first
    return rounds(first, second)


@pytest.fixture(scope="module")
def gemma3_alone(tmp: Path, gemma3: Path) -> Dict[str, Any]:
    """vLLM alone on two_rounds(): the reference of the embedded and the attached runs."""
    return run_vllm(tmp, "alone", gemma3, two_rounds(), None)


def test_gemma3_hma_stays_on_and_reuse_from_g2_equals_vllm(
        tmp: Path, gemma3: Path, gemma3_alone: Dict[str, Any]) -> None:
    steps = two_rounds()
    alone = gemma3_alone
    r = run_vllm(tmp, "g2", gemma3, steps, kvtier_config(tmp, **{"g3.enabled": False}))
    # HMA on, from vLLM's own configuration, and the same KV pool as vLLM alone.
    assert r["engine"]["hma"], r["engine"]
    assert r["engine"]["groups"].count("SlidingWindowSpec") == 5, r["engine"]
    assert r["engine"]["groups"].count("FullAttentionSpec") == 1, r["engine"]
    assert r["engine"]["num_blocks"] == alone["engine"]["num_blocks"]
    assert "Turning off hybrid kv cache manager" not in r["log"]
    assert_same(r, alone, 0, "round 1")
    assert_same(r, alone, 1, "round 2")
    # Round 2's prefixes came from kvtier: the full-attention group's blocks of round 1's
    # prompts (3, 5 and 8 blocks), for the extended prompts (vLLM's cache was reset).
    assert metric(r, "hit_blocks_g2") >= 3 + 5 + 8, counters(r)
    assert metric(r, "hybrid_full_load_blocks") >= 3 + 5 + 8, counters(r)
    # The sliding groups loaded only the window's block at the end of each hit.
    assert 0 < metric(r, "hybrid_sliding_load_blocks") <= 5 * 2 * 6, counters(r)
    assert metric(r, "hybrid_failed_loads") == 0, counters(r)


def test_gemma3_attached_to_kvtier_serve_equals_vllm(
        tmp: Path, gemma3: Path, gemma3_alone: Dict[str, Any]) -> None:
    # The same two rounds with the engine attached to a `kvtier serve` daemon (docs/service.md):
    # every group's blocks go through the daemon's G2, the sliding groups' relookups and the
    # null blocks of the windows included.
    sock = tmp / "serve.sock"
    daemon = ServeDaemon(tmp / "serve.log", sock, g2_bytes="512MiB")
    try:
        r = run_vllm(tmp, "attached", gemma3, two_rounds(),
                     {"service.socket": str(sock), "service.instance": "hybrid"})
        assert daemon.proc.poll() is None, "kvtier serve died with a hybrid engine attached"
    finally:
        daemon.stop()
    assert r["engine"]["hma"], r["engine"]
    assert "kvtier: attached to kvtier serve at" in r["log"], "the engine did not attach"
    assert "kvtier serve: pool " in (tmp / "serve.log").read_text(), "the daemon made no pool"
    assert_same(r, gemma3_alone, 0, "attached, round 1")
    assert_same(r, gemma3_alone, 1, "attached, round 2")
    why = counters(r) + "\n" + "\n".join(
        line for line in r["log"].splitlines() if "kvtier" in line.lower()
        and ("WARNING" in line or "ERROR" in line))[-4000:] + "\nkvtier serve:\n" + \
        (tmp / "serve.log").read_text()[-3000:]
    assert metric(r, "hybrid_full_load_blocks") >= 3 + 5 + 8, why
    assert 0 < metric(r, "hybrid_sliding_load_blocks") <= 5 * 2 * 6, why
    assert metric(r, "hybrid_failed_loads") == 0, why


def test_gemma3_block_size_96_chunked_prefill_g3_after_restart(tmp: Path, gemma3: Path) -> None:
    # A block size that is not a power of two (every group takes the one the user sets), and
    # chunked prefill (256 tokens a step): sliding blocks leave the window and are handed to
    # other groups while the request runs, so the saves must have read them first.
    first = prompts([900, 1200], seed=11)
    steps = [{"name": "all", "generate": first, "max_tokens": 6}]
    extra = {"max_num_batched_tokens": 256, "block_size": 96,
             "num_gpu_blocks": 140}  # about as many tokens as 100 blocks of 128
    alone = run_vllm(tmp, "alone-96", gemma3, steps, None, **extra)
    config = kvtier_config(tmp, **{"g3.dir": str(tmp / "g3-restart")})
    one = run_vllm(tmp, "g3-first", gemma3, steps, config, **extra)
    assert one["engine"]["hma"], one["engine"]
    assert_same(one, alone, 0, "first run")
    # A new process, an empty G2: the prefixes come back from G3 (9 and 12 blocks of 96).
    two = run_vllm(tmp, "g3-second", gemma3, steps, config, **extra)
    assert_same(two, alone, 0, "after a restart")
    assert metric(two, "hit_blocks_g3") >= 9 + 12, counters(two)
    assert metric(two, "hybrid_full_load_blocks") >= 9 + 12, counters(two)
    assert metric(two, "hybrid_failed_loads") == 0, counters(two)


LFM2_EXTRA = {"max_num_batched_tokens": 256}


def lfm2_rounds() -> List[Dict[str, Any]]:
    """Round 1: 2 prompts; vLLM's cache reset; round 2: their extensions (a chat's next turn),
    then the same 2 again. One prompt a step: vLLM's LFM2 outputs depend on how a prompt's
    prefill is split into steps, and with several prompts in a step the split would depend on
    when each asynchronous load ends. Output steps: 0-1 round 1, 2-5 round 2."""
    first = prompts([500, 900], seed=5)
    second = [{"tokens": p["tokens"] + [1000 + i] * 150} for i, p in enumerate(first)] + first
    steps: List[Dict[str, Any]] = [{"name": f"r1-{i}", "generate": [p], "max_tokens": 6}
                                   for i, p in enumerate(first)]
    steps.append({"reset_prefix_cache": True})
    steps += [{"name": f"r2-{i}", "generate": [p], "max_tokens": 6}
              for i, p in enumerate(second)]
    return steps


def assert_steps(got: Dict[str, Any], want: Dict[str, Any], pairs: List[Any], what: str) -> None:
    """Output step g of `got` against step w of `want`, for each (g, w)."""
    for g, w in pairs:
        assert_same(got, want, g, f"{what}, step {g}", want_step=w)


@pytest.fixture(scope="module")
def lfm2() -> Path:
    return _make_model("lfm2")


@pytest.fixture(scope="module")
def lfm2_own(tmp: Path, lfm2: Path) -> Dict[str, Any]:
    """vLLM alone on lfm2_rounds() with its own prefix cache serving round 2 (not reset).

    vLLM itself gives other logprobs (up to ~0.1 nats here) when it resumes from a cached
    mamba state than when it computes the prompt cold, so the reference for a state-space
    hybrid is vLLM's own cache: kvtier must give exactly what it gives."""
    return run_vllm(tmp, "lfm2-alone", lfm2,
                    [s for s in lfm2_rounds() if "reset_prefix_cache" not in s], None,
                    **LFM2_EXTRA)


def test_lfm2_state_groups_reuse_from_g2_and_g3_after_restart_equal_vllm(
        tmp: Path, lfm2: Path, lfm2_own: Dict[str, Any]) -> None:
    # A state-space hybrid (LFM2: 4 short-conv layers in 2 mamba groups, 2 attention layers),
    # chunked prefill (256 tokens a step). vLLM keeps a mamba state only at some block
    # boundaries (a prompt's last one, decode's) and hands them to the connector; a hit needs
    # the attention blocks and, in every state group, the state at the hit's end. kvtier's
    # runs reset vLLM's cache between the rounds: round 2 comes from kvtier.
    steps, own = lfm2_rounds(), lfm2_own
    config = kvtier_config(tmp, **{"g3.dir": str(tmp / "g3-lfm2")})
    one = run_vllm(tmp, "lfm2-kvtier", lfm2, steps, config, **LFM2_EXTRA)
    assert one["engine"]["hma"], one["engine"]
    assert one["engine"]["groups"].count("MambaSpec") == 2, one["engine"]
    assert one["engine"]["groups"].count("FullAttentionSpec") == 1, one["engine"]
    assert one["engine"]["num_blocks"] == own["engine"]["num_blocks"]
    assert "Turning off hybrid kv cache manager" not in one["log"]
    assert "stays out" not in one["log"] and "kvtier saves and loads" not in one["log"]
    assert_steps(one, own, [(i, i) for i in range(6)], "lfm2")
    # Round 2's prompts: round 1's attention blocks (3 and 7 before the states at 384 and 896)
    # and, in each of the 2 state groups, the state at the hit's end.
    assert metric(one, "hit_blocks_g2") >= 3 + 7, counters(one)
    assert metric(one, "hybrid_full_load_blocks") >= 3 + 7, counters(one)
    assert metric(one, "hybrid_state_load_blocks") >= 2 * 2, counters(one)
    assert metric(one, "hybrid_failed_loads") == 0, counters(one)
    # A new process: round 1's prompts come from G3 (as round 2's repeats came from vLLM's own
    # cache in the reference), round 2's from G2 and G3.
    two = run_vllm(tmp, "lfm2-restart", lfm2, steps, config, **LFM2_EXTRA)
    assert_steps(two, own, [(0, 4), (1, 5)] + [(i, i) for i in range(2, 6)],
                 "lfm2 after a restart")
    assert metric(two, "hit_blocks_g3") >= 3 + 7, counters(two)
    assert metric(two, "hybrid_state_load_blocks") >= 2 * 2 * 2, counters(two)
    assert metric(two, "hybrid_failed_loads") == 0, counters(two)


def test_lfm2_attached_to_kvtier_serve_equals_vllm(tmp: Path, lfm2: Path,
                                                   lfm2_own: Dict[str, Any]) -> None:
    # The same rounds attached to a `kvtier serve` daemon: the scheduler's state probes go to
    # the daemon, the states through its G2.
    sock = tmp / "serve-lfm2.sock"
    daemon = ServeDaemon(tmp / "serve-lfm2.log", sock, g2_bytes="512MiB")
    try:
        r = run_vllm(tmp, "lfm2-attached", lfm2, lfm2_rounds(),
                     {"service.socket": str(sock), "service.instance": "lfm2"}, **LFM2_EXTRA)
        assert daemon.proc.poll() is None, "kvtier serve died with a state-space hybrid attached"
    finally:
        daemon.stop()
    assert "kvtier: attached to kvtier serve at" in r["log"], "the engine did not attach"
    assert_steps(r, lfm2_own, [(i, i) for i in range(6)], "lfm2 attached")
    assert metric(r, "hybrid_full_load_blocks") >= 3 + 7, counters(r)
    assert metric(r, "hybrid_state_load_blocks") >= 2 * 2, counters(r)
    assert metric(r, "hybrid_failed_loads") == 0, counters(r)

"""bench/gpu_vllm034.py without a GPU: its argument handling, its loud skip, and its whole path
on host memory (--cpu-stand-in: vLLM 0.34's ExtensibleKVCache logic over a stand-in for the
cuMem*-backed ExtensibleTensor, kvtier's host copy path), including that its checks fail when
kvtier describes the memory wrongly. What only a GPU shows (CUDA virtual memory, kvtier's CUDA
copies) it cannot: docs/cuda.md, "vLLM 0.34 extensible KV cache".

Run with vLLM 0.34's Python (tests/vllm/run.sh BUILD --vllm=0.34.0 test_gpu_vllm034.py;
ctest vllm_gpu_vllm034_script_test). Each case starts a Python that imports vLLM (10-25 s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest

from vllm_under_test import installed_vllm

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_vllm034.py"

if not installed_vllm()[0].startswith("0.34"):
    pytest.skip(f"bench/gpu_vllm034.py checks vLLM 0.34's extensible KV cache; this is vLLM "
                f"{installed_vllm()[0]} (run.sh --vllm=0.34.0)", allow_module_level=True)


def run(args: List[str], tmp_path: Path) -> Tuple[int, str, dict]:
    out = tmp_path / "result.json"
    p = subprocess.run([sys.executable, str(SCRIPT), "--json", str(out), *args],
                       capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, VLLM_TARGET_DEVICE="cpu"))
    said = p.stdout + p.stderr
    return p.returncode, said, json.loads(out.read_text()) if out.exists() else {}


def test_every_layout_and_the_connector_round_trip_on_host_memory(tmp_path: Path) -> None:
    rc, said, res = run(["--cpu-stand-in"], tmp_path)
    assert rc == 0, said[-5000:]
    assert res["vllm"].startswith("0.34") and res["stand_in"] and res["ok"]
    assert set(res["checks"]) == {"layout_LBNHC", "layout_LBHNC", "layout_BLNHC",
                                  "layout_BLHNC", "layout_BHLNC", "layout_LHBNC",
                                  "connector"}, res["checks"].keys()
    for name, check in res["checks"].items():
        assert check["ok"], (name, check)
        if name in ("layout_BHLNC", "layout_LHBNC"):  # a block is one range per head there
            assert "round_trip" not in check and check["refused"].startswith("kvtier: "), check
            continue
        trip = check["round_trip"]
        assert trip["mismatched_bytes"] == 0 and trip["overwritten_neighbour_bytes"] == 0
        assert trip["bytes_checked"] == 8 * 4 * 64 * 1024, trip  # 8 blocks, 4 layers, 64 KiB
        assert trip["by_tier"] == [0, 8, 0, 0], trip  # all eight from G2
    assert res["checks"]["connector"]["connector"] == "KvtierConnector"
    # The layer-outermost layouts give each layer its own segment; block-outermost one.
    assert res["checks"]["layout_LBNHC"]["physical_chunks"] > res["checks"]["layout_BLNHC"][
        "physical_chunks"]


def test_a_wrong_region_fails_both_the_layout_check_and_the_bytes(tmp_path: Path) -> None:
    rc, said, res = run(["--cpu-stand-in", "--layouts", "LBNHC", "--no-connector",
                         "--fault", "region"], tmp_path)
    assert rc == 1, said[-3000:]
    check = res["checks"]["layout_LBNHC"]
    assert not check["ok"] and not res["ok"]
    assert "kvtier's region starts at" in check["error"], check["error"]
    assert "'mismatched_bytes': 0," not in check["error"], check["error"]
    assert "FAIL layout_LBNHC" in said and "FAILED" in said


def test_without_a_gpu_it_skips_loudly_and_checks_nothing(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the script runs for real here")
    rc, said, res = run([], tmp_path)
    assert rc == 77, said[-3000:]
    assert "SKIPPED: no usable GPU" in said and "nothing was checked" in said
    assert res == {}


@pytest.mark.parametrize("args, expect", [
    (["--cpu-stand-in", "--layouts", "LBNHC,NOPE"], "unknown layout(s) ['NOPE']"),
    (["--cpu-stand-in", "--fault", "everything"], "invalid choice"),
])
def test_usage_errors_exit_2(args: List[str], expect: str, tmp_path: Path) -> None:
    rc, said, _ = run(args, tmp_path)
    assert rc == 2, said[-3000:]
    assert expect in said, said[-3000:]

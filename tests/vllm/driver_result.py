"""What the vLLM tests read from the result of a tools/vllm/driver.py run (its JSON: the
steps' outputs and vLLM's metrics, kvtier's among them under vllm:kvtier_*)."""

from __future__ import annotations

from typing import Any, Dict, List


def outputs(result: Dict[str, Any], step: int = -1) -> List[List[int]]:
    """The token ids each prompt of step `step` produced."""
    return result["steps"][step]["outputs"]


def metric(result: Dict[str, Any], name: str) -> float:
    """kvtier's metric `name` (vllm:kvtier_<name>) at the end of the run; 0 when absent."""
    return result["metrics"].get(f"vllm:kvtier_{name}", 0.0)


def counters(result: Dict[str, Any]) -> str:
    """The run's non-zero kvtier metrics, one line (an assertion's message, never cut)."""
    return ", ".join(f"{k[len('vllm:kvtier_'):]}={v:g}"
                     for k, v in sorted(result["metrics"].items())
                     if k.startswith("vllm:kvtier_") and v)

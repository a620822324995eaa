"""What vLLM needs to build its classes on this machine, for the tests here.

vLLM 0.34's CPU platform refuses to build a VllmConfig on x86 without triton-cpu ("vLLM on x86
CPUs requires Triton"). The scheduler-level tests (sched_harness.py) build vLLM's Scheduler,
not its model runner, so no Triton kernel ever runs: they stand in for that check when vLLM
has no Triton. 0.32 and 0.33 do not ask. The end-to-end tests run the 0.32 CPU engine, whose
check passes on its own.
"""

from __future__ import annotations

try:
    import vllm.triton_utils as _triton_utils
except ImportError:  # pragma: no cover - vLLM missing: the tests skip on their own
    _triton_utils = None

if _triton_utils is not None and not getattr(_triton_utils, "HAS_TRITON", True):
    _triton_utils.HAS_TRITON = True

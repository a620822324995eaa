"""kvtier's start-up check (kvtier/vllm/compat.py) against the vLLM under test, and its
refusals: a vLLM whose structures differ from what kvtier reads is refused with a message
naming the change and the last tested version, never run.

Run under every vLLM of the matrix (tests/vllm/run.sh, --vllm=VERSION; ctest vllm_compat_test
and vllm_v0330/v0340_scheduler_test). The refusals patch one class at a time, the way a
vLLM release would move a structure, and build vLLM's real Scheduler with KvtierConnector
(tests/vllm/sched_harness.py): the engine does not start.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Tuple

import pytest
import vllm

from kvtier.vllm import compat
from kvtier.vllm import connector as connector_module
# Imported before any test patches a class: vLLM's modules bind the classes they import.
from sched_harness import Harness, reference_output

MODEL = os.environ.get("KVTIER_TEST_VLLM_MODEL", "")


@pytest.fixture(autouse=True)
def fresh_check(monkeypatch: pytest.MonkeyPatch) -> None:
    # The connector checks once per process: every test here checks again.
    monkeypatch.setattr(connector_module, "_VOUCHED", None)


def test_the_vllm_under_test_is_the_one_asked_for() -> None:
    want = os.environ.get("KVTIER_TEST_VLLM_VERSION")
    if not want:
        pytest.skip("KVTIER_TEST_VLLM_VERSION is not set (run.sh sets it with --vllm=VERSION)")
    assert vllm.__version__.startswith(want), (vllm.__version__, want, vllm.__file__)


def test_every_structure_kvtier_reads_is_as_it_expects_on_this_vllm() -> None:
    report = compat.check_vllm()
    assert report.tested, report.version
    assert not report.problems
    assert len(report.checked) >= 40, report.checked
    assert compat.is_tested(vllm.__version__)


@pytest.mark.parametrize("text,parsed", [("0.34.0", (0, 34, 0)), ("0.33.1rc2+cu130", (0, 33, 1)),
                                         ("0.32.0+cpu", (0, 32, 0)), ("v1.2", (1, 2, 0)),
                                         ("", (0, 0, 0)), ("dev", (0, 0, 0))])
def test_versions_parse(text: str, parsed: Tuple[int, int, int]) -> None:
    assert compat.parse_version(text) == parsed


# One change a vLLM release could make to each kind of structure kvtier reads.
def _drop_field(module: str, cls_name: str, field: str) -> Callable[[pytest.MonkeyPatch], str]:
    def patch(mp: pytest.MonkeyPatch) -> str:
        import importlib

        mod = importlib.import_module(module)
        cls = getattr(mod, cls_name)
        kept = [(f.name, f.type, f) for f in dataclasses.fields(cls) if f.name != field]
        changed = dataclasses.make_dataclass(cls_name, [(n, t, f) for n, t, f in kept])
        mp.setattr(mod, cls_name, changed)
        return f"{cls_name} has no field '{field}'"
    return patch


def _new_abstract(mp: pytest.MonkeyPatch) -> str:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    mp.setattr(KVConnectorBase_V1, "__abstractmethods__",
               frozenset(KVConnectorBase_V1.__abstractmethods__ | {"get_block_layout"}))
    return "new abstract methods ['get_block_layout']"


def _changed_signature(mp: pytest.MonkeyPatch) -> str:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    def get_num_new_matched_tokens(self: Any, request: Any, num_local_hit: int,
                                   num_computed_tokens: int) -> Any:
        raise NotImplementedError

    mp.setattr(KVConnectorBase_V1, "get_num_new_matched_tokens", get_num_new_matched_tokens)
    return "get_num_new_matched_tokens takes (request, num_local_hit, num_computed_tokens)"


def _request_without_skip_flags(mp: pytest.MonkeyPatch) -> str:
    import inspect

    from vllm.v1.request import Request

    source = inspect.getsource(Request)
    for name in ("skip_reading_external_kv", "skip_reading_prefix_cache"):
        source = source.replace(name, "kv_read_policy")
    mp.setattr(inspect, "getsource", lambda obj: source if obj is Request else _getsource(obj))
    if isinstance(inspect.getattr_static(Request, "skip_reading_external_kv", None), property):
        mp.delattr(Request, "skip_reading_external_kv")
    return "Request sets none of skip_reading_external_kv, skip_reading_prefix_cache"


_getsource = __import__("inspect").getsource


def _hit_source_renamed(mp: pytest.MonkeyPatch) -> str:
    import enum

    import vllm.v1.metrics.cache_hit_source as chs

    mp.setattr(chs, "CacheHitSource", enum.Enum("CacheHitSource", ["CPU", "DISK", "REMOTE"]))
    return "CacheHitSource lacks ['HOST', 'EXTERNAL_UNSPECIFIED']"


CHANGES: Dict[str, Callable[[pytest.MonkeyPatch], str]] = {
    "scheduler-output-field": _drop_field("vllm.v1.core.sched.output", "SchedulerOutput",
                                          "scheduled_cached_reqs"),
    "cached-request-field": _drop_field("vllm.v1.core.sched.output", "CachedRequestData",
                                        "new_block_ids"),
    "new-request-field": _drop_field("vllm.v1.core.sched.output", "NewRequestData", "block_ids"),
    "connector-output-field": _drop_field("vllm.v1.outputs", "KVConnectorOutput",
                                          "invalid_block_ids"),
    "new-abstract-method": _new_abstract,
    "changed-signature": _changed_signature,
    "request-attribute": _request_without_skip_flags,
    "enum-member": _hit_source_renamed,
}


@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize("version", ["this", "0.35.0"])
def test_a_changed_structure_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch, change: str,
                                                  version: str) -> None:
    named = CHANGES[change](monkeypatch)
    v = vllm.__version__ if version == "this" else version
    with pytest.raises(compat.VllmNotVouched) as e:
        compat.check_vllm(v)
    message = str(e.value)
    assert named in message, message
    assert f"vLLM {v}" in message
    if version == "this":
        assert "classes differ from the release's" in message
    else:
        assert f"last tested: {compat.LAST_TESTED}" in message
    assert "0.32, 0.33, 0.34" in message


def test_an_untested_version_with_every_structure_as_expected_runs_and_says_what_it_checked(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compat, "vllm_version", lambda: "0.35.0")
    report = compat.check_vllm()
    assert not report.tested and not report.problems
    caplog.set_level(logging.INFO)
    connector_module._vouch_for_vllm()
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "vLLM 0.35.0 (not tested)" in logged, logged
    assert "every check passed" in logged and "SchedulerOutput.scheduled_new_reqs" in logged


# ---- the engine does not start --------------------------------------------------------------


@pytest.fixture
def tmp() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="kvtier-compat-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _harness(tmp: Path) -> Any:
    if not MODEL or not Path(MODEL).is_dir():
        pytest.skip(f"KVTIER_TEST_VLLM_MODEL ({MODEL!r}) is not a model folder; run "
                    f"tests/vllm/run.sh")
    return Harness(MODEL, {"g2.capacity_bytes": "32MiB", "g2.lock_memory": False,
                           "g3.enabled": False})


@pytest.mark.parametrize("change", ["cached-request-field", "request-attribute",
                                    "new-abstract-method"])
def test_vllms_scheduler_with_kvtier_does_not_start_on_a_changed_vllm(
        monkeypatch: pytest.MonkeyPatch, tmp: Path, change: str) -> None:
    named = CHANGES[change](monkeypatch)
    with pytest.raises(compat.VllmNotVouched, match="kvtier refuses to run") as e:
        _harness(tmp)
    assert named in str(e.value)


def test_vllms_scheduler_with_kvtier_runs_on_this_vllm(tmp: Path) -> None:
    h = _harness(tmp)
    try:
        prompt: List[int] = [3000 + i for i in range(40)]
        h.add("r0", prompt, max_tokens=4)
        h.run()
        assert h.outputs["r0"] == reference_output(prompt, 4)
    finally:
        h.shutdown()


# ---- requests vLLM takes no connector KV for --------------------------------------------------


def _spy_on_lookups(h: Any) -> Dict[str, List[Any]]:
    """Every answer the scheduler's connector gives vLLM, per request."""
    answers: Dict[str, List[Any]] = {}
    real = h.connector.get_num_new_matched_tokens

    def spy(request: Any, num_computed_tokens: int) -> Any:
        out = real(request, num_computed_tokens)
        answers.setdefault(request.request_id, []).append(out)
        return out

    h.connector.get_num_new_matched_tokens = spy
    return answers


def test_a_request_that_skips_cache_reads_is_not_looked_up_for_loads(tmp: Path) -> None:
    # skip_reading_prefix_cache (0.32/0.33), skip_reading_external_kv (0.34, set by
    # prefix_cache_hit_limit): vLLM zeroes a connector's hit itself, so a load planned for it
    # would only pin blocks, query G4 and count hits that never happen. kvtier plans none and
    # still saves the request's blocks.
    h = _harness(tmp)
    try:
        bs = h.block_size
        prompt = [4000 + i for i in range(6 * bs + 3)]
        h.add("first", prompt, max_tokens=2)
        h.run()
        h.scheduler.reset_prefix_cache()
        m = h.worker.connector_worker._manager
        before = m.stats()
        pinned: List[int] = []
        h.hooks_before_execute.append(lambda hh, so: pinned.append(m.stats()["pinned_blocks"]))
        answers = _spy_on_lookups(h)
        h.add("skip", prompt, max_tokens=2, skip_reading_prefix_cache=True)
        h.run()
        h.hooks_before_execute.pop()
        after = m.stats()
        # Nothing offered: no hit counted, nothing planned, no G4 query (load_tiers none).
        assert answers and all(a == (0, False) for a in answers["skip"]), answers
        assert h.outputs["skip"] == reference_output(prompt, 2)
        assert after["hit_blocks"] == before["hit_blocks"], (before["hit_blocks"],
                                                             after["hit_blocks"])
        # Found at the lookup, as if it would load (counted), and held while it ran (pinned).
        assert after["lookup_blocks"] == before["lookup_blocks"], (before["lookup_blocks"],
                                                                   after["lookup_blocks"])
        assert max(pinned) == 0, pinned
        # The same prompt without the flag loads (the blocks are there).
        h.scheduler.reset_prefix_cache()
        h.add("reads", prompt, max_tokens=2)
        h.run()
        assert h.outputs["reads"] == reference_output(prompt, 2)
        assert m.stats()["hit_blocks"]["G2"] == before["hit_blocks"]["G2"] + 6
    finally:
        h.shutdown()


def test_prompt_logprobs_bound_the_hit_on_vllm_034(tmp: Path) -> None:
    # 0.34 bounds a request that asks for prompt logprobs (prefix_cache_hit_limit) and then
    # reads no connector KV for it (skip_reading_external_kv).
    if compat.parse_version(vllm.__version__)[:2] < (0, 34):
        pytest.skip(f"vLLM {vllm.__version__} has no prefix_cache_hit_limit (0.34 added it)")
    h = _harness(tmp)
    try:
        bs = h.block_size
        prompt = [6000 + i for i in range(4 * bs + 1)]
        h.add("first", prompt, max_tokens=2)
        h.run()
        h.scheduler.reset_prefix_cache()
        before = h.worker.connector_worker._manager.stats()["hit_blocks"]
        looked = h.worker.connector_worker._manager.stats()["lookup_blocks"]
        answers = _spy_on_lookups(h)
        h.add("logprobs", prompt, max_tokens=2, prompt_logprobs=1)
        req = h.scheduler.requests["logprobs"]
        assert compat.prefix_cache_hit_limit(req) is not None and compat.skips_external_kv(req)
        h.run()
        assert h.worker.connector_worker._manager.stats()["hit_blocks"] == before
        assert h.worker.connector_worker._manager.stats()["lookup_blocks"] == looked
        assert all(a == (0, False) for a in answers["logprobs"]), answers
    finally:
        h.shutdown()

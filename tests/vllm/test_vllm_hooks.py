"""KvtierConnector's answers to vLLM's newer connector hooks (docs/vllm.md, "Sleep mode,
may_load_async, lookahead hashes"), driven through vLLM's own Scheduler on the CPU
(tests/vllm/sched_harness.py).

- Sleep mode (0.33+ calls unregister_kv_caches / restore_kv_caches; here they are called as
  vLLM's worker calls them, so the tests also run on 0.32, which has no such hooks): kvtier's
  own saves and loads end before unregister_kv_caches returns, nothing of kvtier's reads or
  writes the KV cache while it is away (it is scribbled over meanwhile and checked), KV from
  before a sleep that reset the connector is never served, and with reset_connector=False (the
  same weights) it is. A step vLLM runs while asleep gets no load and saves nothing; a KV
  cache that comes back elsewhere is refused; vLLM 0.32 with --enable-sleep-mode is refused.
- may_load_async (0.34's --max-num-inflight-kv-loads; called directly on older vLLMs): True
  exactly for the requests whose lookup finds a G3/G4 (asynchronous) load, and on 0.34 such a
  request starts its load while the running batch is full.

Run by tests/vllm/run.sh BUILD [--vllm=0.33.0|0.34.0] test_vllm_hooks.py.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest
import torch

from sched_harness import Harness, check, config, g3_config, hits, reference_output

MODEL = os.environ.get("KVTIER_TEST_VLLM_MODEL", "")
if not MODEL or not Path(MODEL).is_dir():
    pytest.skip(f"KVTIER_TEST_VLLM_MODEL ({MODEL!r}) is not a model folder; run tests/vllm/run.sh",
                allow_module_level=True)

from kvtier.vllm import compat  # noqa: E402  (after the skip: needs vLLM)
from kvtier.vllm.sleep import KvtierSleepError  # noqa: E402

BS = 16
SCRIBBLE = -7.0  # what "vLLM" writes over its KV cache while asleep


def prompt(seed: int, n: int) -> List[int]:
    return [5000 + seed * 997 + i for i in range(n)]


@pytest.fixture
def tmp() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="kvtier-hooks-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def fill_g3(tmp: Path, reqs: Dict[str, List[int]]) -> None:
    h = Harness(MODEL, g3_config(tmp))
    for rid, p in reqs.items():
        h.add(rid, p, max_tokens=2)
    h.run()
    check(h, list(reqs))
    h.shutdown()  # the clean shutdown writes G2 to G3: the next harness finds them in G3 only


def untouched(h: Harness) -> bool:
    return bool((h.kv_storage == SCRIBBLE).all())


class HeldSaves:
    """The worker's manager with StartSave withheld until release(): what the last steps
    committed is still to be copied out of G1 when vLLM pauses (on a GPU: copies in flight)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.held = True

    def start_save(self, *args: Any) -> Any:
        return None if self.held else self._inner.start_save(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


# ---------------------------------------------------------------------------------------------
# Sleep mode
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("reset_connector", [True, False], ids=["reset", "same-weights"])
def test_sleep_drains_kvtiers_saves_and_serves_old_kv_only_without_a_reset(
        tmp: Path, reset_connector: bool) -> None:
    h = Harness(MODEL, config(tmp))
    held = HeldSaves(h.worker.connector_worker._manager)
    h.worker.connector_worker._manager = held
    reqs = {f"s{i}": prompt(i, 4 * BS + 5) for i in range(3)}
    for rid, p in reqs.items():
        h.add(rid, p, max_tokens=30)
    h.run(until=lambda: all(len(h.outputs[r]) >= 6 for r in reqs))
    assert h.worker.connector_worker._manager.stats()["saved_blocks"] == 0, \
        "the saves are still to be copied"
    # vLLM's sleep (pause mode "keep", then level 1): the running requests are preempted and
    # the prefix cache reset (the connector's too unless reset_connector=False); the worker
    # hears of the preemption only at the next step, after the wake-up.
    assert h.scheduler.reset_prefix_cache(reset_running_requests=True,
                                          reset_connector=reset_connector)
    h.worker.unregister_kv_caches()
    drained = h.worker.connector_worker._manager.stats()
    assert drained["saved_blocks"] + drained["dropped_saves"] >= 3 * 4, drained
    h.worker.connector_worker._manager.wait_for_saves()  # nothing was left to start
    again = h.worker.connector_worker._manager.stats()
    assert (again["saved_blocks"], again["dropped_saves"]) == \
        (drained["saved_blocks"], drained["dropped_saves"])
    h.worker.unregister_kv_caches()  # idempotent
    # Asleep: the memory is vLLM's to free or remap. Nothing of kvtier's may touch it.
    h.kv_storage.fill_(SCRIBBLE)
    assert h.worker.get_finished(set()) == (None, None)
    time.sleep(0.05)
    assert untouched(h), "kvtier wrote into the KV cache while it was unregistered"
    h.worker.restore_kv_caches()
    h.worker.restore_kv_caches()  # idempotent
    held.held = False
    before = hits(h)["G2"]
    h.run()
    check(h, list(reqs))
    resumed = hits(h)["G2"] - before
    if reset_connector:
        assert resumed == 0, "KV saved before the reset was served after it"
    else:
        assert resumed >= 3 * 4, "the same weights: the resumed requests load their prefixes"
    # A second turn with vLLM's own cache empty: kvtier serves what it saved, before the sleep
    # (same weights) or after the reset; either way the answers are exact.
    h.scheduler.reset_prefix_cache()
    before = hits(h)["G2"]
    for rid, p in reqs.items():
        h.add(f"{rid}-2", p, max_tokens=4)
    h.run()
    check(h, [f"{r}-2" for r in reqs])
    assert hits(h)["G2"] - before >= 3 * 4
    assert h.worker_counters["sleep_unregisters"] == 1, h.worker_counters
    h.shutdown()


def test_sleep_waits_for_loads_in_flight_and_nothing_writes_g1_while_asleep(tmp: Path) -> None:
    # Long prompts: each G3 load reads tens of MiB with O_DIRECT, still in flight when the
    # pause reaches the worker.
    reqs = {f"a{i}": prompt(i, 40 * BS + 5) for i in range(4)}
    fill_g3(tmp, reqs)
    h = Harness(MODEL, g3_config(tmp), num_blocks=200, max_num_batched_tokens=1024)
    for rid, p in reqs.items():
        h.add(f"{rid}-b", p, max_tokens=4)
    h.step()  # lookups: every request waits for its G3 load (WAITING_FOR_REMOTE_KVS)
    loading = [r for r in h.scheduler.requests.values()
               if r.status.name == "WAITING_FOR_REMOTE_KVS"]
    assert len(loading) == 4, [r.status for r in h.scheduler.requests.values()]
    # vLLM's pause (mode "abort"): every request is aborted; unregister_kv_caches comes before
    # the worker has heard of it (the worker's drain must not rely on vLLM's).
    h.abort([f"{r}-b" for r in reqs])
    h.worker.unregister_kv_caches()
    h.kv_storage.fill_(SCRIBBLE)
    time.sleep(0.2)
    assert untouched(h), "a load wrote into the KV cache after unregister_kv_caches returned"
    h.worker.restore_kv_caches()
    h.run()  # the aborted loads are reported (finished_recving) and their blocks freed
    check(h, [])
    # After the wake-up the same prompts load again, exactly.
    h.scheduler.reset_prefix_cache()
    for rid, p in reqs.items():
        h.add(f"{rid}-c", p, max_tokens=4)
    h.run()
    check(h, [f"{r}-c" for r in reqs])
    assert hits(h)["G3"] + hits(h)["G2"] >= 4 * 40, hits(h)
    h.shutdown()


def test_a_step_while_asleep_loads_nothing_and_saves_nothing(tmp: Path) -> None:
    h = Harness(MODEL, config(tmp))
    p = prompt(1, 6 * BS + 3)
    h.add("warm", p, max_tokens=2)
    h.run()
    check(h, ["warm"])
    h.scheduler.reset_prefix_cache()
    # vLLM plans a G2 load (the lookup ran while awake), then the worker is unregistered before
    # the step runs: the load must not start; its blocks are reported and vLLM computes them.
    h.add("planned", p, max_tokens=3)
    h.hooks_before_execute.append(lambda hh, so: hh.worker.unregister_kv_caches())
    g2 = hits(h)["G2"]
    h.step()
    h.hooks_before_execute.clear()
    assert h.worker_counters["sleep_refused_loads"] == 1, h.worker_counters
    assert h.invalid_blocks_by_step, "the refused load's blocks were not reported"
    # More steps while asleep: a lookup misses, nothing is saved.
    h.add("asleep", prompt(2, 5 * BS + 1), max_tokens=2)
    h.add("asleep-hit", p, max_tokens=2)
    h.run()
    check(h, ["planned", "asleep", "asleep-hit"])
    assert hits(h)["G2"] == g2, "kvtier loaded while asleep"
    assert h.worker_counters["sleep_skipped_saves"] >= 1, h.worker_counters
    assert not [c for c in h.commits if c.key.split("#")[0] in ("planned", "asleep")]
    h.worker.restore_kv_caches()
    h.scheduler.reset_prefix_cache()
    h.add("awake", p, max_tokens=2)
    h.run()
    check(h, ["awake"])
    assert hits(h)["G2"] >= g2 + 6, "awake again: kvtier serves"
    h.shutdown()


def test_loads_refused_while_asleep_are_reported_failed_in_every_form() -> None:
    # The worker side alone (no vLLM step): an async load, a hybrid load (every group) and a
    # sync load planned while asleep. None starts; vLLM hears each as failed in the form it
    # reads for that kind of load, and computes the blocks.
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,
                                            KVCacheGroupSpec, SlidingWindowSpec)

    from kvtier.vllm.groups import plan_groups
    from kvtier.vllm.metadata import LoadSpec
    from kvtier.vllm.worker import KvtierWorker

    spec = dict(block_size=BS, num_kv_heads=2, head_size=64, dtype=torch.float32)
    hybrid = KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["model.layers.0.attn"], SlidingWindowSpec(sliding_window=BS, **spec)),
        KVCacheGroupSpec(["model.layers.1.attn"], FullAttentionSpec(**spec))])
    c = object.__new__(KvtierWorker)
    c._init_state()
    c._groups = plan_groups(hybrid, BS)
    c._block_size = BS
    c._manager = object()  # any call to it would fail the test
    c._g1.suspended = True
    c._refuse_loads([
        LoadSpec("h#0", [1, 2, 3], 3 * BS, 0, True, group_block_ids=[[0, 2, 3], [1, 2, 3]]),
        LoadSpec("a#0", [4, 5, 6], 3 * BS, 0, True),
        LoadSpec("s#0", [7, 8, 9], 2 * BS, BS, False)])
    sending, recving = c.get_finished(set())
    assert sending is None and recving == {"h", "a"}
    assert c._failed_recving == {"h"}  # hybrid: the whole load failed (recomputed)
    assert c.get_block_ids_with_load_errors() == {4, 5, 6, 8, 9}
    assert c._worker_counts["sleep_refused_loads"] == 3


def test_a_kv_cache_that_comes_back_elsewhere_is_refused_for_good(tmp: Path) -> None:
    h = Harness(MODEL, config(tmp))
    p = prompt(3, 6 * BS + 3)
    h.add("warm", p, max_tokens=2)
    h.run()
    h.worker.unregister_kv_caches()
    name = h.layer_names[1]
    with torch.no_grad():
        h.kv[name].set_(torch.zeros_like(h.kv[name]))  # the layer's tensor now elsewhere
    with pytest.raises(KvtierSleepError, match=rf"{name} \(0x[0-9a-f]+ -> 0x"):
        h.worker.restore_kv_caches()
    with pytest.raises(KvtierSleepError):
        h.worker.restore_kv_caches()
    assert h.worker.connector_worker._worker_counts["sleep_address_changes"] == 2
    # kvtier stays off the KV cache: the prompt it holds is computed, not loaded.
    h.scheduler.reset_prefix_cache()
    g2 = hits(h)["G2"]
    h.add("after", p, max_tokens=2)
    h.run()
    assert hits(h)["G2"] == g2
    assert h.outputs["after"] == reference_output(p, 2)
    h.shutdown()


def test_sleep_mode_needs_the_hooks(tmp: Path) -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    from kvtier.vllm import KvtierConnector

    h = Harness(MODEL, config(tmp))
    mc = h.vllm_config.model_config
    kvc = h.vllm_config.kv_transfer_config
    assert KvtierConnector.supports_lookahead_block_hashes(kvc) is False
    saved = mc.enable_sleep_mode
    try:
        # (The CPU platform refuses --enable-sleep-mode itself: set after the config is built.)
        object.__setattr__(mc, "enable_sleep_mode", True)
        if compat.has_sleep_hooks():
            assert KvtierConnector.supports_sleep_mode(kvc) is True
            KvtierConnector(h.vllm_config, KVConnectorRole.SCHEDULER,
                            h.kv_cache_config).shutdown()
        else:  # 0.32: vLLM would free the KV cache under kvtier's copies
            assert KvtierConnector.supports_sleep_mode(kvc) is False
            with pytest.raises(ValueError, match="sleep mode without telling its KV connector"):
                KvtierConnector(h.vllm_config, KVConnectorRole.SCHEDULER, h.kv_cache_config)
    finally:
        object.__setattr__(mc, "enable_sleep_mode", saved)
    h.shutdown()


def test_the_start_up_check_reads_the_new_hooks_only_where_vllm_has_them() -> None:
    # A hook vLLM lacks (0.32) passes; one whose leading parameters differ from kvtier's is a
    # refusal, as for every method vLLM calls (compat.check_vllm; a parameter added after them
    # passes, as there).
    class Old:
        pass

    class Moved:
        def may_load_async(self, request: Any, budget: int) -> bool:
            return False

    class Renamed:
        def may_load_async(self, req: Any) -> bool:
            return False

    assert compat._optional_method(Old, "may_load_async", ("request",))() is None
    assert compat._optional_method(Moved, "may_load_async", ("request",))() is None
    why = compat._optional_method(Renamed, "may_load_async", ("request",))()
    assert why is not None and "may_load_async takes (req)" in why, why
    assert compat.check_vllm().problems == []


# ---------------------------------------------------------------------------------------------
# may_load_async
# ---------------------------------------------------------------------------------------------


def _predict_then_schedule(h: Harness, reqs: Dict[str, Any]) -> Dict[str, bool]:
    """Adds each request, asks may_load_async as vLLM would when it enters the waiting queue,
    then runs one step and returns what each request's lookup answered (async or not)."""
    predicted = {}
    for rid, (p, params) in reqs.items():
        h.add(rid, p, max_tokens=2, kv_transfer_params=params)
        predicted[rid] = h.connector.may_load_async(h.scheduler.requests[rid])
        h.connector.connector_scheduler._reqs[rid].lookup_async = None  # type: ignore[assignment]
    h.step()  # every request is looked up by the scheduler in this step
    actual = {rid: h.connector.connector_scheduler._reqs[rid].lookup_async for rid in reqs}
    assert all(isinstance(a, bool) for a in actual.values()), actual
    for rid in reqs:
        assert predicted[rid] == actual[rid], (rid, predicted, actual)
    return predicted


def test_may_load_async_is_true_exactly_for_g3_loads(tmp: Path) -> None:
    cold = {"g3": prompt(1, 6 * BS + 3)}
    fill_g3(tmp, cold)
    h = Harness(MODEL, g3_config(tmp), num_blocks=96, max_num_seqs=8,
                max_num_batched_tokens=1024)
    # The consumer below waits for nothing.
    h.connector.connector_scheduler._settings.pd_wait_ms = 20
    h.add("g2", prompt(2, 6 * BS + 3), max_tokens=2)
    h.run()
    h.scheduler.reset_prefix_cache()
    got = _predict_then_schedule(h, {
        "g3-hit": (cold["g3"], None),
        "g2-hit": (prompt(2, 6 * BS + 3), None),
        "miss": (prompt(3, 6 * BS + 3), None),
        "g3-but-g2-only": (cold["g3"], {"kvtier": {"load_tiers": ["G2"]}}),
        "g3-but-no-load": (cold["g3"], {"kvtier": {"load": False}}),
        "one-block": (cold["g3"][:BS], None),
    })
    assert got == {"g3-hit": True, "g2-hit": False, "miss": False, "g3-but-g2-only": False,
                   "g3-but-no-load": False, "one-block": False}
    counts = h.scheduler_counters + h.connector.connector_scheduler._sched_counts
    # The requests that could not load asynchronously were answered without a lookup.
    assert counts["async_probes"] == 3, counts
    # A P/D consumer waiting for a producer: its blocks may not be there yet to ask about.
    h.add("consumer", prompt(4, 6 * BS + 3), max_tokens=2, kv_transfer_params={
        "do_remote_prefill": True, "kvtier": {"expect_tokens": 6 * BS}})
    assert h.connector.may_load_async(h.scheduler.requests["consumer"]) is True
    h.run()
    check(h, list(got) + ["consumer"])
    h.shutdown()
    # Where nothing is asynchronous, no request is asked about.
    n = Harness(MODEL, g3_config(tmp, **{"g3.dir": str(tmp / "g3-other")}))
    n.connector.connector_scheduler._settings.async_load = "never"
    n.add("x", cold["g3"], max_tokens=2)
    assert n.connector.may_load_async(n.scheduler.requests["x"]) is False
    g2only = Harness(MODEL, config(tmp))
    g2only.add("y", cold["g3"], max_tokens=2)
    assert g2only.connector.may_load_async(g2only.scheduler.requests["y"]) is False
    for x in (n, g2only):
        counts = x.scheduler_counters + x.connector.connector_scheduler._sched_counts
        assert counts["async_probes"] == 0
        x.run()
        x.shutdown()


def test_may_load_async_late_lookup_says_true_and_is_reused(tmp: Path) -> None:
    cold = {"g3": prompt(5, 6 * BS + 3)}
    fill_g3(tmp, cold)
    h = Harness(MODEL, g3_config(tmp))
    # Over the socket, as between vLLM's processes (in one process the scheduler's client calls
    # the worker's lookup server directly, and every answer is in time).
    from kvtier.vllm import lookup as channel

    with channel._LOCAL_LOCK:
        del channel._LOCAL[h.worker.connector_worker._server._key]
    real_lookup = h.worker.connector_worker._manager.lookup
    calls = []

    def slow_lookup(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[2])  # num_computed_tokens
        time.sleep(0.02)  # longer than may_load_async waits
        return real_lookup(*args, **kwargs)

    h.worker.connector_worker._manager.lookup = slow_lookup
    h.add("late", prompt(6, 6 * BS + 3), max_tokens=2)  # a miss, but the answer comes late
    assert h.connector.may_load_async(h.scheduler.requests["late"]) is True
    counts = h.connector.connector_scheduler._sched_counts
    assert counts["async_probes_late"] == 1, counts
    h.run()
    check(h, ["late"])
    assert calls == [0], "the scheduler's lookup (from token 0) took over the late one"
    h.shutdown()


def test_may_load_async_lets_vllm_start_g3_loads_while_the_batch_is_full(tmp: Path) -> None:
    # vLLM 0.34: with --max-num-inflight-kv-loads, a request may_load_async says True for waits
    # in its own queue, whose loads start even when no running slot is free.
    cold = {"g3": prompt(7, 8 * BS + 3)}
    fill_g3(tmp, cold)
    for k, hint in enumerate(("kvtier", "vllm-default")):
        h = Harness(MODEL, g3_config(tmp), max_num_seqs=1, num_blocks=96,
                    max_num_batched_tokens=512)
        sc = h.vllm_config.scheduler_config
        if not hasattr(sc, "max_num_inflight_kv_loads"):
            h.shutdown()
            pytest.skip(f"vLLM {compat.vllm_version()} has no --max-num-inflight-kv-loads "
                        f"(may_load_async is never asked)")
        sc.max_num_inflight_kv_loads = 2
        if hint == "vllm-default":  # the base class's answer: P/D remote prefill only
            from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
            h.connector.may_load_async = (  # type: ignore[method-assign]
                KVConnectorBase_V1.may_load_async.__get__(h.connector))
        h.add("long", prompt(8 + k, 3 * BS), max_tokens=40)  # a miss (G3 keeps the first's)
        h.step()
        h.step()  # "long" runs and takes the only running slot
        h.add("g3-hit", cold["g3"], max_tokens=2)
        h.step()
        status = h.scheduler.requests["g3-hit"].status.name
        assert "long" in h.scheduler.requests and h.outputs["long"], "still decoding"
        if hint == "kvtier":
            assert status == "WAITING_FOR_REMOTE_KVS", status  # loading while "long" runs
        else:
            assert status == "WAITING", status  # waits for the slot before its load starts
        h.run()
        check(h, ["long", "g3-hit"])
        assert hits(h)["G3"] >= 8, hits(h)
        h.shutdown()

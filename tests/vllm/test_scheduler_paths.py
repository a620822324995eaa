"""KvtierConnector under the paths vLLM takes on GPUs, driven through vLLM's own Scheduler and
AsyncScheduler on the CPU (tests/vllm/sched_harness.py): async scheduling, speculative decoding
with rejected drafts, chunked prefill, preemption and resume in one step, aborts while loads
are in flight, loads that fail (corrupt G3 files, corrupt G4 objects), per-request controls,
and the reset epoch across restarts.

Every test checks the answers (each request's tokens equal the arithmetic model's reference:
one wrong KV read poisons them), that every block kvtier commits is keyed with the request's
real tokens, that nothing is reported finished twice, and that nothing is left pinned.

Run by tests/vllm/run.sh (ctest: vllm_scheduler_test); KVTIER_TEST_VLLM_MODEL names the
converted model (only its configuration is read: no weights are loaded, nothing is computed).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from redis_util import redis_cli, start_redis
from sched_harness import Harness, check, config, g3_config, hits

MODEL = os.environ.get("KVTIER_TEST_VLLM_MODEL", "")
if not MODEL or not Path(MODEL).is_dir():
    pytest.skip(f"KVTIER_TEST_VLLM_MODEL ({MODEL!r}) is not a model folder; run tests/vllm/run.sh",
                allow_module_level=True)

BS = 16


def prompt(seed: int, n: int, shared: int = 0) -> List[int]:
    """n token ids; the first `shared` are common to every seed."""
    return [1000 + i for i in range(shared)] + [5000 + seed * 997 + i for i in range(n - shared)]


@pytest.fixture
def tmp() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="kvtier-sched-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("async_scheduling,spec", [(True, 0), (False, 3), (False, 0)],
                         ids=["async-scheduling", "spec-decode", "sync"])
def test_saves_key_only_real_tokens_and_multi_turn_reuse_is_exact(
        tmp: Path, async_scheduling: bool, spec: int) -> None:
    # Long decodes cross block boundaries while placeholders (async) or drafts (spec) are
    # counted in num_computed_tokens; the second turn's prompt holds the first's answer, so
    # its loads read blocks saved from decode steps (a rejected draft's KV would poison it).
    h = Harness(MODEL, config(tmp), async_scheduling=async_scheduling, num_spec_tokens=spec,
                max_num_batched_tokens=48)  # chunked prefill: prompts of 100+ tokens
    turn1 = {f"u{i}": prompt(i, 70 + 9 * i, shared=40) for i in range(3)}
    for rid, p in turn1.items():
        h.add(rid, p, max_tokens=40)
    h.run()
    check(h, list(turn1))
    h.scheduler.reset_prefix_cache()
    for rid, p in turn1.items():
        h.add(rid + "-t2", p + h.outputs[rid] + [7, 8, 9], max_tokens=12)
    h.run()
    check(h, [r + "-t2" for r in turn1])
    # Saved: the prompt and 39 generated tokens (the last one sampled has no KV); the 2 blocks
    # the prompts share come once from kvtier, then from vLLM's own cache.
    assert hits(h)["G2"] >= sum((70 + 9 * i + 39) // BS for i in range(3)) - 2 * 2, hits(h)
    # The worker's lookup server answered every lookup the scheduler made, and says so in the
    # counters vLLM exports (vllm:kvtier_lookup_server_*).
    counters = h.worker_counters
    assert counters["lookup_server_lookups"] >= 6, counters
    assert counters["lookup_server_lookup_errors"] == 0, counters
    h.shutdown()


def test_preempt_and_resume_in_one_step_keeps_the_planned_load(tmp: Path) -> None:
    h = Harness(MODEL, config(tmp))
    reqs = {f"p{i}": prompt(i, 60, shared=32) for i in range(3)}
    for rid, p in reqs.items():
        h.add(rid, p, max_tokens=30)
    # Run until every request has decoded past its prompt (its blocks are saved).
    h.run(until=lambda: all(len(h.outputs[r]) >= 10 for r in reqs))
    h.worker.connector_worker._manager.wait_for_saves()
    # reset_prefix_cache(reset_running_requests=True) preempts every running request and the
    # next step resumes them: the connector must load their prefixes in that same step.
    before = hits(h)["G2"]
    assert h.scheduler.reset_prefix_cache(reset_running_requests=True)
    h.run()
    check(h, list(reqs))
    assert hits(h)["G2"] > before, "the resumed requests loaded their prefixes from kvtier"
    h.shutdown()


def _fill_g3(tmp: Path, reqs: Dict[str, List[int]], **extra: Any) -> None:
    h = Harness(MODEL, g3_config(tmp, **extra))
    for rid, p in reqs.items():
        h.add(rid, p, max_tokens=2)
    h.run()
    check(h, list(reqs))
    h.shutdown()  # the clean shutdown writes G2 to G3


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async-scheduling"])
def test_aborts_while_loading_from_g3_never_crash_or_leak(tmp: Path,
                                                          async_scheduling: bool) -> None:
    # Long prompts: each load reads tens of MiB with O_DIRECT, so it is still in flight when
    # the abort reaches the worker.
    reqs = {f"a{i}": prompt(i, 40 * BS + 5, shared=0) for i in range(4)}
    _fill_g3(tmp, reqs)
    h = Harness(MODEL, g3_config(tmp), async_scheduling=async_scheduling, num_blocks=200,
                max_num_batched_tokens=1024)
    for rid, p in reqs.items():
        h.add(f"{rid}-again", p, max_tokens=6)
    h.add("never-scheduled", prompt(9, 40 * BS + 5), max_tokens=6)
    h.abort(["never-scheduled"])  # aborted before any step
    h.step()  # lookups: every request waits for its G3 load (WAITING_FOR_REMOTE_KVS)
    waiting = [r for r in h.scheduler.requests.values()
               if r.status.name == "WAITING_FOR_REMOTE_KVS"]
    assert len(waiting) == 4, [r.status for r in h.scheduler.requests.values()]
    h.abort(["a0-again", "a1-again"])  # while their loads are in flight
    h.step()
    h.abort(["a2-again"])  # a step later: its load may have ended, not yet processed
    h.run()
    check(h, ["a3-again"])
    assert hits(h)["G3"] >= 39, hits(h)
    h.shutdown()


def _corrupt_g3(g3: Path) -> None:
    # Damage every slot's payload (not the superblock): kvtier must refuse each block.
    for f in sorted(g3.rglob("g3-*.kvt")):
        size = f.stat().st_size
        with open(f, "r+b") as fh:
            for off in range(64 << 10, size, 256 << 10):
                fh.seek(off)
                fh.write(b"\xa5" * 512)


@pytest.mark.parametrize("async_load", ["never", "auto"], ids=["sync-load", "async-load"])
def test_failed_loads_are_recomputed_and_saved_good(tmp: Path, async_load: str) -> None:
    reqs = {f"f{i}": prompt(i, 12 * BS + 3, shared=4 * BS) for i in range(3)}
    _fill_g3(tmp, reqs)
    _corrupt_g3(tmp / "g3")
    # Every load fails; vLLM recomputes. No failed block may be committed in the step that
    # found it, and what is recomputed must be saved (good) later.
    # (Every block fails: a G3 that quarantines itself after 8 errors in a row would refuse the
    # recomputed blocks too; this test is about what is saved, so it keeps G3 open.)
    keep_open = {"async_load": async_load, "g3.quarantine_after_errors": 1000}
    h = Harness(MODEL, g3_config(tmp, **keep_open), num_blocks=96)
    for rid, p in reqs.items():
        h.add(f"{rid}-2", p, max_tokens=4)
    h.run()
    check(h, [f"{r}-2" for r in reqs])
    stats = h.worker.connector_worker._manager.stats()
    assert stats["corrupt_blocks"] > 0, stats
    assert h.invalid_blocks_by_step, "the failed loads were reported to vLLM"
    for step, bad in h.invalid_blocks_by_step.items():
        for c in h.commits:
            if c.step == step:
                covered = c.block_ids[:len(c.tokens) // BS]
                assert not set(covered) & bad, f"step {step} committed a failed block: {c}"
    h.shutdown()
    # A fresh process (new G2) over the same G3: it must find the recomputed blocks, and they
    # must be right (a block saved from a failed load would poison the answer).
    h3 = Harness(MODEL, g3_config(tmp, **keep_open), num_blocks=96)
    for rid, p in reqs.items():
        h3.add(f"{rid}-3", p, max_tokens=4)
    h3.run()
    check(h3, [f"{r}-3" for r in reqs])
    assert hits(h3)["G3"] >= 3 * 4, hits(h3)
    h3.shutdown()


def test_corrupt_g4_objects_are_not_offered_in_a_loop(tmp: Path) -> None:
    redis = start_redis()
    try:
        # The lookup deadline (20 ms by default) is no part of this test: on a loaded machine
        # (ctest -j2 beside vLLM tests) Redis's answer came late once and nothing was offered.
        g4 = {"g4.backend": "redis", "g4.endpoints": f"127.0.0.1:{redis.port}",
              "g4.write_through": True, "g4.lookup_deadline_ms": 2000}
        reqs = {f"r{i}": prompt(i, 8 * BS + 1, shared=0) for i in range(2)}
        w = Harness(MODEL, config(tmp, **g4))
        for rid, p in reqs.items():
            w.add(rid, p, max_tokens=2)
        w.run()
        check(w, list(reqs))
        w.shutdown()
        names = [n for n in redis_cli(redis.port, "--scan").split() if n]
        assert len(names) >= 2 * 8, names
        for n in names:  # a flipped region in every object's payload
            redis_cli(redis.port, "SETRANGE", n, "9000", "corrupt-bytes-corrupt-bytes")
        # Each lookup would find the objects again; the loads fail verification. The answer
        # must still come, in a bounded number of steps, and be right.
        h = Harness(MODEL, config(tmp, **g4))
        for rid, p in reqs.items():
            h.add(f"{rid}-b", p, max_tokens=3)
        h.run(max_steps=2000)
        check(h, [f"{r}-b" for r in reqs])
        s = h.worker.connector_worker._manager.stats()
        # One load of each request's 8 blocks fails; the manager deletes the corrupt objects
        # and never offers those keys again (without that: a load per step, forever; with only
        # the connector's bound, max_load_failures loads of each).
        assert s["g4_corrupt_blocks"] == 2 * 8, s
        assert s["g4_removed_corrupt"] + s["g4_rejected_keys"] >= 2 * 8, s
        h.shutdown()
        # The recomputed blocks went to G4 (write-through) in place of the corrupt ones.
        r = Harness(MODEL, config(tmp, **g4))
        for rid, p in reqs.items():
            r.add(f"{rid}-c", p, max_tokens=3)
        r.run()
        check(r, [f"{x}-c" for x in reqs])
        assert hits(r)["G4"] >= 2 * 8, hits(r)
        r.shutdown()
    finally:
        redis.kill()
        redis.wait()


def test_request_controls_and_refusals(tmp: Path) -> None:
    h = Harness(MODEL, config(tmp))
    p = prompt(1, 6 * BS + 2)
    h.add("first", p, max_tokens=2)
    h.add("nosave", prompt(2, 6 * BS + 2), max_tokens=2, kv_transfer_params={
        "kvtier": {"save": False}})
    h.run()
    check(h, ["first", "nosave"])
    assert not [c for c in h.commits if c.key.startswith("nosave#")]
    h.scheduler.reset_prefix_cache()
    h.add("capped", p, max_tokens=2, kv_transfer_params={"kvtier": {"max_load_tokens": 40}})
    h.run()
    assert hits(h)["G2"] == 2, "capped at 40 tokens: two whole blocks"
    h.scheduler.reset_prefix_cache()
    h.add("noload", p, max_tokens=2, kv_transfer_params={"kvtier": {"load": False}})
    h.add("typo", p, max_tokens=2, kv_transfer_params={"kvtier": {"laod": False}})
    h.run()
    check(h, ["capped", "noload", "typo"])
    assert hits(h)["G2"] == 2 + 0, "neither 'noload' nor the refused 'typo' loaded"
    assert not [c for c in h.commits if c.key.startswith("typo#")], "a refused request is " \
        "not saved either"
    # Tiers: this G2-only deployment serves nothing to a request that loads from G3 only, and a
    # request that may not store in G2 saves nothing.
    h.scheduler.reset_prefix_cache()
    h.add("g3-only", p, max_tokens=2, kv_transfer_params={"kvtier": {"load_tiers": ["G3"]}})
    saved = h.worker.connector_worker._manager.stats()["saved_blocks"]
    h.add("no-g2", prompt(5, 6 * BS + 2), max_tokens=2,
          kv_transfer_params={"kvtier": {"store_tiers": ["G3", "G4"]}})
    h.run()
    check(h, ["g3-only", "no-g2"])
    assert hits(h)["G2"] == 2, "g3-only loaded nothing from G2"
    assert h.worker.connector_worker._manager.stats()["saved_blocks"] == saved, \
        "no-g2 stored nothing"
    h.shutdown()


def test_late_lookup_after_finish_leaves_nothing(tmp: Path) -> None:
    h = Harness(MODEL, config(tmp))
    h.add("x", prompt(3, 3 * BS + 1), max_tokens=2)
    h.run()
    check(h, ["x"])
    # A lookup that reaches the worker after the request's end (it was in flight on the
    # channel) is answered without the manager keeping anything.
    n, _ = h.worker.connector_worker._lookup("x#0", prompt(3, 3 * BS + 1), 0, "", "", [], "", "")
    assert n == 0
    s = h.worker.connector_worker._manager.stats()
    if "tracked_requests" in s:
        assert s["tracked_requests"] == 0, s
    h.shutdown()


def test_reset_epoch_survives_a_restart(tmp: Path) -> None:
    p = prompt(4, 5 * BS + 1)
    a = Harness(MODEL, g3_config(tmp))
    a.add("before", p, max_tokens=2)
    a.run()
    assert a.connector.reset_cache() is True  # vLLM's reset_prefix_cache(reset_connector=True)
    a.shutdown()
    b = Harness(MODEL, g3_config(tmp))
    b.add("after-restart", p, max_tokens=2)
    b.run()
    check(b, ["after-restart"])
    assert hits(b)["G3"] == 0, "the blocks stored before the reset stay unreachable"
    b.shutdown()
    c = Harness(MODEL, g3_config(tmp))
    c.add("again", p, max_tokens=2)
    c.run()
    assert hits(c)["G3"] >= 4, "blocks saved after the reset are found"
    c.shutdown()


def test_tensor_parallel_across_nodes_is_refused_at_start(tmp: Path) -> None:
    # The lookup channel is a socket local to the host: the scheduler could not reach a rank on
    # another node and every lookup would miss without a word. Such a deployment stops at start.
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    from kvtier.vllm import KvtierConnector

    h = Harness(MODEL, config(tmp))
    pc = h.vllm_config.parallel_config
    saved = (pc.nnodes, pc.tensor_parallel_size)
    try:
        pc.nnodes, pc.tensor_parallel_size = 2, 2
        with pytest.raises(ValueError, match="across 2 nodes is not supported"):
            KvtierConnector(h.vllm_config, KVConnectorRole.SCHEDULER, h.kv_cache_config)
        # One node with TP 2 is a deployment kvtier serves: the check lets it through.
        pc.nnodes = 1
        h.connector._check_deployment(h.vllm_config)
    finally:
        pc.nnodes, pc.tensor_parallel_size = saved
    h.shutdown()

"""The scheduler <-> worker lookup channel (python/kvtier/vllm/lookup.py) and the connector's
settings (python/kvtier/vllm/settings.py), without vLLM: a real server in a child process, real
Unix sockets, real delays and a real kill."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
import uuid
from typing import Any, Iterator, List, Tuple

import pytest

import kvtier
from kvtier.vllm import lookup
from kvtier.vllm.settings import ConnectorSettings


def _answer(key: str, tokens: List[int], num_computed: int, salt: str,
            lora: str) -> Tuple[int, Tuple[int, int, int, int]]:
    if key.startswith("slow"):
        time.sleep(0.5)
    if key.startswith("boom"):
        raise RuntimeError("the manager said no")
    return len(tokens) - 1, (0, len(tokens) // 16, 0, 0)


def _serve(engine_id: str, ready: Any) -> None:
    lookup.LookupServer(engine_id, 0, _answer)
    ready.set()
    time.sleep(600)


@pytest.fixture
def server() -> Iterator[Tuple[str, Any]]:
    engine_id = str(uuid.uuid4())
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=_serve, args=(engine_id, ready), daemon=True)
    proc.start()
    assert ready.wait(30), "the lookup server did not start"
    yield engine_id, proc
    proc.kill()
    proc.join()


def q(key: str, n: int = 33) -> Tuple[str, List[int], int, str, str]:
    return (key, list(range(n)), 0, "", "")


def test_answers_over_the_socket_in_order(server: Tuple[str, Any]) -> None:
    c = lookup.LookupClient(server[0], 0)
    a, b = c.submit(q("a", 33)), c.submit(q("b", 65))
    status, value = c.result(b, 5)
    assert status == c.OK and tuple(value[1]) == (0, 4, 0, 0) and value[0] == 64
    status, value = c.result(a, 5)
    assert status == c.OK and value[0] == 32
    c.forget(a)
    c.forget(b)
    assert c.result(a, 0)[0] == c.FAILED  # forgotten


def test_a_slow_answer_is_pending_then_arrives(server: Tuple[str, Any]) -> None:
    c = lookup.LookupClient(server[0], 0)
    seq = c.submit(q("slow-1"))
    t0 = time.monotonic()
    assert c.result(seq, 0.05) == (c.PENDING, None)
    assert time.monotonic() - t0 < 0.4, "result() waited past its wait"
    status, value = c.result(seq, 5)
    assert status == c.OK and value[0] == 32


def test_a_forgotten_late_answer_does_not_answer_the_next_call(server: Tuple[str, Any]) -> None:
    c = lookup.LookupClient(server[0], 0)
    slow = c.submit(q("slow-2", 17))
    assert c.result(slow, 0.01)[0] == c.PENDING
    c.forget(slow)
    nxt = c.submit(q("fast", 49))
    status, value = c.result(nxt, 5)
    assert status == c.OK and value[0] == 48  # not the slow call's 16


def test_errors_and_a_dead_server_fail_without_hanging(server: Tuple[str, Any]) -> None:
    engine_id, proc = server
    c = lookup.LookupClient(engine_id, 0)
    status, why = c.result(c.submit(q("boom")), 5)
    assert status == c.FAILED and "the manager said no" in why
    pending = c.submit(q("slow-3"))
    os.kill(proc.pid, signal.SIGKILL)
    t0 = time.monotonic()
    status, why = c.result(pending, 5)
    assert status == c.FAILED and "broke" in why
    assert time.monotonic() - t0 < 3
    status, why = c.result(c.submit(q("after")), 1)
    assert status == c.FAILED and "cannot reach" in why


def test_no_server_fails_at_once() -> None:
    c = lookup.LookupClient(str(uuid.uuid4()), 3)
    t0 = time.monotonic()
    status, why = c.result(c.submit(q("x")), 5)
    assert status == c.FAILED and "cannot reach" in why and time.monotonic() - t0 < 1


def test_same_process_server_is_called_directly() -> None:
    engine_id = str(uuid.uuid4())
    calls: List[str] = []

    def answer(key: str, *rest: Any) -> Tuple[int, Tuple[int, int, int, int]]:
        calls.append(key)
        return 16, (0, 1, 0, 0)

    srv = lookup.LookupServer(engine_id, 0, answer)
    try:
        c = lookup.LookupClient(engine_id, 0)
        assert c.result(c.submit(q("local")), 0) == (c.OK, (16, (0, 1, 0, 0)))
        assert calls == ["local"]
    finally:
        srv.close()


def test_settings_split_check_and_tp_dirs(tmp_path: Any) -> None:
    s = ConnectorSettings.parse({"g2": {"capacity_bytes": "64MiB"}, "g3.dir": str(tmp_path),
                                 "lookup_wait_ms": 10, "async_load": "never"})
    assert s.lookup_wait_ms == 10 and s.async_load == "never"
    assert s.kvtier_values == {"g2.capacity_bytes": "64MiB", "g3.dir": str(tmp_path)}
    c = s.kvtier_config(tp_rank=1, tp_size=2)
    assert c.get("g3.dir") == f"{tmp_path}/tp1"
    assert c.get("g2.capacity_bytes") == str(64 << 20)
    # Each rank's /metrics on its own port: metrics.port + rank.
    m = ConnectorSettings.parse({"metrics.port": 9400, "g3.dir": str(tmp_path)})
    assert m.kvtier_config(tp_rank=0, tp_size=1).get("metrics.port") == "9400"
    assert m.kvtier_config(tp_rank=3, tp_size=4).get("metrics.port") == "9403"
    with pytest.raises(ValueError, match="passes 65535"):
        ConnectorSettings.parse({"metrics.port": 65535}).kvtier_config(tp_rank=0, tp_size=2)
    with pytest.raises(ValueError, match="unknown key.*g2.capacity"):
        ConnectorSettings.parse({"g2.capacity": "1G"})
    with pytest.raises(ValueError, match="async_load"):
        ConnectorSettings.parse({"async_load": "sometimes"})
    with pytest.raises(ValueError, match="lookup_timeout_ms"):
        ConnectorSettings.parse({"lookup_timeout_ms": "soon"})
    with pytest.raises(ValueError, match="lookup_wait_ms"):
        ConnectorSettings.parse({"lookup_wait_ms": 5000})
    with pytest.raises(ValueError, match="load_failure_policy"):
        ConnectorSettings.parse({"load_failure_policy": "ignore"})
    with pytest.raises(kvtier.KvtierError, match="g2.capacity_bytes"):
        ConnectorSettings.parse({"g2.capacity_bytes": "lots"})

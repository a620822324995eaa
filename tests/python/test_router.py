"""kvtier router (python/kvtier/router) over real processes: the router as `python -m
kvtier.router`, workers as tests/python/fake_vllm_worker.py (vLLM's HTTP endpoints and its KV
event wire format over real ZMQ sockets), real HTTP. The real vLLM behind the router is in
tests/vllm/test_router_vllm.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any, Dict, Iterator, List, Optional, Tuple

import msgpack
import pytest

import kvtier
from kvtier.router.events import EventTranslator, decode_batch, tier_of

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE = os.path.join(HERE, "fake_vllm_worker.py")
BS = 16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, body: Optional[Dict[str, Any]] = None,
         timeout: float = 10.0) -> Tuple[int, Dict[str, str], bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def wait_http(url: str, deadline_s: float = 20.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            http(url, timeout=1.0)
            return
        except (urllib.error.URLError, ConnectionError, OSError):
            time.sleep(0.1)
    raise AssertionError(f"{url} did not answer within {deadline_s} s")


class Fake:
    def __init__(self, name: str, capacity: int = 1000, ms_per_token: float = 0.0,
                 medium: str = "GPU", port: int = 0, events: int = 0, replay: int = 0,
                 role: str = "") -> None:
        self.name = name
        self.role = role  # kvtier router --pd: prefill, decode or both
        self.chosen = not (port or events or replay)  # free_port's: may be taken meanwhile
        self.port = port or free_port()
        self.events_port = events or free_port()
        self.replay_port = replay or free_port()
        self.capacity = capacity
        self.ms_per_token = ms_per_token
        self.medium = medium
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def spec(self) -> str:
        return (f"{self.url},events=tcp://127.0.0.1:{self.events_port},"
                f"replay=tcp://127.0.0.1:{self.replay_port}"
                + (f",role={self.role}" if self.role else ""))

    def start(self) -> None:
        # A port free_port found free can be taken by another process before the worker binds
        # it (ctest runs other tests at once): then the worker exits, and the ports it was
        # given are chosen again. Its /health answers its name, so another server on the port
        # is not taken for it. A restart keeps its ports (the router knows them).
        may_move = self.chosen and self.proc is None
        for _ in range(3):
            self.proc = subprocess.Popen(
                [sys.executable, FAKE, "--port", str(self.port), "--name", self.name,
                 "--events", f"tcp://127.0.0.1:{self.events_port}",
                 "--replay", f"tcp://127.0.0.1:{self.replay_port}", "--block-size", str(BS),
                 "--capacity", str(self.capacity), "--ms-per-token", str(self.ms_per_token),
                 "--medium", self.medium])
            end = time.monotonic() + 20.0
            while time.monotonic() < end and self.proc.poll() is None:
                try:
                    if http(self.url + "/health", timeout=1.0)[2] == self.name.encode():
                        return
                except (urllib.error.URLError, ConnectionError, OSError):
                    pass
                time.sleep(0.1)
            self.kill()
            if not may_move:
                break
            self.port, self.events_port, self.replay_port = free_port(), free_port(), free_port()
        raise AssertionError(f"fake worker {self.name} did not start on port {self.port}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def served(self) -> List[Dict[str, Any]]:
        return json.loads(http(self.url + "/fake/served")[2])


class RouterProc:
    def __init__(self, workers: List[Fake], policy: str = "kvtier", extra: List[str] = ()):
        self.port = free_port()
        args = [sys.executable, "-m", "kvtier.router", "--port", str(self.port),
                "--policy", policy, "--block-size", str(BS), "--block-bytes", str(1 << 20),
                "--prefill-tokens-per-s", "2000", "--health-interval", "0.2", *extra]
        for w in workers:
            args += ["--worker", w.spec]
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE)
        wait_http(self.url + "/health")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def state(self) -> Dict[str, Any]:
        return json.loads(http(self.url + "/router/state")[2])

    def wait_blocks(self, worker: int, tier: str, at_least: int, deadline_s: float = 10.0) -> None:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if self.state()["workers"][worker]["blocks"][tier] >= at_least:
                return
            time.sleep(0.05)
        raise AssertionError(f"worker {worker} never reached {at_least} {tier} blocks: "
                             f"{self.state()['workers'][worker]}")

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return err.decode(errors="replace")


@pytest.fixture
def procs() -> Iterator[List[Any]]:
    started: List[Any] = []
    yield started
    for p in started:
        if isinstance(p, RouterProc):
            p.stop()
        else:
            p.kill()


def prompt(user: int, turns: int) -> str:
    # 64 bytes per turn: 4 blocks; each user's text differs from the first byte.
    return "".join(f"user{user:02d} turn {t:02d} " + "x" * 48 + "\n" for t in range(turns))


def complete(router: RouterProc, text: str, **extra: Any) -> Tuple[int, Dict[str, str], bytes]:
    return http(router.url + "/v1/completions", {"model": "fake", "prompt": text,
                                                   "max_tokens": 4, **extra})


# ---------------- the translator, without processes ----------------

def test_translator_recomputes_keys_from_token_ids_and_chains_parents() -> None:
    tr = EventTranslator("router", BS)
    toks = list(range(48))
    evs, cleared = tr.translate({"type": "BlockStored", "block_hashes": [b"a", b"b"],
                                 "parent_block_hash": None, "token_ids": toks[:32],
                                 "block_size": BS, "medium": "GPU"})
    assert not cleared
    want = kvtier._kvtier.BlockHasher("router", BS).keys(toks)
    assert [e[1] for e in evs] == want[:2] and {e[2] for e in evs} == {"G1"}
    # A later block names its parent by the publisher's hash.
    evs, _ = tr.translate({"type": "BlockStored", "block_hashes": [7], "parent_block_hash": b"b",
                           "token_ids": toks[32:], "block_size": BS, "medium": "CPU"})
    assert evs == [("stored", want[2], "G2")]
    evs, _ = tr.translate({"type": "BlockRemoved", "block_hashes": [7, 99], "medium": "CPU"})
    assert evs == [("removed", want[2], "G2")] and tr.stats.unknown_removed == 1


def test_translator_refuses_what_it_cannot_place() -> None:
    tr = EventTranslator("router", BS)
    evs, _ = tr.translate({"type": "BlockStored", "block_hashes": [1], "parent_block_hash": 5,
                           "token_ids": list(range(BS)), "block_size": BS})
    assert evs == [] and tr.stats.orphans == 1 and "parent 5 unknown" in tr.stats.orphan_samples[0]
    evs, _ = tr.translate({"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
                           "token_ids": list(range(BS - 1)), "block_size": BS})
    assert evs == [] and tr.stats.malformed == 1
    evs, _ = tr.translate({"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
                           "token_ids": list(range(32)), "block_size": 32})
    assert evs == [] and tr.stats.malformed == 2
    _, cleared = tr.translate({"type": "AllBlocksCleared"})
    assert cleared


def test_cache_salt_and_tiers() -> None:
    tr = EventTranslator("router", BS)
    toks = list(range(BS))
    evs, _ = tr.translate({"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
                           "token_ids": toks, "block_size": BS, "extra_keys": [("tenant-a",)]})
    assert evs[0][1] == kvtier._kvtier.BlockHasher("router", BS, "tenant-a").keys(toks)[0]
    assert evs[0][1] != kvtier._kvtier.BlockHasher("router", BS).keys(toks)[0]
    assert tier_of("STORAGE", "LOCAL", None) == "G3"
    assert tier_of("STORAGE", "REMOTE", None) == "G4"
    assert tier_of("STORAGE", None, "kvtier:G4") == "G4"
    assert tier_of(None, None, None) == "G1" and tier_of("CPU", None, None) == "G2"


def test_decode_batch_rejects_bad_bytes() -> None:
    with pytest.raises(ValueError, match="msgpack"):
        decode_batch(b"\xc1")
    with pytest.raises(ValueError, match="EventBatch"):
        decode_batch(msgpack.packb({"a": 1}))
    with pytest.raises(ValueError, match="type"):
        decode_batch(msgpack.packb([1.0, [{"block_hashes": []}], None]))


def test_kv_router_binding_estimates_and_refuses_bad_input() -> None:
    r = kvtier._kvtier.KvRouter(BS, 1 << 20, 1000.0, [0.0, 10.0, 1.0, 0.5])
    r.add_worker(0)
    r.add_worker(1)
    keys = kvtier._kvtier.BlockHasher("router", BS).keys(list(range(64)))
    r.apply(1, [("stored", k, "G1") for k in keys])
    d = r.route(keys, 65)
    assert d["worker"] == 1
    c1 = d["candidates"][1]
    assert c1["blocks_by_tier"]["G1"] == 4 and c1["compute_tokens"] == 1
    assert d["candidates"][0]["compute_tokens"] == 65
    with pytest.raises(ValueError, match="16 bytes"):
        r.route([b"short"], 17)
    with pytest.raises(ValueError, match="tier"):
        r.apply(0, [("stored", keys[0], "G9")])
    with pytest.raises(kvtier.KvtierError):
        r.add_worker(0)
    with pytest.raises(kvtier.KvtierError):
        kvtier._kvtier.KvRouter(BS, 0, 1000.0)


# ---------------- the proxy, over real processes ----------------

def test_follow_up_turns_reach_the_worker_holding_their_prefix(procs: List[Any]) -> None:
    a, b = Fake("a"), Fake("b")
    procs += [a, b]
    r = RouterProc([a, b])
    procs.append(r)
    # The first turns go straight to a worker (users 0, 1 to a; 2, 3 to b), as if an earlier
    # router had placed them; the router learns where they are from the events alone.
    first: Dict[int, str] = {}
    for u in range(4):
        w = (a, b)[u // 2]
        st, _, body = http(w.url + "/v1/completions", {"prompt": prompt(u, 1)})
        assert st == 200, body
        first[u] = str(u // 2)
    r.wait_blocks(0, "G1", 8)
    r.wait_blocks(1, "G1", 8)
    for t in range(2, 4):
        for u in range(4):
            st, hdr, body = complete(r, prompt(u, t), user=f"u{u}")
            assert st == 200, body
            assert hdr["x-kvtier-worker"] == first[u], (u, t, hdr)
            # The worker really had the prefix: the fake reports its cache hit.
            assert int(hdr["x-fake-hit-tokens"]) >= (t - 1) * 64
    decisions = json.loads(http(r.url + "/router/decisions")[2])
    assert len(decisions) == 8
    assert all(d["blocks_by_tier"]["G1"] > 0 for d in decisions)


def test_round_robin_ignores_the_prefix(procs: List[Any]) -> None:
    a, b = Fake("a"), Fake("b")
    procs += [a, b]
    r = RouterProc([a, b], policy="round-robin")
    procs.append(r)
    got = [complete(r, prompt(0, t + 1))[1]["x-kvtier-worker"] for t in range(4)]
    assert got == ["0", "1", "0", "1"]


def test_a_cheaper_tier_wins_over_a_longer_slow_one(procs: List[Any]) -> None:
    # Worker a holds the prefix in "STORAGE/REMOTE"-like slow medium, b in G1: b wins even
    # though both hold the same blocks. The router's G4 cost (0.001 GB/s) makes a's slower.
    a, b = Fake("a", medium="CPU"), Fake("b", medium="GPU")
    procs += [a, b]
    r = RouterProc([a, b], extra=["--load-gbps", "0,0.01,2,1.25"])
    procs.append(r)
    text = prompt(3, 4)
    http(a.url + "/v1/completions", {"prompt": text})
    http(b.url + "/v1/completions", {"prompt": text})
    r.wait_blocks(0, "G2", 15)
    r.wait_blocks(1, "G1", 15)
    st, hdr, _ = complete(r, text + "more")
    assert st == 200 and hdr["x-kvtier-worker"] == "1"
    cands = json.loads(http(r.url + "/router/decisions")[2])[-1]
    assert cands["blocks_by_tier"]["G1"] == 16


def test_a_late_router_catches_up_by_replay(procs: List[Any]) -> None:
    a, b = Fake("a"), Fake("b")
    procs += [a, b]
    text = prompt(5, 3)
    http(b.url + "/v1/completions", {"prompt": text})  # before the router exists
    r = RouterProc([a, b])
    procs.append(r)
    r.wait_blocks(1, "G1", 12)
    st, hdr, _ = complete(r, text + "next turn")
    assert hdr["x-kvtier-worker"] == "1"
    assert r.state()["workers"][1]["streams"][0]["replayed"] >= 1


def test_a_dead_worker_is_never_chosen_and_requests_move(procs: List[Any]) -> None:
    a, b = Fake("a"), Fake("b")
    procs += [a, b]
    r = RouterProc([a, b])
    procs.append(r)
    text = prompt(7, 3)
    st, hdr, _ = complete(r, text)
    owner = int(hdr["x-kvtier-worker"])
    r.wait_blocks(owner, "G1", 12)
    (a, b)[owner].kill()
    # Immediately (before the health check notices) the request is retried on the other one.
    st, hdr, body = complete(r, text + "again")
    assert st == 200, body
    assert hdr["x-kvtier-worker"] == str(1 - owner)
    for _ in range(5):
        assert complete(r, text + "again")[1]["x-kvtier-worker"] == str(1 - owner)
    s = r.state()
    assert s["workers"][owner]["up"] is False
    assert s["workers"][owner]["blocks"]["G1"] == 0  # a dead process lost its memory
    (a, b)[1 - owner].kill()
    st, _, body = complete(r, text)
    assert st == 503 and b"no worker is up" in body


def test_a_restarted_worker_is_used_again_with_an_empty_cache(procs: List[Any]) -> None:
    a = Fake("a")
    b = Fake("b")
    procs += [a, b]
    r = RouterProc([a, b])
    procs.append(r)
    text = prompt(9, 2)
    http(a.url + "/v1/completions", {"prompt": text})
    r.wait_blocks(0, "G1", 8)
    a.kill()
    deadline = time.monotonic() + 10
    while r.state()["workers"][0]["up"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not r.state()["workers"][0]["up"]
    a.start()  # same ports: a new publisher whose sequence starts again at 0
    deadline = time.monotonic() + 10
    while not r.state()["workers"][0]["up"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert r.state()["workers"][0]["up"]
    assert r.state()["workers"][0]["blocks"]["G1"] == 0
    http(a.url + "/v1/completions", {"prompt": prompt(10, 2)})
    r.wait_blocks(0, "G1", 8)


def test_streaming_passes_through_in_order(procs: List[Any]) -> None:
    a = Fake("a")
    procs.append(a)
    r = RouterProc([a])
    procs.append(r)
    st, hdr, body = complete(r, prompt(1, 1), stream=True)
    assert st == 200 and hdr["content-type"].startswith("text/event-stream")
    events = [line[6:] for line in body.decode().split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert [json.loads(e)["text"] for e in events[:-1]] == ["one", "two", "three"]
    st, hdr, body = http(r.url + "/v1/chat/completions",
                         {"model": "fake", "messages": [{"role": "user", "content": "hi"}]})
    assert st == 200 and json.loads(body)["worker"] == "a"
    st, _, body = http(r.url + "/v1/models")
    assert st == 200 and json.loads(body)["data"][0]["id"] == "fake"
    st, _, body = http(r.url + "/metrics")
    assert b'kvtier_router_requests_total{worker="0"} 2' in body


def test_bad_requests_get_a_clear_answer(procs: List[Any]) -> None:
    a = Fake("a")
    procs.append(a)
    r = RouterProc([a])
    procs.append(r)
    st, _, body = http(r.url + "/v1/completions", {"model": "fake", "prompt": {"x": 1}})
    assert st == 400 and b"'prompt' must be a string" in body
    req = urllib.request.Request(r.url + "/v1/completions", data=b"{not json",
                                 headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=5)
        raise AssertionError("accepted bad JSON")
    except urllib.error.HTTPError as e:
        assert e.code == 400
    st, _, body = http(r.url + "/v1/chat/completions", {"model": "fake", "messages": "hi"})
    assert st == 400 and b"'messages' must be a list" in body


@pytest.mark.parametrize("args,message", [
    (["--worker", "127.0.0.1:8000"], "http:// URL first"),
    (["--worker", "http://x,evnts=tcp://a:1"], "not events=ENDPOINT"),
    (["--worker", "http://x,replay=tcp://a:1"], "replay= must follow"),
    (["--worker", "http://x", "--load-gbps", "1,2"], "expected 4 numbers"),
    (["--worker", "http://x", "--policy", "random"], "expected one of"),
    (["--worker", "http://x", "--block-bytes", "0"], "--block-bytes must be > 0"),
    ([], "at least one --worker"),
])
def test_bad_flags_exit_2_saying_what_is_wrong(args: List[str], message: str) -> None:
    if "--block-bytes" not in args:
        args = args + ["--block-bytes", "1024"]
    p = subprocess.run([sys.executable, "-m", "kvtier.router", *args], capture_output=True,
                       timeout=30)
    assert p.returncode == 2, p.stderr
    assert message in p.stderr.decode(), p.stderr


def test_the_kvtier_command_runs_the_router_and_passes_flags_through() -> None:
    cli = os.environ.get("KVTIER_TEST_CLI", "")
    if not cli:
        pytest.skip("KVTIER_TEST_CLI is not set (ctest sets it)")
    p = subprocess.run([cli, "router", "--worker", "localhost:1"], capture_output=True,
                       timeout=60)
    assert p.returncode == 2 and b"http:// URL first" in p.stderr, p.stderr
    p = subprocess.run([cli, "router", "--python"], capture_output=True, timeout=60)
    assert p.returncode == 2 and b"--python needs a path" in p.stderr, p.stderr
    p = subprocess.run([cli, "router", "--python", "/nonexistent/python", "--worker", "http://x"],
                       capture_output=True, timeout=60)
    assert p.returncode == 1 and b"cannot run /nonexistent/python" in p.stderr, p.stderr

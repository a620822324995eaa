"""The scheduler <-> worker lookup channel (python/kvtier/vllm/lookup.py, its wire format
python/kvtier/vllm/lookup_wire.py) and the connector's settings (python/kvtier/vllm/settings.py),
without vLLM: real servers in child processes and in this one, real Unix sockets, real delays, a
real kill, real peers of another uid, and a seeded fuzz of the decoder both as functions and over
a live socket."""

from __future__ import annotations

import errno
import logging
import multiprocessing as mp
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from typing import Any, Iterator, List, Optional, Tuple

import pytest

import kvtier
from kvtier.vllm import lookup
from kvtier.vllm import lookup_access as access
from kvtier.vllm import lookup_wire as wire
from kvtier.vllm.settings import ConnectorSettings

OTHER_UID = 65534  # nobody


@pytest.fixture(autouse=True)
def runtime_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each test's channel directory: a private XDG_RUNTIME_DIR of its own (child processes
    inherit it), so tests neither see each other's sockets nor leave files in /tmp/kvtier-<uid>."""
    path = tempfile.mkdtemp(prefix="kvt-")  # mode 0700
    monkeypatch.setenv("XDG_RUNTIME_DIR", path)
    yield os.path.join(path, "kvtier")
    shutil.rmtree(path, ignore_errors=True)


def _answer(key: str, tokens: List[int], num_computed: int, salt: str, lora: str,
            extras: List[bytes] = [], load_tiers: str = "",
            store_tiers: str = "") -> Tuple[int, Tuple[int, int, int, int]]:
    if key == "extras":  # echoes what arrived of the optional fields
        return len(extras), (0, len(load_tiers), len(store_tiers), sum(len(e) for e in extras))
    if key.startswith("slow"):
        time.sleep(0.5)
    if key.startswith("boom"):
        raise RuntimeError("the manager said no")
    return len(tokens) - 1, (0, len(tokens) // 16, 0, 0)


def _serve(engine_id: str, ready: Any) -> None:
    lookup.LookupServer(engine_id, 0, _answer)
    ready.set()
    time.sleep(600)


def _start_server_process(engine_id: str) -> Any:
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=_serve, args=(engine_id, ready), daemon=True)
    proc.start()
    assert ready.wait(30), "the lookup server did not start"
    return proc


@pytest.fixture
def server() -> Iterator[Tuple[str, Any]]:
    engine_id = str(uuid.uuid4())
    proc = _start_server_process(engine_id)
    yield engine_id, proc
    proc.kill()
    proc.join()


@pytest.fixture
def local_server() -> Iterator[lookup.LookupServer]:
    """A server on this process's threads that this process's clients reach over its socket
    (not through the in-process shortcut), so that a test can read its counters."""
    srv = lookup.LookupServer(str(uuid.uuid4()), 0, _answer)
    with lookup._LOCAL_LOCK:
        del lookup._LOCAL[(srv.instance, srv.rank)]
    yield srv
    srv.close()


@pytest.fixture
def thread_errors(monkeypatch: pytest.MonkeyPatch) -> List[str]:
    """Exceptions that escaped any thread (a server thread that died of one would land here)."""
    seen: List[str] = []
    monkeypatch.setattr(threading, "excepthook",
                        lambda a: seen.append(f"{a.thread}: {a.exc_type.__name__}: {a.exc_value}"))
    return seen


def q(key: str, n: int = 33) -> Tuple[str, List[int], int, str, str]:
    return (key, list(range(n)), 0, "", "")


def _ok(c: lookup.LookupClient, key: str = "check", n: int = 33) -> None:
    status, value = c.result(c.submit(q(key, n)), 5)
    assert status == c.OK, value
    assert value == (n - 1, (0, n // 16, 0, 0))


def _raw(srv: lookup.LookupServer) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(srv.socket_path)
    return s


def _read_to_end(s: socket.socket) -> Tuple[List[wire.Message], bool]:
    """Every server frame until the server closes; (frames, closed within the timeout)."""
    buf, out = bytearray(), []
    while True:
        try:
            data = s.recv(1 << 16)
        except socket.timeout:
            return out, False
        except ConnectionResetError:
            data = b""
        if not data:
            break
        buf += data
    while buf:
        body = wire.take_frame(buf, wire.MAX_SERVER_BODY)
        assert body is not None, f"the server sent a partial frame: {bytes(buf)!r}"
        out.append(wire.decode(body, (wire.HELLO, wire.REPLY, wire.REFUSED)))
    return out, True


def _hello(s: socket.socket) -> bytes:
    buf = bytearray()
    while (body := wire.take_frame(buf, wire.MAX_SERVER_BODY)) is None:
        data = s.recv(wire.PREFIX_BYTES + wire.HELLO_BODY - len(buf))
        assert data, "closed before the HELLO"
        buf += data
    msg = wire.decode(body, (wire.HELLO,))
    assert isinstance(msg, wire.Hello)
    return msg.nonce


def _authenticate(srv: lookup.LookupServer, s: socket.socket) -> None:
    nonce = _hello(s)
    s.sendall(wire.encode_auth(access.auth_mac(access.read_secret(srv.secret_path), nonce)))


def _wait_for(cond: Any, what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


# ---- the channel as the connector uses it ------------------------------------------------------

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


def test_a_long_prompt_and_a_value_that_does_not_fit(local_server: lookup.LookupServer) -> None:
    c = lookup.LookupClient(local_server.instance, 0)
    _ok(c, "long", 1 << 20)  # a 4 MiB frame, sent in pieces on a non-blocking socket
    status, why = c.result(c.submit(("neg", [1, -1, 2], 0, "", "")), 1)
    assert status == c.FAILED and "cannot be sent" in why and "u32" in why
    status, why = c.result(c.submit(("k" * (wire.MAX_KEY_BYTES + 1), [1], 0, "", "")), 1)
    assert status == c.FAILED and "request key" in why
    _ok(c, "after")  # the same connection carries on
    assert local_server.stats()["connections"] == 1


# ---- files, directory, and who may connect -----------------------------------------------------

def test_files_are_private_and_removed_on_close(runtime_dir: str) -> None:
    srv = lookup.LookupServer(str(uuid.uuid4()), 2, _answer)
    assert os.path.dirname(srv.socket_path) == runtime_dir
    assert stat.S_IMODE(os.lstat(runtime_dir).st_mode) == 0o700
    assert stat.S_ISSOCK(os.lstat(srv.socket_path).st_mode)
    assert stat.S_IMODE(os.lstat(srv.socket_path).st_mode) == 0o600
    assert stat.S_IMODE(os.lstat(srv.secret_path).st_mode) == 0o600
    assert len(access.read_secret(srv.secret_path)) == 32
    srv.close()
    assert os.listdir(runtime_dir) == []
    srv.close()  # idempotent


def test_files_go_at_exit_but_not_at_a_forked_childs_exit(runtime_dir: str) -> None:
    script = textwrap.dedent("""
        import os, sys, time
        from kvtier.vllm import lookup
        srv = lookup.LookupServer(sys.argv[1], 0, lambda *a: (0, (0, 0, 0, 0)))
        pid = os.fork()
        if pid == 0:
            sys.exit(0)  # a normal exit: atexit and finalizers run in the child
        os.waitpid(pid, 0)
        print(" ".join(sorted(os.listdir(sys.argv[2]))))
        # and the parent exits without close()
    """)
    out = subprocess.run([sys.executable, "-c", script, "x", runtime_dir], capture_output=True,
                         text=True, timeout=60, env=os.environ)
    assert out.returncode == 0, out.stderr
    names = out.stdout.split()  # what the parent saw after its child's exit
    assert len(names) == 2 and names[0].endswith(".secret") and names[1].endswith(".sock")
    assert os.listdir(runtime_dir) == []


@pytest.mark.parametrize("problem", ["mode", "owner", "symlink"])
def test_a_directory_that_is_not_private_is_refused(runtime_dir: str, problem: str) -> None:
    if problem == "mode":
        os.mkdir(runtime_dir, 0o700)
        os.chmod(runtime_dir, 0o755)
        expect = "mode 0755, not 0700"
    elif problem == "owner":
        if os.geteuid() != 0:
            pytest.skip("needs root to make a directory owned by another uid")
        os.mkdir(runtime_dir, 0o700)
        os.chown(runtime_dir, OTHER_UID, -1)
        expect = f"owned by uid {OTHER_UID}"
    else:
        target = os.path.join(os.path.dirname(runtime_dir), "elsewhere")  # removed with it
        os.mkdir(target, 0o700)
        os.symlink(target, runtime_dir)
        expect = "symbolic link"
    instance = str(uuid.uuid4())
    with pytest.raises(lookup.LookupChannelError, match=expect) as e:
        lookup.LookupServer(instance, 0, _answer)
    assert "chmod 700" in str(e.value) and "rm -r" in str(e.value)
    c = lookup.LookupClient(instance, 0)
    status, why = c.result(c.submit(q("x")), 1)
    assert status == c.FAILED and "cannot reach" in why and expect in why


def test_xdg_runtime_dir_is_used_only_when_private(monkeypatch: pytest.MonkeyPatch,
                                                   runtime_dir: str) -> None:
    assert access.channel_dir() == runtime_dir
    os.chmod(os.path.dirname(runtime_dir), 0o755)
    assert access.channel_dir() == f"/tmp/kvtier-{os.geteuid()}"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert access.channel_dir() == f"/tmp/kvtier-{os.geteuid()}"


def test_a_wrong_secret_is_refused_and_the_right_client_still_served(
        local_server: lookup.LookupServer) -> None:
    good = lookup.LookupClient(local_server.instance, 0)
    _ok(good)
    s = _raw(local_server)
    nonce = _hello(s)
    s.sendall(wire.encode_auth(access.auth_mac(b"\x01" * 32, nonce)))
    frames, closed = _read_to_end(s)
    assert closed and len(frames) == 1 and isinstance(frames[0], wire.Refused)
    assert "authentication failed" in frames[0].reason
    # A lookup without the handshake is not read as one.
    s = _raw(local_server)
    _hello(s)
    s.sendall(wire.encode_lookup(1, "sneaky", [1, 2, 3], 0, "", ""))
    frames, closed = _read_to_end(s)
    assert closed and [type(f) for f in frames] == [wire.Refused]
    assert "longer than the 40 allowed" in frames[0].reason  # its body is never read
    s = _raw(local_server)
    _hello(s)
    s.sendall(wire.encode_lookup(1, "", [], 0, "", ""))  # exactly an AUTH's size
    frames, closed = _read_to_end(s)
    assert closed and [type(f) for f in frames] == [wire.Refused]
    assert "unexpected message type LOOKUP" in frames[0].reason
    st = local_server.stats()
    assert st["refused_auth"] == 1 and st["protocol_errors"] == 2 and st["lookups"] == 1
    _ok(good, "still")  # the open connection was never disturbed
    _ok(lookup.LookupClient(local_server.instance, 0), "new")


def test_the_client_reads_the_secret_at_each_connection(local_server: lookup.LookupServer) -> None:
    real = access.read_secret(local_server.secret_path)
    with open(local_server.secret_path, "wb") as f:
        f.write(b"\x02" * 32)
    c = lookup.LookupClient(local_server.instance, 0)
    status, why = c.result(c.submit(q("x")), 5)
    assert status == c.FAILED and "refused this client" in why and "authentication" in why
    assert local_server.stats()["refused_auth"] == 1
    with open(local_server.secret_path, "wb") as f:
        f.write(real)
    _ok(c)  # reconnected and read the file again
    os.chmod(local_server.secret_path, 0o644)
    c2 = lookup.LookupClient(local_server.instance, 0)
    status, why = c2.result(c2.submit(q("x")), 5)
    assert status == c2.FAILED and "private file" in why  # a readable secret is not trusted
    os.unlink(local_server.secret_path)
    os.mkfifo(local_server.secret_path, 0o600)
    t0 = time.monotonic()
    status, why = c2.result(c2.submit(q("x")), 5)
    assert status == c2.FAILED and "private file" in why and time.monotonic() - t0 < 1


def _child_as_other_uid(script: str, *args: str) -> str:
    """Runs `script` in a child that starts as root and drops to OTHER_UID itself."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], cwd="/",
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another uid")
def test_another_uid_cannot_reach_the_socket(local_server: lookup.LookupServer) -> None:
    got = _child_as_other_uid("""
        import os, socket, sys
        os.setgid(65534)
        os.setuid(65534)
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(sys.argv[1])
            print("connected")
        except OSError as e:
            print(type(e).__name__)
    """, local_server.socket_path)
    assert got == "PermissionError"  # the 0700 directory stops it before the socket


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another uid")
def test_another_uid_that_reaches_the_socket_is_refused_by_its_credentials(
        local_server: lookup.LookupServer) -> None:
    # euid OTHER_UID (what SO_PEERCRED reports) with filesystem uid 0 (so that the path lookup
    # passes the 0700 directory): the peer-credential check is the only thing left to stop it.
    got = _child_as_other_uid("""
        import ctypes, os, socket, sys
        libc = ctypes.CDLL(None, use_errno=True)
        os.setresuid(65534, 65534, 0)
        libc.setfsuid(0)
        assert os.geteuid() == 65534 and libc.setfsuid(0xFFFFFFFF) == 0
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(10)
        s.connect(sys.argv[1])
        try:
            data = s.recv(100)
        except ConnectionResetError:
            data = b""
        print("connected, got", len(data), "bytes")
    """, local_server.socket_path)
    assert got == "connected, got 0 bytes"  # closed without even a HELLO
    st = local_server.stats()
    assert st["refused_peer"] == 1 and st["connections"] == 0
    _ok(lookup.LookupClient(local_server.instance, 0))
    assert local_server.stats()["connections"] == 1


# ---- stale files, a second instance ------------------------------------------------------------

def test_a_stale_socket_file_does_not_stop_a_new_server(runtime_dir: str) -> None:
    instance = str(uuid.uuid4())
    os.mkdir(runtime_dir, 0o700)
    path, secret = access.channel_paths(instance, 0, runtime_dir)
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(path)  # bound and closed without unlink: what a killed server leaves
    dead.close()
    with open(secret, "wb") as f:
        f.write(b"\x03" * 32)
    srv = lookup.LookupServer(instance, 0, _answer)
    try:
        with lookup._LOCAL_LOCK:
            del lookup._LOCAL[(instance, 0)]
        assert access.read_secret(secret) != b"\x03" * 32
        _ok(lookup.LookupClient(instance, 0))
    finally:
        srv.close()


def test_a_killed_server_is_replaced_and_the_client_follows(server: Tuple[str, Any]) -> None:
    engine_id, proc = server
    c = lookup.LookupClient(engine_id, 0)
    _ok(c)
    path, secret = access.channel_paths(engine_id, 0, access.private_dir(create=False))
    old = access.read_secret(secret)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    assert os.path.exists(path) and os.path.exists(secret)  # left behind
    status, _ = c.result(c.submit(q("x")), 5)
    assert status == c.FAILED
    again = _start_server_process(engine_id)
    try:
        assert access.read_secret(secret) != old
        _ok(c, "again")  # the same client, the new server's secret
    finally:
        again.kill()
        again.join()


def test_a_second_server_under_the_same_name_fails_clearly(
        local_server: lookup.LookupServer) -> None:
    with pytest.raises(lookup.LookupChannelError) as e:
        lookup.LookupServer(local_server.instance, 0, _answer)
    text = str(e.value)
    assert "already listening" in text and local_server.instance in text
    assert "distinct engine_id" in text
    # The first server's files are untouched and it still serves.
    _ok(lookup.LookupClient(local_server.instance, 0))
    other = lookup.LookupServer(local_server.instance, 1, _answer)  # another rank is fine
    other.close()


# ---- malformed, oversized, truncated and slow frames --------------------------------------------

def test_a_bad_connection_does_not_disturb_the_others(local_server: lookup.LookupServer,
                                                      thread_errors: List[str]) -> None:
    c = lookup.LookupClient(local_server.instance, 0)
    _ok(c)
    stalled = _raw(local_server)  # half a frame, then silence
    _authenticate(local_server, stalled)
    stalled.sendall(wire.encode_lookup(1, "half", list(range(100)), 0, "", "")[:50])
    huge = _raw(local_server)  # a length over the maximum: refused before the body is read
    _authenticate(local_server, huge)
    huge.sendall((wire.MAX_LOOKUP_BODY + 1).to_bytes(4, "little") + b"KVTL")
    frames, closed = _read_to_end(huge)
    assert closed and [type(f) for f in frames] == [wire.Refused]
    assert "longer than" in frames[0].reason
    t0 = time.perf_counter()
    for i in range(20):
        _ok(c, f"during-{i}")
    assert time.perf_counter() - t0 < 2
    stalled.shutdown(socket.SHUT_WR)  # the server sees the frame end early
    frames, closed = _read_to_end(stalled)
    assert closed and [type(f) for f in frames] == [wire.Refused]
    assert "truncated" in frames[0].reason
    assert local_server.stats()["protocol_errors"] == 2
    assert not thread_errors


def test_slow_handshakes_and_frames_time_out(monkeypatch: pytest.MonkeyPatch,
                                             local_server: lookup.LookupServer) -> None:
    monkeypatch.setattr(lookup, "_HANDSHAKE_TIMEOUT_S", 1.0)
    monkeypatch.setattr(lookup, "_FRAME_TIMEOUT_S", 1.0)
    monkeypatch.setattr(lookup, "_POLL_S", 0.05)
    silent = _raw(local_server)  # connects and never answers the HELLO
    idle = _raw(local_server)  # authenticated and idle between frames: fine for ever
    _authenticate(local_server, idle)
    idle_since = time.monotonic()
    partial = _raw(local_server)
    _authenticate(local_server, partial)
    partial.sendall(b"\x40\x00")  # half a length prefix
    frames, closed = _read_to_end(silent)
    assert closed and [type(f) for f in frames] == [wire.Hello, wire.Refused]
    assert "handshake took too long" in frames[1].reason
    frames, closed = _read_to_end(partial)
    assert closed and [type(f) for f in frames] == [wire.Refused]
    assert "a frame took too long" in frames[0].reason
    time.sleep(max(0.0, idle_since + 1.3 - time.monotonic()))
    idle.sendall(wire.encode_lookup(9, "idle", [1, 2, 3], 0, "", ""))
    body = wire.take_frame(bytearray(idle.recv(1 << 16)), wire.MAX_SERVER_BODY)
    assert body is not None
    reply = wire.decode(body, (wire.REPLY,))
    assert isinstance(reply, wire.Reply) and reply.seq == 9 and reply.num_tokens == 2
    assert local_server.stats()["timeouts"] == 2


def test_golden_bytes() -> None:
    """The wire format, pinned: a change here is a change of VERSION."""
    frame = wire.encode_lookup(7, "k", [1, 0x01020304], 3, "s", "a", [b"\xee", b""], "G2",
                               "")
    assert frame.hex() == ("38000000" "4b56544c" "0100" "0300" "0700000000000000" "03000000"
                           "0100" "0100" "0100" "0000" "02000000" "02" "00" "0000" "02000000"
                           "6b" "73" "61" "4732" "01000000" "04030201" "01ee" "00")
    assert wire.encode_reply_ok(7, 32, (0, 2, 1, 0)).hex() == (
        "28000000" "4b56544c" "0100" "0400" "0700000000000000" "0000" "0000" "20000000"
        "00000000" "02000000" "01000000" "00000000")
    assert wire.encode_reply_error(8, "no").hex() == (
        "2a000000" "4b56544c" "0100" "0400" "0800000000000000" "0100" "0200" "00000000"
        "00000000" "00000000" "00000000" "00000000" "6e6f")
    assert wire.encode_refused("x").hex() == "0d000000" "4b56544c" "0100" "0500" "0100" "0000" "78"
    assert wire.encode_hello(b"\x05" * 32).hex() == "28000000" "4b56544c" "0100" "0100" + "05" * 32
    assert wire.encode_auth(b"\x06" * 32).hex() == "28000000" "4b56544c" "0100" "0200" + "06" * 32


# ---- fuzz ---------------------------------------------------------------------------------------

_CLIENT_TYPES = (wire.AUTH, wire.LOOKUP)
_SERVER_TYPES = (wire.HELLO, wire.REPLY, wire.REFUSED)
_ALPHABET = "abc/-_\x00é漢🙂"


def _text(rng: random.Random, max_chars: int) -> str:
    return "".join(rng.choice(_ALPHABET) for _ in range(rng.randrange(max_chars + 1)))


def _valid_frame(rng: random.Random, from_client: bool) -> bytes:
    if from_client:
        if rng.random() < 0.2:
            return wire.encode_auth(rng.randbytes(32))
        tokens = [rng.choice((0, 1, 0xFFFFFFFF, rng.getrandbits(32))) for _ in
                  range(rng.randrange(40))]
        extras = [rng.randbytes(rng.choice((0, 16, wire.MAX_EXTRA_BYTES)))
                  for _ in range(rng.randrange(6))]
        return wire.encode_lookup(rng.getrandbits(64), _text(rng, 12), tokens,
                                  rng.getrandbits(32), _text(rng, 6), _text(rng, 4), extras,
                                  _text(rng, 5), _text(rng, 3))
    r = rng.random()
    if r < 0.25:
        return wire.encode_hello(rng.randbytes(32))
    if r < 0.6:
        return wire.encode_reply_ok(rng.getrandbits(64), rng.getrandbits(32),
                                    [rng.getrandbits(32) for _ in range(4)])
    if r < 0.85:
        return wire.encode_reply_error(rng.getrandbits(64), _text(rng, 40))
    return wire.encode_refused(_text(rng, 40))


def _mutate(rng: random.Random, frame: bytes, limit: int) -> bytes:
    data = bytearray(frame)
    how = rng.randrange(9)
    if how == 0:  # a few flipped bytes anywhere
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif how == 1:  # a random byte in the fixed part (magic, version, type, lengths, counts)
        data[rng.randrange(min(len(data), wire.PREFIX_BYTES + 40))] = rng.randrange(256)
    elif how == 2:  # truncated
        del data[rng.randrange(len(data)):]
    elif how == 3:  # extra bytes after it
        data += rng.randbytes(rng.randint(1, 64))
    elif how == 4:  # a length prefix that says something else: small, large, just over
        n = rng.choice((0, 1, 7, 8, len(data), limit, limit + 1, 0xFFFFFFFF, rng.getrandbits(32)))
        data[:4] = n.to_bytes(4, "little")
    elif how == 5:  # a body length that agrees with the prefix, but fields that do not add up
        data += rng.randbytes(rng.randint(1, 16))
        data[:4] = (len(data) - 4).to_bytes(4, "little")
    elif how == 6:  # pure noise
        data = bytearray(rng.randbytes(rng.randrange(80)))
    elif how == 7:  # two frames back to back, the second one cut
        other = _valid_frame(rng, rng.random() < 0.5)
        data += other[:rng.randrange(len(other) + 1)]
    else:  # invalid UTF-8 in a string
        if len(data) > 40:
            data[rng.randrange(36, len(data))] = rng.choice((0x80, 0xC0, 0xFF, 0xED))
    return bytes(data)


def _reencode(msg: wire.Message) -> bytes:
    if isinstance(msg, wire.Hello):
        return wire.encode_hello(msg.nonce)
    if isinstance(msg, wire.Auth):
        return wire.encode_auth(msg.mac)
    if isinstance(msg, wire.Lookup):
        return wire.encode_lookup(msg.seq, msg.key, msg.tokens, msg.num_computed, msg.salt,
                                  msg.adapter, msg.extras, msg.load_tiers, msg.store_tiers)
    if isinstance(msg, wire.Reply):
        return (wire.encode_reply_ok(msg.seq, msg.num_tokens, msg.blocks_by_tier) if msg.ok
                else wire.encode_reply_error(msg.seq, msg.error))
    assert isinstance(msg, wire.Refused)
    return wire.encode_refused(msg.reason)


def _decode_stream(data: bytes, limits: List[int],
                   expected: List[Tuple[int, ...]]) -> Tuple[List[wire.Message], Optional[str]]:
    """What a reader makes of `data` followed by the end of the connection: the messages, then
    None (a clean end between frames) or the WireError text. limits[i]/expected[i] apply to the
    i-th frame (the last entry to every later one). Nothing but WireError may be raised."""
    buf, out = bytearray(data), []
    try:
        while True:
            i = min(len(out), len(limits) - 1)
            body = wire.take_frame(buf, limits[i])
            if body is None:
                if buf:
                    raise wire.WireError("truncated")
                return out, None
            msg = wire.decode(body, expected[i])
            # Canonical: what decodes re-encodes to the very same bytes.
            assert _reencode(msg) == len(body).to_bytes(4, "little") + body
            out.append(msg)
    except wire.WireError as e:
        return out, str(e) or "error"


def test_fuzz_the_decoder() -> None:
    rng = random.Random(20261202)
    counts = {"decoded": 0, "refused": 0}
    for i in range(20000):
        from_client = i % 2 == 0
        limit = wire.MAX_LOOKUP_BODY if from_client else wire.MAX_SERVER_BODY
        types = _CLIENT_TYPES if from_client else _SERVER_TYPES
        frame = _valid_frame(rng, from_client)
        if i < 200:  # valid frames round-trip
            msgs, err = _decode_stream(frame, [limit], [types])
            assert err is None and len(msgs) == 1
        data = _mutate(rng, frame, limit)
        msgs, err = _decode_stream(data, [limit], [types])
        counts["refused" if err else "decoded"] += 1
        # The bodies alone, and with the wrong direction's types, never raise anything else.
        for body in (data[4:], data):
            for want in (types, _CLIENT_TYPES + _SERVER_TYPES, ()):
                try:
                    wire.decode(body, want)
                except wire.WireError:
                    pass
    # Both ends of the decoder were exercised, not only the first check.
    assert counts["decoded"] > 1000 and counts["refused"] > 10000, counts


def test_fuzz_over_a_live_socket(local_server: lookup.LookupServer, thread_errors: List[str],
                                 caplog: pytest.LogCaptureFixture) -> None:
    """Mutated frames over real connections, before and after the handshake. For each, what the
    server did (replies, REFUSED, counters) must be what the pure decoder says of those bytes;
    the server must close every bad connection promptly and keep serving."""
    caplog.set_level(logging.WARNING, logger="kvtier.vllm")
    rng = random.Random(7)
    secret = access.read_secret(local_server.secret_path)
    predicted = {"protocol_errors": 0, "refused_auth": 0}
    before = local_server.stats()
    for i in range(3000):
        authenticated = i % 4 != 0
        frame = _valid_frame(rng, True)
        if not authenticated and rng.random() < 0.5:
            frame = wire.encode_auth(rng.randbytes(32))
        data = _mutate(rng, frame, wire.MAX_LOOKUP_BODY)
        if authenticated:
            msgs, err = _decode_stream(data, [wire.MAX_LOOKUP_BODY], [(wire.LOOKUP,)])
        else:
            msgs, err = _decode_stream(data, [wire.AUTH_BODY], [(wire.AUTH,)])
            if msgs:  # a well-formed AUTH with the wrong MAC
                msgs, err = [], "auth"
        s = _raw(local_server)
        nonce = _hello(s)
        if authenticated:
            s.sendall(wire.encode_auth(access.auth_mac(secret, nonce)))
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError as e:  # the server may close before it has read everything
            assert e.errno in (errno.EPIPE, errno.ECONNRESET), e
        frames, closed = _read_to_end(s)
        s.close()
        assert closed, f"case {i}: the server kept a bad connection open"
        replies = [f for f in frames if isinstance(f, wire.Reply)]
        assert len(replies) == len(msgs), (i, data.hex(), frames)
        assert [r.seq for r in replies] == [m.seq for m in msgs]
        refused = [f for f in frames if isinstance(f, wire.Refused)]
        assert len(refused) == (1 if err else 0), (i, data.hex(), err, frames)
        if err == "auth":
            predicted["refused_auth"] += 1
        elif err:
            predicted["protocol_errors"] += 1
    after = local_server.stats()
    for k, v in predicted.items():
        assert after[k] - before[k] == v, (k, after, predicted)
    assert predicted["protocol_errors"] > 1500 and predicted["refused_auth"] > 100, predicted
    _wait_for(lambda: not local_server._conns, "a connection was left open")
    _ok(lookup.LookupClient(local_server.instance, 0), "after the fuzz")
    assert not thread_errors
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert 1 <= len(warnings) <= 3, [r.getMessage() for r in warnings]  # one per kind


# ---- settings ----------------------------------------------------------------------------------

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


def test_extras_and_tiers_travel_and_are_bounded(local_server: Any) -> None:
    c = lookup.LookupClient(local_server.instance, local_server.rank)
    try:
        request = ("extras", [1, 2, 3], 0, "", "", [b"\x01" * 16, b"", b"\x02" * 16], "G2,G3",
                   "G2")
        assert c.result(c.submit(request), 5) == (c.OK, (3, (0, 5, 2, 32)))
        # Too long an extra, or too many tiers characters: FAILED, and the channel lives on.
        status, why = c.result(c.submit(("extras", [1], 0, "", "",
                                         [b"x" * (wire.MAX_EXTRA_BYTES + 1)], "", "")), 1)
        assert status == c.FAILED and "extra" in why
        status, why = c.result(c.submit(("extras", [1], 0, "", "", [], "G" * 40, "")), 1)
        assert status == c.FAILED and "load_tiers" in why
        assert c.result(c.submit(request), 5)[0] == c.OK
    finally:
        c.close()
    # A body whose extras do not add up is refused by the decoder.
    good = wire.encode_lookup(1, "k", [1], 0, "", "", [b"\x05" * 4])
    body = bytearray(good[wire.PREFIX_BYTES:])
    body[-5] = 30  # the extra claims 30 bytes; 4 follow
    with pytest.raises(wire.WireError, match="extra"):
        wire.decode(bytes(body), (wire.LOOKUP,))
    with pytest.raises(wire.WireError, match="past its block extras"):
        wire.decode(bytes(good[wire.PREFIX_BYTES:]) + b"\x00", (wire.LOOKUP,))

"""The lookup channel between vLLM's scheduler and kvtier's BlockManager in each worker.

vLLM's scheduler (engine-core process) asks "how much of this prompt can kvtier load?" while
kvtier's index lives with the BlockManager in each model-worker process (docs/vllm.md says
why). Each worker runs a :class:`LookupServer` for its rank of one vLLM instance; the scheduler
holds one :class:`LookupClient` per rank. A lookup reads only the manager's in-memory index (G4
queries are bounded by ``g4.lookup_deadline_ms``): no storage I/O is on this path. `instance`
is an opaque string naming the vLLM instance (both ends must be given the same one).

When the worker lives in the scheduler's own process (vLLM's single-process executor), the
client finds the server in :data:`_LOCAL` and calls it directly, without a socket.

Messages are fixed binary frames (:mod:`kvtier.vllm.lookup_wire`; the table is in
docs/vllm.md, "The lookup channel"). Every request carries a sequence number and replies echo
it, so a reply that arrives after its caller gave up is recognised and dropped.

This module holds the worker's end (:class:`LookupServer`); the scheduler's end
(:class:`LookupClient`), the request and answer types and :data:`_LOCAL` are in
:mod:`kvtier.vllm.lookup_client`, and are imported from here.

Security model (the files and checks: :mod:`kvtier.vllm.lookup_access`). The trust boundary
is the user: a process of the worker's own uid is trusted (it could ptrace the worker anyway),
nothing else is, and no byte from the socket is ever executed or unpickled.

- The socket is a file in a private directory: ``$XDG_RUNTIME_DIR/kvtier`` when
  ``XDG_RUNTIME_DIR`` is a directory of this uid with mode 0700, else ``/tmp/kvtier-<uid>``.
  The directory must be owned by this uid with mode 0700 (created so; refused, with what to
  do, when it is not). Other uids cannot even reach the socket (root excepted, as always).
- Every accepted connection's peer credentials (SO_PEERCRED) must carry the server's uid; other
  peers are closed at once, before a byte is read or sent, and counted (``refused_peer``). The
  client checks the server's uid the same way.
- The server draws a random 32-byte secret (``secrets.token_bytes``) at start and writes it to
  a 0600 file beside the socket. A connection starts with a challenge: the server sends a
  random nonce (HELLO), the client answers HMAC-SHA256(secret, AUTH_CONTEXT || nonce) (AUTH),
  compared with ``hmac.compare_digest``. No lookup is read before that; a wrong answer is
  refused (REFUSED), closed and counted (``refused_auth``). The client reads the secret file
  at each connection, after the HELLO, so a restarted worker's new secret is picked up. The
  secret keeps out a peer that reaches the socket but not the file (the socket passed on or
  mounted elsewhere); against the uid itself it adds nothing, and is not meant to.
- The decoder trusts no byte: lengths and counts are checked against fixed bounds before use
  (a frame over its bound is refused before its body is read); an unauthenticated peer can only
  make the server read a 40-byte AUTH. A malformed frame closes that connection only (logged,
  rate-limited, counted); each connection has its own thread, so others keep being served.
  A frame that has begun must be complete within ``_FRAME_TIMEOUT_S``; the handshake within
  ``_HANDSHAKE_TIMEOUT_S``; at most ``_MAX_CONNECTIONS`` connections are served at once.
- The socket and secret files are removed on close (and at interpreter exit). A socket file
  that nobody listens on (a killed worker's) is replaced; one that somebody does listen on
  means a second instance under the same name: the server refuses to start, saying so.

The client never blocks: submit() queues its frame on a non-blocking socket and result() waits
at most the time it is given. A server that is gone turns every call into FAILED, never into
an exception or a hang.
"""

from __future__ import annotations

import errno
import hmac
import logging
import os
import secrets
import socket
import stat
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from kvtier.vllm import lookup_access as access
from kvtier.vllm import lookup_wire as wire
from kvtier.vllm.lookup_access import LookupChannelError
from kvtier.vllm.lookup_client import _LOCAL, _LOCAL_LOCK, _full
from kvtier.vllm.lookup_client import LookupAnswer as LookupAnswer
from kvtier.vllm.lookup_client import LookupClient as LookupClient
from kvtier.vllm.lookup_client import LookupFn as LookupFn
from kvtier.vllm.lookup_client import LookupRequest as LookupRequest

logger = logging.getLogger("kvtier.vllm")

_HANDSHAKE_TIMEOUT_S = 5.0  # from accept to a verified AUTH
_FRAME_TIMEOUT_S = 10.0  # from a frame's first byte to its last
_SEND_TIMEOUT_S = 30.0  # a reply the client does not read for this long ends the connection
_POLL_S = 0.5  # how often blocked server threads look at the closed flag
_MAX_CONNECTIONS = 64
_LOG_INTERVAL_S = 60.0

COUNTERS = ("connections", "refused_peer", "refused_auth", "refused_busy", "protocol_errors",
            "timeouts", "lookups", "lookup_errors")


class _RateLimitedLog:
    """One warning per kind per interval; the ones held back are counted in the next."""

    def __init__(self, interval_s: float) -> None:
        self._interval = interval_s
        self._lock = threading.Lock()
        self._last: Dict[str, float] = {}
        self._held: Dict[str, int] = {}

    def warning(self, kind: str, fmt: str, *args: Any) -> None:
        now = time.monotonic()
        with self._lock:
            last = self._last.get(kind)
            if last is not None and now - last < self._interval:
                self._held[kind] = self._held.get(kind, 0) + 1
                return
            self._last[kind] = now
            held = self._held.pop(kind, 0)
        if held:
            fmt += " (and %d more like it since the last one)"
            args += (held,)
        logger.warning(fmt, *args)


class _PeerGone(Exception):
    """The connection ended or the server is closing: nothing to report."""


class _TimedOut(Exception):
    pass


def _remove_files_of(pid: int, files: List[Tuple[str, int, int]]) -> None:
    if os.getpid() == pid:
        access.remove_files(files)


class _FrameReader:
    """The frames of one connection, in as few recv calls as they take: a small frame in one.
    Never holds more than one chunk past the frame being read, and never more than a frame's
    `limit` allows when that is small (an unauthenticated peer's AUTH)."""

    _CHUNK = 1 << 16

    def __init__(self, conn: socket.socket, closed: Callable[[], bool]) -> None:
        self._conn = conn
        self._closed = closed
        self._buf = bytearray()

    def frame(self, limit: int, deadline: Optional[float]) -> Optional[bytes]:
        """The next frame's body (at most `limit` bytes), or None when the peer closed between
        frames. Waits for the frame's first byte until `deadline` (None: for as long as the
        server is open); from there the frame must be whole within _FRAME_TIMEOUT_S. Raises
        WireError (a bad or truncated frame), _TimedOut, _PeerGone (server closing), OSError."""
        size = min(self._CHUNK, wire.PREFIX_BYTES + limit)
        if not self._buf and not self._fill(size, deadline, boundary=True):
            return None
        frame_deadline = time.monotonic() + _FRAME_TIMEOUT_S
        if deadline is not None:
            frame_deadline = min(frame_deadline, deadline)
        while len(self._buf) < wire.PREFIX_BYTES:
            self._fill(size, frame_deadline, boundary=False)
        n = wire.body_length(bytes(self._buf[:wire.PREFIX_BYTES]), limit)
        end = wire.PREFIX_BYTES + n
        while len(self._buf) < end:
            self._fill(max(size, end - len(self._buf)), frame_deadline, boundary=False)
        body = bytes(self._buf[wire.PREFIX_BYTES:end])
        del self._buf[:end]
        return body

    def _fill(self, size: int, deadline: Optional[float], boundary: bool) -> bool:
        """One recv of at most `size` bytes into the buffer. False when the peer closed at a
        `boundary` (between frames)."""
        while True:
            try:
                data = self._conn.recv(size)
                break
            except socket.timeout:
                if self._closed():
                    raise _PeerGone() from None
                if deadline is not None and time.monotonic() > deadline:
                    what = "the handshake" if boundary else "a frame"
                    raise _TimedOut(f"{what} took too long") from None
        if not data:
            if boundary:
                return False
            raise wire.WireError(f"the connection closed {len(self._buf)} bytes into a frame "
                                 f"(a truncated frame)")
        self._buf += data
        return True


# ---- server -------------------------------------------------------------------------------------

class LookupServer:
    """Answers lookups for one worker's BlockManager on a background thread per connection.

    `lookup` is called on those threads; it must be thread-safe (BlockManager.lookup is, and
    releases the GIL while it hashes and matches). Raises LookupChannelError when the channel
    cannot be set up (see the module's security model), OSError when the socket cannot."""

    def __init__(self, instance: str, rank: int, lookup: LookupFn) -> None:
        self.instance, self.rank = instance, rank
        self._key = (instance, rank)
        self._lookup = lookup
        self._uid = os.geteuid()
        self.socket_path, self.secret_path = access.channel_paths(
            instance, rank, access.private_dir(create=True))
        self._closed = False
        self._lock = threading.Lock()
        self._conns: Set[socket.socket] = set()
        self._counts = dict.fromkeys(COUNTERS, 0)
        self._log = _RateLimitedLog(_LOG_INTERVAL_S)
        self._listener = self._listen()
        files = [(self.socket_path, *self._inode(self.socket_path))]
        # At interpreter exit too, but never in a forked child's (the files are the parent's).
        self._finalizer = weakref.finalize(self, _remove_files_of, os.getpid(), files)
        try:
            self._secret = secrets.token_bytes(access.SECRET_BYTES)
            files.append((self.secret_path,
                          *access.write_secret(self.secret_path, self._secret)))
        except BaseException:
            self._listener.close()
            self._finalizer()
            raise
        self._thread = threading.Thread(target=self._accept_loop, name="kvtier-lookup",
                                        daemon=True)
        self._thread.start()
        with _LOCAL_LOCK:
            _LOCAL[self._key] = self

    @staticmethod
    def _inode(path: str) -> Tuple[int, int]:
        st = os.lstat(path)
        return st.st_dev, st.st_ino

    def _in_use_error(self, detail: str) -> LookupChannelError:
        return LookupChannelError(
            f"kvtier lookup channel: another lookup server is already listening at "
            f"{self.socket_path} for vLLM instance {self.instance!r}, rank {self.rank} "
            f"({detail}). Two vLLM instances under the same name on this host: give each one "
            f"a distinct engine_id (kv_transfer_config), or stop the other one.")

    def _listen(self) -> socket.socket:
        """Binds the socket, replacing a stale socket file (nobody listening on it)."""
        path = self.socket_path
        try:
            st: Optional[os.stat_result] = os.lstat(path)
        except FileNotFoundError:
            st = None
        if st is not None:
            if not stat.S_ISSOCK(st.st_mode):
                raise LookupChannelError(
                    f"kvtier lookup channel: {path} exists and is not a socket; remove it")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            probe.settimeout(1.0)
            try:
                probe.connect(path)
            except (ConnectionRefusedError, FileNotFoundError):
                try:
                    os.unlink(path)  # stale: its server died without cleaning up
                except FileNotFoundError:
                    pass
                logger.info("kvtier lookup server: replaced the stale socket %s", path)
            except OSError as e:  # a timeout: somebody holds it and does not accept
                raise self._in_use_error(f"it does not accept: {e}") from e
            else:
                raise self._in_use_error("it accepted a connection")
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
        except OSError as e:
            sock.close()
            if e.errno == errno.EADDRINUSE:
                raise self._in_use_error("it was bound while this one started") from e
            raise
        try:
            os.chmod(path, 0o600)
            sock.listen(16)
            sock.settimeout(_POLL_S)
        except BaseException:
            sock.close()
            access.remove_files([(path, *self._inode(path))])
            raise
        return sock

    def stats(self) -> Dict[str, int]:
        """Counters since start: connections (authenticated), refused_peer (another uid),
        refused_auth (wrong secret), refused_busy (too many connections), protocol_errors
        (malformed frames), timeouts (handshake or frame too slow), lookups, lookup_errors."""
        with self._lock:
            return dict(self._counts)

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def call(self, request: LookupRequest) -> LookupAnswer:
        """Answers one lookup in this process (the single-process executor's path); counted as
        the socket's lookups are."""
        try:
            answer = self._lookup(*_full(request))
        except Exception:
            self._count("lookup_errors")
            raise
        self._count("lookups")
        return answer

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError as e:
                if self._closed:
                    return
                self._log.warning("accept", "kvtier lookup server: accept failed: %s", e)
                time.sleep(_POLL_S)  # EMFILE and the like: do not spin
                continue
            try:
                self._admit(conn)
            except Exception as e:  # never let one connection end the accept loop
                self._log.warning("accept", "kvtier lookup server: dropped a connection: %s", e)
                conn.close()

    def _admit(self, conn: socket.socket) -> None:
        pid, uid = access.peer_uid(conn)
        if uid != self._uid:
            self._count("refused_peer")
            self._log.warning("peer", "kvtier lookup server (%s, rank %d): refused a connection "
                              "from pid %d uid %d (not this server's uid %d)",
                              self.instance, self.rank, pid, uid, self._uid)
            conn.close()
            return
        with self._lock:
            busy = len(self._conns) >= _MAX_CONNECTIONS
            if not busy:
                self._conns.add(conn)
        if busy:
            self._count("refused_busy")
            self._log.warning("busy", "kvtier lookup server (%s, rank %d): refused pid %d: "
                              "%d connections already", self.instance, self.rank, pid,
                              _MAX_CONNECTIONS)
            conn.close()
            return
        threading.Thread(target=self._serve, args=(conn, pid), name="kvtier-lookup-conn",
                         daemon=True).start()

    def _serve(self, conn: socket.socket, pid: int) -> None:
        try:
            conn.settimeout(_POLL_S)
            reader = _FrameReader(conn, lambda: self._closed)
            nonce = secrets.token_bytes(wire.NONCE_BYTES)
            self._send(conn, wire.encode_hello(nonce))
            body = reader.frame(wire.AUTH_BODY, time.monotonic() + _HANDSHAKE_TIMEOUT_S)
            if body is None:
                return  # gone before it authenticated (a liveness probe, say)
            auth = wire.decode(body, (wire.AUTH,))
            assert isinstance(auth, wire.Auth)
            if not hmac.compare_digest(auth.mac, access.auth_mac(self._secret, nonce)):
                self._count("refused_auth")
                self._log.warning("auth", "kvtier lookup server (%s, rank %d): refused pid %d: "
                                  "its answer to the challenge does not match this server's "
                                  "secret", self.instance, self.rank, pid)
                self._send(conn, wire.encode_refused(
                    f"authentication failed: the answer does not match the secret of the "
                    f"server now at {self.socket_path}"))
                return
            self._count("connections")
            while True:
                body = reader.frame(wire.MAX_LOOKUP_BODY, None)
                if body is None:
                    return
                request = wire.decode(body, (wire.LOOKUP,))
                assert isinstance(request, wire.Lookup)
                self._send(conn, self._answer(request))
        except wire.WireError as e:
            if self._closed:
                return  # close() cut a frame short
            self._count("protocol_errors")
            self._log.warning("protocol", "kvtier lookup server (%s, rank %d): closed the "
                              "connection of pid %d: %s", self.instance, self.rank, pid, e)
            self._try_send(conn, wire.encode_refused(f"protocol error: {e}"))
        except _TimedOut as e:
            self._count("timeouts")
            self._log.warning("timeout", "kvtier lookup server (%s, rank %d): closed the "
                              "connection of pid %d: %s", self.instance, self.rank, pid, e)
            self._try_send(conn, wire.encode_refused(str(e)))
        except (_PeerGone, OSError):
            pass
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _answer(self, request: wire.Lookup) -> bytes:
        try:
            num, by_tier = self._lookup(request.key, request.tokens, request.num_computed,
                                        request.salt, request.adapter, request.extras,
                                        request.load_tiers, request.store_tiers)
            frame = wire.encode_reply_ok(request.seq, num, by_tier)
            self._count("lookups")
            return frame
        except Exception as e:  # answered as an error; the scheduler counts a miss
            self._count("lookup_errors")
            return wire.encode_reply_error(request.seq, f"{type(e).__name__}: {e}")

    def _send(self, conn: socket.socket, data: bytes) -> None:
        view, sent = memoryview(data), 0
        deadline = time.monotonic() + _SEND_TIMEOUT_S
        while sent < len(view):
            try:
                sent += conn.send(view[sent:])
            except socket.timeout:
                if self._closed:
                    raise _PeerGone() from None
                if time.monotonic() > deadline:
                    raise _TimedOut("the client did not read its replies") from None

    def _try_send(self, conn: socket.socket, data: bytes) -> None:
        try:
            conn.settimeout(_POLL_S)
            conn.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        """Stops accepting, closes every connection and removes the socket and secret files.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        with _LOCAL_LOCK:
            if _LOCAL.get(self._key) is self:
                del _LOCAL[self._key]
        for s in [self._listener] + self._take_conns():
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        self._finalizer()

    def _take_conns(self) -> List[socket.socket]:
        with self._lock:
            conns = list(self._conns)
            self._conns.clear()
        return conns


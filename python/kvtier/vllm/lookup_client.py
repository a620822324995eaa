"""The scheduler's end of the lookup channel: :class:`LookupClient`, and what both ends share
(the request and answer types, and :data:`_LOCAL`, the servers of this process).

The channel, its wire format and its security model are described in :mod:`kvtier.vllm.lookup`,
which holds the worker's end (:class:`~kvtier.vllm.lookup.LookupServer`) and re-exports every
name defined here, so callers import both ends from there.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Deque, Dict, List, Optional, Tuple

from kvtier.vllm import lookup_access as access
from kvtier.vllm import lookup_wire as wire
from kvtier.vllm.lookup_access import LookupChannelError

if TYPE_CHECKING:
    from kvtier.vllm.lookup import LookupServer

# (num_tokens, blocks_by_tier) or an error text.
LookupAnswer = Tuple[int, Tuple[int, int, int, int]]
# (key, tokens, num_computed, salt, adapter, block extras, load_tiers, store_tiers)
LookupFn = Callable[[str, List[int], int, str, str, List[bytes], str, str], LookupAnswer]
LookupRequest = Tuple[Any, ...]  # the arguments of a LookupFn; the last three may be left out


def _full(request: LookupRequest) -> Tuple[Any, ...]:
    """A request with the optional trailing fields (no extras, every tier) filled in."""
    return tuple(request) + ([], "", "")[max(0, len(request) - 5):]

# Servers of this process by (instance, rank): the single-process executor's shortcut.
_LOCAL: Dict[Tuple[str, int], "LookupServer"] = {}
_LOCAL_LOCK = threading.Lock()

_CLIENT_MAX_QUEUED_BYTES = 64 << 20  # requests waiting to be sent to a server that is not reading


class LookupClient:
    """The scheduler's end of one rank's lookup channel: submit() sends a lookup, result()
    collects its answer, waiting at most a given time, so the scheduler can move on to other
    requests while a slow lookup (a G4 query) is out. Not thread-safe (vLLM's scheduler calls
    it from one thread). Never raises and never blocks past the wait it is given.

    The server answers one connection's lookups in order; answers that arrive for a call that
    is no longer outstanding (forgotten, or given up) are dropped."""

    PENDING = "pending"
    OK = "ok"
    FAILED = "failed"

    def __init__(self, instance: str, rank: int) -> None:
        self._instance, self._rank = instance, rank
        self._key = (instance, rank)
        self._sock: Optional[socket.socket] = None
        self._poll: Optional[Any] = None
        self._secret_path = ""
        self._authed = False  # the server's HELLO is answered: lookups may follow
        self._rx = bytearray()
        self._tx: Deque[Tuple[int, memoryview]] = deque()  # (seq, frame); seq 0 is the AUTH
        self._tx_bytes = 0
        self._head_sent = 0  # bytes of _tx[0] already sent
        self._seq = 0
        self._outstanding: Dict[int, None] = {}  # seqs sent and not yet answered
        self._answers: Dict[int, Tuple[str, Any]] = {}  # seq -> (OK, answer) | (FAILED, why)

    def submit(self, request: LookupRequest) -> int:
        """Sends one lookup (key, tokens, num_computed, salt, adapter[, block extras,
        load_tiers, store_tiers]); returns its sequence number for result(). Never raises: a
        failure to send becomes a FAILED result."""
        self._seq += 1
        seq = self._seq
        with _LOCAL_LOCK:
            local = _LOCAL.get(self._key)
        if local is not None:
            try:
                self._answers[seq] = (self.OK, local.call(request))
            except Exception as e:
                self._answers[seq] = (self.FAILED, f"{type(e).__name__}: {e}")
            return seq
        try:
            key, tokens, num_computed, salt, adapter, extras, load_t, store_t = _full(request)
            frame = wire.encode_lookup(seq, key, tokens, num_computed, salt, adapter, extras,
                                       load_t, store_t)
        except (wire.WireError, TypeError, ValueError) as e:
            self._answers[seq] = (self.FAILED, f"the lookup cannot be sent: {e}")
            return seq
        if self._sock is None:
            why = self._connect()
            if why is not None:
                self._answers[seq] = (self.FAILED, f"cannot reach the worker's lookup server: "
                                                   f"{why}")
                return seq
        if self._tx_bytes + len(frame) > _CLIENT_MAX_QUEUED_BYTES:
            self._answers[seq] = (self.FAILED, f"the worker's lookup server is not reading "
                                               f"({self._tx_bytes >> 20} MiB queued for it)")
            return seq
        self._tx.append((seq, memoryview(frame)))
        self._tx_bytes += len(frame)
        self._outstanding[seq] = None
        if self._authed:
            self._flush()
        else:
            self._pump(0.0)  # the HELLO may be in: answer it and send
        return seq

    def result(self, seq: int, wait_s: float) -> Tuple[str, Any]:
        """(OK, (num_tokens, blocks_by_tier)), (FAILED, why), or (PENDING, None) when no
        answer came within `wait_s`. An OK or FAILED result stays until forget(seq)."""
        deadline = time.monotonic() + max(0.0, wait_s)
        first = True
        while seq not in self._answers:
            if seq not in self._outstanding or self._sock is None:
                return (self.FAILED, "the lookup was given up")
            left = deadline - time.monotonic()
            if left <= 0 and not first:
                return (self.PENDING, None)
            first = False
            self._pump(max(0.0, left))
        return self._answers[seq]

    def forget(self, seq: int) -> None:
        """The caller no longer wants `seq`'s answer (its request went away)."""
        self._outstanding.pop(seq, None)
        self._answers.pop(seq, None)

    def close(self) -> None:
        """Closes the connection; outstanding calls are given up. The next submit reconnects."""
        if self._sock is not None:
            self._sock.close()
        self._sock, self._poll, self._authed = None, None, False
        self._rx.clear()
        self._tx.clear()
        self._tx_bytes = self._head_sent = 0
        self._outstanding.clear()

    def _connect(self) -> Optional[str]:
        """Connects (without blocking); None on success, else why not."""
        try:
            path, self._secret_path = access.channel_paths(
                self._instance, self._rank, access.private_dir(create=False))
        except LookupChannelError as e:
            return str(e)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect(path)
            _, uid = access.peer_uid(sock)
        except BlockingIOError:
            sock.close()
            return f"{path}: its queue of connections is full"
        except OSError as e:
            sock.close()
            return f"{path}: {e.strerror or e}"
        if uid != os.geteuid():
            sock.close()
            return f"{path} is served by uid {uid}, not this process's uid {os.geteuid()}"
        self._sock, self._authed = sock, False
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)
        return None

    def _broken(self, why: str) -> None:
        """Fails every outstanding call with `why` and closes the connection."""
        for s in self._outstanding:
            self._answers[s] = (self.FAILED, why)
        self.close()

    def _lost(self, detail: str) -> None:
        """The connection failed: before the handshake, the server was never reached."""
        if self._authed:
            self._broken(f"the lookup channel broke: {detail}")
        else:
            self._broken(f"cannot reach the worker's lookup server: {detail} (before the "
                         f"handshake)")

    def _pump(self, timeout_s: float) -> None:
        """Moves bytes both ways, waiting at most `timeout_s` for the socket to be ready."""
        if self._sock is None or self._poll is None:
            return
        want = select.POLLIN | (select.POLLOUT if self._tx and self._authed else 0)
        try:
            self._poll.modify(self._sock, want)
            ready = self._poll.poll(timeout_s * 1000.0)
        except OSError as e:
            self._lost(str(e))
            return
        for _, events in ready:
            if events & (select.POLLIN | select.POLLHUP | select.POLLERR):
                self._receive()
            if self._sock is not None and self._authed and self._tx:
                self._flush()

    def _flush(self) -> None:
        while self._tx and self._sock is not None:
            seq, frame = self._tx[0]
            if self._head_sent == 0 and seq and seq not in self._outstanding:
                self._tx.popleft()  # forgotten before a byte of it left: not sent at all
                self._tx_bytes -= len(frame)
                continue
            try:
                self._head_sent += self._sock.send(frame[self._head_sent:])
            except BlockingIOError:
                return
            except OSError as e:
                self._receive()  # a REFUSED the server sent before it closed says why
                if self._sock is not None:
                    self._lost(str(e))
                return
            if self._head_sent == len(frame):
                self._tx.popleft()
                self._tx_bytes -= len(frame)
                self._head_sent = 0

    def _receive(self) -> None:
        assert self._sock is not None
        try:
            data = self._sock.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError as e:
            self._lost(str(e))
            return
        if not data:
            self._lost("the worker closed the connection")
            return
        self._rx += data
        try:
            while self._sock is not None:
                body = wire.take_frame(self._rx, wire.MAX_SERVER_BODY)
                if body is None:
                    return
                self._handle(wire.decode(body, (wire.HELLO, wire.REPLY, wire.REFUSED)))
        except wire.WireError as e:
            self._lost(f"protocol error from the server: {e}")

    def _handle(self, msg: wire.Message) -> None:
        if isinstance(msg, wire.Reply):
            if not self._authed:
                raise wire.WireError("a REPLY before the HELLO")
            if msg.seq in self._outstanding:
                del self._outstanding[msg.seq]
                self._answers[msg.seq] = ((self.OK, (msg.num_tokens, msg.blocks_by_tier))
                                          if msg.ok else (self.FAILED, msg.error))
        elif isinstance(msg, wire.Hello):
            if self._authed:
                raise wire.WireError("a second HELLO")
            try:
                secret = access.read_secret(self._secret_path)
            except (OSError, LookupChannelError) as e:
                self._broken(f"cannot reach the worker's lookup server: its secret: {e}")
                return
            frame = memoryview(wire.encode_auth(access.auth_mac(secret, msg.nonce)))
            self._tx.appendleft((0, frame))  # nothing was sent before it; _pump sends it
            self._tx_bytes += len(frame)
            self._authed = True
        elif isinstance(msg, wire.Refused):
            self._broken(f"the worker's lookup server refused this client: {msg.reason}")

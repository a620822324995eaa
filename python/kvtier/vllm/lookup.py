"""The lookup channel between vLLM's scheduler and kvtier's BlockManager in each worker.

vLLM's scheduler (engine-core process) asks "how much of this prompt can kvtier load?" while
kvtier's index lives with the BlockManager in each model-worker process (docs/vllm.md says
why). Each worker runs a :class:`LookupServer` on an abstract Unix socket named after vLLM's
engine id and the worker's tensor-parallel rank; the scheduler holds one :class:`LookupClient`
per rank. A lookup reads only the manager's in-memory index (G4 queries are bounded by
``g4.lookup_deadline_ms``): no storage I/O is on this path.

When the worker lives in the scheduler's own process (vLLM's single-process executor), the
client finds the server in :data:`_LOCAL` and calls it directly, without a socket.

Messages are pickled tuples over :mod:`multiprocessing.connection`, authenticated with a key
derived from the engine id (an abstract socket is visible to every process of the network
namespace). Every request carries a sequence number and replies echo it, so a reply that
arrives after its caller gave up is recognised and dropped.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from multiprocessing.connection import Client, Connection, Listener
from typing import Any, Callable, Dict, List, Optional, Tuple

logger = logging.getLogger("kvtier.vllm")

# (num_tokens, blocks_by_tier) or an error text.
LookupAnswer = Tuple[int, Tuple[int, int, int, int]]
LookupFn = Callable[[str, List[int], int, str, str], LookupAnswer]

_LOCAL: Dict[str, "LookupServer"] = {}
_LOCAL_LOCK = threading.Lock()


def socket_name(engine_id: str, rank: int) -> str:
    """The abstract socket of rank `rank`'s lookup server for vLLM engine `engine_id`."""
    digest = hashlib.sha256(engine_id.encode()).hexdigest()[:24]
    return f"\0kvtier-lookup-{digest}-{rank}"


def _authkey(engine_id: str) -> bytes:
    return hashlib.sha256(b"kvtier-lookup:" + engine_id.encode()).digest()


class LookupServer:
    """Answers lookups for one worker's BlockManager on a background thread per connection.

    `lookup` is called on those threads; it must be thread-safe (BlockManager.lookup is, and
    releases the GIL while it hashes and matches).
    """

    def __init__(self, engine_id: str, rank: int, lookup: LookupFn) -> None:
        self.name = socket_name(engine_id, rank)
        self._lookup = lookup
        self._listener = Listener(self.name, family="AF_UNIX", authkey=_authkey(engine_id))
        self._closed = False
        self._conns: List[Connection] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name="kvtier-lookup", daemon=True)
        self._thread.start()
        with _LOCAL_LOCK:
            _LOCAL[self.name] = self

    def call(self, request: Tuple[str, List[int], int, str, str]) -> LookupAnswer:
        """Answers one lookup in this process (the single-process executor's path)."""
        return self._lookup(*request)

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn = self._listener.accept()
            except Exception as e:  # a failed handshake, or the listener closed
                if self._closed:
                    return
                logger.warning("kvtier lookup server: refused a connection: %s", e)
                continue
            with self._lock:
                self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), name="kvtier-lookup-conn",
                             daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        try:
            while not self._closed:
                try:
                    seq, request = conn.recv()
                except (EOFError, OSError):
                    return
                try:
                    reply: Any = ("ok", self._lookup(*request))
                except Exception as e:  # answered as an error; the scheduler counts a miss
                    reply = ("error", f"{type(e).__name__}: {e}")
                conn.send((seq, reply))
        finally:
            conn.close()

    def close(self) -> None:
        """Stops accepting and closes every connection. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with _LOCAL_LOCK:
            _LOCAL.pop(self.name, None)
        try:
            self._listener.close()
        except OSError:
            pass
        with self._lock:
            for c in self._conns:
                try:
                    c.close()
                except OSError:
                    pass


class LookupClient:
    """The scheduler's end of one rank's lookup channel: submit() sends a lookup, result()
    collects its answer, waiting at most a given time, so the scheduler can move on to other
    requests while a slow lookup (a G4 query) is out. Not thread-safe (vLLM's scheduler calls
    it from one thread).

    The server answers one connection's lookups in order; answers that arrive for a call that
    is no longer outstanding (forgotten, or given up) are dropped."""

    PENDING = "pending"
    OK = "ok"
    FAILED = "failed"

    def __init__(self, engine_id: str, rank: int) -> None:
        self._name = socket_name(engine_id, rank)
        self._authkey = _authkey(engine_id)
        self._conn: Optional[Connection] = None
        self._seq = 0
        self._outstanding: Dict[int, None] = {}  # seqs sent and not yet answered
        self._answers: Dict[int, Tuple[str, Any]] = {}  # seq -> (OK, answer) | (FAILED, why)

    def submit(self, request: Tuple[str, List[int], int, str, str]) -> int:
        """Sends one lookup; returns its sequence number for result(). Never raises: a failure
        to send becomes a FAILED result."""
        self._seq += 1
        seq = self._seq
        with _LOCAL_LOCK:
            local = _LOCAL.get(self._name)
        if local is not None:
            try:
                self._answers[seq] = (self.OK, local.call(request))
            except Exception as e:
                self._answers[seq] = (self.FAILED, f"{type(e).__name__}: {e}")
            return seq
        try:
            if self._conn is None:
                self._conn = Client(self._name, family="AF_UNIX", authkey=self._authkey)
            self._conn.send((seq, request))
            self._outstanding[seq] = None
        except Exception as e:
            self._answers[seq] = (self.FAILED, f"cannot reach the worker's lookup server: {e}")
            self.close()
        return seq

    def result(self, seq: int, wait_s: float) -> Tuple[str, Any]:
        """(OK, (num_tokens, blocks_by_tier)), (FAILED, why), or (PENDING, None) when no
        answer came within `wait_s`. An OK or FAILED result stays until forget(seq)."""
        deadline = time.monotonic() + max(0.0, wait_s)
        while seq not in self._answers:
            if seq not in self._outstanding or self._conn is None:
                return (self.FAILED, "the lookup was given up")
            left = deadline - time.monotonic()
            try:
                if not self._conn.poll(max(0.0, left)):
                    return (self.PENDING, None)
                got, (status, value) = self._conn.recv()
            except Exception as e:  # the server went away: every outstanding call fails
                why = f"the lookup channel broke: {e}"
                for s in self._outstanding:
                    self._answers[s] = (self.FAILED, why)
                self._outstanding.clear()
                self.close()
                break
            if got in self._outstanding:
                del self._outstanding[got]
                self._answers[got] = (self.OK, value) if status == "ok" else (self.FAILED, value)
        return self._answers[seq]

    def forget(self, seq: int) -> None:
        """The caller no longer wants `seq`'s answer (its request went away)."""
        self._outstanding.pop(seq, None)
        self._answers.pop(seq, None)

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except OSError:
                pass
            self._conn = None

"""What the KV-event tests share (test_events.py with a plain msgpack decoder under the system
Python, test_events_vllm.py with vLLM's own classes under the vLLM environment): a real
BlockManager publishing on 127.0.0.1, a real ZMQ SUB and DEALER, and a request whose events are
known through take_events(details=True)."""

from __future__ import annotations

import ctypes
import socket
import time
from typing import Dict, List, Optional, Tuple

import zmq

import kvtier

TPB = 16
LAYERS = 2
TOPIC = b"kvtier-test"
END_SEQ = (-1).to_bytes(8, "big", signed=True)


def layout() -> kvtier.Layout:
    return kvtier.Layout(LAYERS, 2, 2, 16, TPB, "fp16")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Worker:
    """A BlockManager with its event stream on tcp://*:PORT and replay on 127.0.0.1, host memory
    as G1, and a SUB already receiving."""

    def __init__(self, g3_dir: str = "", g2_blocks: int = 64,
                 extra: Optional[Dict[str, object]] = None) -> None:
        self.port, self.replay_port = free_port(), free_port()
        slot = 4096 + layout().block_bytes
        values = {
            "g2.capacity_bytes": g2_blocks * slot,
            "g2.lock_memory": False,
            "g2.prefault_threads": 1,
            "g3.enabled": bool(g3_dir),
            "events.endpoint": f"tcp://*:{self.port}",
            "events.replay_endpoint": f"tcp://127.0.0.1:{self.replay_port}",
            "events.topic": TOPIC.decode(),
        }
        if g3_dir:
            values.update({"g3.dir": g3_dir, "g3.capacity_bytes": 64 * slot + (1 << 20),
                           "g3.admit_min_seen": 1})
        values.update(extra or {})
        config = kvtier.load_config(values, file="", environment=False)
        self.m = kvtier.BlockManager(layout(), "test-model", config)
        lay = self.m.layout
        self.num_blocks = 64
        self.chunk = lay.chunk_bytes
        regions = lay.num_layers * lay.num_planes
        self.buf = ctypes.create_string_buffer(self.chunk * self.num_blocks * regions)
        base = ctypes.addressof(self.buf)
        self.m.register_memory(
            lay, self.num_blocks,
            [(base + r * self.chunk * self.num_blocks, self.chunk) for r in range(regions)], False)
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
        self.sub.connect(f"tcp://127.0.0.1:{self.port}")
        self._join()

    def run(self, rid: str, tokens: List[int], salt: str = "", adapter: str = "") -> None:
        """One request: nothing cached is assumed; computes, commits and saves every block."""
        self.m.lookup(rid, tokens, 0, cache_salt=salt, adapter_id=adapter)
        self.m.commit(rid, tokens, list(range(len(tokens) // TPB)))
        self.m.start_save()
        self.m.request_finished(rid)
        self.m.wait_for_saves()

    def _join(self) -> None:
        # ZMQ's slow joiner: run tiny requests until the SUB hears one, then drain.
        for i in range(200):
            self.run(f"join{i}", [50000 + i] * (TPB + 1))
            if self.sub.poll(50):
                while self.sub.poll(100):
                    self.sub.recv_multipart()
                self.m.take_events()
                return
        raise AssertionError("the subscriber never joined the event stream")

    def receive(self, until_hashes: int, timeout_s: float = 10) -> List[Tuple[int, bytes]]:
        """(seq, payload) messages until `until_hashes` block hashes of BlockStored arrived."""
        out: List[Tuple[int, bytes]] = []
        seen = 0
        deadline = time.monotonic() + timeout_s
        while seen < until_hashes:
            left = int((deadline - time.monotonic()) * 1000)
            assert left > 0 and self.sub.poll(left), f"only {seen} of {until_hashes} blocks came"
            topic, seq, payload = self.sub.recv_multipart()
            assert topic == TOPIC and len(seq) == 8
            out.append((int.from_bytes(seq, "big"), payload))
            seen += count_stored(payload)
        return out

    def settle(self) -> None:
        """Waits until every event the manager emitted has been sent (batches leave every 2 ms;
        a demotion's store is emitted when its write ends)."""
        self.m.wait_for_saves()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            s = self.m.stats()
            if s["events_published"] + s["events_publish_dropped"] >= s["events_emitted"]:
                time.sleep(0.02)  # the batch is on its way to the replay buffer, and so sent
                return
            time.sleep(0.005)
        raise AssertionError("the publisher did not send what the manager emitted")

    def replay(self, start: int) -> List[Tuple[int, bytes]]:
        """Everything the replay socket returns from `start`, up to END_SEQ (asserted), once
        what was emitted has been sent."""
        self.settle()
        d = self.ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)
        d.connect(f"tcp://127.0.0.1:{self.replay_port}")
        d.send_multipart([b"", start.to_bytes(8, "big")])
        out = []
        while True:
            assert d.poll(5000), "the replay socket did not answer"
            empty, topic, seq, payload = d.recv_multipart()
            assert empty == b""
            if seq == END_SEQ:
                assert topic == b"" and payload == b""
                break
            assert topic == TOPIC
            out.append((int.from_bytes(seq, "big"), payload))
        d.close()
        return out

    def close(self) -> None:
        self.sub.close(linger=0)
        self.m.close()
        self.ctx.term()


def plain_decode(payload: bytes):
    """The payload as plain Python objects, by whichever generic msgpack decoder is installed
    (python3-msgpack under the system Python; msgspec's untyped decoder in vLLM's env)."""
    try:
        import msgpack
    except ImportError:
        import msgspec

        return msgspec.msgpack.decode(payload)
    return msgpack.unpackb(payload, raw=False)


def count_stored(payload: bytes) -> int:
    batch = plain_decode(payload)
    return sum(len(e["block_hashes"]) for e in batch[1] if e["type"] == "BlockStored")


def stored_details(events: List[Dict]) -> List[Dict]:
    """take_events(details=True) entries of stores, in order."""
    return [e for e in events if e["kind"] == "stored"]


def prompt(seed: int, blocks: int) -> List[int]:
    return [(seed * 1000 + i) % 49152 for i in range(blocks * TPB + 1)]


def parent_or_none(e: Dict) -> Optional[bytes]:
    return None if e["parent_is_root"] else e["parent"]

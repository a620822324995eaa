"""Workers' KV events, from vLLM's wire format to the router's prefix index.

A worker's stream (vLLM's own ZMQ publisher, which also carries the kvtier connector's G2/G3/G4
events, or kvtier's own publisher) is a multipart message: topic, an 8-byte big-endian sequence
number, and a msgpack ``EventBatch`` ``[ts, [event, ...], dp_rank]`` whose events are maps tagged
by ``type``: ``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``.

Each publisher names blocks by its own hashes (vLLM's block hashes, kvtier's 128-bit keys). The
router does not trust those names: it recomputes every block's key in its own namespace from the
token ids the event carries, chained from the parent's key (``EventTranslator``), so the keys it
computes for a prompt and the keys it learns from any worker's events meet.
"""
from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Hashable, List, Optional, Tuple

from kvtier import _kvtier

log = logging.getLogger("kvtier.router")

RouterEvent = Tuple[str, bytes, str]  # (kind "stored"|"removed", 16-byte key, tier "G1".."G4")

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def tier_of(medium: Optional[str], locality: Optional[str], ownership: Optional[str]) -> str:
    """The kvtier tier a vLLM event's medium names. vLLM: "GPU" (its own cache; also None in
    older releases), "CPU", "STORAGE"; kvtier adds locality LOCAL (G3) / REMOTE (G4) and puts its
    tier in ``ownership`` ("kvtier:G3")."""
    if ownership and ownership.startswith("kvtier:") and ownership[7:] in _kvtier.TIER_NAMES:
        return ownership[7:]
    if medium is None or medium == "GPU":
        return "G1"
    if medium == "CPU":
        return "G2"
    if medium == "STORAGE":
        return "G4" if locality == "REMOTE" else "G3"
    return "G3"


def _salt_of(extra_keys: Any, lora_name: Optional[str]) -> str:
    """The cache_salt carried by a first block's extra keys (vLLM puts, in order: the LoRA name
    when lora_name is set, (mm_identifier, offset) pairs, the cache_salt string, prompt-embedding
    digests)."""
    if not extra_keys:
        return ""
    first = extra_keys[0]
    if not first:
        return ""
    items = list(first)
    if lora_name and items and items[0] == lora_name:
        items = items[1:]
    for item in items:
        if isinstance(item, str):
            return item
    return ""


@dataclass
class TranslatorStats:
    stored: int = 0
    removed: int = 0
    cleared: int = 0
    orphans: int = 0          # stores whose parent the router never saw (events missed)
    malformed: int = 0        # token ids that do not fill the blocks, a wrong block size
    unknown_removed: int = 0  # removals of blocks the router never saw stored
    # The first few orphans, described (medium, the parent's name, blocks), for diagnosis.
    orphan_samples: List[str] = field(default_factory=list)


class EventTranslator:
    """Maps one stream's block hashes to router keys (bounded: the oldest names are forgotten
    past ``max_names``, so a stream whose removals were lost cannot grow it forever)."""

    def __init__(self, model_id: str, tokens_per_block: int, max_names: int = 1 << 20) -> None:
        self._model_id = model_id
        self._tpb = tokens_per_block
        self._max = max_names
        self._names: "OrderedDict[Hashable, bytes]" = OrderedDict()
        self._hashers: Dict[Tuple[str, str], Any] = {}
        self.stats = TranslatorStats()

    def hasher(self, cache_salt: str = "", lora_name: str = "") -> Any:
        key = (cache_salt, lora_name)
        h = self._hashers.get(key)
        if h is None:
            h = _kvtier.BlockHasher(self._model_id, self._tpb, cache_salt, lora_name)
            self._hashers[key] = h
        return h

    @staticmethod
    def _name(h: Any) -> Hashable:
        return bytes(h) if isinstance(h, (bytes, bytearray, memoryview)) else h

    def _remember(self, name: Hashable, key: bytes) -> None:
        self._names[name] = key
        self._names.move_to_end(name)
        while len(self._names) > self._max:
            self._names.popitem(last=False)

    def translate(self, event: Dict[str, Any]) -> Tuple[List[RouterEvent], bool]:
        """The router events for one decoded vLLM event, and whether it was AllBlocksCleared."""
        kind = event.get("type")
        if kind == "AllBlocksCleared":
            self.stats.cleared += 1
            return [], True
        tier = tier_of(event.get("medium"), event.get("locality"), event.get("ownership"))
        hashes = event.get("block_hashes") or []
        out: List[RouterEvent] = []
        if kind == "BlockRemoved":
            for h in hashes:
                key = self._names.get(self._name(h))
                if key is None:
                    self.stats.unknown_removed += 1
                    continue
                out.append(("removed", key, tier))
                self.stats.removed += 1
            return out, False
        if kind != "BlockStored":
            self.stats.malformed += 1
            return [], False
        tokens = event.get("token_ids") or []
        bs = event.get("block_size")
        if bs != self._tpb or len(tokens) != len(hashes) * self._tpb:
            self.stats.malformed += 1
            return [], False
        lora = event.get("lora_name") or ""
        parent_name = event.get("parent_block_hash")
        hasher = self.hasher(_salt_of(event.get("extra_keys"), lora or None), lora)
        if parent_name is None:
            parent = hasher.root
        else:
            parent = self._names.get(self._name(parent_name))
            if parent is None:
                self.stats.orphans += len(hashes)
                if len(self.stats.orphan_samples) < 8:
                    self.stats.orphan_samples.append(
                        f"{event.get('medium')}/{event.get('ownership')}: parent "
                        f"{parent_name!r} unknown, {len(hashes)} blocks, first "
                        f"{hashes[0] if hashes else None!r}")
                return [], False
        for i, h in enumerate(hashes):
            key = hasher.chain(parent, tokens[i * self._tpb:(i + 1) * self._tpb])
            self._remember(self._name(h), key)
            out.append(("stored", key, tier))
            self.stats.stored += 1
            parent = key
        return out, False


@dataclass
class StreamState:
    """One subscription: where it reads from and what it has seen."""
    endpoint: str
    replay_endpoint: Optional[str] = None
    topic: str = ""
    last_seq: int = -1
    batches: int = 0
    gaps: int = 0
    replayed: int = 0
    restarts: int = 0
    resyncs: int = 0
    # Set by the router when the worker came back after being down: start over from the
    # publisher's first buffered batch (a restarted worker numbers from 0 again).
    resync: bool = False
    decode_errors: int = 0
    last_event_time: float = field(default_factory=time.monotonic)


def decode_batch(payload: bytes) -> List[Dict[str, Any]]:
    """The events of one msgpack EventBatch ``[ts, events, dp_rank]``; ValueError when the bytes
    are not one."""
    import msgpack  # Debian python3-msgpack; imported here so the module loads without it

    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several types for bad bytes
        raise ValueError(f"not a msgpack EventBatch: {exc}") from exc
    if not isinstance(batch, (list, tuple)) or len(batch) < 2 or not isinstance(batch[1], list):
        raise ValueError("not an EventBatch: expected [ts, [events...], dp_rank]")
    events = []
    for e in batch[1]:
        if not isinstance(e, dict) or "type" not in e:
            raise ValueError("an event is a map with a 'type' key")
        events.append(e)
    return events


Apply = Callable[[List[RouterEvent], bool], None]


async def subscribe(state: StreamState, translator: EventTranslator, apply: Apply,
                    stop: "Any", replay_timeout_s: float = 2.0,
                    idle_resync_s: float = 1.0) -> None:
    """Reads one stream until ``stop`` (an asyncio.Event) is set: decodes each batch, fills gaps
    from the replay socket when there is one, and hands the router events to ``apply(events,
    cleared)``. A sequence number that goes backwards means the publisher restarted: apply is
    called with cleared=True first."""
    import asyncio

    import zmq
    import zmq.asyncio

    ctx = zmq.asyncio.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt_string(zmq.SUBSCRIBE, state.topic)
    sub.connect(state.endpoint)

    def handle(seq: int, payload: bytes) -> None:
        try:
            events = decode_batch(payload)
        except ValueError as exc:
            state.decode_errors += 1
            log.warning("events %s: batch %d dropped: %s", state.endpoint, seq, exc)
            return
        for e in events:
            evs, cleared = translator.translate(e)
            if evs or cleared:
                apply(evs, cleared)
        state.last_seq = seq
        seen[seq] = digest(payload)
        while len(seen) > 4096:
            seen.popitem(last=False)
        state.batches += 1
        state.last_event_time = time.monotonic()

    # A batch may arrive twice (live, after a replay already delivered it): the same sequence
    # number with the same bytes is skipped. A number not above last_seq with other bytes means
    # the publisher started again (a restarted worker numbers from 0).
    seen: "OrderedDict[int, bytes]" = OrderedDict()

    def digest(payload: bytes) -> bytes:
        return hashlib.blake2b(payload, digest_size=8).digest()

    async def replay_from(start: int) -> None:
        if not state.replay_endpoint:
            return
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(state.replay_endpoint)
        try:
            await dealer.send_multipart([b"", start.to_bytes(8, "big")])
            deadline = time.monotonic() + replay_timeout_s
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not await dealer.poll(int(left * 1000)):
                    log.warning("events %s: replay from %d timed out", state.replay_endpoint,
                                start)
                    return
                # ROUTER -> DEALER: b"", topic, 8-byte seq, payload; the end is END_SEQ.
                frames = await dealer.recv_multipart()
                if frames and frames[0] == b"":
                    frames = frames[1:]
                if len(frames) != 3 or len(frames[1]) != 8:
                    state.decode_errors += 1
                    return
                if frames[1] == END_SEQ:
                    return
                seq = int.from_bytes(frames[1], "big", signed=True)
                if seq > state.last_seq:
                    handle(seq, frames[2])
                    state.replayed += 1
        finally:
            dealer.close(0)

    try:
        # A router that starts after the worker did asks for everything still buffered.
        await replay_from(0)
        idle_since = time.monotonic()
        while not stop.is_set():
            if state.resync:
                state.resync = False
                state.resyncs += 1
                state.last_seq = -1
                seen.clear()
                await replay_from(0)
            if not await sub.poll(200):
                # Quiet for a while: ask the replay socket for anything after the last batch
                # (a SUB socket that was reconnecting misses what was sent meanwhile).
                if time.monotonic() - idle_since >= idle_resync_s:
                    await replay_from(state.last_seq + 1)
                    idle_since = time.monotonic()
                continue
            idle_since = time.monotonic()
            frames = await sub.recv_multipart()
            if len(frames) != 3 or len(frames[1]) != 8:
                state.decode_errors += 1
                continue
            seq = int.from_bytes(frames[1], "big", signed=True)
            if state.last_seq >= 0 and seq <= state.last_seq:
                if seen.get(seq) == digest(frames[2]):
                    continue  # already delivered by a replay
                # The publisher started again from 0: a restarted worker.
                state.restarts += 1
                apply([], True)
                state.last_seq = -1
                seen.clear()
            if seq > state.last_seq + 1 and (state.last_seq >= 0 or seq > 0):
                state.gaps += 1
                await replay_from(state.last_seq + 1)
            if seq > state.last_seq:
                handle(seq, frames[2])
            await asyncio.sleep(0)
    finally:
        sub.close(0)

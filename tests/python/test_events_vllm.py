"""kvtier's KV event stream read by vLLM's own decoder: msgspec.msgpack.Decoder(KVEventBatch)
from vllm.distributed.kv_events, as Dynamo's and llm-d's vLLM listeners decode it. Every
payload (live and replayed, stores in G2, G3 and G4, removals, AllBlocksCleared) decodes into
vLLM's classes, its fields equal what the manager reported through take_events(details=True),
and msgspec re-encodes the decoded batch to the very same bytes.

Runs under the vLLM environment (tests/python/events_vllm_test.sh; exit 77 when it cannot be
made). Format: docs/events.md.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

import kvtier
from events_util import TPB, Worker, layout, prompt

kv_events = pytest.importorskip("vllm.distributed.kv_events")
AllBlocksCleared = kv_events.AllBlocksCleared
BlockRemoved = kv_events.BlockRemoved
BlockStored = kv_events.BlockStored
KVEventBatch = kv_events.KVEventBatch


def test_vllm_s_decoder_reads_every_batch_and_re_encodes_it_byte_for_byte(tmp_path: Path) -> None:
    g4 = tmp_path / "g4"
    g4.mkdir()
    w = Worker(g3_dir=str(tmp_path / "g3"), g2_blocks=8,
               extra={"g4.backend": "fs", "g4.dir": str(g4)})
    try:
        w.m.take_events()
        expected = {}  # key -> tokens
        for r in range(6):
            tokens = prompt(60 + r, 2)
            w.run(f"r{r}", tokens, salt="tenant-v", adapter="lora-v")
            keys = kvtier.block_keys(tokens, "test-model", layout(), cache_salt="tenant-v",
                                     adapter_id="lora-v")
            for i in range(2):
                expected[keys[i]] = (tokens[i * TPB:(i + 1) * TPB], i == 0)
        details = w.m.take_events(details=True)
        tiers = {d["tier"] for d in details if d["kind"] == "stored"}
        assert {"G2", "G3", "G4"} <= tiers, tiers

        decoder = msgspec.msgpack.Decoder(KVEventBatch)
        encoder = msgspec.msgpack.Encoder()
        replayed = w.replay(0)
        assert replayed, "the replay socket returned the history"
        seen = {"G2": set(), "G3": set(), "G4": set()}
        removed = 0
        for i, (seq, payload) in enumerate(replayed):
            batch = decoder.decode(payload)
            assert isinstance(batch, KVEventBatch)
            assert batch.data_parallel_rank == 0
            assert encoder.encode(batch) == payload, f"batch {seq}: msgspec encodes it otherwise"
            if i == 0:
                assert isinstance(batch.events[0], AllBlocksCleared)
            for e in batch.events:
                if isinstance(e, BlockRemoved):
                    assert e.medium in ("CPU", "STORAGE")
                    removed += len(e.block_hashes)
                    continue
                if not isinstance(e, BlockStored):
                    continue
                tier = {"CPU": "G2", ("STORAGE", "LOCAL"): "G3",
                        ("STORAGE", "REMOTE"): "G4"}.get(
                            e.medium if e.medium == "CPU" else (e.medium, e.locality))
                assert tier is not None, (e.medium, e.locality)
                assert e.ownership == f"kvtier:{tier}"
                assert e.block_size == TPB and e.lora_id is None
                for j, h in enumerate(e.block_hashes):
                    if h not in expected:
                        continue  # the Worker's joining requests
                    toks, first = expected[h]
                    assert isinstance(h, bytes) and len(h) == 16
                    assert e.token_ids[j * TPB:(j + 1) * TPB] == toks
                    assert e.lora_name == "lora-v"
                    assert e.extra_keys is not None
                    assert list(e.extra_keys[j]) == (["lora-v", "tenant-v"] if first
                                                     else ["lora-v"])
                    if j == 0:
                        assert (e.parent_block_hash is None) == first
                    seen[tier].add(h)
        for tier, keys in seen.items():
            assert keys, f"no BlockStored of our blocks in {tier}"
        assert removed > 0
        s = w.m.stats()
        assert s["events_publish_dropped"] == 0
        assert s["event_batches_published"] >= len(replayed)
    finally:
        w.close()


def test_vllm_s_decoder_reads_the_live_stream() -> None:
    w = Worker()
    try:
        tokens = prompt(90, 3)
        w.run("a", tokens)
        keys = kvtier.block_keys(tokens, "test-model", layout())[:3]
        decoder = msgspec.msgpack.Decoder(KVEventBatch)
        hashes, toks = [], []
        for _, payload in w.receive(3):
            for e in decoder.decode(payload).events:
                if isinstance(e, BlockStored):
                    hashes.extend(e.block_hashes)
                    toks.extend(e.token_ids)
                    assert e.medium == "CPU" and e.locality == "LOCAL"
        assert hashes == keys
        assert toks == tokens[:3 * TPB]
    finally:
        w.close()

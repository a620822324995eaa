"""kvtier's KV event stream decoded with a plain msgpack decoder (python3-msgpack), every field
checked against what the test did through the binding (take_events(details=True)). The same
stream through vLLM's own classes: test_events_vllm.py. Format: docs/events.md.

Run by ctest (python_events_test) with PYTHONPATH=build/python.
"""

from __future__ import annotations

import time
from pathlib import Path

import msgpack

import kvtier
from events_util import TPB, Worker, layout, plain_decode, prompt, stored_details

STORED_KEYS = ["type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
               "medium", "lora_name"]


def events_of(payloads):
    out = []
    for _, p in payloads:
        out.extend(plain_decode(p)[1])
    return out


def test_every_field_of_a_request_s_stores_matches_what_the_manager_did() -> None:
    w = Worker()
    try:
        tokens = prompt(3, 3)
        before = time.time()
        w.run("a", tokens, salt="tenant-x", adapter="lora-a")
        details = stored_details(w.m.take_events(details=True))
        keys = kvtier.block_keys(tokens, "test-model", layout(), cache_salt="tenant-x",
                                 adapter_id="lora-a")
        # The binding's view: what the manager stored.
        assert [d["key"] for d in details] == keys[:3]
        assert [d["tier"] for d in details] == ["G2"] * 3
        for i, d in enumerate(details):
            assert d["token_ids"] == tokens[i * TPB:(i + 1) * TPB]
            assert d["block_size"] == TPB
            assert d["parent_is_root"] == (i == 0)
            assert d["lora_name"] == "lora-a" and d["cache_salt"] == "tenant-x"
            assert d["namespace_known"]
            if i:
                assert d["parent"] == keys[i - 1]

        msgs = w.receive(3)
        seqs = [s for s, _ in msgs]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        for _, payload in msgs:
            batch = msgpack.unpackb(payload, raw=False)
            assert isinstance(batch, list) and len(batch) == 3
            ts, _, rank = batch
            assert isinstance(ts, float) and before - 1 < ts < time.time() + 1
            assert rank == 0
        stored = [e for e in events_of(msgs) if e["type"] == "BlockStored"]
        hashes = [h for e in stored for h in e["block_hashes"]]
        assert hashes == keys[:3]
        assert stored[0]["parent_block_hash"] is None, "a first block has no parent"
        n = 0
        for e in stored:
            # vLLM's field order: the class's own, defaults that hold their value left out.
            assert list(e)[:8] == STORED_KEYS
            assert list(e)[8:] == ["extra_keys", "locality", "ownership"]
            if n:
                assert e["parent_block_hash"] == keys[n - 1]
            k = len(e["block_hashes"])
            assert e["token_ids"] == tokens[n * TPB:(n + k) * TPB]
            assert e["block_size"] == TPB
            assert e["lora_id"] is None
            assert e["medium"] == "CPU" and e["locality"] == "LOCAL"
            assert e["ownership"] == "kvtier:G2"
            assert e["lora_name"] == "lora-a"
            # Per block: the LoRA name, then the salt on the first block only.
            assert e["extra_keys"] == [["lora-a", "tenant-x"] if n + j == 0 else ["lora-a"]
                                       for j in range(k)]
            n += k
        s = w.m.stats()
        assert s["events_published"] >= 3 and s["events_publish_dropped"] == 0
        assert s["event_batches_published"] > seqs[-1]
    finally:
        w.close()


def test_demotion_to_g3_is_a_removal_from_cpu_and_a_store_in_local_storage(tmp_path: Path) -> None:
    # 8 G2 slots (4 of them staging): a few requests push blocks down to G3.
    w = Worker(g3_dir=str(tmp_path), g2_blocks=8)
    try:
        w.m.take_events()
        all_tokens = {}
        for r in range(6):
            tokens = prompt(20 + r, 2)
            w.run(f"r{r}", tokens)
            keys = kvtier.block_keys(tokens, "test-model", layout())
            for i in range(2):
                all_tokens[keys[i]] = tokens[i * TPB:(i + 1) * TPB]
        details = w.m.take_events(details=True)
        # (Blocks of the Worker's joining requests are demoted too: only ours are checked.)
        g3 = [d for d in details if d["kind"] == "stored" and d["tier"] == "G3"
              and d["key"] in all_tokens]
        assert g3, "some blocks were demoted"
        for d in g3:
            assert d["token_ids"] == all_tokens[d["key"]], "G3 stores carry the block's tokens"
        # On the wire, through replay (nothing missed): the same facts.
        events = events_of(w.replay(0))
        removed_cpu = [h for e in events if e["type"] == "BlockRemoved" and e["medium"] == "CPU"
                       for h in e["block_hashes"]]
        local = [e for e in events if e["type"] == "BlockStored" and e["medium"] == "STORAGE"]
        assert local and all(e["locality"] == "LOCAL" and e["ownership"] == "kvtier:G3"
                             for e in local)
        ours = 0
        for e in local:
            for j, h in enumerate(e["block_hashes"]):
                assert h in removed_cpu, "demoted: left G2 first"
                if h in all_tokens:
                    assert e["token_ids"][j * TPB:(j + 1) * TPB] == all_tokens[h]
                    ours += 1
        assert ours == len(g3)
        for e in events:
            if e["type"] == "BlockRemoved":
                assert list(e) == ["type", "block_hashes", "medium", "locality", "ownership"]
    finally:
        w.close()


def test_replay_from_zero_starts_with_all_blocks_cleared_and_equals_the_live_bytes() -> None:
    w = Worker()
    try:
        w.run("a", prompt(5, 2))
        live = dict(w.receive(2))
        replayed = w.replay(0)
        assert [s for s, _ in replayed] == list(range(len(replayed)))
        assert plain_decode(replayed[0][1])[1][0] == {"type": "AllBlocksCleared"}
        by_seq = dict(replayed)
        for seq, payload in live.items():
            assert by_seq[seq] == payload
        assert w.replay(replayed[-1][0] + 1) == []
        assert w.m.stats()["event_replay_requests"] == 2
    finally:
        w.close()


def test_a_warm_restart_announces_itself_then_what_g3_recovered(tmp_path: Path) -> None:
    tokens = prompt(40, 2)
    w = Worker(g3_dir=str(tmp_path))
    w.run("a", tokens, salt="tenant-r")
    keys = kvtier.block_keys(tokens, "test-model", layout(), cache_salt="tenant-r")[:2]
    w.close()  # g3.flush_on_close writes G2 to G3

    w = Worker(g3_dir=str(tmp_path))
    try:
        replayed = w.replay(0)
        first = plain_decode(replayed[0][1])[1]
        assert first[0] == {"type": "AllBlocksCleared"}, "a subscriber learns of the restart"
        stored = [e for e in events_of(replayed[:3]) if e["type"] == "BlockStored"
                  and e["medium"] == "STORAGE"]
        by_hash = {}
        for e in stored:
            for j, h in enumerate(e["block_hashes"]):
                by_hash[h] = (e, e["token_ids"][j * TPB:(j + 1) * TPB])
        for i, k in enumerate(keys):
            e, toks = by_hash[k]
            assert toks == tokens[i * TPB:(i + 1) * TPB], "tokens from the G3 header"
            # The header keeps the namespace's hash, not its names: no salt or LoRA name.
            assert e["lora_name"] is None and "extra_keys" not in e
        e0, _ = by_hash[keys[0]]
        if e0["block_hashes"][0] == keys[0]:
            assert e0["parent_block_hash"] is None
    finally:
        w.close()

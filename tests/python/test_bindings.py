"""Tests of kvtier's Python binding (python/src/kvtier_bindings.cc) against the real C++
manager: real G2 arena, real G3 files in a temporary directory, host memory as G1.

Run by ctest (tests/CMakeLists.txt) with PYTHONPATH=build/python and KVTIER_TEST_CLI=build/kvtier.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import List, Tuple

import pytest

import kvtier

TPB = 16
LAYERS = 4


def small_layout() -> kvtier.Layout:
    # 4 layers x 2 planes x 16 tokens x 2 heads x 32 dims x 2 bytes = 32 KiB per block.
    return kvtier.Layout(LAYERS, 2, 2, 32, TPB, "fp16")


def small_config(g3_dir: str = "", g2_blocks: int = 64) -> kvtier.Config:
    slot = 4096 + small_layout().block_bytes
    values = {
        "g2.capacity_bytes": g2_blocks * slot,
        "g2.lock_memory": False,
        "g2.prefault_threads": 1,
        "g3.enabled": bool(g3_dir),
    }
    if g3_dir:
        values.update({"g3.dir": g3_dir, "g3.capacity_bytes": 256 * slot + (1 << 20),
                       "g3.admit_min_seen": 1})
    return kvtier.load_config(values, file="", environment=False)


class HostG1:
    """Host memory as G1, layer-separate: one region per (layer, plane)."""

    def __init__(self, manager: kvtier.BlockManager, num_blocks: int) -> None:
        layout = manager.layout
        self.chunk = layout.chunk_bytes
        self.num_blocks = num_blocks
        self.regions = layout.num_layers * layout.num_planes
        self.buf = ctypes.create_string_buffer(self.chunk * num_blocks * self.regions)
        base = ctypes.addressof(self.buf)
        regions = [(base + r * self.chunk * num_blocks, self.chunk) for r in range(self.regions)]
        manager.register_memory(layout, num_blocks, regions, False)

    def offset(self, block: int, region: int) -> int:
        return region * self.chunk * self.num_blocks + block * self.chunk

    def fill(self, block: int, seed: int) -> None:
        for r in range(self.regions):
            pattern = bytes([(seed * 31 + r * 7 + i) % 251 for i in range(251)])
            data = (pattern * (self.chunk // 251 + 1))[: self.chunk]
            off = self.offset(block, r)
            self.buf[off : off + self.chunk] = data

    def read(self, block: int) -> bytes:
        return b"".join(
            self.buf[self.offset(block, r) : self.offset(block, r) + self.chunk]
            for r in range(self.regions)
        )

    def clear(self, block: int) -> None:
        for r in range(self.regions):
            off = self.offset(block, r)
            self.buf[off : off + self.chunk] = bytes(self.chunk)


def prompt(seed: int, blocks: int) -> List[int]:
    return [(seed * 1000 + i) % 49152 for i in range(blocks * TPB + 1)]


def compute_and_save(m: kvtier.BlockManager, g1: HostG1, rid: str, tokens: List[int],
                     blocks: List[int], salt: str = "") -> None:
    n, _ = m.lookup(rid, tokens, 0, cache_salt=salt)
    assert n == 0
    for i, b in enumerate(blocks):
        g1.fill(b, seed=tokens[i * TPB])
    m.commit(rid, tokens, blocks)
    m.start_save()
    m.request_finished(rid)
    m.wait_for_saves()


def load(m: kvtier.BlockManager, rid: str, tokens: List[int], blocks: List[int],
         salt: str = "") -> Tuple[int, Tuple[int, int, int, int], int]:
    n, by_tier = m.lookup(rid, tokens, 0, cache_salt=salt)
    planned = m.prepare_load(rid, blocks, n)
    m.start_load()
    for layer in range(LAYERS):
        assert m.wait_layer(layer) is None
    return n, by_tier, m.loaded_tokens(rid) if planned else 0


def test_config_sources_and_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    toml = tmp_path / "k.toml"
    toml.write_text('[g2]\ncapacity_bytes = "64MiB"\n[g3]\nqueue_depth = 8\n')
    monkeypatch.setenv("KVTIER_G3_QUEUE_DEPTH", "16")
    c = kvtier.load_config({"g3.files": 2}, file=str(toml))
    assert c.get("g2.capacity_bytes") == str(64 << 20)
    assert c.get("g3.queue_depth") == "16"  # the environment beats the file
    assert c.get("g3.files") == "2"  # the dict beats both
    sources = {e[0]: e[2] for e in c.entries()}
    assert sources["g2.capacity_bytes"] == "file"
    assert sources["g3.queue_depth"] == "env"
    assert sources["g3.files"] == "set"
    assert "g2.capacity_bytes" in kvtier.Config.field_names()
    # is_set: chosen by a file, the environment or set(); False at the built-in default.
    assert c.is_set("g2.capacity_bytes") and c.is_set("g3.queue_depth") and c.is_set("g3.files")
    assert not c.is_set("g3.dir") and not kvtier.Config().is_set("g2.capacity_bytes")
    with pytest.raises(kvtier.KvtierError) as e:
        c.is_set("g9.nothing")
    assert e.value.code == "InvalidArgument" and "g9.nothing" in str(e.value)

    with pytest.raises(kvtier.KvtierError) as e:
        c.set("g2.capacity_bytes", "lots")
    assert e.value.code == "InvalidArgument" and "g2.capacity_bytes" in str(e.value)
    with pytest.raises(kvtier.KvtierError) as e:
        c.set("g9.nothing", 1)
    assert e.value.code == "InvalidArgument"
    with pytest.raises(kvtier.KvtierError) as e:
        c.set("g3.files", [1])  # type: ignore[arg-type]
    assert "must be str, int, float or bool" in str(e.value)
    with pytest.raises(kvtier.KvtierError) as e:
        kvtier.load_config(file=str(tmp_path / "missing.toml"))
    assert e.value.code == "NotFound"
    monkeypatch.setenv("KVTIER_G2_NO_SUCH_FIELD", "1")
    with pytest.raises(kvtier.KvtierError) as e:
        kvtier.load_config(file="")
    assert "KVTIER_G2_NO_SUCH_FIELD" in str(e.value)


def test_layout_and_keys_match_the_cli() -> None:
    layout = kvtier.Layout(2, 2, 1, 8, 8, "fp32")
    assert layout.block_bytes == 2 * 2 * 1 * 8 * 8 * 4
    tokens = list(range(1, 18))
    keys = kvtier.block_keys(tokens, "m", layout)
    assert len(keys) == 2 and all(len(k) == 16 for k in keys)
    cli = os.environ.get("KVTIER_TEST_CLI")
    if not cli:
        pytest.skip("KVTIER_TEST_CLI is not set (ctest sets it to build/kvtier)")
    out = subprocess.run(
        [cli, "keys", "--model", "m", "--tokens", ",".join(map(str, tokens)), "--layers", "2",
         "--kv-heads", "1", "--head-dim", "8", "--tokens-per-block", "8", "--dtype", "fp32"],
        check=True, capture_output=True, text=True).stdout.split("\n")
    assert out[1].split()[1] == keys[0].hex()
    assert out[2].split()[1] == keys[1].hex()
    assert kvtier.block_keys(tokens, "m", layout, cache_salt="s")[0] != keys[0]
    with pytest.raises(kvtier.KvtierError) as e:
        kvtier.Layout(2, 2, 1, 8, 4097, "fp32")  # past the largest block size
    assert "tokens_per_block = 4097" in str(e.value) and "1..4096" in str(e.value)
    with pytest.raises(kvtier.KvtierError):
        kvtier.Layout(2, 2, 1, 8, 8, "fp64")


@pytest.mark.parametrize("tpb", [12, 96, 528, 784])
def test_block_sizes_that_are_not_powers_of_two_key_like_the_cli(tpb: int) -> None:
    layout = kvtier.Layout(2, 2, 1, 8, tpb, "fp32")
    assert layout.tokens_per_block == tpb and layout.block_bytes == 2 * 2 * 8 * tpb * 4
    tokens = [(i * 7919) % 50000 for i in range(2 * tpb + tpb // 2)]  # two blocks and a tail
    keys = kvtier.block_keys(tokens, "m", layout)
    assert len(keys) == 2
    assert kvtier.block_keys(tokens[:2 * tpb - 1], "m", layout) == keys[:1]
    cli = os.environ.get("KVTIER_TEST_CLI")
    if not cli:
        pytest.skip("KVTIER_TEST_CLI is not set (ctest sets it to build/kvtier)")
    out = subprocess.run(
        [cli, "keys", "--model", "m", "--tokens", ",".join(map(str, tokens)), "--layers", "2",
         "--kv-heads", "1", "--head-dim", "8", "--tokens-per-block", str(tpb), "--dtype", "fp32"],
        check=True, capture_output=True, text=True).stdout.split("\n")
    assert [line.split()[1] for line in out[1:3]] == [k.hex() for k in keys]


def test_save_then_load_bytes_equal_and_stats_and_events() -> None:
    m = kvtier.BlockManager(small_layout(), "test-model", small_config())
    g1 = HostG1(m, 32)
    tokens = prompt(1, 4)
    compute_and_save(m, g1, "a", tokens, [0, 1, 2, 3, 4])
    expected = [g1.read(b) for b in range(4)]
    events = m.take_events()
    stored = [e for e in events if e[0] == "stored" and e[3] == "G2"]
    assert len(stored) == 4
    assert [e[1] for e in stored] == kvtier.block_keys(tokens, "test-model", small_layout())[:4]
    assert stored[1][2] == stored[0][1]  # the parent of block 1 is block 0

    for b in range(10, 15):
        g1.clear(b)
    n, by_tier, loaded = load(m, "b", tokens, [10, 11, 12, 13, 14])
    assert n == 4 * TPB and by_tier == (0, 4, 0, 0) and loaded == 4 * TPB
    assert [g1.read(b) for b in range(10, 14)] == expected
    m.request_finished("b")
    s = m.stats()
    assert s["hit_blocks"]["G2"] == 4
    assert s["saved_blocks"] == 4
    assert s["bytes_by_path"]["G2->G1"] == 4 * small_layout().block_bytes
    assert s["pinned_blocks"] == 0

    # Another salt: the same tokens are other blocks.
    n, _ = m.lookup("c", tokens, 0, cache_salt="tenant-2")
    assert n == 0
    m.request_finished("c")
    m.close()
    with pytest.raises(kvtier.KvtierError) as e:
        m.stats()
    assert e.value.code == "FailedPrecondition"


def test_stats_has_every_field_of_the_table() -> None:
    """BlockManager.stats() has a key per row of kvtier.stats_fields()
    (include/kvtier/manager_stats_fields.h) of the row's shape, and no key that is not a row
    but the binding's own events_dropped."""
    fields = kvtier.stats_fields()
    names = [f["name"] for f in fields]
    assert len(set(names)) == len(names)
    assert {"lookups", "hit_blocks", "bytes_by_path", "g4_late_returns"} <= set(names)
    for f in fields:
        assert f["kind"] in ("counter", "gauge"), f
        assert f["vllm"] in ("own_name", "figure", "none"), f
        assert f["help"], f
    m = kvtier.BlockManager(small_layout(), "test-model", small_config())
    s = m.stats()
    m.close()
    assert set(s) == set(names) | {"events_dropped"}
    paths = [f"G{a}->G{b}" for a, b in ((1, 2), (2, 1), (2, 3), (3, 2), (3, 1), (2, 4), (4, 2),
                                        (4, 1))]
    for f in fields:
        v = s[f["name"]]
        if f["shape"] == "per_tier":
            assert list(v) == list(kvtier.TIER_NAMES), f
        elif f["shape"] == "per_path":
            assert list(v) == paths, f
        elif f["shape"] == "flag":
            assert isinstance(v, bool), f
        else:
            assert f["shape"] == "u64" and isinstance(v, int) and not isinstance(v, bool), f


def test_async_load_preemption_wait_and_leak_stats() -> None:
    m = kvtier.BlockManager(small_layout(), "test-model", small_config())
    g1 = HostG1(m, 32)
    tokens = prompt(3, 4)
    compute_and_save(m, g1, "a", tokens, [0, 1, 2, 3, 4])
    expected = [g1.read(b) for b in range(4)]
    for b in range(10, 15):
        g1.clear(b)
    # An async load: polled through finished(), still answered by loaded_tokens.
    n, _ = m.lookup("b", tokens, 0)
    assert m.prepare_load("b", [10, 11, 12, 13, 14], n, async_load=True) == 4 * TPB
    m.start_load()
    assert m.loaded_tokens("b") == 4 * TPB
    assert [g1.read(b) for b in range(10, 14)] == expected
    assert "b" in m.finished()[1]
    assert m.request_finished("b") is False
    # Preemption: waits for this request's saves only (here: none left after commit + save).
    m.lookup("p", prompt(4, 2), 0)
    m.commit("p", prompt(4, 2), [20, 21, 22])
    m.start_save()
    m.wait_for_request_saves("p")
    m.wait_for_request_saves("unknown")  # returns at once
    m.request_finished("p")
    m.wait_for_saves()
    m.finished()
    s = m.stats()
    for key in ("g4_rejected_keys", "g4_removed_corrupt", "tracked_requests", "expired_requests"):
        assert key in s
    assert s["tracked_requests"] == 0
    assert s["pinned_blocks"] == 0
    m.close()


def test_g3_survives_a_restart(tmp_path: Path) -> None:
    g3 = str(tmp_path / "g3")
    m = kvtier.BlockManager(small_layout(), "test-model", small_config(g3))
    g1 = HostG1(m, 16)
    tokens = prompt(2, 3)
    compute_and_save(m, g1, "a", tokens, [0, 1, 2, 3])
    expected = [g1.read(b) for b in range(3)]
    m.close()  # flushes G2 to G3 (g3.flush_on_close)

    m2 = kvtier.BlockManager(small_layout(), "test-model", small_config(g3))
    g1b = HostG1(m2, 16)
    n, by_tier, loaded = load(m2, "b", tokens, [5, 6, 7, 8])
    assert (n, by_tier, loaded) == (3 * TPB, (0, 0, 3, 0), 3 * TPB)
    assert [g1b.read(b) for b in range(5, 8)] == expected
    assert m2.stats()["hit_blocks"]["G3"] == 3
    m2.close()


def test_an_explicit_g3_dir_that_cannot_open_raises(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("x")
    with pytest.raises(kvtier.KvtierError) as e:
        kvtier.BlockManager(small_layout(), "test-model", small_config(str(not_a_dir)))
    assert e.value.code == "InvalidArgument"
    assert f"G3 cannot open in g3.dir = {not_a_dir}" in str(e.value)
    assert "g3.enabled = false" in str(e.value)


def test_errors_raise_with_codes() -> None:
    m = kvtier.BlockManager(small_layout(), "test-model", small_config())
    with pytest.raises(kvtier.KvtierError) as e:
        m.prepare_load("never-looked-up", [0], 16)
    assert e.value.code == "NotFound"
    with pytest.raises(kvtier.KvtierError) as e:
        m.lookup("", prompt(3, 1), 0)
    assert e.value.code == "InvalidArgument"
    tokens = prompt(3, 2)
    m.lookup("early", tokens, 0)
    m.commit("early", tokens, [0, 1, 2])
    with pytest.raises(kvtier.KvtierError) as e:
        m.start_save()  # a save before register_memory: nowhere to read it from
    assert e.value.code == "FailedPrecondition"
    m.request_finished("early")
    with pytest.raises(kvtier.KvtierError) as e:
        m.start_load(engine_stream=0)  # no G1: nothing to order
    assert e.value.code == "FailedPrecondition"
    HostG1(m, 4)
    # A host G1's copies have no CUDA stream to be ordered after; the plain calls still work.
    for call in (m.start_save, m.start_load):
        with pytest.raises(kvtier.KvtierError) as e:
            call(engine_stream=0x1234)
        assert e.value.code == "InvalidArgument" and "host memory" in str(e.value)
        call(engine_stream=None)
        call()
    with pytest.raises(kvtier.KvtierError) as e:
        m.wait_layer(LAYERS)
    assert e.value.code == "InvalidArgument"
    with pytest.raises(kvtier.KvtierError):
        m.register_memory(small_layout(), 4, [(0, 16)], False)  # wrong region count, null base
    with pytest.raises(kvtier.KvtierError) as e:
        kvtier.BlockManager(small_layout(), "m", kvtier.load_config(
            {"g2.capacity_bytes": 4096}, file="", environment=False))
    m.close()


def test_gil_is_released_while_cxx_works() -> None:
    m = kvtier.BlockManager(small_layout(), "test-model", small_config())
    tokens = [i % 49152 for i in range(2_000_000)]  # hashing 125k blocks takes a while
    started = threading.Event()
    done = threading.Event()
    elapsed = [0.0]

    def work() -> None:
        started.set()
        t0 = time.perf_counter()
        for i in range(3):
            m.lookup(f"big{i}", tokens, 0)
        elapsed[0] = time.perf_counter() - t0
        done.set()

    t = threading.Thread(target=work)
    t.start()
    started.wait()
    spins = 0
    while not done.is_set():
        spins += 1
    t.join()
    # With the GIL held through the lookups this thread would not run until they end.
    assert elapsed[0] > 0.05, "the lookups were too quick to tell"
    assert spins > 1000, f"main thread ran {spins} times during {elapsed[0]:.3f} s of lookups"
    m.close()

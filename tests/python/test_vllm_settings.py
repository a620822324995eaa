"""The vLLM connector's settings, per-request controls, reset epoch and weights fingerprint
(python/kvtier/vllm/{settings,params,keys}.py), without vLLM: real files, real errors."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from kvtier.vllm.keys import weights_fingerprint
from kvtier.vllm.params import RequestControls
from kvtier.vllm.settings import ConnectorSettings


def test_new_keys_are_checked() -> None:
    s = ConnectorSettings.parse({})
    assert (s.load_failure_policy, s.max_load_failures, s.save_decode_tokens) == ("auto", 2, True)
    assert s.allow_unvouched_layout is False
    assert ConnectorSettings.parse({"allow_unvouched_layout": True}).allow_unvouched_layout
    for bad, what in [({"max_load_failures": -1}, "max_load_failures"),
                      ({"allow_unvouched_layout": 1}, "allow_unvouched_layout"),
                      ({"max_load_failures": True}, "max_load_failures"),
                      ({"save_decode_tokens": "yes"}, "save_decode_tokens"),
                      ({"load_failure_policy": "ignore"}, "load_failure_policy")]:
        with pytest.raises(ValueError, match=what):
            ConnectorSettings.parse(bad)


def test_each_replica_stage_and_rank_has_its_own_g3_and_port(tmp_path: Path) -> None:
    s = ConnectorSettings.parse({"g3.dir": str(tmp_path), "metrics.port": 9400})
    one = s.kvtier_config()
    assert one.get("g3.dir") == str(tmp_path)
    assert one.get("metrics.port") == "9400"
    c = s.kvtier_config(tp_rank=1, tp_size=2, pp_rank=1, pp_size=2, dp_rank=2, dp_size=3)
    assert c.get("g3.dir") == f"{tmp_path}/dp2/pp1/tp1"
    # index = (dp * pp_size + pp) * tp_size + tp = (2 * 2 + 1) * 2 + 1
    assert c.get("metrics.port") == str(9400 + 11)
    assert s.kvtier_config(dp_rank=1, dp_size=2).get("g3.dir") == f"{tmp_path}/dp1"
    seen = {s.kvtier_config(tp_rank=t, tp_size=2, dp_rank=d, dp_size=2).get("metrics.port")
            for t in range(2) for d in range(2)}
    assert len(seen) == 4, "no two workers of one instance share a port"
    with pytest.raises(ValueError, match="passes 65535"):
        ConnectorSettings.parse({"metrics.port": 65534}).kvtier_config(dp_rank=0, dp_size=4)
    # A relative g3.dir is made absolute (and so counts as set: a G3 that cannot open there
    # stops start-up instead of leaving the instance without G3).
    rel = ConnectorSettings.parse({"g3.dir": "relative-dir"}).kvtier_config()
    assert os.path.isabs(rel.get("g3.dir"))


def test_reset_epoch_is_kept_and_bad_files_are_survived(tmp_path: Path) -> None:
    s = ConnectorSettings.parse({"g3.dir": str(tmp_path / "g3")})
    assert s.load_epoch() == 0
    assert s.bump_epoch(0) == 1
    assert s.bump_epoch(1) == 2
    assert s.load_epoch() == 2, "a restart reads the epoch back"
    assert (tmp_path / "g3" / "kvtier-reset-epoch").read_text().strip() == "2"
    # Per DP replica.
    assert s.load_epoch(dp_rank=1, dp_size=2) == 0
    assert s.bump_epoch(0, dp_rank=1, dp_size=2) == 1
    assert (tmp_path / "g3" / "dp1" / "kvtier-reset-epoch").exists()
    # Garbage in the file: read as 0, never a crash.
    (tmp_path / "g3" / "kvtier-reset-epoch").write_text("not a number")
    assert s.load_epoch() == 0
    (tmp_path / "g3" / "kvtier-reset-epoch").write_text("9" * 40)
    assert s.load_epoch() == 0
    # A g3.dir that cannot hold the file (a regular file in the way): the epoch still moves on
    # for this run.
    blocked = tmp_path / "a-file"
    blocked.write_text("x")
    b = ConnectorSettings.parse({"g3.dir": str(blocked / "g3")})
    assert b.bump_epoch(4) == 5
    assert b.load_epoch() == 0


def test_request_controls() -> None:
    assert RequestControls.parse(None) == RequestControls()
    assert RequestControls.parse({"other_connector": 1}) == RequestControls()
    c = RequestControls.parse({"kvtier": {"save": False, "max_load_tokens": 256,
                                          "load_tiers": ["G3", "G2"], "store_tiers": ["G2"]}})
    assert (c.save, c.load, c.max_load_tokens, c.load_tiers, c.store_tiers, c.error) == (
        False, True, 256, "G2,G3", "G2", "")
    for bad, what in [({"kvtier": 3}, "must be an object"),
                      ({"kvtier": {"laod": False}}, "unknown"),
                      ({"kvtier": {"save": "no"}}, "save must be"),
                      ({"kvtier": {"max_load_tokens": -5}}, "max_load_tokens"),
                      ({"kvtier": {"max_load_tokens": 1.5}}, "max_load_tokens"),
                      ({"kvtier": {"load_tiers": []}}, "load_tiers"),
                      ({"kvtier": {"store_tiers": ["G1"]}}, "store_tiers"),
                      ({"kvtier": {"load_tiers": "G2"}}, "load_tiers")]:
        assert what in RequestControls.parse(bad).error, bad


def _safetensors(path: Path, tensors: dict) -> None:
    """A minimal safetensors file: {name: bytes} as U8 tensors."""
    header, offset, blobs = {}, 0, []
    for name, data in tensors.items():
        header[name] = {"dtype": "U8", "shape": [len(data)], "data_offsets": [offset,
                                                                              offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def test_weights_fingerprint_sees_changed_weights_cheaply(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    a = bytes(range(256)) * 4096  # 1 MiB
    _safetensors(model / "model.safetensors", {"w.weight": a, "norm.weight": b"\x01" * 64})
    args = dict(revision=None, config={"hidden": 8}, dtype="float32", quantization=None,
                kv_cache_dtype="auto")
    fp = weights_fingerprint(str(model), **args)
    assert fp == weights_fingerprint(str(model), **args), "deterministic"
    assert fp != weights_fingerprint(str(model), **{**args, "kv_cache_dtype": "fp8"})
    assert fp != weights_fingerprint(str(model), **{**args, "config": {"hidden": 9}})
    # A small tensor's bytes change (a norm, say): the per-tensor samples see it.
    _safetensors(model / "model.safetensors", {"w.weight": a, "norm.weight": b"\x02" * 64})
    changed = weights_fingerprint(str(model), **args)
    assert changed != fp
    # weights_id stands for the files.
    assert weights_fingerprint(str(model), **args, weights_id="v7") == \
        weights_fingerprint(str(tmp_path / "elsewhere"), **args, weights_id="v7")
    # A damaged header is survived (and still fingerprints the file).
    (model / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 60) + b"garbage")
    damaged = weights_fingerprint(str(model), **args)
    assert damaged not in (fp, changed)
    # No local files (a hub name never downloaded): the name and revision.
    hub = weights_fingerprint("org/not-a-local-model", **args)
    assert hub != weights_fingerprint("org/not-a-local-model", **{**args, "revision": "v2"})

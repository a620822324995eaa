"""KvtierConnector's settings, from vLLM's ``kv_connector_extra_config``.

Keys are kvtier's own configuration fields, exactly as ``kvtier config`` lists them
("g2.capacity_bytes", "g3.dir", "g4.backend", ...), flat or nested ({"g2": {"capacity_bytes":
"4GiB"}}), plus the connector's own keys below. The rest of kvtier's configuration comes from
the same places as everywhere else: the TOML file named by ``config_file`` (or
``$KVTIER_CONFIG``) and the ``KVTIER_*`` environment; keys given here win over both.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Dict, Mapping

import kvtier

_log = logging.getLogger("kvtier.vllm")

# The connector's own keys, with their defaults.
_OWN = {
    # A kvtier TOML file (the same format as `kvtier --config`).
    "config_file": "",
    # How long the scheduler waits for a worker's lookup answer before it counts a miss.
    "lookup_timeout_ms": 2000,
    # How long one scheduling pass waits for it; a slower answer (a G4 query) makes vLLM ask
    # again at a later step (None), while other requests are scheduled.
    "lookup_wait_ms": 50,
    # "auto": loads that read G3 or G4 run between steps (vLLM's asynchronous loads), G2
    # loads are layer-pipelined inside the step. "never": every load is layer-pipelined.
    "async_load": "auto",
    # The model's name in kvtier's key namespace (default: vLLM's model path or name).
    "model_id": "",
    # vLLM's kv_load_failure_policy, set by the connector: "recompute" (a block that fails to
    # load is computed again), "fail" (the request fails), or "auto": vLLM's own setting when it
    # is "recompute", else "recompute" (vLLM's default is "fail", and it cannot say whether the
    # user chose it).
    "load_failure_policy": "auto",
    # Loads of one request that may lose blocks before kvtier stops offering it any (it then
    # computes): no request can loop on a block that keeps failing.
    "max_load_failures": 2,
    # Save the blocks of generated tokens too (a follow-up turn's prompt holds them), not only
    # the prompt's.
    "save_decode_tokens": True,
    # Names the weights in the key namespace instead of their fingerprint (kvtier/vllm/keys.py):
    # for weights kvtier cannot read, or to version them by hand.
    "weights_id": "",
    # Disaggregated prefill/decode (vLLM's kv_role; docs/pd.md). A consumer's request that
    # announces the producer's blocks (kv_transfer_params.kvtier.expect_tokens) is looked up
    # again each step until they have all arrived, for at most this long; then what arrived
    # loads and the rest is computed (counted: pd_missing_tokens).
    "pd_wait_ms": 2000,
    # A consumer (kv_role "kv_consumer") saves the prompt blocks it loaded or computed again:
    # off by default, the producer saved them.
    "consumer_saves_prompt": False,
    # A producer (kv_role "kv_producer") looks its prompts up and loads what kvtier holds (a
    # later turn's prefill reuses the earlier turn): on by default; off, it only saves.
    "producer_loads": True,
    # Run on a KV cache layout kvtier has not vouched for (an attention backend, dtype, stride
    # order or ISA outside kvtier/vllm/layout_vouch.py's VOUCHED), with a warning, instead of
    # refusing at start-up. Its blocks still get their own layout fingerprint.
    "allow_unvouched_layout": False,
}


def _flatten(values: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for k, v in values.items():
        name = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, name + "."))
        else:
            out[name] = v
    return out


@dataclasses.dataclass
class ConnectorSettings:
    config_file: str
    lookup_timeout_ms: int
    lookup_wait_ms: int
    async_load: str
    model_id: str
    load_failure_policy: str
    max_load_failures: int
    save_decode_tokens: bool
    weights_id: str
    kvtier_values: Dict[str, Any]
    pd_wait_ms: int = 2000
    consumer_saves_prompt: bool = False
    producer_loads: bool = True
    allow_unvouched_layout: bool = False

    @staticmethod
    def parse(extra: Mapping[str, Any]) -> "ConnectorSettings":
        """Splits and checks `extra`. Raises ValueError naming the key, the value and what is
        allowed; a kvtier setting is checked by kvtier itself (KvtierError)."""
        flat = _flatten(extra)
        own = {k: flat.pop(k) for k in list(flat) if k in _OWN}
        known = set(kvtier.Config.field_names())
        unknown = sorted(k for k in flat if k not in known)
        if unknown:
            raise ValueError(
                f"kvtier: unknown key(s) in kv_connector_extra_config: {', '.join(unknown)}; "
                f"allowed: the connector's {', '.join(sorted(_OWN))} and kvtier's settings "
                f"(`kvtier config` lists them)")
        s = ConnectorSettings(
            config_file=str(own.get("config_file", _OWN["config_file"])),
            lookup_timeout_ms=own.get("lookup_timeout_ms", _OWN["lookup_timeout_ms"]),
            lookup_wait_ms=own.get("lookup_wait_ms", _OWN["lookup_wait_ms"]),
            async_load=str(own.get("async_load", _OWN["async_load"])),
            model_id=str(own.get("model_id", _OWN["model_id"])),
            load_failure_policy=str(own.get("load_failure_policy", _OWN["load_failure_policy"])),
            max_load_failures=own.get("max_load_failures", _OWN["max_load_failures"]),
            save_decode_tokens=own.get("save_decode_tokens", _OWN["save_decode_tokens"]),
            weights_id=str(own.get("weights_id", _OWN["weights_id"])),
            kvtier_values=flat,
            pd_wait_ms=own.get("pd_wait_ms", _OWN["pd_wait_ms"]),
            consumer_saves_prompt=own.get("consumer_saves_prompt",
                                          _OWN["consumer_saves_prompt"]),
            producer_loads=own.get("producer_loads", _OWN["producer_loads"]),
            allow_unvouched_layout=own.get("allow_unvouched_layout",
                                           _OWN["allow_unvouched_layout"]),
        )
        if (not isinstance(s.pd_wait_ms, int) or isinstance(s.pd_wait_ms, bool)
                or not 0 <= s.pd_wait_ms <= 600_000):
            raise ValueError(f"kvtier: pd_wait_ms must be an integer in 0..600000, not "
                             f"{s.pd_wait_ms!r}")
        for flag in ("consumer_saves_prompt", "producer_loads", "allow_unvouched_layout"):
            if not isinstance(getattr(s, flag), bool):
                raise ValueError(f"kvtier: {flag} must be true or false, not "
                                 f"{getattr(s, flag)!r}")
        if (not isinstance(s.lookup_timeout_ms, int) or isinstance(s.lookup_timeout_ms, bool)
                or not 1 <= s.lookup_timeout_ms <= 600_000):
            raise ValueError(f"kvtier: lookup_timeout_ms must be an integer in 1..600000, "
                             f"not {s.lookup_timeout_ms!r}")
        if (not isinstance(s.lookup_wait_ms, int) or isinstance(s.lookup_wait_ms, bool)
                or not 0 <= s.lookup_wait_ms <= s.lookup_timeout_ms):
            raise ValueError(f"kvtier: lookup_wait_ms must be an integer in 0..lookup_timeout_ms "
                             f"({s.lookup_timeout_ms}), not {s.lookup_wait_ms!r}")
        if s.async_load not in ("auto", "never"):
            raise ValueError(f"kvtier: async_load must be 'auto' or 'never', not {s.async_load!r}")
        if s.load_failure_policy not in ("auto", "recompute", "fail"):
            raise ValueError(f"kvtier: load_failure_policy must be 'auto', 'recompute' or "
                             f"'fail', not {s.load_failure_policy!r}")
        if (not isinstance(s.max_load_failures, int) or isinstance(s.max_load_failures, bool)
                or not 0 <= s.max_load_failures <= 100):
            raise ValueError(f"kvtier: max_load_failures must be an integer in 0..100, not "
                             f"{s.max_load_failures!r}")
        if not isinstance(s.save_decode_tokens, bool):
            raise ValueError(f"kvtier: save_decode_tokens must be true or false, not "
                             f"{s.save_decode_tokens!r}")
        s.kvtier_config()  # refuse a bad kvtier setting at start-up, in every process
        return s

    def kvtier_config(self, tp_rank: int = 0, tp_size: int = 1, pp_rank: int = 0,
                      pp_size: int = 1, dp_rank: int = 0, dp_size: int = 1) -> kvtier.Config:
        """The manager's configuration: defaults < file < environment < extra config. Each
        data-parallel replica, pipeline stage and tensor-parallel rank keeps its G3 in its own
        subdirectory of g3.dir (dpD/ppP/tpT, each level only when there is more than one), and
        serves its /metrics on metrics.port + its index among the instance's workers (the ports
        of one instance are consecutive)."""
        config = kvtier.load_config(self.kvtier_values, file=self.config_file or None)
        sub = self.rank_subdir(tp_rank, tp_size, pp_rank, pp_size, dp_rank, dp_size)
        # Always set, so that kvtier treats G3 as asked for: a G3 that cannot open (another
        # vLLM instance holds its lock, say) stops start-up with the reason instead of leaving
        # this instance silently without G3.
        config.set("g3.dir", os.path.abspath(os.path.join(config.get("g3.dir"), sub)))
        port = int(config.get("metrics.port") or 0)
        workers = tp_size * pp_size * dp_size
        if port and workers > 1:
            index = (dp_rank * pp_size + pp_rank) * tp_size + tp_rank
            if port + workers - 1 > 65535:
                raise ValueError(f"kvtier: metrics.port {port} + {workers} workers passes 65535")
            config.set("metrics.port", str(port + index))
        return config

    @staticmethod
    def rank_subdir(tp_rank: int, tp_size: int, pp_rank: int, pp_size: int, dp_rank: int,
                    dp_size: int) -> str:
        parts = [f"dp{dp_rank}" if dp_size > 1 else "", f"pp{pp_rank}" if pp_size > 1 else "",
                 f"tp{tp_rank}" if tp_size > 1 else ""]
        return os.path.join(*[p for p in parts if p]) if any(parts) else ""

    # ---- the reset epoch (vLLM's reset_prefix_cache(reset_connector=True)) ----

    def _epoch_file(self, dp_rank: int, dp_size: int) -> str:
        config = kvtier.load_config(self.kvtier_values, file=self.config_file or None)
        base = config.get("g3.dir")
        if dp_size > 1:
            base = os.path.join(base, f"dp{dp_rank}")
        return os.path.join(base, "kvtier-reset-epoch")

    def load_epoch(self, dp_rank: int = 0, dp_size: int = 1) -> int:
        """The reset epoch a previous run left (0 when none). A file that cannot be read as a
        number is reported and read as 0."""
        path = self._epoch_file(dp_rank, dp_size)
        try:
            with open(path) as f:
                text = f.read(64).strip()
        except FileNotFoundError:
            return 0
        except OSError as e:
            _log.warning("kvtier: cannot read the reset epoch in %s (%s); starting at 0",
                         path, e)
            return 0
        if not text.isdigit() or len(text) > 18:
            _log.warning("kvtier: %s does not hold a reset epoch (%r); starting at 0", path,
                         text[:32])
            return 0
        return int(text)

    def bump_epoch(self, epoch: int, dp_rank: int = 0, dp_size: int = 1) -> int:
        """epoch + 1, written (atomically) where the next run reads it; a write that fails is
        reported, and the new epoch holds for this run only."""
        epoch += 1
        path = self._epoch_file(dp_rank, dp_size)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.tmp{os.getpid()}"
            with open(tmp, "w") as f:
                f.write(f"{epoch}\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as e:
            _log.warning("kvtier: cannot keep the reset epoch in %s (%s): a restart will find "
                         "the blocks stored before this reset", path, e)
        return epoch

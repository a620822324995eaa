"""KvtierConnector's settings, from vLLM's ``kv_connector_extra_config``.

Keys are kvtier's own configuration fields, exactly as ``kvtier config`` lists them
("g2.capacity_bytes", "g3.dir", "g4.backend", ...), flat or nested ({"g2": {"capacity_bytes":
"4GiB"}}), plus the connector's own keys below. The rest of kvtier's configuration comes from
the same places as everywhere else: the TOML file named by ``config_file`` (or
``$KVTIER_CONFIG``) and the ``KVTIER_*`` environment; keys given here win over both.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping

import kvtier

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
    # load is computed again) or "fail" (the request fails).
    "load_failure_policy": "recompute",
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
    kvtier_values: Dict[str, Any]

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
            kvtier_values=flat,
        )
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
        if s.load_failure_policy not in ("recompute", "fail"):
            raise ValueError(f"kvtier: load_failure_policy must be 'recompute' or 'fail', not "
                             f"{s.load_failure_policy!r}")
        s.kvtier_config()  # refuse a bad kvtier setting at start-up, in every process
        return s

    def kvtier_config(self, tp_rank: int = 0, tp_size: int = 1) -> kvtier.Config:
        """The manager's configuration: defaults < file < environment < extra config. With
        tensor parallelism each rank keeps its G3 in its own subdirectory of g3.dir, and serves
        its /metrics on metrics.port + rank (the ports of one engine are consecutive)."""
        config = kvtier.load_config(self.kvtier_values, file=self.config_file or None)
        if tp_size > 1:
            config.set("g3.dir", f"{config.get('g3.dir')}/tp{tp_rank}")
            port = int(config.get("metrics.port") or 0)
            if port:
                if port + tp_size - 1 > 65535:
                    raise ValueError(f"kvtier: metrics.port {port} + {tp_size} ranks passes 65535")
                config.set("metrics.port", str(port + tp_rank))
        return config

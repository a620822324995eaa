"""kvtier: a KV-cache manager that keeps LLM inference engines' KV blocks across G1 (engine
memory), G2 (host DRAM), G3 (local SSD) and G4 (shared networked storage).

This package is the Python face of kvtier's C++ API (``include/kvtier/``):

- :class:`BlockManager`: the connector API (lookup, load, save), mirroring vLLM's KV connector.
- :class:`ServiceLookup`: lookups straight to ``kvtier serve`` for a process with no G1 (an
  engine's scheduler), under an attached engine instance's name.
- :class:`Config` and :func:`load_config`: the same settings as ``kvtier config`` (TOML file,
  ``KVTIER_*`` environment variables, or a dict).
- :class:`Layout`: the shape of one KV block and how the engine arranges blocks in memory.
- :func:`block_keys`: kvtier's chained 128-bit block keys, identical in every process.
- :func:`stats_fields`: the fields of ``BlockManager.stats()``, with their kinds and help.
- ``kvtier.vllm.KvtierConnector``: the vLLM KV connector (imports vLLM; loaded by vLLM).

Every call that hashes, copies, waits or does I/O releases the GIL. Errors raise
:class:`KvtierError`, whose ``code`` is kvtier's status code name ("InvalidArgument", ...).
"""

from __future__ import annotations

import os
from typing import Mapping, Optional, Union

from kvtier._kvtier import (
    NO_G1_BLOCK,
    NUM_TIERS,
    TIER_NAMES,
    BlockManager,
    Config,
    KvtierError,
    Layout,
    ServiceLookup,
    block_keys,
    stats_fields,
)

__all__ = [
    "NO_G1_BLOCK",
    "NUM_TIERS",
    "TIER_NAMES",
    "BlockManager",
    "Config",
    "KvtierError",
    "Layout",
    "ServiceLookup",
    "block_keys",
    "load_config",
    "stats_fields",
]

__version__ = "0.1.0"

ConfigValue = Union[str, int, float, bool]


def load_config(
    values: Optional[Mapping[str, ConfigValue]] = None,
    file: Optional[str] = None,
    environment: bool = True,
) -> Config:
    """Builds a configuration the way the ``kvtier`` command does, then applies ``values``.

    Precedence, lowest to highest: built-in defaults; the TOML ``file`` (or, when ``file`` is
    None, the file named by ``$KVTIER_CONFIG`` if set); the ``KVTIER_*`` environment variables
    (when ``environment``); then ``values`` ({"g2.capacity_bytes": "8GiB", ...}).

    Raises KvtierError (code "InvalidArgument" or "NotFound") naming the setting, the value,
    where it came from and what is allowed.
    """
    config = Config()
    path = file if file is not None else os.environ.get("KVTIER_CONFIG", "")
    if path:
        config.load_file(path)
    if environment:
        config.load_environment()
    for name, value in (values or {}).items():
        config.set(name, value)
    return config

"""kvtier's vLLM integration: ``KvtierConnector`` (a KV connector, KVConnectorBase_V1).

vLLM loads it with ``kv_connector_module_path="kvtier.vllm"``. The connector (and vLLM) are
imported on first use, so the vLLM-free parts (``kvtier.vllm.lookup``, ``kvtier.vllm.settings``)
import without vLLM. See docs/vllm.md.
"""

from typing import Any

__all__ = ["KvtierConnector", "KvtierMetadata"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from kvtier.vllm import connector

        return getattr(connector, name)
    raise AttributeError(f"module 'kvtier.vllm' has no attribute {name!r}")

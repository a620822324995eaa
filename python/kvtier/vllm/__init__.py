"""kvtier's vLLM integration: ``KvtierConnector`` (a KV connector, KVConnectorBase_V1).

Importing this module imports vLLM. See docs/vllm.md.
"""

from kvtier.vllm.connector import KvtierConnector, KvtierMetadata

__all__ = ["KvtierConnector", "KvtierMetadata"]

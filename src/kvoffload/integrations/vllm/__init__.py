"""vLLM integration: `kv_connector="KVOffloadConnector"` with
`kv_connector_module_path="kvoffload.integrations.vllm"` (see docs/vllm.md).

The connector class is imported lazily, so that `model_builder` and the rest of
this package work without importing vLLM.
"""

from __future__ import annotations

from typing import Any

__all__ = ["KVOffloadConnector"]


def __getattr__(name: str) -> Any:
    if name == "KVOffloadConnector":
        from kvoffload.integrations.vllm.connector import KVOffloadConnector

        return KVOffloadConnector
    raise AttributeError(name)

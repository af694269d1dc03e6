"""What names a LoRA adapter in kvoffload's keys.

The adapter's name alone is not enough in a shared or persistent tier: an adapter
retrained under the same name, or two deployments that give one name to
different adapters, would share keys and serve each other's KV. The identity
covers the name, the path and a digest of the adapter's files, read as the base
model's weights are (`weights_digest`) plus its `adapter_config.json` (rank and
alpha change the KV as much as the weights do). `lora_int_id` is left out: it is
local to one engine.

The digest is read once per adapter (name, path and `lora_int_id`: vLLM loads a new id
afresh, and reuses a loaded one) on the scheduler thread, and cached; a request
with `load_inplace`, which makes vLLM read the files again, reads them again too.
Where the files cannot be read (a hub name the worker downloads, a missing
directory), the adapter is named by its name and path only, and a warning says
so once per adapter.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from kvoffload.integrations.vllm.model_identity import weights_digest

logger = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"


def adapter_digest(path: Path) -> str:
    """Digest of the adapter's weight files and config; "" where there are no
    weight files on local disk. Raises `OSError` where they cannot be read."""
    weights = weights_digest(path)
    if not weights:
        return ""
    config = path / ADAPTER_CONFIG if path.is_dir() else None
    config_hash = (
        hashlib.sha256(config.read_bytes()).hexdigest()
        if config is not None and config.is_file()
        else ""
    )
    return hashlib.sha256(f"{weights}\0{config_hash}".encode()).hexdigest()


class LoraIdentities:
    """The identity string of each request's adapter, cached per adapter."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, str, int], str] = {}

    def identity(self, lora: Any) -> str | None:
        """`None` for a request without an adapter (keys as without LoRA)."""
        if lora is None:
            return None
        name = str(getattr(lora, "lora_name", ""))
        path = str(getattr(lora, "lora_path", "") or "")
        cache_key = (name, path, int(getattr(lora, "lora_int_id", 0) or 0))
        cached = self._cache.get(cache_key)
        if cached is not None and not getattr(lora, "load_inplace", False):
            return cached
        digest = self._digest(name, path, warn=cached is None)
        fields = {"name": name, "path": path, "weights": digest}
        identity = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        self._cache[cache_key] = identity
        return identity

    def _digest(self, name: str, path: str, *, warn: bool) -> str:
        try:
            digest = adapter_digest(Path(path)) if path else ""
        except OSError as exc:
            reason = f"cannot read it ({exc})"
            digest = ""
        else:
            reason = "no weight files on local disk"
        if not digest and warn:
            logger.warning(
                "LoRA adapter %r at %r: %s; named by its name and path only, "
                "so an adapter replaced at that path can be served stale KV",
                name,
                path,
                reason,
            )
        return digest

"""`kv_connector_extra_config`, validated once at start-up.

The keys of vLLM's own `OffloadingConnector` where they mean the same thing, plus a
few of kvoffload's. Sizes may be written as `"64GiB"`; a null `block_size` or
`blocks_per_chunk` is unset, as there. An unknown key or a bad value raises
`ValueError` naming the key, the value and what is allowed, so vLLM stops at
start-up instead of serving with a misread setting. Given through the Python API,
the config is first checked as a whole (`config_mapping`): a list or a string in
place of it, a key that is not a string, an int of thousands of digits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvoffload.config import config_mapping, is_count, parse_size, shown
from kvoffload.connector.config import is_valid_max_defer_s
from kvoffload.policies import get_policy_class, policy_names
from kvoffload.tiers.secondary import parse_tier_config
from kvoffload.tiers.secondary.redis_url import shown_value

KEYS: dict[str, str] = {
    "cpu_bytes_to_use": "host memory for the primary tier: bytes, or a size like '64GiB' (required)",
    "block_size": "tokens per chunk (a multiple of the engine block size)",
    "blocks_per_chunk": "engine blocks per chunk (instead of block_size; default 1)",
    "eviction_policy": f"eviction policy: one of {policy_names()} or 'module:Class'",
    "store_threshold": "reuse filter: store a chunk once this many requests saw it (0 or 1: off)",
    "max_tracker_size": "keys the reuse filter remembers (default 64000)",
    "offload_prompt_only": "store only prompt chunks (default true)",
    "secondary_tiers": "list of tiers behind host memory: {'type': 'file', 'path': ..., "
    "'capacity': ...} or {'type': 'redis', 'url': ...}",
    "max_defer_s": "longest a request waits for chunks still in flight (default 1.0)",
    "model_tag": "names the weights in keys, files and Redis instead of the model's "
    "path and a sample of its weight files (a checkpoint version, say)",
}

# Keys vLLM's OffloadingConnector reads with `extra_config.get(...)`, where null
# is unset: so it is here (and two nulls are not "both given").
NULL_IS_UNSET = ("block_size", "blocks_per_chunk")


def _int(extra: Mapping[str, Any], key: str, default: int, minimum: int) -> int:
    value = extra.get(key, default)
    if not is_count(value, minimum):
        raise ValueError(
            f"kv_connector_extra_config[{key!r}]: {shown(value)} is not an integer "
            f">= {minimum} (up to 2**63 - 1)"
        )
    return value


def _bool(extra: Mapping[str, Any], key: str, default: bool) -> bool:
    value = extra.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(
            f"kv_connector_extra_config[{key!r}]: {shown(value)} is not true or false"
        )
    return value


@dataclass(frozen=True)
class KVOffloadSettings:
    """kvoffload's settings inside vLLM."""

    cpu_bytes_to_use: int
    chunk_tokens: int | None = None
    blocks_per_chunk: int | None = None
    eviction_policy: str = "lru"
    store_threshold: int = 0
    max_tracker_size: int = 64_000
    offload_prompt_only: bool = True
    secondary_tiers: tuple[Mapping[str, Any], ...] = field(default=())
    max_defer_s: float = 1.0
    model_tag: str | None = None

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any] | None) -> KVOffloadSettings:
        extra = {
            key: value
            for key, value in config_mapping(
                {} if extra is None else extra, "kv_connector_extra_config"
            ).items()
            if not (key in NULL_IS_UNSET and value is None)
        }
        unknown = sorted(set(extra) - set(KEYS))
        if unknown:
            valid = "\n".join(f"  {key}: {doc}" for key, doc in KEYS.items())
            raise ValueError(
                f"kv_connector_extra_config: unknown key(s) {shown(unknown)}; "
                f"valid keys:\n{valid}"
            )
        if "cpu_bytes_to_use" not in extra:
            raise ValueError(
                "kv_connector_extra_config['cpu_bytes_to_use'] is required: "
                "host memory for the primary tier, e.g. '16GiB'"
            )
        raw_cpu = extra["cpu_bytes_to_use"]
        cpu = parse_size(raw_cpu, "kv_connector_extra_config['cpu_bytes_to_use']")
        if cpu < 1:
            raise ValueError(
                f"kv_connector_extra_config['cpu_bytes_to_use']: {shown(raw_cpu)} must be "
                "> 0 bytes: host memory for the primary tier, e.g. '16GiB'"
            )
        if "block_size" in extra and "blocks_per_chunk" in extra:
            raise ValueError(
                "kv_connector_extra_config: give block_size (tokens per chunk) or "
                "blocks_per_chunk, not both (block_size="
                f"{shown(extra['block_size'])}, "
                f"blocks_per_chunk={shown(extra['blocks_per_chunk'])})"
            )
        chunk_tokens = (
            _int(extra, "block_size", 0, 1) if "block_size" in extra else None
        )
        per_chunk = (
            _int(extra, "blocks_per_chunk", 1, 1)
            if "blocks_per_chunk" in extra
            else None
        )
        policy = extra.get("eviction_policy", "lru")
        try:
            get_policy_class(policy)
        except ValueError as exc:
            # The key is named once, not as `['eviction_policy']: eviction_policy:`.
            reason = str(exc).removeprefix("eviction_policy: ")
            raise ValueError(
                f"kv_connector_extra_config['eviction_policy']: {reason}"
            ) from None
        tiers = extra.get("secondary_tiers", [])
        if not isinstance(tiers, Sequence) or isinstance(tiers, str | bytes):
            raise ValueError(
                "kv_connector_extra_config['secondary_tiers']: "
                f"{shown_value(tiers)} is not a list of tier configs"
            )
        for i, tier in enumerate(tiers):
            try:
                parse_tier_config(tier)
            except (ValueError, TypeError) as exc:
                raise ValueError(
                    f"kv_connector_extra_config['secondary_tiers'][{i}]: {exc}"
                ) from None
        defer = extra.get("max_defer_s", 1.0)
        if not is_valid_max_defer_s(defer):
            raise ValueError(
                f"kv_connector_extra_config['max_defer_s']: {shown(defer)} is not a "
                "finite number of seconds >= 0 (a deferral must end)"
            )
        tag = extra.get("model_tag")
        if tag is not None and (not isinstance(tag, str) or not tag.strip()):
            raise ValueError(
                "kv_connector_extra_config['model_tag']: "
                f"{shown(tag)} is not a non-empty string"
            )
        return cls(
            cpu_bytes_to_use=cpu,
            chunk_tokens=chunk_tokens,
            blocks_per_chunk=per_chunk,
            eviction_policy=policy,
            store_threshold=_int(extra, "store_threshold", 0, 0),
            max_tracker_size=_int(extra, "max_tracker_size", 64_000, 1),
            offload_prompt_only=_bool(extra, "offload_prompt_only", True),
            secondary_tiers=tuple(dict(t) for t in tiers),
            max_defer_s=float(defer),
            model_tag=tag,
        )

    def blocks_per_chunk_for(self, engine_block_tokens: int) -> int:
        """Engine blocks per chunk for a group whose blocks hold that many tokens."""
        if self.chunk_tokens is None:
            return self.blocks_per_chunk or 1
        if self.chunk_tokens % engine_block_tokens:
            raise ValueError(
                f"kv_connector_extra_config['block_size']: {self.chunk_tokens} tokens is "
                f"not a multiple of the engine block size {engine_block_tokens}"
            )
        return self.chunk_tokens // engine_block_tokens

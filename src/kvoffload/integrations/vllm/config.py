"""`kv_connector_extra_config`, validated once at start-up, every key at once.

The keys of vLLM's own `OffloadingConnector` where they mean the same thing, plus a
few of kvoffload's. Sizes may be written as `"64GiB"`; a null `block_size` or
`blocks_per_chunk` is unset, as there. The settings may come from a file
(`config_file`, `KVOFFLOAD_CONFIG`) and hold `${NAME}` references to the
environment (`kvoffload.config.sources`). Each key is checked on its own and every
error is reported together (`ConfigError`, a `ValueError`), each naming the key,
the value and what is allowed, with a suggestion for a mistyped key, so vLLM stops
at start-up instead of serving with a misread setting. Given through the Python API,
the config is first checked as a whole (`config_mapping`): a list or a string in
place of it, a key that is not a string, an int of thousands of digits.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvoffload.config import config_mapping, is_count, parse_size, shown
from kvoffload.config.errors import ErrorList, unknown_key
from kvoffload.config.sources import CONFIG_FILE_KEY, expand_env, with_config_file
from kvoffload.connector.config import DEFAULT_MAX_DEFER_S, is_valid_max_defer_s
from kvoffload.policies import get_policy_class, policy_names
from kvoffload.policies.retention import (
    DEFAULT_MAX_HINTED_SHARE,
    check_max_hinted_share,
)
from kvoffload.tiers.secondary import parse_tier_config
from kvoffload.tiers.secondary.redis_url import shown_value

WHERE = "kv_connector_extra_config"

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
    "max_defer_s": "longest a request waits for chunks still in flight "
    f"(default {DEFAULT_MAX_DEFER_S:g})",
    "max_hinted_share": "share of each tier that retention hints (kv_retention_s) "
    f"may hold, 0 to 1 (default {DEFAULT_MAX_HINTED_SHARE})",
    "model_tag": "names the weights in keys, files and Redis instead of the model's "
    "path and a sample of its weight files (a checkpoint version, say)",
    CONFIG_FILE_KEY: "a JSON or YAML file holding these settings; keys given "
    "beside it override the file's",
}

# Keys vLLM's OffloadingConnector reads with `extra_config.get(...)`, where null
# is unset: so it is here (and two nulls are not "both given").
NULL_IS_UNSET = ("block_size", "blocks_per_chunk")


def _key(key: str) -> str:
    return f"{WHERE}[{key!r}]"


def _count(minimum: int) -> Callable[[str, object], int]:
    def parse(key: str, value: object) -> int:
        if not is_count(value, minimum):
            raise ValueError(
                f"{_key(key)}: {shown(value)} is not an integer >= {minimum} "
                "(up to 2**63 - 1)"
            )
        return value

    return parse


def _bool(key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{_key(key)}: {shown(value)} is not true or false")
    return value


def _cpu_bytes(key: str, value: object) -> int:
    cpu = parse_size(value, _key(key))
    if cpu < 1:
        raise ValueError(
            f"{_key(key)}: {shown(value)} must be > 0 bytes: host memory for the "
            "primary tier, e.g. '16GiB'"
        )
    return cpu


def _policy(key: str, value: object) -> str:
    try:
        get_policy_class(value)  # type: ignore[arg-type]  # raises a naming ValueError
    except ValueError as exc:
        # The key is named once, not as `['eviction_policy']: eviction_policy:`.
        reason = str(exc).removeprefix("eviction_policy: ")
        raise ValueError(f"{_key(key)}: {reason}") from None
    assert isinstance(value, str)
    return value


def _tiers(key: str, value: object) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        raise ValueError(
            f"{_key(key)}: {shown_value(value)} is not a list of tier configs"
        )
    errors = ErrorList()
    names: dict[str, int] = {}
    for i, tier in enumerate(value):
        if tier is UNRESOLVED:
            continue  # its `${NAME}` error is reported already
        with errors.check(f"{_key(key)}[{i}]: "):
            name = parse_tier_config(tier).name
            if name in names:
                raise ValueError(
                    f"name: {shown(name)} is also the name of tier {names[name]}; "
                    "give each tier a distinct 'name'"
                )
            names[name] = i
    errors.raise_if_any()
    return tuple(dict(tier) for tier in value if tier is not UNRESOLVED)


def _defer(key: str, value: object) -> float:
    if not is_valid_max_defer_s(value):
        raise ValueError(
            f"{_key(key)}: {shown(value)} is not a finite number of seconds >= 0 "
            "(a deferral must end)"
        )
    return float(value)  # type: ignore[arg-type]  # a finite int or float


def _share(key: str, value: object) -> float:
    return check_max_hinted_share(value, _key(key))


def _tag(key: str, value: object) -> str | None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ValueError(f"{_key(key)}: {shown(value)} is not a non-empty string")
    return value


# Each key's check, on its value alone, in the order of `KEYS`.
_PARSERS: dict[str, Callable[[str, Any], Any]] = {
    "cpu_bytes_to_use": _cpu_bytes,
    "block_size": _count(1),
    "blocks_per_chunk": _count(1),
    "eviction_policy": _policy,
    "store_threshold": _count(0),
    "max_tracker_size": _count(1),
    "offload_prompt_only": _bool,
    "secondary_tiers": _tiers,
    "max_defer_s": _defer,
    "max_hinted_share": _share,
    "model_tag": _tag,
}


UNRESOLVED = object()
"""A setting (or a tier) whose `${NAME}` could not be resolved: its error is
reported, and its own checks are skipped (they would only add confusion)."""


def _expanded(
    merged: Mapping[str, Any], errors: ErrorList, environ: Mapping[str, str]
) -> dict[str, Any]:
    """`merged` with `${NAME}` resolved, key by key and tier by tier; what
    cannot be resolved is `UNRESOLVED`."""

    def expand(value: Any, where: str) -> Any:
        found = ErrorList()
        value = expand_env(value, where, found, environ)
        errors.messages.extend(found.messages)
        return UNRESOLVED if found else value

    extra: dict[str, Any] = {}
    for key, value in merged.items():
        if key == "secondary_tiers" and isinstance(value, list | tuple):
            extra[key] = [expand(t, f"{_key(key)}[{i}]") for i, t in enumerate(value)]
        else:
            extra[key] = expand(value, _key(key))
    return extra


def _checked(extra: Mapping[str, Any], errors: ErrorList) -> dict[str, Any]:
    """Each key of `extra` checked on its own, into `errors`; the values of
    those that passed."""
    for key in extra:
        if key not in _PARSERS:
            errors.add(unknown_key(WHERE, key, KEYS))
    if "cpu_bytes_to_use" not in extra:
        errors.add(
            f"{_key('cpu_bytes_to_use')} is required: host memory for the primary "
            "tier, e.g. '16GiB'"
        )
    if "block_size" in extra and "blocks_per_chunk" in extra:
        errors.add(
            f"{WHERE}: give block_size (tokens per chunk) or blocks_per_chunk, not "
            f"both (block_size={shown(extra['block_size'])}, "
            f"blocks_per_chunk={shown(extra['blocks_per_chunk'])})"
        )
    values: dict[str, Any] = {}
    for key, parse in _PARSERS.items():
        if key in extra and extra[key] is not UNRESOLVED:
            with errors.check():
                values[key] = parse(key, extra[key])
    return values


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
    # Not in the repr: a tier's mapping may hold a password.
    secondary_tiers: tuple[Mapping[str, Any], ...] = field(default=(), repr=False)
    max_defer_s: float = DEFAULT_MAX_DEFER_S
    max_hinted_share: float = DEFAULT_MAX_HINTED_SHARE
    model_tag: str | None = None
    config_file: str | None = None
    """The file the settings were read from, if any (`config_file`, `KVOFFLOAD_CONFIG`)."""

    @classmethod
    def from_extra_config(
        cls,
        extra: Mapping[str, Any] | None,
        environ: Mapping[str, str] = os.environ,
    ) -> KVOffloadSettings:
        """The settings in `extra`, the file it names and the environment
        (`environ`); a `ConfigError` holding every error if any."""
        given = config_mapping({} if extra is None else extra, WHERE)
        merged, source = with_config_file(given, WHERE, environ)
        errors = ErrorList()
        extra = {
            key: value
            for key, value in _expanded(merged, errors, environ).items()
            if not (key in NULL_IS_UNSET and value is None)
        }
        values = _checked(extra, errors)
        errors.raise_if_any()
        return cls(
            cpu_bytes_to_use=values["cpu_bytes_to_use"],
            chunk_tokens=values.get("block_size"),
            blocks_per_chunk=values.get("blocks_per_chunk"),
            eviction_policy=values.get("eviction_policy", "lru"),
            store_threshold=values.get("store_threshold", 0),
            max_tracker_size=values.get("max_tracker_size", 64_000),
            offload_prompt_only=values.get("offload_prompt_only", True),
            secondary_tiers=values.get("secondary_tiers", ()),
            max_defer_s=values.get("max_defer_s", DEFAULT_MAX_DEFER_S),
            max_hinted_share=values.get("max_hinted_share", DEFAULT_MAX_HINTED_SHARE),
            model_tag=values.get("model_tag"),
            config_file=source,
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

"""Build secondary tiers from the mappings users write in `secondary_tiers`."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from kvoffload.config import shown
from kvoffload.policies.retention import DEFAULT_MAX_HINTED_SHARE
from kvoffload.tiers.secondary.base import Clock, SecondaryTier
from kvoffload.tiers.secondary.config import FileTierConfig, MemoryTierConfig
from kvoffload.tiers.secondary.redis_config import RedisTierConfig
from kvoffload.tiers.secondary.redis_url import shown_value
from kvoffload.worker import ChunkBuffer

TIER_TYPES = ("file", "memory", "redis")
_CONFIGS: dict[str, type[FileTierConfig | MemoryTierConfig | RedisTierConfig]] = {
    "file": FileTierConfig,
    "memory": MemoryTierConfig,
    "redis": RedisTierConfig,
}


def parse_tier_config(
    mapping: Mapping[str, Any],
) -> FileTierConfig | MemoryTierConfig | RedisTierConfig:
    """Validate a tier's mapping without creating the tier (start-up checks)."""
    if not isinstance(mapping, Mapping):
        raise _not_a_mapping(mapping)
    tier_type = mapping.get("type")
    # A str first: a list or a dict is no key of `_CONFIGS` (not even hashable).
    if not isinstance(tier_type, str) or tier_type not in _CONFIGS:
        raise ValueError(
            f"type: {shown(tier_type)} is not a secondary tier type; "
            f"expected one of {TIER_TYPES}"
        )
    return _CONFIGS[tier_type].from_mapping(mapping)


def create_secondary_tier(
    mapping: Mapping[str, Any],
    buffer: ChunkBuffer,
    fingerprint: str,
    clock: Clock = time.monotonic,
    max_hinted_share: float = DEFAULT_MAX_HINTED_SHARE,
) -> SecondaryTier:
    """A tier from `{"type": "file" | "redis" | "memory", ...}`.

    `buffer` is the host pool the tier copies from and into; `fingerprint` (see
    `make_fingerprint`) names the model and layout whose chunks it holds;
    `max_hinted_share` is the engine's bound on retention hints (in the tiers
    that evict by themselves: file and memory).
    """
    if not isinstance(mapping, Mapping):
        raise _not_a_mapping(mapping)
    tier_type = mapping.get("type")
    if tier_type == "file":
        from kvoffload.tiers.secondary.file_tier import FileTier

        return FileTier(
            FileTierConfig.from_mapping(mapping),
            buffer,
            fingerprint,
            clock,
            max_hinted_share,
        )
    if tier_type == "redis":
        from kvoffload.tiers.secondary.redis_tier import RedisTier

        return RedisTier(
            RedisTierConfig.from_mapping(mapping), buffer, fingerprint, clock
        )
    if tier_type == "memory":
        from kvoffload.tiers.secondary.memory import MemoryTier

        return MemoryTier(
            MemoryTierConfig.from_mapping(mapping), buffer, clock, max_hinted_share
        )
    raise ValueError(
        f"type: {shown(tier_type)} is not a secondary tier type; expected one of {TIER_TYPES}"
    )


def _not_a_mapping(value: object) -> ValueError:
    # Not the value as it is: a Redis URL given where its tier's mapping
    # belongs would show its password.
    return ValueError(
        f"secondary tier: {shown_value(value)} is not a mapping with a 'type'"
    )


def create_secondary_tiers(
    mappings: Sequence[Mapping[str, Any]],
    buffer: ChunkBuffer,
    fingerprint: str,
    clock: Clock = time.monotonic,
    max_hinted_share: float = DEFAULT_MAX_HINTED_SHARE,
) -> list[SecondaryTier]:
    """Tiers in order; names must be unique (events and stats are keyed by name)."""
    if not isinstance(mappings, list | tuple):
        # A string or a mapping would be iterated as characters or keys.
        raise ValueError(
            f"secondary_tiers: {shown_value(mappings)} is not a list of tier configs"
        )
    tiers: list[SecondaryTier] = []
    try:
        for mapping in mappings:
            tiers.append(
                create_secondary_tier(
                    mapping, buffer, fingerprint, clock, max_hinted_share
                )
            )
            names = [t.name for t in tiers]
            if len(set(names)) != len(names):
                raise ValueError(
                    f"name: {shown(names[-1])} is used by two secondary tiers; "
                    "give each tier a distinct 'name'"
                )
    except BaseException:
        for tier in tiers:
            tier.shutdown()
        raise
    return tiers

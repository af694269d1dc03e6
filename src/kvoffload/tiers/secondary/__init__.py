"""Secondary tiers: local disk and a shared store behind the host-memory tier."""

from kvoffload.tiers.secondary.base import (
    Clock,
    Locality,
    Medium,
    SecondaryTier,
    TierJob,
    TierJobResult,
)
from kvoffload.tiers.secondary.buffer import ArrayChunkBuffer, RankedChunkBuffer
from kvoffload.tiers.secondary.codec import CorruptChunkError, make_fingerprint
from kvoffload.tiers.secondary.config import FileTierConfig, MemoryTierConfig
from kvoffload.tiers.secondary.factory import (
    TIER_TYPES,
    create_secondary_tier,
    create_secondary_tiers,
    parse_tier_config,
)
from kvoffload.tiers.secondary.file_tier import FileTier
from kvoffload.tiers.secondary.memory import MemoryTier
from kvoffload.tiers.secondary.redis_config import RedisTierConfig

__all__ = [
    "TIER_TYPES",
    "ArrayChunkBuffer",
    "Clock",
    "CorruptChunkError",
    "FileTier",
    "FileTierConfig",
    "Locality",
    "Medium",
    "MemoryTier",
    "MemoryTierConfig",
    "RankedChunkBuffer",
    "RedisTierConfig",
    "SecondaryTier",
    "TierJob",
    "TierJobResult",
    "create_secondary_tier",
    "create_secondary_tiers",
    "make_fingerprint",
    "parse_tier_config",
]

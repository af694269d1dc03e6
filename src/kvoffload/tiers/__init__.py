"""Tiers: the manager vocabulary, the primary (host) tier and secondary tiers."""

from kvoffload.tiers.base import (
    LookupResult,
    OffloadingEvent,
    OffloadingManager,
    OffloadPolicy,
    PrefixLookup,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    TierStats,
)

__all__ = [
    "LookupResult",
    "OffloadPolicy",
    "OffloadingEvent",
    "OffloadingManager",
    "PrefixLookup",
    "PrepareStoreOutput",
    "ReqContext",
    "RequestOffloadingContext",
    "TierStats",
]

"""Per-request parameters read from `kv_transfer_params`, parsed once.

Bad values never fail a request: each logs one warning naming the request and the
value, and is ignored as if absent (SPEC §4). `max_offload_tokens` and
`max_load_tokens` are experimental and may change.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

MEDIA = ("cpu", "storage")
LOCALITIES = ("local", "remote")


@dataclass(frozen=True)
class TierSelector:
    """Which secondary tiers a request may use: by name, medium or locality.

    `None` for `names` means every tier. Each entry of `kv_load_tiers` /
    `kv_store_tiers` is a tier name, a medium (`cpu`, `storage`), a locality
    (`local`, `remote`) or `medium:locality`.
    """

    entries: tuple[str, ...] | None = None

    def allows(self, name: str, medium: str, locality: str) -> bool:
        if self.entries is None:
            return True
        for entry in self.entries:
            if entry in (name, medium, locality):
                return True
            if entry == f"{medium}:{locality}":
                return True
        return False


ALL_TIERS = TierSelector()


@dataclass(frozen=True)
class RequestParams:
    """The parsed, validated per-request offloading parameters."""

    max_offload_tokens: int | None = None
    max_load_tokens: int | None = None
    load_tiers: TierSelector = ALL_TIERS
    store_tiers: TierSelector = ALL_TIERS

    @classmethod
    def parse(cls, req_id: str, params: Mapping[str, Any] | None) -> RequestParams:
        if not params:
            return cls()
        return cls(
            max_offload_tokens=_token_cap(req_id, params, "max_offload_tokens"),
            max_load_tokens=_token_cap(req_id, params, "max_load_tokens"),
            load_tiers=_tier_selector(req_id, params, "kv_load_tiers"),
            store_tiers=_tier_selector(req_id, params, "kv_store_tiers"),
        )


def _token_cap(req_id: str, params: Mapping[str, Any], name: str) -> int | None:
    raw = params.get(name)
    if raw is None:
        return None
    # `type(...) is int` on purpose: True and False are ints to isinstance().
    if type(raw) is int and raw >= 0:
        return raw
    logger.warning(
        "request %s: ignoring %s=%r (expected a non-negative int or null)",
        req_id,
        name,
        raw,
    )
    return None


def _valid_tier_entry(entry: object) -> bool:
    if not isinstance(entry, str) or not entry:
        return False
    if ":" in entry:
        medium, _, locality = entry.partition(":")
        return medium in MEDIA and locality in LOCALITIES
    return True


def _tier_selector(req_id: str, params: Mapping[str, Any], name: str) -> TierSelector:
    raw = params.get(name)
    if raw is None:
        return ALL_TIERS
    entries: object = raw.split(",") if isinstance(raw, str) else raw
    if isinstance(entries, list | tuple) and all(_valid_tier_entry(e) for e in entries):
        return TierSelector(tuple(str(e).strip() for e in entries))
    logger.warning(
        "request %s: ignoring %s=%r (expected a list of tier names, media %s, "
        "localities %s or medium:locality)",
        req_id,
        name,
        raw,
        MEDIA,
        LOCALITIES,
    )
    return ALL_TIERS

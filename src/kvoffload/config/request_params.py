"""Per-request parameters read from `kv_transfer_params`, parsed once.

Bad values never fail a request: each logs one warning naming the request and the
value (cut short: it comes from a client), and is ignored as if absent (SPEC §4);
in a list of tiers, only its bad entries are, unless none is good.
`max_offload_tokens` and `max_load_tokens` are experimental and may change.
`kv_retention_s` is the request's retention hint (docs/policies.md, "Retention
hints"): a request sharing this prompt will come within that many seconds; 0
says none will, so its chunks go first.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from kvoffload.config.seconds import finite_seconds
from kvoffload.config.shapes import shown

logger = logging.getLogger(__name__)

RETENTION_PARAM = "kv_retention_s"
PARAMETER_NAMES = (
    "max_offload_tokens",
    "max_load_tokens",
    "kv_load_tiers",
    "kv_store_tiers",
    RETENTION_PARAM,
)
"""The `kv_transfer_params` keys kvoffload reads; each bad one is one warning."""
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
    retention_s: float | None = None
    """`kv_retention_s`: seconds within which a request sharing this prompt will
    come (0: none will); `None`, no hint."""

    @classmethod
    def parse(
        cls,
        req_id: str,
        params: object,
        tier_names: Collection[str] | None = None,
    ) -> RequestParams:
        """`params`: the request's `kv_transfer_params`, a mapping or `None`;
        anything else is warned about and ignored as a whole. `tier_names`: the
        names `kv_load_tiers`/`kv_store_tiers` may give (any name is taken when
        `None`); other names are warned about and ignored."""
        if params is None:
            return cls()
        if not isinstance(params, Mapping):
            logger.warning(
                "request %s: ignoring kv_transfer_params=%s (expected a mapping)",
                req_id,
                shown(params),
            )
            return cls()
        if not params:
            return cls()
        return cls(
            max_offload_tokens=_token_cap(req_id, params, "max_offload_tokens"),
            max_load_tokens=_token_cap(req_id, params, "max_load_tokens"),
            load_tiers=_tier_selector(req_id, params, "kv_load_tiers", tier_names),
            store_tiers=_tier_selector(req_id, params, "kv_store_tiers", tier_names),
            retention_s=_retention(req_id, params, RETENTION_PARAM),
        )


def _token_cap(req_id: str, params: Mapping[str, Any], name: str) -> int | None:
    raw = params.get(name)
    if raw is None:
        return None
    # `type(...) is int` on purpose: True and False are ints to isinstance().
    if type(raw) is int and raw >= 0:
        return raw
    logger.warning(
        "request %s: ignoring %s=%s (expected a non-negative int or null)",
        req_id,
        name,
        shown(raw),
    )
    return None


def _retention(req_id: str, params: Mapping[str, Any], name: str) -> float | None:
    raw = params.get(name)
    if raw is None:
        return None
    seconds = finite_seconds(raw)  # ints and floats, never bools, NaN or inf
    if seconds is not None and seconds >= 0:
        return seconds
    logger.warning(
        "request %s: ignoring %s=%s (expected a finite number of seconds >= 0, "
        "or null)",
        req_id,
        name,
        shown(raw),
    )
    return None


def _known_tier_entry(entry: str, tier_names: Collection[str] | None) -> bool:
    if ":" in entry:
        medium, _, locality = entry.partition(":")
        return medium in MEDIA and locality in LOCALITIES
    if entry in MEDIA or entry in LOCALITIES:
        return True
    return tier_names is None or entry in tier_names


def _tier_selector(
    req_id: str,
    params: Mapping[str, Any],
    name: str,
    tier_names: Collection[str] | None,
) -> TierSelector:
    """The entries of `name` that select tiers; one warning for the rest.

    A bad entry (a misspelt tier name, say) is dropped and the others are kept:
    the request still avoids the tiers it left out. When no entry is good the
    value is ignored as if absent (every tier); an empty list is good and
    selects no secondary tier.
    """
    raw = params.get(name)
    if raw is None:
        return ALL_TIERS
    entries: object = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(entries, list | tuple):
        _warn_tiers(req_id, name, raw, None, tier_names)
        return ALL_TIERS
    good: list[str] = []
    bad: list[object] = []
    for entry in entries:
        entry = entry.strip() if isinstance(entry, str) else entry
        if isinstance(entry, str) and entry and _known_tier_entry(entry, tier_names):
            good.append(entry)
        else:
            bad.append(entry)
    if not bad:
        return TierSelector(tuple(good))
    if not good:
        _warn_tiers(req_id, name, raw, None, tier_names)
        return ALL_TIERS
    _warn_tiers(req_id, name, raw, bad, tier_names)
    return TierSelector(tuple(good))


def _warn_tiers(
    req_id: str,
    name: str,
    raw: object,
    bad: list[object] | None,
    tier_names: Collection[str] | None,
) -> None:
    """One warning for `name`: its bad entries are ignored, or (`bad=None`) all of it."""
    what = "" if bad is None else f"{shown(bad)} in "
    names = "tier names" if tier_names is None else f"tier names {sorted(tier_names)}"
    logger.warning(
        "request %s: ignoring %s%s=%s (expected a list of %s, media %s, "
        "localities %s or medium:locality)",
        req_id,
        what,
        name,
        shown(raw),
        names,
        MEDIA,
        LOCALITIES,
    )

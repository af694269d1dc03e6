"""The tiering manager's own settings, and its construction from configuration."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from kvoffload.config import config_mapping, finite_seconds, is_count, shown
from kvoffload.policies.retention import DEFAULT_MAX_HINTED_SHARE
from kvoffload.tiers.secondary import Clock, create_secondary_tiers
from kvoffload.worker import ChunkBuffer

if TYPE_CHECKING:
    from kvoffload.tiering.manager import TieringManager
    from kvoffload.tiers.primary import CPUOffloadingManager


@dataclass(frozen=True)
class TieringConfig:
    """How long a failed promotion makes its key miss, and how many are remembered;
    how a request's promotion from one tier is cut into jobs."""

    promotion_failure_ttl_s: float = 30.0
    max_remembered_failures: int = 65_536
    promotion_first_batch: int = 4
    """Chunks in a promotion's first job; each later job of the same promotion
    is twice the one before, up to `promotion_max_batch`. The head of a prefix
    lands first, so a request whose deferral ends before the whole prefix has
    landed still loads its head (0: one job for the whole promotion)."""
    promotion_max_batch: int = 64

    def __post_init__(self) -> None:
        ttl = self.promotion_failure_ttl_s
        seconds = finite_seconds(ttl)
        if seconds is None or seconds <= 0:
            raise ValueError(
                f"promotion_failure_ttl_s: {shown(ttl)} must be a positive number of "
                "seconds"
            )
        n = self.max_remembered_failures
        if not is_count(n, 1):
            raise ValueError(
                f"max_remembered_failures: {shown(n)} must be an int >= 1 "
                "(up to 2**63 - 1)"
            )
        first, most = self.promotion_first_batch, self.promotion_max_batch
        if not is_count(first, 0) or first > 1 << 20:
            raise ValueError(
                f"promotion_first_batch: {shown(first)} must be an int from 0 "
                "(one job per promotion) to 1,048,576 chunks"
            )
        if not is_count(most, 1) or most > 1 << 20 or (first and most < first):
            raise ValueError(
                f"promotion_max_batch: {shown(most)} must be an int from "
                f"promotion_first_batch ({shown(first)}) to 1,048,576 chunks"
            )

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> TieringConfig:
        settings = config_mapping(mapping, "tiering config")
        valid = [f.name for f in fields(cls)]
        unknown = sorted(set(settings) - set(valid))
        if unknown:
            raise ValueError(
                f"unknown tiering keys {shown(unknown)}; valid keys: {valid}"
            )
        return cls(**settings)


def create_tiering_manager(
    primary: CPUOffloadingManager,
    secondary_tiers: Sequence[Mapping[str, Any]],
    buffer: ChunkBuffer,
    fingerprint: str,
    config: TieringConfig | None = None,
    clock: Clock = time.monotonic,
    max_hinted_share: float = DEFAULT_MAX_HINTED_SHARE,
) -> TieringManager:
    """A tiering manager over `primary` and the tiers described by mappings.

    `buffer` is the host pool behind `primary` (slot `i` of the manager is slot `i`
    of the buffer); `fingerprint` names the model and layout (`make_fingerprint`);
    `max_hinted_share` bounds retention hints in every tier, as in `primary`.
    """
    from kvoffload.tiering.manager import TieringManager

    tiers = create_secondary_tiers(
        secondary_tiers, buffer, fingerprint, clock, max_hinted_share
    )
    return TieringManager(primary, tiers, config or TieringConfig(), clock)

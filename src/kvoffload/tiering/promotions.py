"""Promotions: chunks on their way from a secondary tier into the primary tier.

Lookups allocate a primary slot per promoted chunk at once (so that the chunk reads
`HIT_PENDING` from then on) and batch the loads per tier and request, submitted at
the end of a prefix lookup or of the step in jobs of growing size, head first
(`promotion_batches`). A failed promotion is
remembered for a bounded time, so the next lookups of that key miss instead of
promoting, failing and retrying forever.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvoffload.keys import OffloadKey
from kvoffload.tiers.base import ReqContext
from kvoffload.tiers.secondary.base import Clock


@dataclass
class PendingLoad:
    tier: int
    ctx: ReqContext
    keys: list[OffloadKey] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)


def promotion_batches(count: int, first: int, most: int) -> list[tuple[int, int]]:
    """`[start, end)` ranges cutting `count` chunks into jobs of `first`, then
    twice as many each time up to `most` chunks; one range when `first` is 0."""
    if first <= 0:
        return [(0, count)] if count else []
    out: list[tuple[int, int]] = []
    start, size = 0, first
    while start < count:
        end = min(count, start + size)
        out.append((start, end))
        start, size = end, min(size * 2, most)
    return out


class PromotionTracker:
    """Pending and in-flight promotions, and recently failed keys."""

    def __init__(self, clock: Clock, failure_ttl_s: float, max_failures: int) -> None:
        self._clock = clock
        self._failure_ttl_s = failure_ttl_s
        self._max_failures = max_failures
        self._pending: dict[tuple[int, str], PendingLoad] = {}
        self._in_flight: set[OffloadKey] = set()
        self._failed: OrderedDict[OffloadKey, float] = OrderedDict()

    def add(self, tier: int, ctx: ReqContext, key: OffloadKey, slot: int) -> None:
        load = self._pending.get((tier, ctx.req_id))
        if load is None:
            load = self._pending[(tier, ctx.req_id)] = PendingLoad(tier, ctx)
        load.keys.append(key)
        load.slots.append(slot)
        self._in_flight.add(key)

    def take_pending(self) -> list[PendingLoad]:
        out = list(self._pending.values())
        self._pending.clear()
        return out

    def has_pending(self) -> bool:
        return bool(self._pending)

    def is_in_flight(self, key: OffloadKey) -> bool:
        return key in self._in_flight

    def finished(
        self, keys: Iterable[OffloadKey], failed: Iterable[OffloadKey]
    ) -> list[OffloadKey]:
        """Promotions of `keys` ended (`failed` did not land); returns the keys
        still tracked, those a `clear` (a reset) has not forgotten."""
        tracked = [key for key in keys if key in self._in_flight]
        self._in_flight.difference_update(tracked)
        expires = self._clock() + self._failure_ttl_s
        for key in failed:
            self._failed[key] = expires
            self._failed.move_to_end(key)
            if len(self._failed) > self._max_failures:
                self._failed.popitem(last=False)
        return tracked

    def recently_failed(self, key: OffloadKey) -> bool:
        expires = self._failed.get(key)
        if expires is None:
            return False
        if self._clock() < expires:
            return True
        del self._failed[key]
        return False

    def clear(self) -> None:
        """Forget pending and in-flight promotions (failures are kept)."""
        self._pending.clear()
        self._in_flight.clear()

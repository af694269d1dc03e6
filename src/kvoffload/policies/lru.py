"""Least-recently-used eviction."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence, Set

from kvoffload.keys import OffloadKey
from kvoffload.policies.base import (
    Evictable,
    EvictionPolicy,
    first_evictable,
    register_policy,
)


@register_policy("lru")
class LRUPolicy(EvictionPolicy):
    """Evicts the chunk used longest ago; a request's head ends most recent."""

    chains_drain_from_tail = True

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._order: OrderedDict[OffloadKey, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, key: object) -> bool:
        return key in self._order

    def insert(self, key: OffloadKey) -> None:
        self._order[key] = None

    def insert_many(self, keys: Sequence[OffloadKey]) -> None:
        # A loop, not `update`: OrderedDict.update sets keys through the generic
        # mapping protocol, about three times slower for a request's batch.
        order = self._order
        for key in keys:
            order[key] = None

    def remove(self, key: OffloadKey) -> None:
        self._order.pop(key, None)

    def remove_many(self, keys: Sequence[OffloadKey]) -> None:
        pop = self._order.pop
        for key in keys:
            pop(key, None)

    def touch(
        self, keys: Sequence[OffloadKey], new: Set[OffloadKey] = frozenset()
    ) -> None:
        order = self._order
        move = order.move_to_end
        for key in reversed(keys):
            if key in order:
                move(key)

    def evict(
        self, n: int, incoming: Sequence[OffloadKey], evictable: Evictable
    ) -> list[OffloadKey] | None:
        if n <= 0:
            return []
        order = self._order
        victims = first_evictable(order, n, evictable)
        if len(victims) < n:
            return None
        for key in victims:
            del order[key]
        return victims

    def clear(self) -> None:
        self._order.clear()

"""A floor for the cost of retention hints: their three classes and nothing more.

`BareHints` orders evictions as `RetentionPolicy` does in its plainest reading
(docs/policies.md, "Retention hints"): chunks hinted 0 first (every 0 believed
at once, oldest hint first, a hint's chunks from its end back), then the
wrapped policy's own order, then the chunks under an unexpired positive hint;
an expired hint is no hint, and past the bound the oldest claims stop
counting. It learns nothing (no `ZeroTrust`, no `HintWorth`, no shared
prefixes, no per-run counters), keeps one deadline per chunk (a later claim
overwrites it, shorter or not) and does its bookkeeping in bulk in C wherever
CPython allows: a claim is one `dict.update`; the chunks hinted 0 are the
product's own table (`ZeroHints`), every 0 dated alike and so believed.

It is a measure, not a product: `python -m kvoffload.bench manager --hints MODE
--floor` runs it beside the real thing, so that the manager's cost with hints
can be read against what the classes cost written as plainly as CPython
allows, not only against the same policy without them (docs/benchmarks.md,
"The 0s as one table, and what the classes cost by themselves").
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Container, Sequence, Set

from kvoffload.keys import OffloadKey
from kvoffload.policies.base import Evictable, EvictionPolicy, Refusing
from kvoffload.policies.hint_claims import Clock
from kvoffload.policies.retention import RetentionPolicy
from kvoffload.policies.zero_hints import Ripe

_BELIEVED: Ripe = (0, 0)
"""Every 0 is dated 0 here, so every 0 is believed."""


class BareHints(RetentionPolicy):
    """The classes of `RetentionPolicy` over `inner`, without what it learns.

    A subclass so that a manager can hold it where it holds the real one;
    of the parent's state it uses only the table of 0s (`ZeroHints`)."""

    def __init__(
        self, inner: EvictionPolicy, clock: Clock, max_hinted_share: float
    ) -> None:
        super().__init__(inner, clock, max_hinted_share)
        self._limit = math.floor(max_hinted_share * inner.capacity)
        self._due: dict[OffloadKey, float] = {}
        """Chunks under a positive hint, with its deadline."""
        self._queue: list[tuple[float, int, Sequence[OffloadKey]]] = []
        """Claims by deadline: what expires, and what stops counting first."""
        self._seq = 0
        self._latest = -math.inf
        self._at_latest: set[OffloadKey] = set()

    # -- the wrapped policy, called straight through ----------------------------

    def insert_many(self, keys: Sequence[OffloadKey]) -> None:
        self.inner.insert_many(keys)

    def remove(self, key: OffloadKey) -> None:
        self.inner.remove(key)
        self._due.pop(key, None)
        self._zero.pop(key)

    def touch(
        self, keys: Sequence[OffloadKey], new: Set[OffloadKey] = frozenset()
    ) -> None:
        self.inner.touch(keys, new)

    def clear(self) -> None:
        self.inner.clear()
        self._due.clear()
        self._zero.clear()
        self._queue.clear()
        self._at_latest.clear()

    # -- hints -------------------------------------------------------------------

    @property
    def active(self) -> bool:
        return bool(self._due or self._zero_marks)

    def num_hinted(self) -> int:
        return len(self._due)

    @property
    def hint_room(self) -> int:
        return self._limit

    def hint_of(self, key: OffloadKey) -> float | None:
        due = self._due.get(key)
        if due is not None:
            left = due - self._clock()
            return left if left > 0 else None  # expired: no hint
        return 0.0 if key in self._zero_marks else None

    def covers(self, keys: Sequence[OffloadKey], seconds: float) -> bool:
        return (
            seconds > 0
            and self._clock() + seconds == self._latest
            and self._at_latest.issuperset(keys)
        )

    def retain(
        self,
        keys: Sequence[OffloadKey],
        seconds: float,
        stored: Container[OffloadKey] | None = None,
    ) -> None:
        if not keys:
            return
        due = self._due
        if seconds <= 0:
            self._zero.add(keys, 0, due)  # (a positive hint stands)
            return
        deadline = self._clock() + seconds
        if deadline > self._latest:
            self._latest = deadline
            self._at_latest = set(keys)
        else:
            self._at_latest.update(keys)
        due.update(dict.fromkeys(keys, deadline))
        if self._zero_marks:
            self._zero.pop_many(keys)
        heapq.heappush(self._queue, (deadline, self._seq, keys))
        self._seq += 1
        while len(due) > self._limit and self._queue:
            self._end_claim()

    def _end_claim(self) -> None:
        """The first claim in the queue stops counting."""
        deadline, _, keys = heapq.heappop(self._queue)
        due = self._due
        for key in keys:
            if due.get(key) == deadline:
                del due[key]

    def note_hit(self, keys: Sequence[OffloadKey]) -> None:
        if self._zero_marks:
            self._zero.pop_many(keys)

    def evict(
        self, n: int, incoming: Sequence[OffloadKey], evictable: Evictable
    ) -> list[OffloadKey] | None:
        due, zeros = self._due, self._zero_marks
        if n <= 0 or (not due and not zeros):
            return self.inner.evict(n, incoming, evictable)
        queue, now = self._queue, self._clock()
        while queue and queue[0][0] <= now:
            self._end_claim()
        taken = self._zero.first_evictable(n, _BELIEVED, evictable) if zeros else []
        rest = n - len(taken)
        refused: list[Container[OffloadKey]] = [zeros, due] if due else [zeros]
        got = self.inner.evict(rest, incoming, Refusing(refused, evictable))
        if got is None:
            # Class 3, in the wrapped policy's order (not the longest first).
            got = self.inner.evict(rest, incoming, Refusing([zeros], evictable))
            if got is None:
                return None
            for key in got:
                due.pop(key, None)
        if taken:
            self._zero.take(taken, self.inner.remove_many)
        return taken + got

"""The positive retention hints a tier holds: which chunks each request's hint
covers until when, what became of them, and which stop counting past the bound.

`RetentionPolicy` keeps the chunks under these hints last (class 3 of its
order) and asks `HintClaims` which of them to give up first when it must.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import filterfalse

from kvoffload.keys import OffloadKey
from kvoffload.policies.base import Evictable

Clock = Callable[[], float]

_Claim = tuple[float, int, tuple[OffloadKey, ...]]
"""(deadline, sequence, keys): one request's hint on a run of chunks, in the
order hints expire."""
_Ranked = tuple[float, int, float, tuple[OffloadKey, ...]]
"""(-seconds, sequence, deadline, keys): the same, in the order hints stop
counting past the bound: the longest first, then the oldest."""


@dataclass
class RetentionCounts:
    """What became of the hints (counters only grow)."""

    honoured: int = 0
    """Chunks loaded while under a hint (once per hint)."""
    expired_unused: int = 0
    """Hints that expired before their chunk was loaded."""
    dropped: int = 0
    """Hints that stopped counting before they expired: past the bound, or
    their chunk evicted when nothing else could be."""


class HintClaims:
    """The positive hints on a tier's chunks, at most `limit` chunks at once.

    `claim(keys, seconds)` holds `keys` until `now + seconds` (a later deadline
    from another request extends a chunk's, an earlier one does not shorten
    it); past `limit` chunks, hints stop counting in the order of `pick`. An
    expired hint is no hint: `expire(now)` drops them, and the owner calls it
    before it reads `deadline`. `deadline` is read, never written, outside.
    """

    def __init__(self, limit: int, clock: Clock) -> None:
        self.limit = limit
        self._clock = clock
        self.deadline: dict[OffloadKey, float] = {}
        """Chunks under an unexpired hint within the bound, with its deadline."""
        self._used: set[OffloadKey] = set()
        """Chunks loaded under their present hint (a later hint on a chunk is a
        new one, not yet honoured). Always within `deadline`: the set
        operations below rely on it."""
        self._claims: list[_Claim] = []
        self._ranks: list[_Ranked] = []
        self._seq = 0
        self._latest = -math.inf
        self._at_latest: set[OffloadKey] = set()
        """The chunks whose deadline is `_latest`, the latest of all: a
        request's later claims at the same instant skip them in C."""
        self.counts = RetentionCounts()

    def clear(self) -> None:
        """Forget every hint (the counters stay: they only grow)."""
        self.deadline.clear()
        self._used.clear()
        self._claims.clear()
        self._ranks.clear()
        self._latest = -math.inf
        self._at_latest.clear()

    def claim(self, keys: Sequence[OffloadKey], seconds: float) -> Sequence[OffloadKey]:
        """Put `keys` (prefix order, not empty) under a hint of `seconds` > 0
        from now; returns those whose deadline it set (none if it changed none)."""
        if self.limit == 0:
            return ()
        deadline = self.deadline
        due = self._clock() + seconds
        claimed: Sequence[OffloadKey]
        if due > self._latest:
            # Every live deadline is earlier: extend them all at C speed (the
            # common case: one hint length for every request).
            claimed = keys
            self._latest = due
            self._at_latest = set(keys)
        elif due == self._latest:
            # A request's second and third claims at one instant (its store,
            # its touch): only the keys not yet under this deadline, found in C.
            at_latest = self._at_latest
            if at_latest.issuperset(keys):
                return ()
            claimed = list(filterfalse(at_latest.__contains__, keys))
            at_latest.update(claimed)
        else:
            claimed = [k for k in keys if deadline.get(k, -math.inf) < due]
            if not claimed:
                return ()
        deadline.update(dict.fromkeys(claimed, due))
        if self._used:
            self._used.difference_update(claimed)
        run = tuple(claimed)
        heapq.heappush(self._claims, (due, self._seq, run))
        heapq.heappush(self._ranks, (-seconds, self._seq, due, run))
        self._seq += 1
        if len(deadline) > self.limit:
            self._drop_past_bound()
        if len(self._claims) + len(self._ranks) > 8 * len(deadline) + 4096:
            self._compact()
        return claimed

    def covers(self, keys: Sequence[OffloadKey], seconds: float) -> bool:
        """Whether `claim(keys, seconds)` now would change nothing, known in C
        without reading each key: every one of `keys` is under a hint ending
        when this one would, the latest of all (a request's touch after its
        store at one instant). `keys` need not be held."""
        return (
            seconds > 0
            and self.limit > 0
            and self._clock() + seconds == self._latest
            and self._at_latest.issuperset(keys)
        )

    def honour(self, keys: Sequence[OffloadKey]) -> None:
        """`keys` were loaded: count the hints they are under as honoured (once
        per hint). Call after `expire`, with `deadline` not empty."""
        # Set operations: at C speed, whatever the prefix length.
        # (`difference`, not `-=`: that walks all of `used`.)
        fresh = (self.deadline.keys() & keys).difference(self._used)
        if fresh:
            self._used |= fresh
            self.counts.honoured += len(fresh)

    def num_hinted(self) -> int:
        """Chunks under an unexpired hint (what the bound caps)."""
        if self._claims:
            self.expire(self._clock())
        return len(self.deadline)

    def expire(self, now: float) -> None:
        """Drop the hints whose deadline is at or before `now`."""
        claims = self._claims
        if not claims or claims[0][0] > now:
            return
        deadline, used = self.deadline, self._used
        while claims and claims[0][0] <= now:
            due, _, keys = heapq.heappop(claims)
            for key in keys:
                if deadline.get(key) == due:
                    del deadline[key]
                    if key in used:
                        used.discard(key)
                    else:
                        self.counts.expired_unused += 1
        if now >= self._latest:  # every chunk at the latest deadline left above
            self._at_latest.clear()

    def forget(self, keys: Sequence[OffloadKey]) -> None:
        """`keys` left the tier: their hints with them (not counted)."""
        deadline, used, at_latest = self.deadline, self._used, self._at_latest
        for key in keys:
            deadline.pop(key, None)
            used.discard(key)
            at_latest.discard(key)

    def _drop_past_bound(self) -> None:
        """Past the bound, hints stop counting: the longest first (a chunk held
        for a long hint costs more room per hit than one for a short hint, and a
        client that claims a day gains nothing by it), among hints of one length
        the oldest (the soonest to expire); a run's tail before its head (a hit
        is a leading run)."""
        deadline, ranks = self.deadline, self._ranks
        while len(deadline) > self.limit and ranks:
            length, seq, due, keys = heapq.heappop(ranks)
            # The whole run is read, not only its tail: what goes back must be
            # its live chunks only, or one that left and later took the same
            # deadline again would count in this run, ahead of its own.
            live = [k for k in keys if deadline.get(k) == due]
            excess = len(deadline) - self.limit
            drop = live[-excess:] if excess < len(live) else live
            used, at_latest = self._used, self._at_latest
            for key in drop:
                deadline.pop(key, None)
                used.discard(key)
                at_latest.discard(key)
            self.counts.dropped += len(drop)
            if len(drop) < len(live):
                kept = tuple(live[: len(live) - len(drop)])
                heapq.heappush(ranks, (length, seq, due, kept))

    def _compact(self) -> None:
        """Drop the stale entries of both heaps (a run whose chunks have all
        left, or taken later deadlines), which pile up under long hints."""
        deadline = self.deadline

        def live(keys: tuple[OffloadKey, ...], due: float) -> tuple[OffloadKey, ...]:
            return tuple(k for k in keys if deadline.get(k) == due)

        claims = [(d, q, live(k, d)) for d, q, k in self._claims]
        self._claims = [c for c in claims if c[2]]
        heapq.heapify(self._claims)
        ranks = [(n, q, d, live(k, d)) for n, q, d, k in self._ranks]
        self._ranks = [r for r in ranks if r[3]]
        heapq.heapify(self._ranks)

    def pick(self, need: int, evictable: Evictable, picked: set[OffloadKey]) -> None:
        """Add to `picked` up to `need` evictable hinted chunks, the first to stop
        counting first (popped from the claims and pushed back: `evictable` may
        raise `StopEviction`)."""
        hinted, ranks = self.deadline, self._ranks
        popped: list[_Ranked] = []
        try:
            while ranks and len(picked) < need:
                entry = heapq.heappop(ranks)
                _, _, due, keys = entry
                live = [k for k in keys if hinted.get(k) == due]
                if not live:
                    continue  # stale: dropped for good
                popped.append(entry)
                for key in reversed(live):  # a run's tail first: a hit is a leading run
                    if key not in picked and evictable(key):
                        picked.add(key)
                        if len(picked) == need:
                            break
        finally:
            for entry in popped:
                heapq.heappush(ranks, entry)

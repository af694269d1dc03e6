"""The positive retention hints a tier holds: which chunks each request's hint
covers until when, what became of them, and which stop counting past the bound.

`RetentionPolicy` keeps the chunks under these hints last (class 3 of its
order) and asks `HintClaims` which of them to give up first when it must.

State is kept per *run*: one `HintRun` for each claim (a request's hint on the
chunks of one store or touch), holding its deadline, its length and the chunks
loaded under it; a chunk's only entry is the run whose deadline it is under
(`owner`). Expiring a run, trimming it past the bound or asking whether a chunk
is under a given run is one lookup per chunk, at C speed; what a run's chunks
were worth (honoured, expired unused) is counted from the run, not kept per
chunk in tables of their own.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from kvoffload.keys import OffloadKey
from kvoffload.policies.base import Evictable

Clock = Callable[[], float]


class HintRun:
    """One request's positive hint on a run of chunks. Its chunks are those of
    `keys` that `HintClaims.owner` maps to it: a later deadline from another
    claim takes a chunk over, and one that leaves the tier, expires or stops
    counting leaves `owner`."""

    __slots__ = ("due", "keys", "live", "seconds", "seq", "used")

    def __init__(
        self, due: float, seconds: float, seq: int, keys: tuple[OffloadKey, ...]
    ) -> None:
        self.due = due
        self.seconds = seconds
        self.seq = seq
        self.keys = keys
        self.live = len(keys)
        """How many of `keys` are still under this run."""
        self.used: set[OffloadKey] | None = None
        """Chunks loaded under this hint (once each; `None` while none was)."""


_Queued = tuple[float, int, HintRun]
"""(deadline, sequence, run) in the order hints expire, or (-seconds,
sequence, run) in the order they stop counting past the bound: the longest
first, then the oldest."""


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
    before it reads `owner`. `owner` is read, never written, outside.
    """

    def __init__(self, limit: int, clock: Clock) -> None:
        self.limit = limit
        self._clock = clock
        self.owner: dict[OffloadKey, HintRun] = {}
        """Chunks under an unexpired hint within the bound, with the run whose
        deadline they are under."""
        self._claims: list[_Queued] = []
        self._ranks: list[_Queued] = []
        self._seq = 0
        self._latest = -math.inf
        self._at_latest: set[OffloadKey] = set()
        """The chunks whose deadline is `_latest`, the latest of all: a
        request's later claims at the same instant skip them in C."""
        self.counts = RetentionCounts()
        self.on_drop: Callable[[Sequence[OffloadKey], float], None] | None = None
        """Told of the chunks whose hint stops counting past the limit, with
        the hint's deadline (`HintWorth.dropped`)."""

    def clear(self) -> None:
        """Forget every hint (the counters stay: they only grow)."""
        self.owner.clear()
        self._claims.clear()
        self._ranks.clear()
        self._latest = -math.inf
        self._at_latest.clear()

    def live(self, run: HintRun) -> Sequence[OffloadKey]:
        """The chunks still under `run`, in its order (looked up only when
        some have left)."""
        keys = run.keys
        if run.live == len(keys):
            return keys
        if not run.live:
            return ()
        get = self.owner.get
        return [key for key in keys if get(key) is run]

    def claim(self, keys: Sequence[OffloadKey], seconds: float) -> Sequence[OffloadKey]:
        """Put `keys` (prefix order, not empty) under a hint of `seconds` > 0
        from now; returns those whose deadline it set (none if it changed none)."""
        if self.limit == 0:
            return ()
        owner = self.owner
        due = self._clock() + seconds
        claimed: Sequence[OffloadKey]
        if due > self._latest:
            # Every live deadline is earlier: all of `keys` (the common case:
            # one hint length for every request).
            claimed = keys
            self._latest = due
            self._at_latest = set(keys)
        elif due == self._latest:
            # A request's second and third claims at one instant (its store,
            # its touch): only the keys not yet under this deadline, found in C.
            at_latest = self._at_latest
            if at_latest.issuperset(keys):
                return ()
            claimed = [key for key in keys if key not in at_latest]
            at_latest.update(claimed)
        else:
            claimed = [k for k in keys if k not in owner or owner[k].due < due]
            if not claimed:
                return ()
        run = HintRun(due, seconds, self._seq, tuple(claimed))
        get = owner.get
        for key in claimed:
            left = get(key)
            if left is not None:
                left.live -= 1
            owner[key] = run
        heapq.heappush(self._claims, (due, self._seq, run))
        heapq.heappush(self._ranks, (-seconds, self._seq, run))
        self._seq += 1
        if len(owner) > self.limit:
            self._drop_past_bound()
        if len(self._claims) + len(self._ranks) > 8 * len(owner) + 4096:
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
        per hint). Call after `expire`, with `owner` not empty."""
        owner = self.owner
        fresh = 0
        for key in owner.keys() & keys:  # (found in C: most loads hold few)
            run = owner[key]
            used = run.used
            if used is None:
                run.used = {key}
            elif key in used:
                continue
            else:
                used.add(key)
            fresh += 1
        self.counts.honoured += fresh

    def num_hinted(self) -> int:
        """Chunks under an unexpired hint (what the bound caps)."""
        if self._claims:
            self.expire(self._clock())
        return len(self.owner)

    def expire(self, now: float) -> None:
        """Drop the hints whose deadline is at or before `now`."""
        claims = self._claims
        if not claims or claims[0][0] > now:
            return
        owner = self.owner
        while claims and claims[0][0] <= now:
            run = heapq.heappop(claims)[2]
            live = self.live(run)
            if not live:
                continue
            for key in live:
                del owner[key]
            run.live = 0
            used = run.used
            unused = len(live) - (len(used.intersection(live)) if used else 0)
            self.counts.expired_unused += unused
        if now >= self._latest:  # every chunk at the latest deadline left above
            self._at_latest.clear()

    def forget(self, keys: Iterable[OffloadKey]) -> None:
        """`keys` left the tier, or a 0 ended their hints (not counted)."""
        pop, at_latest = self.owner.pop, self._at_latest
        for key in keys:
            run = pop(key, None)
            if run is not None:
                run.live -= 1
                at_latest.discard(key)

    def _drop_past_bound(self) -> None:
        """Past the bound, hints stop counting: the longest first (a chunk held
        for a long hint costs more room per hit than one for a short hint, and a
        client that claims a day gains nothing by it), among hints of one length
        the oldest (the soonest to expire); a run's tail before its head (a hit
        is a leading run)."""
        owner, ranks = self.owner, self._ranks
        while len(owner) > self.limit and ranks:
            entry = heapq.heappop(ranks)
            run = entry[2]
            live = self.live(run)
            excess = len(owner) - self.limit
            keep = len(live) - excess if excess < len(live) else 0
            dropped = live[keep:]
            for key in dropped:
                del owner[key]
            if self.on_drop is not None:
                self.on_drop(dropped, run.due)
            self._at_latest.difference_update(dropped)
            run.live = keep
            self.counts.dropped += len(dropped)
            if keep:
                # What goes back is its live head only: the next drop reads
                # no chunk twice.
                run.keys = tuple(live[:keep])
                heapq.heappush(ranks, entry)

    def _compact(self) -> None:
        """Drop the stale entries of both heaps (a run whose chunks have all
        left, or taken later deadlines), which pile up under long hints."""
        self._claims = [c for c in self._claims if c[2].live]
        heapq.heapify(self._claims)
        self._ranks = [r for r in self._ranks if r[2].live]
        heapq.heapify(self._ranks)

    def pick(self, need: int, evictable: Evictable, picked: set[OffloadKey]) -> None:
        """Add to `picked` up to `need` evictable hinted chunks, the first to stop
        counting first (popped from the claims and pushed back: `evictable` may
        raise `StopEviction`)."""
        ranks = self._ranks
        popped: list[_Queued] = []
        try:
            while ranks and len(picked) < need:
                entry = heapq.heappop(ranks)
                live = self.live(entry[2])
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

"""The chunks a tier holds under a retention hint of 0, oldest hint first.

`RetentionPolicy` sends them first once their 0 is believed (`ZeroTrust`). As
with the positive hints (`HintClaims`), state is kept per *run*: one `ZeroRun`
for each request's call that hints chunks 0, holding the eviction clock when it
did and which *kind* of chunk it holds (`OWN` or `FOUND`, judged apart by
`ZeroTrust`); a chunk's only entry is the run it is under (`run_of`). The queue
of runs is the order in which 0s go first: runs oldest first, a run's chunks
from its end back (what a later request can hit is a leading run, so where a
wrong 0 loses some of a prompt it keeps its head), a chunk that leaves
(loaded, given a positive hint, evicted) skipped where it was.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from itertools import chain, islice, takewhile
from operator import attrgetter

from kvoffload.keys import OffloadKey
from kvoffload.policies.base import Evictable, evictable_in

OWN = 0
"""The kind of a chunk hinted 0 by the request that stored it (or where the
caller cannot tell)."""
FOUND = 1
"""The kind of a chunk hinted 0 by a request that found it in the tier (loaded
it, or found it resident): one that has been asked for before."""
Ripe = tuple[int, int]
"""The clock reading at or before which a 0 is believed, for each kind."""


class ZeroRun:
    """One request's 0 on a run of chunks: those of `keys` still mapped to it,
    `keys` from the end of the request's prefix back."""

    __slots__ = ("keys", "kind", "live", "mark", "stamp", "start")

    def __init__(self, stamp: int, kind: int, keys: tuple[OffloadKey, ...]) -> None:
        self.stamp = stamp
        """`ZeroTrust.clock` when the chunks were hinted 0."""
        self.kind = kind
        """`OWN` or `FOUND`."""
        self.mark = stamp << 1 | kind
        """Its date and kind in one int, as `ZeroTrust` reads them back."""
        self.keys = keys
        self.live = len(keys)
        """How many of `keys` are still under this run."""
        self.start = 0
        """No key before this index is under this run any more."""


_live_count = attrgetter("live")
_mark = attrgetter("mark")


class ZeroHints:
    """Chunks hinted 0, with the clock reading of their hint, oldest first."""

    def __init__(self) -> None:
        self.run_of: dict[OffloadKey, ZeroRun] = {}
        """Each chunk hinted 0 and the run it is under (read, never written,
        outside)."""
        self._queue: deque[ZeroRun] = deque()
        self._latest = [-1, -1]
        """The latest date given to each kind (a bound: its run may be gone)."""

    def __len__(self) -> int:
        return len(self.run_of)

    def __bool__(self) -> bool:
        return bool(self.run_of)

    def __contains__(self, key: object) -> bool:
        return key in self.run_of

    def clear(self) -> None:
        self.run_of.clear()
        self._queue.clear()
        self._latest = [-1, -1]

    def all_believed(self, ripe: Ripe) -> bool:
        """Whether every 0 is dated at or before `ripe` of its kind (`False`
        may also mean that it cannot tell cheaply)."""
        latest = self._latest
        return not self._queue or (latest[0] <= ripe[0] and latest[1] <= ripe[1])

    def is_believed(self, key: OffloadKey, ripe: Ripe) -> bool:
        """Whether `key` is hinted 0 and dated at or before `ripe` of its kind."""
        run = self.run_of.get(key)
        return run is not None and run.stamp <= ripe[run.kind]

    def add(
        self,
        keys: Sequence[OffloadKey],
        stamp: int,
        skip: Container[object],
        own: Container[object] | None = None,
    ) -> tuple[int, int]:
        """Hint 0, dated `stamp` (never earlier than the last), those of `keys`
        (prefix order) neither hinted 0 already (they keep their date) nor in
        `skip`: those in `own` (all where it is `None`) as `OWN`, the rest as
        `FOUND`, in that order. Returns how many of each."""
        run_of = self.run_of
        # (A comprehension: cheaper per key than `filterfalse` and a method
        # call. A request's later calls find most of its keys here.)
        fresh = [key for key in keys if key not in run_of and key not in skip]
        if not fresh:
            return 0, 0
        if own is None:
            return self._queue_run(stamp, OWN, fresh), 0
        mine = [key for key in fresh if key in own]
        if len(mine) == len(fresh):
            return self._queue_run(stamp, OWN, fresh), 0
        found = [key for key in fresh if key not in own] if mine else fresh
        # (Its own chunks first: they end its prompt.)
        given = self._queue_run(stamp, OWN, mine) if mine else 0
        return given, self._queue_run(stamp, FOUND, found)

    def _queue_run(self, stamp: int, kind: int, keys: list[OffloadKey]) -> int:
        run = ZeroRun(stamp, kind, tuple(reversed(keys)))
        run_of = self.run_of
        for key in keys:
            run_of[key] = run
        self._queue.append(run)
        self._latest[kind] = stamp
        return len(keys)

    def pop(self, key: OffloadKey) -> int | None:
        """Take `key` out; the `ZeroRun.mark` of its 0, or `None` if it had
        none."""
        run = self.run_of.pop(key, None)
        if run is None:
            return None
        run.live -= 1
        return run.mark

    def pop_many(self, keys: Sequence[OffloadKey]) -> list[int]:
        """Take out those of `keys` hinted 0 (found in C: most are not); the
        `ZeroRun.mark`s of their 0s."""
        found = self.run_of.keys() & keys
        return self.take(list(found)) if found else []

    def believed(self, ripe: Ripe) -> Iterator[OffloadKey]:
        """The chunks whose 0 is dated at or before `ripe` of its kind, oldest
        first, lazily (dates only grow: the believed ones lead)."""
        low, high = min(ripe), max(ripe)

        def may_be(run: ZeroRun) -> bool:
            return run.stamp <= high

        def is_believed(run: ZeroRun) -> bool:
            return run.stamp <= low or run.stamp <= ripe[run.kind]

        runs: Iterable[ZeroRun] = takewhile(may_be, self._queue)
        if low < high:
            runs = filter(is_believed, runs)
        return chain.from_iterable(map(self._live, runs))

    def _live(self, run: ZeroRun) -> Iterable[OffloadKey]:
        """The chunks still under `run`, in its order, lazily. Most runs are
        whole from `start` on (class 1 takes a run from its front): those are
        read without a lookup per key."""
        keys, start = run.keys, run.start
        if run.live == len(keys) - start:
            return islice(keys, start, None)
        if not run.live:
            return ()
        get = self.run_of.get
        return [key for key in islice(keys, start, None) if get(key) is run]

    def first_evictable(
        self, n: int, ripe: Ripe, evictable: Evictable
    ) -> list[OffloadKey]:
        """Up to `n` evictable chunks whose 0 is believed (dated at or before
        `ripe` of its kind), in the order of the queue; nothing is taken out
        (`evictable` may raise `StopEviction`)."""
        return list(islice(evictable_in(self.believed(ripe), evictable), n))

    def take(
        self,
        keys: Sequence[OffloadKey],
        remove: Callable[[Sequence[OffloadKey]], None] | None = None,
    ) -> list[int]:
        """Take out `keys` (all hinted 0), and `remove` them; the
        `ZeroRun.mark`s of their 0s, in the order of `keys`."""
        if remove is not None:
            remove(keys)
        runs = list(map(self.run_of.pop, keys))
        for run in runs:
            run.live -= 1
        queue, get = self._queue, self.run_of.get
        while queue:
            run = queue[0]
            if not run.live:
                queue.popleft()
                continue
            front, start = run.keys, run.start
            while get(front[start]) is not run:  # (each key passed once)
                start += 1
            run.start = start
            break
        if len(queue) > 2 * len(self.run_of) + 64:
            # Runs emptied behind live ones: at most half the queue.
            self._queue = deque(filter(_live_count, queue))
        return list(map(_mark, runs))

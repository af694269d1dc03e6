"""The chunks a tier holds under a retention hint of 0, oldest hint first.

`RetentionPolicy` sends them first once their 0 is believed (`ZeroTrust`). As
with the positive hints (`HintClaims`), state is kept per *run*: one `ZeroRun`
for each request's call that hints chunks 0, holding the eviction clock when it
did; a chunk's only entry is the run it is under (`run_of`). The queue of runs
is the order in which 0s go first: a run's chunks in its order, runs oldest
first, a chunk that leaves (loaded, given a positive hint, evicted) skipped
where it was.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from itertools import chain, islice, takewhile
from operator import attrgetter

from kvoffload.keys import OffloadKey
from kvoffload.policies.base import Evictable, evictable_in


class ZeroRun:
    """One request's 0 on a run of chunks: those of `keys` still mapped to it."""

    __slots__ = ("keys", "live", "stamp", "start")

    def __init__(self, stamp: int, keys: tuple[OffloadKey, ...]) -> None:
        self.stamp = stamp
        """`ZeroTrust.clock` when the chunks were hinted 0."""
        self.keys = keys
        self.live = len(keys)
        """How many of `keys` are still under this run."""
        self.start = 0
        """No key before this index is under this run any more."""


_live_count = attrgetter("live")


class ZeroHints:
    """Chunks hinted 0, with the clock reading of their hint, oldest first."""

    def __init__(self) -> None:
        self.run_of: dict[OffloadKey, ZeroRun] = {}
        """Each chunk hinted 0 and the run it is under (read, never written,
        outside)."""
        self._queue: deque[ZeroRun] = deque()

    def __len__(self) -> int:
        return len(self.run_of)

    def __bool__(self) -> bool:
        return bool(self.run_of)

    def __contains__(self, key: object) -> bool:
        return key in self.run_of

    def clear(self) -> None:
        self.run_of.clear()
        self._queue.clear()

    def all_believed(self, ripe: int) -> bool:
        """Whether every 0 is dated at or before `ripe`."""
        queue = self._queue
        return not queue or queue[-1].stamp <= ripe

    def stamp(self, key: OffloadKey) -> int | None:
        """The clock reading when `key` was hinted 0, or `None`."""
        run = self.run_of.get(key)
        return None if run is None else run.stamp

    def add(
        self, keys: Sequence[OffloadKey], stamp: int, skip: Container[object]
    ) -> int:
        """Hint 0, dated `stamp` (never earlier than the last), those of `keys`
        neither hinted 0 already (they keep their date) nor in `skip`; returns
        how many."""
        run_of = self.run_of
        # (A comprehension: cheaper per key than `filterfalse` and a method
        # call. A request's later calls find most of its keys here.)
        fresh = tuple([key for key in keys if key not in run_of and key not in skip])
        if not fresh:
            return 0
        run = ZeroRun(stamp, fresh)
        for key in fresh:
            run_of[key] = run
        self._queue.append(run)
        return len(fresh)

    def pop(self, key: OffloadKey) -> int | None:
        """Take `key` out; the clock reading of its 0, or `None` if it had none."""
        run = self.run_of.pop(key, None)
        if run is None:
            return None
        run.live -= 1
        return run.stamp

    def pop_many(self, keys: Sequence[OffloadKey]) -> list[int]:
        """Take out those of `keys` hinted 0 (found in C: most are not); the
        clock readings of their 0s."""
        found = self.run_of.keys() & keys
        return self.take(list(found)) if found else []

    def believed(self, ripe: int) -> Iterator[OffloadKey]:
        """The chunks whose 0 is dated at or before `ripe`, oldest first,
        lazily (dates only grow: the believed ones lead)."""

        def is_believed(run: ZeroRun) -> bool:
            return run.stamp <= ripe

        return chain.from_iterable(map(self._live, takewhile(is_believed, self._queue)))

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
        self, n: int, ripe: int, evictable: Evictable
    ) -> list[OffloadKey]:
        """Up to `n` evictable chunks whose 0 is believed (dated at or before
        `ripe`), oldest first; nothing is taken out (`evictable` may raise
        `StopEviction`)."""
        return list(islice(evictable_in(self.believed(ripe), evictable), n))

    def take(
        self,
        keys: Sequence[OffloadKey],
        remove: Callable[[Sequence[OffloadKey]], None] | None = None,
    ) -> list[int]:
        """Take out `keys` (all hinted 0), and `remove` them; the clock
        readings of their 0s, in the order of `keys`."""
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
        return [run.stamp for run in runs]

"""The chunks a tier holds under a retention hint of 0, oldest hint first.

`RetentionPolicy` sends them first once their 0 is believed (`ZeroTrust`). They
are one table, `marks`: each chunk hinted 0 with its *mark*, the
`ZeroTrust.clock` reading when it was hinted and which *kind* of chunk it is
(`OWN` or `FOUND`, judged apart by `ZeroTrust`), in the order they go: each
call's chunks after those of the calls before it (dates only grow), from the
end of its prefix back (what a later request can hit is a leading run, so
where a wrong 0 loses some of a prompt it keeps its head), its own chunks
before those it found; a chunk that leaves (loaded, given a positive hint,
evicted) leaves the table. Hinting a call's chunks, taking them out and
reading the believed ones from the front are bulk operations in C: no object
per call or per chunk. A dict keeps its insertion order, but what leaves its
front stays behind as empty slots that every walk from the front reads past,
until the next insert that makes it grow; so the table is rebuilt in place
once as many chunks have left it as it holds.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterator, Sequence
from itertools import islice

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


def mark_of(stamp: int, kind: int) -> int:
    """A 0's date and kind in one int, as `ZeroTrust` reads them back."""
    return stamp << 1 | kind


class ZeroHints:
    """Chunks hinted 0, with the mark of their hint, in the order they go."""

    def __init__(self) -> None:
        self.marks: dict[OffloadKey, int] = {}
        """Each chunk hinted 0 and its mark (`mark_of`), in the order they go
        (read, never written, outside)."""
        self._latest = [-1, -1]
        """The latest date given to each kind (a bound: its chunks may be gone)."""
        self._left = 0
        """Chunks taken out since the table was last rebuilt."""

    def __len__(self) -> int:
        return len(self.marks)

    def __bool__(self) -> bool:
        return bool(self.marks)

    def __contains__(self, key: object) -> bool:
        return key in self.marks

    def clear(self) -> None:
        self.marks.clear()
        self._latest = [-1, -1]
        self._left = 0

    def all_believed(self, ripe: Ripe) -> bool:
        """Whether every 0 is dated at or before `ripe` of its kind (`False`
        may also mean that it cannot tell cheaply)."""
        latest = self._latest
        return not self.marks or (latest[0] <= ripe[0] and latest[1] <= ripe[1])

    def is_believed(self, key: OffloadKey, ripe: Ripe) -> bool:
        """Whether `key` is hinted 0 and dated at or before `ripe` of its kind."""
        mark = self.marks.get(key)
        return mark is not None and mark >> 1 <= ripe[mark & 1]

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
        marks = self.marks
        # (A comprehension: cheaper per key than `filterfalse` and a method
        # call. A request's later calls find most of its keys here.)
        fresh = [key for key in keys if key not in marks and key not in skip]
        if not fresh:
            return 0, 0
        if own is None:
            return self._append(stamp, OWN, fresh), 0
        mine = [key for key in fresh if key in own]
        if len(mine) == len(fresh):
            return self._append(stamp, OWN, fresh), 0
        found = [key for key in fresh if key not in own] if mine else fresh
        # (Its own chunks first: they end its prompt.)
        given = self._append(stamp, OWN, mine) if mine else 0
        return given, self._append(stamp, FOUND, found)

    def _append(self, stamp: int, kind: int, keys: list[OffloadKey]) -> int:
        keys.reverse()  # from the end of the prefix back
        self.marks.update(dict.fromkeys(keys, mark_of(stamp, kind)))
        self._latest[kind] = stamp
        return len(keys)

    def pop(self, key: OffloadKey) -> int | None:
        """Take `key` out; the mark of its 0, or `None` if it had none."""
        mark = self.marks.pop(key, None)
        if mark is not None:
            self._taken(1)
        return mark

    def pop_many(self, keys: Sequence[OffloadKey]) -> list[int]:
        """Take out those of `keys` hinted 0 (found in C: most are not); the
        marks of their 0s."""
        found = self.marks.keys() & keys
        return self.take(list(found)) if found else []

    def believed(self, ripe: Ripe) -> Iterator[OffloadKey]:
        """The chunks whose 0 is dated at or before `ripe` of its kind, oldest
        first, lazily (dates only grow: the believed ones lead)."""
        if self.all_believed(ripe):
            return iter(self.marks)
        return _believed(self.marks, ripe)

    def first_evictable(
        self, n: int, ripe: Ripe, evictable: Evictable
    ) -> list[OffloadKey]:
        """Up to `n` evictable chunks whose 0 is believed (dated at or before
        `ripe` of its kind), in the order they go; nothing is taken out
        (`evictable` may raise `StopEviction`)."""
        return list(islice(evictable_in(self.believed(ripe), evictable), n))

    def take(
        self,
        keys: Sequence[OffloadKey],
        remove: Callable[[Sequence[OffloadKey]], None] | None = None,
    ) -> list[int]:
        """Take out `keys` (all hinted 0), and `remove` them; the marks of
        their 0s, in the order of `keys`."""
        if remove is not None:
            remove(keys)
        marks = list(map(self.marks.pop, keys))
        self._taken(len(keys))
        return marks

    def _taken(self, n: int) -> None:
        """`n` chunks left the table: rebuilt in place (the same dict, which
        others hold) once as many have left as it holds."""
        self._left += n
        marks = self.marks
        if self._left > len(marks) + 64:
            live = dict(marks)
            marks.clear()
            marks.update(live)
            self._left = 0


def _believed(marks: dict[OffloadKey, int], ripe: Ripe) -> Iterator[OffloadKey]:
    """The keys of `marks` dated at or before `ripe` of their kind, up to the
    first dated past both."""
    high = max(ripe)
    for key, mark in marks.items():
        stamp = mark >> 1
        if stamp > high:
            return
        if stamp <= ripe[mark & 1]:
            yield key

"""What the positive retention hints are worth to the policy they overrule,
and so how much of a tier they may hold.

Hinted chunks leave after every chunk under no hint (`RetentionPolicy`), so the
room they take is room the wrapped policy does not get. Where a hint's length
outlasts the tier's turnover, no hint expires: every one stops counting at the
bound instead, and the hinted share is simply the chunks claimed last. A policy
that keeps recent chunks anyway (LRU) loses nothing by it; one that gains by
*not* keeping fresh chunks seen once (`split`) loses that gain on the hinted
share (docs/policies.md, "The same modes on the generated workloads"). So a
tier measures both sides, as ARC weighs its two lists by the hits each one's
ghosts would have had:

- for the hints: a hinted chunk that the wrapped policy's eviction scan read
  past (it would have given it up, the hint kept it) and that a request then
  loads while the hint stands is a hit the hint bought; and a chunk whose hint
  stopped counting because the room had been lowered below the bound, stored
  again by the hint's deadline (evicted meanwhile, and asked for as the hint
  said), is a hit a larger room would have kept;
- against them: the chunks the policy gave up in an eviction whose scan read
  past hinted ones are remembered, as many as the hints hold; a store of one
  again is a hit the room the hints took would have kept.

Each counts one chunk of room: a credit raises the share hints may hold, a
debit lowers it, between `FLOOR` of the bound (the hints keep enough room to
be measured again) and the bound itself. An application whose hints buy hits
the policy would have missed keeps the whole bound; one whose hints keep what
the policy would have kept anyway, while what it gives up comes back, is held
to the floor.

The two remembered lists are ARC's two ghosts: without the second, a room
lowered early (victims come back within a store or two, hinted chunks at
their conversation's next turn) could not earn itself back, the chunks it no
longer holds never being read past under a hint.

Memory: at most as many remembered victims as chunks under a hint, at most the
bound's worth of chunks whose hint stopped counting, and a set of the hinted
chunks a scan read past (trimmed to those still hinted past twice the bound).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Container, Iterable, Sequence

from kvoffload.keys import OffloadKey

FLOOR = 0.25
"""The least share of the bound hints keep, however little they are worth:
enough hinted chunks for the scan to reach, so that their worth is still
measured and the share can grow back when the application's hints improve."""


class HintWorth:
    """The room positive hints may hold, in chunks, moved by what they are
    worth (see the module). `limit` starts at `bound`."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self._floor = int(bound * FLOOR)
        self._share = float(bound)
        self.victims: OrderedDict[OffloadKey, None] = OrderedDict()
        """The policy's victims while it read past hinted chunks, oldest first,
        at most as many as the chunks under a hint (read, never written,
        outside)."""
        self.lost: OrderedDict[OffloadKey, float] = OrderedDict()
        """Chunks whose hint stopped counting while the room was below the
        bound, with the hint's deadline, oldest first, at most `bound` of them
        (read, never written, outside)."""
        self.rescued: set[OffloadKey] = set()
        """Hinted chunks an eviction scan read past (some since left their
        hint: they are looked up in the hinted chunks when loaded)."""

    @property
    def limit(self) -> int:
        """How many chunks hints may hold now."""
        return int(self._share)

    def clear(self) -> None:
        """Forget the chunks (what was learned of the hints stays)."""
        self.victims.clear()
        self.lost.clear()
        self.rescued.clear()

    def passed(
        self,
        rescued: set[OffloadKey],
        victims: Sequence[OffloadKey],
        hinted: Collection[OffloadKey],
    ) -> None:
        """An eviction's scan read past the chunks `rescued`, under a hint, and
        gave up `victims` instead; `hinted` are the chunks under a hint now."""
        self.rescued |= rescued
        self._trim(hinted)
        remembered = self.victims
        for key in victims:  # (a loop: OrderedDict.update is slower)
            remembered[key] = None
        popitem = remembered.popitem
        for _ in range(len(remembered) - max(len(hinted), 1)):
            popitem(False)  # the oldest

    def dropped(self, keys: Iterable[OffloadKey], due: float) -> None:
        """The hint on `keys`, due at `due`, stopped counting at the room's
        limit: remembered while that limit is below the bound (a drop at the
        bound itself is the cap the application is held to, not a measure)."""
        if self._share >= self.bound:
            return
        lost = self.lost
        for key in keys:
            lost[key] = due
        popitem = lost.popitem
        for _ in range(len(lost) - self.bound):
            popitem(False)  # the oldest

    def survived(self, keys: Iterable[OffloadKey]) -> None:
        """`keys` were loaded: those whose hint had stopped counting stayed
        without it (no credit)."""
        lost = self.lost
        for key in lost.keys() & keys:
            del lost[key]

    def stored(self, keys: Iterable[OffloadKey], now: float) -> bool:
        """`keys` were stored at `now`: chunks whose hint stopped counting
        came back by its deadline (credits) and remembered victims came back
        (debits). Whether the share moved."""
        share = self._share
        lost = self.lost
        if lost:
            back = lost.keys() & keys
            if back:
                pop = lost.pop
                # (A hint's deadline is when its request is due: one that
                # comes then comes as the hint said.)
                kept = sum(1 for key in back if pop(key) >= now)
                self._share = min(self.bound, self._share + kept)
        remembered = self.victims
        back = remembered.keys() & keys
        if back:
            for key in back:
                del remembered[key]
            self._share = max(self._floor, self._share - len(back))
        return self._share != share

    def loaded(self, keys: Sequence[OffloadKey], hinted: Container[OffloadKey]) -> bool:
        """`keys` were loaded: rescued chunks still under a hint are hits the
        hints bought. Whether the share moved. `hinted` is a mapping's keys or
        the mapping."""
        rescued = self.rescued
        found = rescued.intersection(keys)
        if not found:
            return False
        rescued -= found
        bought = sum(1 for key in found if key in hinted)
        self._trim(hinted)
        if not bought:
            return False
        self._share = min(self.bound, self._share + bought)
        return True

    def _trim(self, hinted: Container[OffloadKey]) -> None:
        """Past twice the bound, keep the rescued chunks still under a hint
        (only those can be hits the hints bought)."""
        if len(self.rescued) > 2 * self.bound + 64:
            self.rescued = {key for key in self.rescued if key in hinted}

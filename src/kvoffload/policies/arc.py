"""Adaptive Replacement Cache (Megiddo and Modha, FAST 2003).

T1 holds chunks seen once recently, T2 chunks reused; B1 and B2 remember the keys
recently evicted from each. A new chunk found in B1 says T1 was too small (the
target `p` grows), one found in B2 says T2 was. Eviction takes from T1 while it is
above its target, else from T2.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence, Set

from kvoffload.keys import OffloadKey
from kvoffload.policies.base import (
    Evictable,
    EvictionPolicy,
    StopList,
    evictable_in,
    register_policy,
)


def _after_b2_hit(p: float, b1: int, b2: int, weight: float = 1.0) -> float:
    """The T1 target `p` after a ghost hit in B2, with `b1` and `b2` keys in the
    ghost lists: the textbook step, `max(1, |B1| // |B2|)`, times `weight`,
    down to 0."""
    return max(0.0, p - weight * max(b1 // max(b2, 1), 1))


@register_policy("arc")
class ARCPolicy(EvictionPolicy):
    """Textbook ARC mapped onto batch inserts; pinned chunks are skipped."""

    # Its touch moves a request's chunks head last within T1 and T2 alike.
    chains_drain_from_tail = True

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._t1: OrderedDict[OffloadKey, None] = OrderedDict()
        self._t2: OrderedDict[OffloadKey, None] = OrderedDict()
        self._b1: OrderedDict[OffloadKey, None] = OrderedDict()
        self._b2: OrderedDict[OffloadKey, None] = OrderedDict()
        self._p = 0.0
        # Evictions lately, ARC's own and the tier's in its place
        # (`evicted_for`): what a ghost hit is worth (`_ghost_weight`).
        self._own = 0.0
        self._others = 0.0

    @property
    def target_t1(self) -> float:
        """The adaptive target size of T1."""
        return self._p

    def __len__(self) -> int:
        return len(self._t1) + len(self._t2)

    def __contains__(self, key: object) -> bool:
        return key in self._t1 or key in self._t2

    def insert(self, key: OffloadKey) -> None:
        self.insert_many((key,))

    def insert_many(self, keys: Sequence[OffloadKey]) -> None:
        """Insert a store batch as textbook ARC does when it sees the batch tail
        first: every ghost hit enters T2 before any new key enters T1, and the
        ghost lists are trimmed once, after the batch.

        Trimming after each insert let a new head, inserted before its own
        batch's ghost hit, push that ghost out of B1: the key, whose ghost hit
        `evict` had already counted, then entered T1 as new, and the trim for
        it lost one more ghost."""
        b1, b2, t1, t2 = self._b1, self._b2, self._t1, self._t2
        fresh: list[OffloadKey] = []
        for key in keys:
            ghosts = b1 if key in b1 else b2 if key in b2 else None
            if ghosts is None:
                fresh.append(key)
            else:
                del ghosts[key]
                t2[key] = None
        for key in fresh:
            t1[key] = None
        self._trim_ghosts()

    def remove(self, key: OffloadKey) -> None:
        if self._t1.pop(key, 0) == 0:
            self._t2.pop(key, None)

    def remove_many(self, keys: Sequence[OffloadKey]) -> None:
        t1, t2 = self._t1, self._t2
        for key in keys:
            if t1.pop(key, 0) == 0:
                t2.pop(key, None)

    def evicted_for(self, keys: Sequence[OffloadKey]) -> None:
        self.remove_many(keys)
        self._count(others=len(keys))

    def _count(self, own: int = 0, others: int = 0) -> None:
        """Count evictions, forgetting older ones by halves (about the last
        two turnovers count)."""
        self._own += own
        self._others += others
        if self._own + self._others > 2 * self.capacity:
            self._own /= 2
            self._others /= 2

    def _ghost_weight(self) -> float:
        """How many of the tier's evictions each of ARC's own stands for.

        ARC learns its target only from its own victims' ghosts. Where the
        tier evicts most chunks in its place (believed 0s), it has few victims
        and few ghost hits, and the target stays where it started: with a
        small target every victim of its own is the front of T1, the chunks
        the next turn asks for (docs/policies.md, "ARC's target while 0s go
        first"). Each ghost hit is then a sample of one in `weight` evictions,
        and moves the target as much. 1 where ARC evicts everything itself, so
        a tier without 0s keeps textbook ARC."""
        own = self._own + 1.0
        return (own + self._others) / own

    def touch(
        self, keys: Sequence[OffloadKey], new: Set[OffloadKey] = frozenset()
    ) -> None:
        t1, t2 = self._t1, self._t2
        for key in reversed(keys):
            if key in t1:
                if key in new:
                    t1.move_to_end(key)
                else:
                    del t1[key]
                    t2[key] = None
            elif key in t2:
                t2.move_to_end(key)

    def evict(
        self, n: int, incoming: Sequence[OffloadKey], evictable: Evictable
    ) -> list[OffloadKey] | None:
        # Adapt the target to the incoming keys' ghost hits first, as textbook ARC
        # does before REPLACE; committed only if the eviction succeeds.
        p = self._p
        b1, b2 = len(self._b1), len(self._b2)
        last_in_b2 = False
        weight = self._ghost_weight()
        # Textbook steps, delta = max(1, |B2| // |B1|), with the ghost lists
        # shrinking as each key leaves them. Integer division reproduces the
        # reference ARC of traces/README.md to 0.001 (real division: 0.143
        # instead of 0.150 at 5,859 chunks).
        for key in reversed(incoming):  # the order a tail-first replay sees them
            if key in self._b1:
                p = min(float(self.capacity), p + weight * max(b2 // max(b1, 1), 1))
                b1 -= 1
                last_in_b2 = False
            elif key in self._b2:
                p = _after_b2_hit(p, b1, b2, weight)
                b2 -= 1
                last_in_b2 = True
        if n <= 0:
            self._p = p
            return []
        t1_iter = evictable_in(self._t1, evictable)
        t2_iter = evictable_in(self._t2, evictable)
        from_t1: list[OffloadKey] = []
        from_t2: list[OffloadKey] = []
        t1_size = len(self._t1)
        for _ in range(n):
            prefer_t1 = t1_size > 0 and (
                t1_size > p or (last_in_b2 and t1_size == int(p))
            )
            first, second = (t1_iter, t2_iter) if prefer_t1 else (t2_iter, t1_iter)
            try:
                victim = next(first, None)
            except StopList:
                if not prefer_t1 and not from_t2:  # T2 gave nothing before it
                    self._t2_in_use()
                raise
            took_t1 = prefer_t1
            if victim is None:
                victim = next(second, None)
                took_t1 = not prefer_t1
            if victim is None:
                return None
            if took_t1:
                from_t1.append(victim)
                t1_size -= 1
            else:
                from_t2.append(victim)
        self._p = p
        self._count(own=n)
        for key in from_t1:
            del self._t1[key]
            self._b1[key] = None
        for key in from_t2:
            del self._t2[key]
            self._b2[key] = None
        self._trim_ghosts()
        return from_t1 + from_t2

    def _t2_in_use(self) -> None:
        """The target preferred T2, and T2's first choice was the storing
        request's own chunk (`StopList`): the store is refused, and the target
        moves as for a ghost hit in B2, as if that chunk had left and come
        straight back.

        Without this a stop in T2 could recur at every store: once T2 holds
        little but a prefix every request loads (a system prompt), its front is
        each storing request's own chunk, and with no eviction the target would
        never move again, so no store would ever be taken. (A stop in T1 ends
        with the request's touch, which moves its chunks out of T1's front; a
        stop after T2 gave victims found T2 holding chunks it could give.) The
        target moves from its value before this eviction: the ghost hits of the
        refused store's own chunks are not counted, as for any eviction that
        does not happen (docs/policies.md, "A stop that never ends")."""
        self._p = _after_b2_hit(self._p, len(self._b1), len(self._b2))

    def _trim_ghosts(self) -> None:
        # Keep |T1| + |B1| <= c and |T1| + |T2| + |B1| + |B2| <= 2c.
        c = self.capacity
        while self._b1 and len(self._t1) + len(self._b1) > c:
            self._b1.popitem(last=False)
        while self._b2 and len(self) + len(self._b1) + len(self._b2) > 2 * c:
            self._b2.popitem(last=False)

    def clear(self) -> None:
        for part in (self._t1, self._t2, self._b1, self._b2):
            part.clear()
        self._p = 0.0
        self._own = self._others = 0.0

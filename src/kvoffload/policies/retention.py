"""Retention hints: chunks an application says will be asked for again stay longer,
under any eviction policy.

A request's `kv_retention_s` says that a request sharing its prompt will come
within that many seconds (0: none will). `RetentionPolicy` wraps any
`EvictionPolicy` and changes only the order in which `evict` offers chunks:

1. chunks hinted 0, the oldest hint first, once the 0 is believed: a tier
   learns how often, and how late, its application's 0s are proven wrong, and
   until a 0 has outlived the age at which such 0s were asked for again more
   often than the policy's own victims, it is in class 2 (`ZeroTrust`);
2. chunks under no hint, in the wrapped policy's order;
3. chunks under an unexpired hint, the longest hint first, and among hints of
   one length the soonest to expire.

An expired hint is no hint. A tier holds at most `max_hinted_share` of its
capacity under hints: past that, hints stop counting in the order of class 3
(their chunks stay, in class 2), so neither one tenant nor an application that
hints everything can pin the cache, and a client claiming a day gains nothing
over one claiming a minute. Recency, admission and whatever the wrapped
policy learns are its own: it sees every insert, touch and removal as before.
With no hint live, `evict` is the wrapped policy's, call for call.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass
from itertools import compress, count, filterfalse, takewhile

from kvoffload.config import finite_seconds, shown
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import (
    Evictable,
    EvictionPolicy,
    Refusing,
    first_evictable,
)
from kvoffload.policies.zero_trust import ZeroTrust

Clock = Callable[[], float]

DEFAULT_MAX_HINTED_SHARE = 0.35
"""About a third of each tier: an application that hints everything still
leaves two thirds to the policy. A compromise measured on the bundled trace
(docs/policies.md, "Retention hints"): exact hints gain with more room, hints of
one length for every open session with less, and `all:S` stays near the
policy's own figure only with a bound. Chunks hinted 0 go first whatever it."""

_Claim = tuple[float, int, tuple[OffloadKey, ...]]
"""(deadline, sequence, keys): one request's hint on a run of chunks, in the
order hints expire."""
_Ranked = tuple[float, int, float, tuple[OffloadKey, ...]]
"""(-seconds, sequence, deadline, keys): the same, in the order hints stop
counting past the bound: the longest first, then the oldest."""


def check_max_hinted_share(value: object, where: str = "max_hinted_share") -> float:
    """`value` as a share of a tier in [0, 1]; a `ValueError` naming `where`."""
    share = finite_seconds(value)  # a finite int or float, never a bool
    if share is None or not 0 <= share <= 1:
        raise ValueError(
            f"{where}: {shown(value)} is not a number in [0, 1] (the share of "
            "each tier that retention hints may hold; 0 turns positive hints off)"
        )
    return share


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


class RetentionPolicy(EvictionPolicy):
    """An `EvictionPolicy` that honours retention hints over a wrapped one.

    `retain(keys, seconds)` puts resident chunks under a request's hint:
    `seconds > 0` holds them until `now + seconds` (a later deadline from another
    request extends it, an earlier one does not shorten it); `0` marks chunks
    under no hint as the first to go, while an unexpired hint of another request
    stands. A load of a chunk hinted 0 (`note_hit`) ends that hint: it was
    wrong, which `ZeroTrust` learns from. `evict` keeps the contract of
    `EvictionPolicy` (exactly `n` victims or `None`, `StopEviction` from
    `evictable` propagates having changed nothing) and asks `evictable` in the
    order of the module docstring.
    """

    def __init__(
        self,
        inner: EvictionPolicy,
        clock: Clock,
        max_hinted_share: float = DEFAULT_MAX_HINTED_SHARE,
    ) -> None:
        super().__init__(inner.capacity)
        self.inner = inner
        self._clock = clock
        self._limit = math.floor(
            check_max_hinted_share(max_hinted_share) * inner.capacity
        )
        self._deadline: dict[OffloadKey, float] = {}
        """Chunks under an unexpired hint within the bound, with its deadline."""
        # An OrderedDict, not a dict: chunks leave from the front, and a dict's
        # iteration walks every slot its deletions left, from the start.
        self._zero: OrderedDict[OffloadKey, int] = OrderedDict()
        """Chunks hinted 0, oldest first (a positive hint takes a chunk out),
        with `ZeroTrust.clock` when hinted: believed once it is `ripe`."""
        self._trust = ZeroTrust(inner.capacity)
        self._gone = self._trust.gone
        """The chunks evicted under a 0 (`ZeroTrust`): empty unless 0s are sent."""
        self._used: set[OffloadKey] = set()
        """Chunks loaded under their present hint (a later hint on a chunk is a
        new one, not yet honoured). Always within `_deadline`, which never
        shares a key with `_zero`: the set operations below rely on both."""
        self._claims: list[_Claim] = []
        self._ranks: list[_Ranked] = []
        self._seq = 0
        self._hinting = False
        """Whether any request has sent a hint: until then nothing is learned
        for them, so a deployment that sends none pays nothing."""
        self._children: OrderedDict[OffloadKey, OffloadKey] = OrderedDict()
        """A chunk's first child: the first chunk a request stored after it."""
        self._shared: OrderedDict[OffloadKey, None] = OrderedDict()
        """Chunks seen with two different children (bounded, oldest out)."""
        self._latest = -math.inf
        self._at_latest: set[OffloadKey] = set()
        """The chunks whose deadline is `_latest`, the latest of all: a
        request's later claims at the same instant skip them in C."""
        self.counts = RetentionCounts()

    # -- the wrapped policy ------------------------------------------------------

    def __len__(self) -> int:
        return len(self.inner)

    def __contains__(self, key: object) -> bool:
        return key in self.inner

    def insert(self, key: OffloadKey) -> None:
        self.inner.insert(key)
        if self._gone:
            self._trust.stored((key,))

    def insert_many(self, keys: Sequence[OffloadKey]) -> None:
        self.inner.insert_many(keys)
        if self._gone:
            self._trust.stored(keys)

    def remove(self, key: OffloadKey) -> None:
        self.inner.remove(key)
        if self._deadline or self._zero:
            self._forget((key,))

    def touch(
        self, keys: Sequence[OffloadKey], new: Set[OffloadKey] = frozenset()
    ) -> None:
        self.inner.touch(keys, new)
        if self._hinting and new and keys and keys[0] not in new:
            self._note_branch(keys, new)

    def _note_branch(self, keys: Sequence[OffloadKey], new: Set[OffloadKey]) -> None:
        """A request that found a prefix and stored what follows it branches
        there: the chunk before its first own one has that one as a child. A
        chunk with two different children ends a prefix requests share (a
        system prompt, say), which a 0 does not speak for (`retain`)."""
        # The first stored key, found in C (keys[0] is not one).
        i = next(compress(count(), map(new.__contains__, keys)), 0)
        if not i:
            return
        parent, child = keys[i - 1], keys[i]
        first = self._children.get(parent)
        if first is None:
            self._children[parent] = child
            if len(self._children) > self.inner.capacity:
                self._children.popitem(last=False)
        elif first != child and parent not in self._shared:
            self._shared[parent] = None
            if len(self._shared) > self.inner.capacity:
                self._shared.popitem(last=False)

    def admit(self, keys: Sequence[OffloadKey]) -> Sequence[OffloadKey]:
        return self.inner.admit(keys)

    def clear(self) -> None:
        """Forget every chunk and hint (the counters stay: they only grow)."""
        self.inner.clear()
        self._deadline.clear()
        self._zero.clear()
        self._trust.clear()
        self._used.clear()
        self._claims.clear()
        self._ranks.clear()
        self._children.clear()
        self._shared.clear()
        self._latest = -math.inf
        self._at_latest.clear()

    # -- hints -------------------------------------------------------------------

    @property
    def active(self) -> bool:
        """Whether any chunk is under a hint (positive or 0)."""
        return bool(self._deadline or self._zero)

    def retain(self, keys: Sequence[OffloadKey], seconds: float) -> None:
        """Put resident `keys` (prefix order) under a hint of `seconds` from now."""
        if not keys:
            return
        self._hinting = True
        deadline = self._deadline
        if seconds <= 0:
            # The prefix other requests share is not this one's to drop.
            self._retain_zero(self._past_shared(keys))
            return
        if self._limit == 0:
            return
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
                return
            claimed = list(filterfalse(at_latest.__contains__, keys))
            at_latest.update(claimed)
        else:
            claimed = [k for k in keys if deadline.get(k, -math.inf) < due]
            if not claimed:
                return
        deadline.update(dict.fromkeys(claimed, due))
        if self._used:
            self._used.difference_update(claimed)
        zero = self._zero
        if zero:
            for key in zero.keys() & claimed:
                del zero[key]
        run = tuple(claimed)
        heapq.heappush(self._claims, (due, self._seq, run))
        heapq.heappush(self._ranks, (-seconds, self._seq, due, run))
        self._seq += 1
        if len(deadline) > self._limit:
            self._drop_past_bound()
        if len(self._claims) + len(self._ranks) > 8 * len(deadline) + 4096:
            self._compact()

    def covers(self, keys: Sequence[OffloadKey], seconds: float) -> bool:
        """Whether `retain(keys, seconds)` now would change nothing, known in C
        without reading each key: every one of `keys` is under a positive hint
        ending when this one would, the latest of all (a request's touch after
        its store at one instant). `keys` need not be resident."""
        return (
            seconds > 0
            and self._limit > 0
            and self._clock() + seconds == self._latest
            and self._at_latest.issuperset(keys)
        )

    def _past_shared(self, keys: Sequence[OffloadKey]) -> Sequence[OffloadKey]:
        """`keys` after the last one that ends a prefix requests share (all of
        them if none does). Such chunks are few and near the front (block 0 on
        the bundled trace): each is looked for from the front, not the whole
        prompt walked from its end. (A request's keys are distinct: each
        chains its prefix's hash.)"""
        shared = self._shared
        if not shared:
            return keys
        found = shared.keys() & keys
        if not found:
            return keys
        return keys[max(map(keys.index, found)) + 1 :]

    def _retain_zero(self, keys: Sequence[OffloadKey]) -> None:
        """Put `keys` under no positive hint in class 1 (believed once ripe,
        `ZeroTrust`), dated by the eviction clock; a chunk hinted 0 already keeps
        its date."""
        deadline, zero = self._deadline, self._zero
        trust = self._trust
        now = trust.clock
        given = 0
        for key in keys:  # (`zero` first: a request's later calls find most there)
            if key not in zero and key not in deadline:
                zero[key] = now
                given += 1
        if given:
            trust.given(given)

    def note_hit(self, keys: Sequence[OffloadKey]) -> None:
        """`keys` were loaded for a request: hints honoured, and 0s proven wrong."""
        if not self._deadline and not self._zero:
            return
        self._expire(self._clock())
        deadline, zero, used = self._deadline, self._zero, self._used
        if deadline:  # set operations: at C speed, whatever the prefix length
            # (`difference`, not `-=`: that walks all of `used`.)
            fresh = (deadline.keys() & keys).difference(used)
            if fresh:
                used |= fresh
                self.counts.honoured += len(fresh)
        if zero:
            wrong = zero.keys() & keys
            if wrong:
                now = self._trust.clock
                self._trust.proven([now - zero.pop(key) for key in wrong])

    def hint_of(self, key: OffloadKey) -> float | None:
        """The hint `key` is under now, as a request gives one: seconds left
        (> 0), 0, or `None` for none."""
        due = self._deadline.get(key)
        if due is not None:
            left = due - self._clock()
            return left if left > 0 else None
        return 0.0 if key in self._zero else None

    def zero_believed(self, key: OffloadKey) -> bool:
        """Whether `key` is hinted 0 and the 0 is believed now: it goes first
        (a 0 not yet believed ranks as no hint; `ZeroTrust`)."""
        stamp = self._zero.get(key)
        return stamp is not None and stamp <= self._trust.ripe()

    @property
    def wrong_zero_rate(self) -> float:
        """The share of chunks hinted 0 that were asked for again, as measured
        lately (`ZeroTrust`)."""
        return self._trust.rate

    def num_hinted(self) -> int:
        """Chunks under an unexpired hint (what the bound caps)."""
        if self._claims:
            self._expire(self._clock())
        return len(self._deadline)

    def _expire(self, now: float) -> None:
        claims = self._claims
        if not claims or claims[0][0] > now:
            return
        deadline, used = self._deadline, self._used
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

    def _drop_past_bound(self) -> None:
        """Past the bound, hints stop counting: the longest first (a chunk held
        for a long hint costs more room per hit than one for a short hint, and a
        client that claims a day gains nothing by it), among hints of one length
        the oldest (the soonest to expire); a run's tail before its head (a hit
        is a leading run)."""
        deadline, ranks = self._deadline, self._ranks
        while len(deadline) > self._limit and ranks:
            length, seq, due, keys = heapq.heappop(ranks)
            # The whole run is read, not only its tail: what goes back must be
            # its live chunks only, or one that left and later took the same
            # deadline again would count in this run, ahead of its own.
            live = [k for k in keys if deadline.get(k) == due]
            excess = len(deadline) - self._limit
            drop = live[-excess:] if excess < len(live) else live
            # (Chunks under a deadline are not hinted 0: `_forget` without it.)
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
        deadline = self._deadline

        def live(keys: tuple[OffloadKey, ...], due: float) -> tuple[OffloadKey, ...]:
            return tuple(k for k in keys if deadline.get(k) == due)

        claims = [(d, q, live(k, d)) for d, q, k in self._claims]
        self._claims = [c for c in claims if c[2]]
        heapq.heapify(self._claims)
        ranks = [(n, q, d, live(k, d)) for n, q, d, k in self._ranks]
        self._ranks = [r for r in ranks if r[3]]
        heapq.heapify(self._ranks)

    def _forget(self, keys: Sequence[OffloadKey]) -> None:
        deadline, zero, used = self._deadline, self._zero, self._used
        at_latest = self._at_latest
        for key in keys:
            deadline.pop(key, None)
            zero.pop(key, None)
            used.discard(key)
            at_latest.discard(key)

    # -- eviction ----------------------------------------------------------------

    def evict(
        self, n: int, incoming: Sequence[OffloadKey], evictable: Evictable
    ) -> list[OffloadKey] | None:
        if n <= 0 or (not self._deadline and not self._zero):
            return self.inner.evict(n, incoming, evictable)
        self._expire(self._clock())
        hinted, zero = self._deadline, self._zero
        ripe = self._trust.ripe() if zero else 0
        taken = self._take_zero(n, ripe, evictable) if zero else []
        rest = n - len(taken)
        accepted = 0

        def accept(key: OffloadKey) -> bool:
            nonlocal accepted
            stamp = zero.get(key)  # a 0 not yet believed ranks as no hint
            if (stamp is not None and stamp <= ripe) or not evictable(key):
                return False
            accepted += 1
            return True

        # Chunks under a hint outlive the unhinted ones around them, so they
        # gather at the front of the wrapped policy's order: `Refusing` lets
        # its scan skip them in C, not with a call each at every eviction. (A
        # 0 is refused only once believed: `accept` asks.)
        unhinted = Refusing([hinted] if hinted else [], accept)
        got = self.inner.evict(rest, incoming, unhinted)
        forget = got is None
        if got is None:
            got = self._evict_hinted(rest, rest - accepted, incoming, evictable, ripe)
            if got is None:
                return None
        # (Else `got` holds no chunk under a positive hint: nothing to forget.)
        if zero:
            self._zero_evicted(taken, got)
        if forget:
            self._forget(got)
        return taken + got

    def _zero_evicted(self, taken: list[OffloadKey], got: list[OffloadKey]) -> None:
        """`taken` (class 1) and `got` leave. `ZeroTrust` remembers them: a
        store of one again says what a 0, or the policy's victim, was worth."""
        zero = self._zero
        remove = self.inner.remove
        for key in taken:
            remove(key)
        # (`taken` are hinted 0 only: not under a deadline.)
        stamps = list(map(zero.pop, taken))
        victims = list(filterfalse(zero.__contains__, got))
        if len(victims) < len(got):  # 0s not yet believed, evicted as unhinted
            unripe = [key for key in got if key in zero]
            taken = taken + unripe
            stamps += map(zero.pop, unripe)
        self._trust.evicted(taken, stamps, victims)

    def _pick_hinted(
        self, need: int, evictable: Evictable, picked: set[OffloadKey]
    ) -> None:
        """Add to `picked` up to `need` evictable hinted chunks, the first to stop
        counting first (popped from the claims and pushed back: `evictable` may
        raise `StopEviction`)."""
        hinted, ranks = self._deadline, self._ranks
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

    def _take_zero(self, n: int, ripe: int, evictable: Evictable) -> list[OffloadKey]:
        """Up to `n` evictable chunks whose 0 is believed (dated at or before
        `ripe`), oldest first (nothing removed)."""
        zero = self._zero
        # Dates only grow: the believed ones lead, and the scan runs in C.
        believed = compress(zero, takewhile(bool, map(ripe.__ge__, zero.values())))
        return first_evictable(believed, n, evictable)

    def _evict_hinted(
        self,
        n: int,
        need: int,
        incoming: Sequence[OffloadKey],
        evictable: Evictable,
        ripe: int,
    ) -> list[OffloadKey] | None:
        """Every evictable unhinted chunk (`n - need` of them, as far as the
        wrapped policy, which asked about each before giving up, tells), and the
        `need` evictable hinted ones first in the order of class 3. A 0 dated
        after `ripe` is not yet believed: it ranks as no hint."""
        hinted, zero = self._deadline, self._zero
        picked: set[OffloadKey] = set()
        if need > 0:
            self._pick_hinted(need, evictable, picked)
            if len(picked) < need:
                return None

        def believed(key: OffloadKey) -> bool:
            stamp = zero.get(key)
            return stamp is not None and stamp <= ripe

        def allowed(key: OffloadKey) -> bool:
            if believed(key) or (key in hinted and key not in picked):
                return False
            return evictable(key)

        got = self.inner.evict(n, incoming, allowed)
        if got is None:
            # A policy that gave up before asking about every chunk: its own
            # order over everything but class 1 (taken already, or not evictable).
            got = self.inner.evict(
                n, incoming, lambda key: not believed(key) and evictable(key)
            )
        if got is not None:
            self.counts.dropped += sum(1 for key in got if key in hinted)
        return got

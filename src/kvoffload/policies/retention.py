"""Retention hints: chunks an application says will be asked for again stay longer,
under any eviction policy.

A request's `kv_retention_s` says that a request sharing its prompt will come
within that many seconds (0: none will). `RetentionPolicy` wraps any
`EvictionPolicy` and changes only the order in which `evict` offers chunks:

1. chunks hinted 0, the oldest hint first (a hint's chunks from the end of
   the prompt back), once the 0 is believed: a tier learns how often, and how
   late, its application's 0s are proven wrong (apart for chunks the hinting
   request stored and chunks it found), and until a 0 has outlived the age at
   which such 0s were asked for again more often than the policy's own
   victims, it is in class 2 (`ZeroTrust`);
2. chunks under no hint, in the wrapped policy's order;
3. chunks under an unexpired hint, the longest hint first, and among hints of
   one length the soonest to expire.

A chunk evicted under a 0 and stored again tells the wrapped policy of a reuse
(a touch): it left by `remove`, unseen by the policy's own memory of victims
(ARC's ghosts), and its return is the reuse that memory would have caught.

An expired hint is no hint. A tier holds at most `max_hinted_share` of its
capacity under hints, and less where they prove worth less than the room they
take from the wrapped policy (`HintWorth`): past that, hints stop counting in
the order of class 3 (their chunks stay, in class 2), so neither one tenant nor
an application that hints everything can pin the cache, and a client claiming
a day gains nothing over one claiming a minute. Recency, admission and
whatever the wrapped policy learns are its own: it sees every insert, touch
and removal as before (and the touch above). With no hint live, `evict` is
the wrapped policy's, call for call.

The positive hints are `HintClaims` (hint_claims.py), what they are worth
`HintWorth` (hint_worth.py), the 0s `ZeroHints` (zero_hints.py), what 0s are
worth `ZeroTrust` (zero_trust.py) and where shared prefixes end
`SharedPrefixes` (shared_prefixes.py); this class orders evictions over them.
Positive hints are kept per run (a request's hint on the chunks of one store
or touch), each chunk under one run at most; the 0s are one table of chunks in
the order they go.
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable, Sequence, Set
from itertools import count, filterfalse

from kvoffload.config import finite_seconds, shown
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import (
    Evictable,
    EvictionPolicy,
    Refusing,
    StopEviction,
)
from kvoffload.policies.hint_claims import Clock, HintClaims, RetentionCounts
from kvoffload.policies.hint_worth import HintWorth
from kvoffload.policies.shared_prefixes import SharedPrefixes
from kvoffload.policies.zero_hints import FOUND, OWN, Ripe, ZeroHints
from kvoffload.policies.zero_trust import ZeroTrust

__all__ = [
    "DEFAULT_MAX_HINTED_SHARE",
    "Clock",
    "RetentionCounts",
    "RetentionPolicy",
    "check_max_hinted_share",
]

DEFAULT_MAX_HINTED_SHARE = 0.35
"""About a third of each tier: an application that hints everything still
leaves two thirds to the policy. A compromise measured on the bundled trace
(docs/policies.md, "Retention hints"): exact hints gain with more room, hints of
one length for every open session with less, and `all:S` stays near the
policy's own figure only with a bound. Chunks hinted 0 go first whatever it."""


def check_max_hinted_share(value: object, where: str = "max_hinted_share") -> float:
    """`value` as a share of a tier in [0, 1]; a `ValueError` naming `where`."""
    share = finite_seconds(value)  # a finite int or float, never a bool
    if share is None or not 0 <= share <= 1:
        raise ValueError(
            f"{where}: {shown(value)} is not a number in [0, 1] (the share of "
            "each tier that retention hints may hold; 0 turns positive hints off)"
        )
    return share


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
        limit = math.floor(check_max_hinted_share(max_hinted_share) * inner.capacity)
        self._hints = HintClaims(limit, clock)
        self._worth = HintWorth(limit)
        """How much of the bound the positive hints are worth (`HintWorth`):
        it sets `HintClaims.limit`."""
        self._displaced = self._worth.victims
        """The policy's victims while hints held room (`HintWorth`): empty
        unless positive hints are sent."""
        self._lost = self._worth.lost
        """Chunks whose hint stopped counting at a lowered room (`HintWorth`)."""
        self._hints.on_drop = self._worth.dropped
        self._hinted = self._hints.owner
        """Chunks under an unexpired positive hint within the bound, with its
        run (`HintClaims`'s, read here; it never shares a key with `_zero`)."""
        self._zero = ZeroHints()
        """Chunks hinted 0, oldest first (a positive hint takes a chunk out),
        with `ZeroTrust.clock` when hinted: believed once it is `ripe`."""
        self._zero_marks = self._zero.marks
        self._trust = ZeroTrust(inner.capacity)
        self._gone = self._trust.gone
        """The chunks evicted under a 0 (`ZeroTrust`): empty unless 0s are sent."""
        self._hinting = False
        """Whether any request has sent a hint: until then nothing is learned
        for them, so a deployment that sends none pays nothing."""
        self._prefixes = SharedPrefixes(inner.capacity)
        self.counts: RetentionCounts = self._hints.counts

    # -- the wrapped policy ------------------------------------------------------

    def __len__(self) -> int:
        return len(self.inner)

    def __contains__(self, key: object) -> bool:
        return key in self.inner

    def insert(self, key: OffloadKey) -> None:
        self.insert_many((key,))

    def insert_many(self, keys: Sequence[OffloadKey]) -> None:
        self.inner.insert_many(keys)
        if self._gone:
            wrong = self._trust.stored(keys)
            if wrong:
                # Evicted under a 0 and asked for again: a reuse, which the
                # wrapped policy would have seen had it chosen these victims
                # itself (ARC's ghosts, `split`'s memory of what it let go).
                self.inner.touch(wrong)
        if (self._displaced or self._lost) and self._worth.stored(keys, self._clock()):
            self._hints.limit = self._worth.limit

    def remove(self, key: OffloadKey) -> None:
        self.inner.remove(key)
        if self._hinted or self._zero_marks:
            self._hints.forget((key,))
            self._zero.pop(key)

    def touch(
        self, keys: Sequence[OffloadKey], new: Set[OffloadKey] = frozenset()
    ) -> None:
        self.inner.touch(keys, new)
        if self._hinting and new and keys and keys[0] not in new:
            # A chunk that ends a prefix requests share is not a 0's (`retain`).
            self._prefixes.note_branch(keys, new)

    def admit(self, keys: Sequence[OffloadKey]) -> Sequence[OffloadKey]:
        return self.inner.admit(keys)

    def last_use(self, key: OffloadKey) -> int:
        return self.inner.last_use(key)

    def latest_use(self, keys: Iterable[OffloadKey]) -> int:
        return self.inner.latest_use(keys)

    @property
    def use_clock(self) -> int | None:
        return self.inner.use_clock

    def clear(self) -> None:
        """Forget every chunk and hint (the counters stay: they only grow)."""
        self.inner.clear()
        self._hints.clear()
        self._zero.clear()
        self._trust.clear()
        self._worth.clear()
        self._prefixes.clear()

    # -- hints -------------------------------------------------------------------

    @property
    def active(self) -> bool:
        """Whether any chunk is under a hint (positive or 0)."""
        return bool(self._hinted or self._zero_marks)

    def retain(
        self,
        keys: Sequence[OffloadKey],
        seconds: float,
        stored: Container[OffloadKey] | None = None,
    ) -> None:
        """Put resident `keys` (prefix order) under a hint of `seconds` from now.
        `stored`: those of `keys` the hinting request stored itself, where the
        caller knows (`None`: all of them); a 0 on a chunk it found instead
        is judged apart (`ZeroTrust`)."""
        if not keys:
            return
        self._hinting = True
        if seconds <= 0:
            # The prefix other requests share is not this one's to drop. Past
            # it, the chunks are this request's conversation, and a positive
            # hint on them promised the request that has now come: where the
            # tier believes 0s on found chunks at once (on any chunk, for a
            # caller that cannot tell), the 0 is the latest word and ends that
            # hint; where it does not (they are often wrong), the hint stands.
            # In class 1 (believed once ripe, `ZeroTrust`), dated by the
            # eviction clock; a chunk hinted 0 already keeps its date.
            trust = self._trust
            mine = self._prefixes.past_shared(keys)
            held: Container[OffloadKey] = self._hinted
            if held and trust.believed_at_once(OWN if stored is None else FOUND):
                self._hints.forget(self._hinted.keys() & mine)
                held = ()
            own, found = self._zero.add(mine, trust.clock, held, stored)
            if own:
                trust.given(own, OWN)
            if found:
                trust.given(found, FOUND)
            return
        claimed = self._hints.claim(keys, seconds)
        if self._zero_marks and claimed:
            self._zero.pop_many(claimed)

    def covers(self, keys: Sequence[OffloadKey], seconds: float) -> bool:
        """Whether `retain(keys, seconds)` now would change nothing, known in C
        without reading each key (`HintClaims.covers`). `keys` need not be
        resident."""
        return seconds > 0 and self._hints.covers(keys, seconds)

    def note_hit(self, keys: Sequence[OffloadKey]) -> None:
        """`keys` were loaded for a request: hints honoured, and 0s proven wrong."""
        if self._lost:
            self._worth.survived(keys)
        if not self._hinted and not self._zero_marks:
            return
        self._hints.expire(self._clock())
        if self._hinted:
            self._hints.honour(keys)
            worth = self._worth
            if worth.rescued and worth.loaded(keys, self._hinted):
                self._hints.limit = worth.limit
        if self._zero_marks:
            wrong = self._zero.pop_many(keys)
            if wrong:
                self._trust.proven(wrong)

    def hint_of(self, key: OffloadKey) -> float | None:
        """The hint `key` is under now, as a request gives one: seconds left
        (> 0), 0, or `None` for none."""
        run = self._hinted.get(key)
        if run is not None:
            left = run.due - self._clock()
            return left if left > 0 else None
        return 0.0 if key in self._zero_marks else None

    def zero_believed(self, key: OffloadKey) -> bool:
        """Whether `key` is hinted 0 and the 0 is believed now: it goes first
        (a 0 not yet believed ranks as no hint; `ZeroTrust`)."""
        return self._zero.is_believed(key, self._trust.ripe())

    @property
    def wrong_zero_rate(self) -> float:
        """The share of chunks hinted 0 that were asked for again, as measured
        lately (`ZeroTrust`)."""
        return self._trust.rate

    def num_hinted(self) -> int:
        """Chunks under an unexpired hint (what the bound caps)."""
        return self._hints.num_hinted()

    @property
    def hint_room(self) -> int:
        """How many chunks positive hints may hold now: the bound, less what
        they proved not to be worth (`HintWorth`)."""
        return self._hints.limit

    # -- eviction ----------------------------------------------------------------

    def evict(
        self, n: int, incoming: Sequence[OffloadKey], evictable: Evictable
    ) -> list[OffloadKey] | None:
        if n <= 0 or (not self._hinted and not self._zero_marks):
            return self.inner.evict(n, incoming, evictable)
        self._hints.expire(self._clock())
        hinted, zero = self._hinted, self._zero_marks
        ripe = self._trust.ripe() if zero else (0, 0)
        taken = self._zero.first_evictable(n, ripe, evictable) if zero else []
        # Where 0s would fill every eviction, the policy still chooses a few
        # victims (`ZeroTrust.starved`): `v` is read from them.
        spare = taken.pop() if len(taken) == n and self._trust.starved() else None
        rest = n - len(taken)
        # Chunks under a hint outlive the unhinted ones around them, so they
        # gather at the front of the wrapped policy's order: `Refusing` lets
        # its scan skip them in C, not with a call each at every eviction, and
        # counts the chunks it accepts.
        # The hinted chunks it reads past are those the hints keep from it
        # (`HintWorth`).
        tally = count()
        passed: set[OffloadKey] = set()
        watched = (hinted, passed) if hinted else None
        if self._zero.all_believed(ripe):
            unhinted = Refusing([zero] if zero else [], evictable, tally, watched)
        else:
            # A 0 is refused only once believed (one not yet ranks as no hint).
            def accept(key: OffloadKey) -> bool:
                mark = zero.get(key)
                return (mark is None or mark >> 1 > ripe[mark & 1]) and evictable(key)

            unhinted = Refusing([], accept, tally, watched)
        try:
            got = self.inner.evict(rest, incoming, unhinted)
        except StopEviction:
            if spare is None:
                raise
            got = None
            passed.clear()  # a scan that stopped gave nothing up
        if passed:
            self._worth.passed(passed, got or (), hinted.keys())
        if got is None and spare is not None:  # the policy had none to give
            taken.append(spare)
            got = []
        forget = got is None
        if got is None:
            accepted = next(tally)
            got = self._evict_hinted(rest, rest - accepted, incoming, evictable, ripe)
            if got is None:
                return None
        # (Else `got` holds no chunk under a positive hint: nothing to forget.)
        if zero:
            self._zero_evicted(taken, got)
        if forget:
            self._hints.forget(got)
            self._zero.pop_many(got)
        return taken + got

    def _zero_evicted(self, taken: list[OffloadKey], got: list[OffloadKey]) -> None:
        """`taken` (class 1) and `got` leave. `ZeroTrust` remembers them: a
        store of one again says what a 0, or the policy's victim, was worth."""
        zero = self._zero
        # (`taken` are hinted 0 only: not under a deadline.)
        # Where 0s are often wrong, the policy learns that the tier evicted in
        # its place (ARC weighs its own victims' ghost hits by it); where they
        # are seldom wrong, the 0s chose well and there is nothing to correct.
        inner = self.inner
        leave = inner.evicted_for if self._trust.often_wrong() else inner.remove_many
        marks = zero.take(taken, leave)
        victims = list(filterfalse(self._zero_marks.__contains__, got))
        if len(victims) < len(got):  # 0s not yet believed, evicted as unhinted
            unripe = [key for key in got if key in self._zero_marks]
            taken = taken + unripe
            marks += zero.take(unripe)
        self._trust.evicted(taken, marks, victims)

    def _evict_hinted(
        self,
        n: int,
        need: int,
        incoming: Sequence[OffloadKey],
        evictable: Evictable,
        ripe: Ripe,
    ) -> list[OffloadKey] | None:
        """Every evictable unhinted chunk (`n - need` of them, as far as the
        wrapped policy, which asked about each before giving up, tells), and the
        `need` evictable hinted ones first in the order of class 3. A 0 dated
        after `ripe` is not yet believed: it ranks as no hint."""
        hinted, is_believed = self._hinted, self._zero.is_believed
        picked: set[OffloadKey] = set()
        if need > 0:
            self._hints.pick(need, evictable, picked)
            if len(picked) < need:
                return None

        def believed(key: OffloadKey) -> bool:
            return is_believed(key, ripe)

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

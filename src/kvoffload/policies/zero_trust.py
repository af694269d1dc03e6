"""How far a tier believes the 0s an application sends, from how often, and
how late, they are proven wrong.

A retention hint of 0 says that no request will share the prompt again, so
`RetentionPolicy` sends its chunks first. A wrong 0 (the conversation goes on)
costs the next turn its prefix; where the tier would have kept nearly
everything, that is the only effect hints have left. So a tier measures its
application's 0s against its own evictions:

- a chunk hinted 0 and later asked for again (a load of it while still hinted
  0, or a store of it again after it was evicted under its 0) proves its 0
  wrong, at an *age*: the chunks the tier evicted in between (the tier's own
  clock, whatever its traffic). Of the chunks hinted 0 that reached age `a`
  unproven, the share proven wrong later is `r(a)`; it falls with age (a wrong
  0 is proven by the conversation's next turn, or never);
- of the chunks the wrapped policy evicted under no hint, the share stored
  again later is `v`: what the policy's own victims are worth.

Both count what is asked for within about a turnover (the evicted chunks a tier
remembers are its capacity's worth). A chunk hinted 0 is believed (goes first)
from the first age at which such 0s have been asked for again no more often than
the policy's victims, `r(a) <= v`; until then it ranks as unhinted, in the
wrapped policy's order. Where the tier is short of room its victims are often
asked for again and 0s that are right four times in five go first at once;
where it holds nearly everything its victims are seldom wanted and an
application's wrong 0s would be the tier's costliest evictions, so they wait.
An application whose 0s are never proven wrong keeps the order of old.

`v` is read only from victims the policy chose, and once 0s are believed they
take nearly every eviction, so two rules keep it a reading of now (stop 48): its
counts are halved with each capacity's worth of the tier's evictions, 0s
included (counted in victims, a reading from when the policy chose differently
would stand for it indefinitely), and where the policy chose less than one in
20 of them lately, an eviction that believed 0s would fill leaves one chunk to
the policy (`starved`; `RetentionPolicy` gives the 0 back if the policy has
none to give). A believed 0 then goes before the policy's choice 19 times in
20. (Not where 0s are proven wrong less than one time in 20: they go first
whatever `v` reads above that.)

`r` is learned apart for two kinds of 0 (`zero_hints.OWN`, `FOUND`): on a chunk
the hinting request stored itself, and on one it found in the tier. A found
chunk has been asked for before; where an application's 0s are sometimes wrong,
those are the ones proven wrong (a conversation's history is found at every
turn), while its right 0s are mostly on chunks no request found (a one-shot
document, a last turn's own text). One rate for both lets the many right 0s
vouch for the wrong ones (docs/policies.md, "Wrong 0s, by kind").

Memory: the evicted chunks remembered, at most the tier's capacity, and one
counter per kind and power of two of age. Each operation costs a few dict
operations per chunk evicted or hinted 0 (only while a chunk hinted 0 is
resident); the age from which 0s of a kind are believed is recomputed (a few
dozen steps) when a count has changed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from kvoffload.keys import OffloadKey
from kvoffload.policies.zero_hints import Ripe

WINDOW_TURNOVERS = 2
"""The counts cover about this many tiers' worth of chunks hinted 0 and of
victims (older counts are halved away): recent enough to follow an
application that changes, long enough that most have met their next turn."""
EXPLORE_SHARE = 0.05
"""The least share of a tier's evictions, while chunks hinted 0 are resident,
that the wrapped policy chooses itself (`RetentionPolicy` leaves it one chunk
of an eviction that believed 0s would fill): `v` is read from its victims, and
a policy that chooses none is never read again."""
_UNHINTED = -1
"""What `ZeroTrust.gone` holds for a victim under no hint (a 0 holds its
mark, `zero_hints.mark_of`, >= 0)."""


class ZeroTrust:
    """What a tier learns of an application's 0s (see the module)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self.clock = 0
        """Chunks evicted while a chunk hinted 0 was resident: the age of a 0 is
        this clock's advance since it was given."""
        self.gone: OrderedDict[OffloadKey, int] = OrderedDict()
        """Chunks evicted while a chunk hinted 0 was resident, oldest first, at
        most `capacity` of them: with the mark of their 0
        (`zero_hints.mark_of`), or `_UNHINTED`. A store of one of them is a
        chunk asked for again."""
        self._window = WINDOW_TURNOVERS * self.capacity
        self._given = [0.0, 0.0]
        """Chunks hinted 0 lately, per kind."""
        self._proofs: tuple[list[float], list[float]] = ([], [])
        """Chunks proven wrong, by kind and age: entry `i` of a kind holds ages
        of `i` bits."""
        self._victims = 0.0
        self._victims_back = 0.0
        self._evictions = 0.0
        """Chunks evicted lately (0s and victims alike); `_victims` of them
        were the policy's."""
        self._aged_at = 0
        """The clock when the counts of victims were last halved."""
        self._often_wrong: bool | None = False
        """`often_wrong`, None once a count of 0s changed."""
        self._wait: list[int | None] = [0, 0]
        """The age from which a 0 of each kind is believed (None: to be
        recomputed)."""

    @property
    def rate(self) -> float:
        """The share of chunks hinted 0 lately that were proven wrong."""
        given = sum(self._given)
        wrong = sum(map(sum, self._proofs))
        return min(1.0, wrong / given) if given else 0.0

    @property
    def victim_rate(self) -> float:
        """The share of the policy's unhinted victims lately stored again."""
        if not self._victims:
            return 0.0
        # (Victims counted before a halving may come back after it.)
        return min(1.0, self._victims_back / self._victims)

    def ripe(self) -> Ripe:
        """The clock reading at or before which a 0 of each kind is believed."""
        wait = self._wait
        own, found = wait
        if own is None:
            own = wait[0] = self._first_believed_age(0)
        if found is None:
            found = wait[1] = self._first_believed_age(1)
        return self.clock - own, self.clock - found

    def starved(self) -> bool:
        """Whether the policy chose a whole victim less than `EXPLORE_SHARE`
        of the tier's evictions lately (so the first after 20 evictions),
        while more than that share of 0s were proven wrong: 0s wrong less
        often go first whatever the policy's victims are worth (`r <= v` from
        age 0 for any `v` above it), and reading `v` would only cost them."""
        return (
            self._victims + 1.0 <= EXPLORE_SHARE * self._evictions
            and self.often_wrong()
        )

    def often_wrong(self) -> bool:
        """Whether more than `EXPLORE_SHARE` of the 0s lately were proven
        wrong (read at each eviction: kept until a count of 0s changes)."""
        often = self._often_wrong
        if often is None:
            often = self._often_wrong = self.rate > EXPLORE_SHARE
        return often

    def believed_at_once(self, kind: int) -> bool:
        """Whether a 0 of `kind` given now is believed at once."""
        return self.ripe()[kind] >= self.clock

    def _first_believed_age(self, kind: int) -> int:
        """The least age `a` with `r(a) <= v` for 0s of `kind` (ages in buckets
        of powers of two: `r` is read at their edges)."""
        proofs, given = self._proofs[kind], self._given[kind]
        worth = self.victim_rate
        later = sum(proofs)
        before = 0.0
        for bits, count in enumerate(proofs):
            left = given - before  # hinted 0 and not proven wrong before this age
            if left <= 0 or later <= worth * left:
                return (1 << bits) >> 1  # the least age of `bits` bits: 0, 1, 2, 4...
            before += count
            later -= count
        return (1 << len(proofs)) >> 1  # past every proof: r is 0

    def given(self, n: int, kind: int) -> None:
        """`n` chunks of `kind` came under a 0."""
        given = self._given
        given[kind] += n
        if given[kind] > self._window:
            given[kind] /= 2
            proofs = self._proofs[kind]
            proofs[:] = [count / 2 for count in proofs]
        self._wait[kind] = None
        self._often_wrong = None

    def proven(self, marks: Iterable[int]) -> None:
        """Chunks hinted 0 were asked for again (their 0s' marks,
        `zero_hints.mark_of`)."""
        clock, wait = self.clock, self._wait
        for mark in marks:
            kind = mark & 1
            proofs = self._proofs[kind]
            bits = max(0, clock - (mark >> 1)).bit_length()
            if bits >= len(proofs):
                proofs.extend([0.0] * (bits + 1 - len(proofs)))
            proofs[bits] += 1
            wait[kind] = None
        self._often_wrong = None

    def evicted(
        self,
        zeros: Sequence[OffloadKey],
        marks: Sequence[int],
        unhinted: Sequence[OffloadKey],
    ) -> None:
        """Chunks hinted 0 (`marks`: their 0s', `zero_hints.mark_of`) and the
        policy's unhinted victims (distinct keys, none remembered) left:
        remember them (bounded) and advance the clock."""
        gone = self.gone
        # Loops, not `update`: an OrderedDict takes a batch through the generic
        # mapping protocol, several times slower.
        for key, mark in zip(zeros, marks, strict=True):
            gone[key] = mark
        for key in unhinted:
            gone[key] = _UNHINTED
        left = len(zeros) + len(unhinted)
        self.clock += left
        popitem = gone.popitem
        for _ in range(len(gone) - self.capacity):
            popitem(False)  # the oldest
        self._evictions += left
        if unhinted:
            self._victims += len(unhinted)
            self._wait = [None, None]
        if self.clock - self._aged_at >= self.capacity:
            # `v` follows the tier's evictions, not the policy's alone: where
            # 0s take nearly all of them, victims counted long ago, when the
            # policy chose differently, would stand for it indefinitely.
            self._aged_at = self.clock
            self._victims /= 2
            self._victims_back /= 2
            self._evictions /= 2
            self._wait = [None, None]

    def stored(self, keys: Sequence[OffloadKey]) -> list[OffloadKey]:
        """`keys` were stored again: remembered ones were asked for again.
        Returns those evicted under a 0, now proven wrong, in the order of
        `keys`."""
        gone = self.gone
        found = gone.keys() & keys
        if not found:
            return []
        back = [(key, gone.pop(key)) for key in found]
        wrong = {key: mark for key, mark in back if mark != _UNHINTED}
        if len(wrong) < len(back):
            self._victims_back += len(back) - len(wrong)
            self._wait = [None, None]
        if not wrong:
            return []
        self.proven(wrong.values())
        return [key for key in keys if key in wrong]

    def clear(self) -> None:
        """Forget the evicted chunks (what was learned of the application stays)."""
        self.gone.clear()

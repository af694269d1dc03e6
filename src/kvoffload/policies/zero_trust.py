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

Memory: the evicted chunks remembered, at most the tier's capacity, and one
counter per power of two of age. Each operation costs a few dict operations
per chunk evicted or hinted 0 (only while a chunk hinted 0 is resident); the
age from which 0s are believed is recomputed (a few dozen steps) when a count
has changed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from kvoffload.keys import OffloadKey

WINDOW_TURNOVERS = 2
"""The counts cover about this many tiers' worth of chunks hinted 0 and of
victims (older counts are halved away): recent enough to follow an
application that changes, long enough that most have met their next turn."""
_UNHINTED = -1
"""What `ZeroTrust.gone` holds for a victim under no hint (a 0 holds a clock
reading, >= 0)."""


class ZeroTrust:
    """What a tier learns of an application's 0s (see the module)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self.clock = 0
        """Chunks evicted while a chunk hinted 0 was resident: the age of a 0 is
        this clock's advance since it was given."""
        self.gone: OrderedDict[OffloadKey, int] = OrderedDict()
        """Chunks evicted while a chunk hinted 0 was resident, oldest first, at
        most `capacity` of them: with the clock when hinted 0, or `_UNHINTED`.
        A store of one of them is a chunk asked for again."""
        self._window = WINDOW_TURNOVERS * self.capacity
        self._given = 0.0
        self._proofs: list[float] = []
        """Chunks proven wrong by age: entry `i` holds ages of `i` bits."""
        self._victims = 0.0
        self._victims_back = 0.0
        self._wait: int | None = 0
        """The age from which a 0 is believed (None: to be recomputed)."""

    @property
    def rate(self) -> float:
        """The share of chunks hinted 0 lately that were proven wrong."""
        return min(1.0, sum(self._proofs) / self._given) if self._given else 0.0

    @property
    def victim_rate(self) -> float:
        """The share of the policy's unhinted victims lately stored again."""
        return self._victims_back / self._victims if self._victims else 0.0

    def ripe(self) -> int:
        """The clock reading at or before which a 0 is believed."""
        if self._wait is None:
            self._wait = self._first_believed_age()
        return self.clock - self._wait

    def _first_believed_age(self) -> int:
        """The least age `a` with `r(a) <= v` (ages in buckets of powers of two:
        `r` is read at their edges)."""
        proofs, given, worth = self._proofs, self._given, self.victim_rate
        later = sum(proofs)
        before = 0.0
        for bits, count in enumerate(proofs):
            left = given - before  # hinted 0 and not proven wrong before this age
            if left <= 0 or later <= worth * left:
                return (1 << bits) >> 1  # the least age of `bits` bits: 0, 1, 2, 4...
            before += count
            later -= count
        return (1 << len(proofs)) >> 1  # past every proof: r is 0

    def given(self, n: int) -> None:
        """`n` chunks came under a 0."""
        self._given += n
        if self._given > self._window:
            self._given /= 2
            self._proofs = [count / 2 for count in self._proofs]
        self._wait = None

    def proven(self, ages: Iterable[int]) -> None:
        """Chunks hinted 0 were asked for again, at these ages."""
        proofs = self._proofs
        for age in ages:
            bits = max(0, age).bit_length()
            if bits >= len(proofs):
                proofs.extend([0.0] * (bits + 1 - len(proofs)))
            proofs[bits] += 1
        self._wait = None

    def evicted(
        self,
        zeros: Sequence[OffloadKey],
        stamps: Sequence[int],
        unhinted: Sequence[OffloadKey],
    ) -> None:
        """Chunks hinted 0 (`stamps`: the clock when they were) and the
        policy's unhinted victims (distinct keys, none remembered) left:
        remember them (bounded) and advance the clock."""
        gone = self.gone
        # Loops, not `update`: an OrderedDict takes a batch through the generic
        # mapping protocol, several times slower.
        for key, stamp in zip(zeros, stamps, strict=True):
            gone[key] = stamp
        for key in unhinted:
            gone[key] = _UNHINTED
        self.clock += len(zeros) + len(unhinted)
        popitem = gone.popitem
        for _ in range(len(gone) - self.capacity):
            popitem(False)  # the oldest
        victims = unhinted
        if victims:
            self._victims += len(victims)
            if self._victims > self._window:
                self._victims /= 2
                self._victims_back /= 2
            self._wait = None

    def stored(self, keys: Iterable[OffloadKey]) -> None:
        """`keys` were stored again: remembered ones were asked for again."""
        gone = self.gone
        back = [gone.pop(key) for key in gone.keys() & keys]
        if not back:
            return
        ages = [self.clock - stamp for stamp in back if stamp != _UNHINTED]
        if len(ages) < len(back):
            self._victims_back += len(back) - len(ages)
            self._wait = None
        if ages:
            self.proven(ages)

    def clear(self) -> None:
        """Forget the evicted chunks (what was learned of the application stays)."""
        self.gone.clear()

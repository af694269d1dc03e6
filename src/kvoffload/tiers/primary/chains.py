"""Which resident chunks continue a prefix the tier holds: whole chains kept.

A chunk can hit only behind the chunks before it, so evicting a chunk whose
successor is resident strands the successor (a hole: lookups stop there). With
`ChainLinks` on, the primary tier records, for each chunk a store adds, the
chunk before it in the store's offer, and does not evict a chunk that one
resident chunk continues: a store that would have to cut into a chain is
refused instead, and the chain stays whole. A chunk that several chunks
continue is a prefix their conversations share (a system prompt), which the
engine keeps while any of them runs: it may go.

That refusal is a bypass: the tier keeps what it has rather than admit what
would break it. Conversations taking turns over a tier smaller than a round
are LRU on a loop, every store evicting the conversation due next; kept whole,
the conversations the tier holds hit on every turn (docs/policies.md, "Whole
chains"). It costs where the tier is small next to the engine's cache, which
then needs the room, so the connector turns it on only with an engine prefix
cache smaller than the pool, and only for policies that give up a chain's tail
first (`EvictionPolicy.chains_drain_from_tail`).

A link is a hint, not an invariant: keys of several KV groups in one offer link
across the groups' boundary, and a chunk that leaves by a path other than
eviction (a failed store, a reset) orphans its successors. Neither can pin a
chunk: counts only fall when a successor leaves, and a chain always drains
from its end.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence, Set

from kvoffload.keys import OffloadKey


class ChainLinks:
    """For each linked resident chunk, the one before it; for each chunk, how
    many resident chunks it continues into."""

    __slots__ = ("_after", "_before")

    def __init__(self) -> None:
        self._before: dict[OffloadKey, OffloadKey] = {}
        self._after: dict[OffloadKey, int] = {}

    def link(self, offer: Sequence[OffloadKey], added: Set[OffloadKey]) -> None:
        """A store of `offer` (prefix order) added `added`: each continues the
        key before it in the offer."""
        before, after = self._before, self._after
        prev: OffloadKey | None = None
        for key in offer:
            if prev is not None and key in added and key not in before:
                before[key] = prev
                after[prev] = after.get(prev, 0) + 1
            prev = key

    def unlink(self, keys: Iterable[OffloadKey]) -> None:
        """`keys` left the tier: their predecessors may end a chain now, and
        their successors are orphans (they continue nothing resident)."""
        before, after = self._before, self._after
        for key in keys:
            prev = before.pop(key, None)
            if prev is not None and prev in after:
                left = after[prev] - 1
                if left:
                    after[prev] = left
                else:
                    del after[prev]
            after.pop(key, None)

    def holds_back(self, key: OffloadKey) -> bool:
        """Whether `key` is not to be evicted: one resident chunk continues it.
        A chunk several continue is a prefix they share (a system prompt),
        which the engine keeps while any of their requests runs: lookups start
        past it, so giving up the host copy strands nothing, and keeping it
        whole would hold room no lookup asks for."""
        return self._after.get(key) == 1

    def clear(self) -> None:
        self._before.clear()
        self._after.clear()

"""Write-back tiers: chunks are written when host memory is about to evict them.

A write-through tier is written every chunk host memory stores and follows host
memory's touches, so it holds host memory's chunks too: 5,859 chunks of host
memory and a 50,000-chunk disk hold about 50,000 distinct chunks. A write-back
tier (`write: back`) holds what host memory does not, as an exclusive cache
does: the disk adds its whole capacity.

Host memory's chunks reach it only on their way out: the chunks its policy
would evict next (a window of `window_chunks`, in the policy's own order, asked
without changing it) are written to each write-back tier that lacks them, from
their pinned slots, and those it has are touched there, so the tier keeps the
chunks that just left host memory longest. The window is looked at again once
host memory has taken a quarter of a window of new chunks, so an eviction finds
its victims written unless one step stores more than three quarters of a
window (an eighth of host memory, at least 64 chunks) or the tier falls behind
(its `max_inflight_chunks` full: what did not fit is offered at the next step).
A chunk found in a write-back tier and promoted stays there too: if host memory
evicts it unchanged, nothing is written again.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvoffload.keys import OffloadKey
from kvoffload.tiers.base import ReqContext
from kvoffload.tiers.primary import CPUOffloadingManager
from kvoffload.tiers.secondary.base import SecondaryTier

MIN_WINDOW_CHUNKS = 64
DEMOTION_CONTEXT = ReqContext("kvoffload-demotion")
"""The request context of write-back jobs: they are no request's."""


class Demotions:
    """Which chunks to write to the write-back tiers, and when."""

    def __init__(
        self,
        primary: CPUOffloadingManager,
        tiers: Sequence[SecondaryTier],
    ) -> None:
        self._primary = primary
        self.indices = tuple(i for i, t in enumerate(tiers) if t.write_back)
        self.window_chunks = max(MIN_WINDOW_CHUNKS, primary.num_chunks // 8)
        self._looked_at: int | None = None
        self._behind = False

    def due(self) -> bool:
        """Whether to look at the window now: host memory is within a window of
        full and has taken a quarter of a window since the last look, or a tier
        could not take all it was offered then."""
        if not self.indices:
            return False
        primary = self._primary
        if self._behind:
            return True
        if primary.num_free_slots() >= self.window_chunks:
            return False
        inserted = primary.num_inserted
        last = self._looked_at
        return last is None or inserted - last >= self.window_chunks // 4

    def window(self) -> list[OffloadKey]:
        """The chunks host memory would evict next (marks the look)."""
        self._looked_at = self._primary.num_inserted
        self._behind = False
        return self._primary.eviction_order(self.window_chunks)

    def fell_behind(self) -> None:
        """A tier's in-flight bound left part of the window unwritten."""
        self._behind = True

    def reset(self) -> None:
        self._looked_at = None
        self._behind = False

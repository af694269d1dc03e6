"""When the engine lets go of a request's KV: the moment its chunks' host-tier
recency starts, for an engine with a prefix cache.

An engine that keeps a prefix cache (vLLM does) serves a later request with the
same prefix from its own blocks for as long as it keeps them; the host tier is
asked only once it has given them to another request. Until then the host copy
is insurance, and marking it most recently used (when the request loaded it, or
when its prompt was computed) protects it at the very moment it is least needed:
the conversation was just served and, in a chat, its next turn comes last. So
the connector watches a finished (or preempted) request's engine blocks and
touches the chunks the request hit or offered, head last, once the engine
allocates any of those blocks afresh (docs/policies.md, "Inside a real engine").

Each engine block names at most one watch (the latest request that held it:
its prefix covers the earlier one's there), so the watch is bounded by the
engine's block count, whatever the number of requests.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence, Set

from kvoffload.connector.config import GroupSpec
from kvoffload.keys import OffloadKey
from kvoffload.tiers.base import ReqContext


class _Watch:
    __slots__ = ("blocks", "ctx", "keys", "seq", "stored")

    def __init__(
        self,
        seq: int,
        keys: list[OffloadKey],
        ctx: ReqContext,
        stored: Set[OffloadKey],
        blocks: set[int],
    ) -> None:
        self.seq = seq
        self.keys = keys
        self.ctx = ctx
        self.stored = stored
        self.blocks = blocks


Release = tuple[list[OffloadKey], ReqContext, Set[OffloadKey]]
"""A due touch: the keys (prefix order), the request, the keys it stored itself."""


class ReleaseWatch:
    """Chunks to touch once the engine reallocates a block that held them."""

    def __init__(self, groups: Sequence[GroupSpec], null_block: int | None) -> None:
        self._specs = tuple(groups)
        self._null = null_block
        self._by_block: dict[int, _Watch] = {}
        self._due: list[_Watch] = []
        self._seq = 0

    def __len__(self) -> int:
        """Watches not due yet."""
        return len({id(w) for w in self._by_block.values()})

    def watch(
        self,
        keys: list[OffloadKey],
        ctx: ReqContext,
        stored: Set[OffloadKey],
        tables: Iterable[Iterable[int]],
    ) -> None:
        """Touch `keys` (prefix order; `stored`: those the request stored itself)
        once any block of `tables` is reallocated."""
        blocks = {b for ids in tables for b in ids if b != self._null and b >= 0}
        if not keys or not blocks:
            return
        self._seq += 1
        watch = _Watch(self._seq, keys, ctx, stored, blocks)
        by_block = self._by_block
        for block in blocks:
            older = by_block.get(block)
            if older is not None:
                older.blocks.discard(block)  # superseded here by the newer holder
            by_block[block] = watch

    def note_allocated(self, tables: Sequence[Sequence[int]], hit_tokens: int) -> None:
        """Blocks past the first `hit_tokens` of each table were allocated afresh
        (the engine's prefix-cache hits before them keep their KV): the watches
        naming them are due."""
        by_block = self._by_block
        if not by_block:
            return
        for spec, ids in zip(self._specs, tables, strict=True):
            for block in ids[hit_tokens // spec.tokens_per_block :]:
                watch = by_block.pop(block, None)
                if watch is None:
                    continue
                for other in watch.blocks:
                    if by_block.get(other) is watch:
                        del by_block[other]
                watch.blocks = set()
                self._due.append(watch)

    def take_due(self) -> list[Release]:
        """The watches that fell due since the last call, in the order they were
        set (the request the engine let go of first is touched first)."""
        due, self._due = self._due, []
        due.sort(key=lambda w: w.seq)
        return [(w.keys, w.ctx, w.stored) for w in due]

    def clear(self) -> None:
        self._by_block.clear()
        self._due.clear()

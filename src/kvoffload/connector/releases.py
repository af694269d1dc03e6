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

A chunk of the request's engine hit that a live request of another conversation
still holds in the engine (a shared system prompt) is left out of the touch
(`held`): that request's own release touches it, if no other holds it then.

Each engine block names at most one watch (the latest request that held it:
its prefix covers the earlier one's there), so the watch is bounded by the
engine's block count, whatever the number of requests.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence, Set
from dataclasses import dataclass

from kvoffload.connector.config import GroupSpec
from kvoffload.connector.held import HeldChunks
from kvoffload.connector.request_state import RequestState
from kvoffload.keys import OffloadKey
from kvoffload.tiers.base import ReqContext

Touch = tuple[list[OffloadKey], ReqContext, Set[OffloadKey]]
"""A due touch: the keys (prefix order), the request, the keys it stored itself."""


@dataclass(frozen=True, slots=True)
class Release:
    """A touch to make when the engine lets go of a request's blocks."""

    keys: list[OffloadKey]
    """The chunks the request hit or offered, prefix order."""
    ctx: ReqContext
    stored: Set[OffloadKey]
    """Those it stored itself."""
    engine_hit: tuple[tuple[Sequence[OffloadKey], OffloadKey], ...] = ()
    """Per group: the chunks the engine served the request from its own prefix
    cache, and the last chunk of its prompt (`HeldChunks.held_elsewhere`)."""


class _Watch:
    __slots__ = ("blocks", "release", "seq")

    def __init__(self, seq: int, release: Release, blocks: set[int]) -> None:
        self.seq = seq
        self.release = release
        self.blocks = blocks


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

    def watch_request(self, state: RequestState) -> None:
        """Touch the chunks the request hit or offered once the engine
        reallocates any block of its table (it finished, or was preempted)."""
        # A request of the same conversation holds the last chunk of its prompt
        # (not the last decoded one: the next turn's prompt may tokenize the
        # answer differently).
        prompt = state.request.num_prompt_tokens
        hits = tuple(
            (g.keys[:hit], g.keys[min(len(g.keys), prompt // tpc) - 1])
            for g in state.groups
            for tpc in (g.tokens_per_chunk,)
            if (hit := state.engine_hit_tokens // tpc)
        )
        release = Release(state.seen_keys(), state.ctx, frozenset(state.stored), hits)
        self.watch(release, [group.block_ids for group in state.groups])

    def watch(self, release: Release, tables: Iterable[Iterable[int]]) -> None:
        """Touch `release` once any block of `tables` is reallocated."""
        blocks = {b for ids in tables for b in ids if b != self._null and b >= 0}
        if not release.keys or not blocks:
            return
        self._seq += 1
        watch = _Watch(self._seq, release, blocks)
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

    def take_due(self, held: HeldChunks) -> list[Touch]:
        """The touches that fell due since the last call, in the order they were
        set (the request the engine let go of first is touched first), less the
        chunks of their engine hits `held` says others hold."""
        due, self._due = self._due, []
        due.sort(key=lambda w: w.seq)
        touches: list[Touch] = []
        for w in due:
            release = w.release
            kept = held.held_elsewhere(release.engine_hit)
            keys = release.keys
            if kept:
                keys = [key for key in keys if key not in kept]
            if keys:
                touches.append((keys, release.ctx, release.stored))
        return touches

    def clear(self) -> None:
        self._by_block.clear()
        self._due.clear()

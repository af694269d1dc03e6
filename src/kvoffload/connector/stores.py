"""Which of a request's chunks a step stores, and the host slots they get.

Each step a request offers its whole chunks past its store cursor whose KV exists
after the step, within its store limit (`transfers.chunks_to_store`), less those
behind a gap in the tier (`transfers.anchor_store`), in one `prepare_store` call:
all or nothing. If they do not all fit, the head of the span is tried in free
room only; if nothing fits, the cursors stay and the chunks are offered again
next step. The chunks prepared move the cursors past them.
"""

from __future__ import annotations

from kvoffload.connector.base import ChunkObserver, ConnectorStats
from kvoffload.connector.config import ConnectorConfig
from kvoffload.connector.head_bets import HeadBets
from kvoffload.connector.observe import observe_store
from kvoffload.connector.request_state import RequestState
from kvoffload.connector.reuse_guard import ReuseGuard
from kvoffload.connector.transfers import anchor_store, chunks_to_store, store_transfers
from kvoffload.connector.unoffered import UnofferedChunks
from kvoffload.keys import OffloadKey
from kvoffload.tiers.base import OffloadingManager
from kvoffload.worker.base import GroupTransfer


class StorePlanner:
    """Plans the store of one request at a time; the connector makes it a job."""

    def __init__(
        self,
        config: ConnectorConfig,
        manager: OffloadingManager,
        guard: ReuseGuard,
        stats: ConnectorStats,
        observer: ChunkObserver | None,
        bets: HeadBets,
        unoffered: UnofferedChunks,
    ) -> None:
        self._config = config
        self._bets = bets
        self._unoffered = unoffered
        self._manager = manager
        self._guard = guard
        self._stats = stats
        self._observer = observer

    def plan(
        self, state: RequestState, computed_tokens: int
    ) -> tuple[tuple[OffloadKey, ...], tuple[GroupTransfer, ...]] | None:
        """The keys to store from the request's first `computed_tokens` this step
        (its keys refreshed by the caller) and their transfers, their host slots
        prepared; `None` when there is nothing to store."""
        null_block = self._config.null_block_id
        offloadable = min(computed_tokens, state.store_limit)
        chunks = chunks_to_store(state, offloadable, null_block)
        chunks, prefix, gaps = anchor_store(
            self._manager, state, chunks, null_block, self._unoffered
        )
        self._stats.store_skipped += gaps
        if not chunks:
            return None
        # Over its own loaded head only while the engine is seen to keep such
        # heads until their conversations return (`head_bets`).
        offer = [*prefix, *(g.keys[c] for g, c in chunks)]
        if state.loaded_from_tiers and self._bets.tail_first():
            prepared = self._manager.prepare_store(offer, state.ctx, keep_loaded=False)
        else:
            prepared = self._manager.prepare_store(offer, state.ctx)
        while prepared is None and len(chunks) > 1:
            # No room for all of them: the head of the prefix is worth the most,
            # so try the chunks ending in the first half of the span, in free room
            # only: evicting others' chunks for a part of this prompt would trade
            # whole prefixes for a fragment (a tier smaller than one prompt would
            # hold the head of whichever request came last, and hit nothing).
            ends = sorted({(c + 1) * g.tokens_per_chunk for g, c in chunks})
            half = ends[(len(ends) - 1) // 2]
            head = [(g, c) for g, c in chunks if (c + 1) * g.tokens_per_chunk <= half]
            if len(head) == len(chunks):
                break
            self._stats.store_skipped += len(chunks) - len(head)
            chunks = head
            prepared = self._manager.prepare_store(
                [*prefix, *(g.keys[c] for g, c in chunks)], state.ctx, may_evict=False
            )
        if prepared is None:
            self._stats.store_skipped += len(chunks)
            return None  # cursors stay: offered again next step
        for group, chunk in chunks:
            group.store_cursor = max(group.store_cursor, chunk + 1)
        self._guard.sync(state)
        if not prepared.keys_to_store:
            return None
        state.stored.update(prepared.keys_to_store)
        self._unoffered.discard(prepared.keys_to_store)
        if self._config.engine_prefix_caching:
            # The new chunks are used now, head last (their hit prefix waits for
            # the engine to let go of it; without a prefix cache the prompt's
            # touch follows in this very step).
            self._manager.touch(prepared.keys_to_store, state.ctx)
        if self._observer is not None:
            observe_store(self._observer, state.req_id, chunks, prepared.keys_to_store)
        return prepared.keys_to_store, store_transfers(chunks, prepared)

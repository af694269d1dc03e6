"""Planning the load of a request's hit once the engine allocated its blocks.

The chunks covering the tokens the lookup promised past the engine's own hit are
pinned (`prepare_load`) and their host blocks mapped to the request's engine
blocks (`transfers.plan_load`). If a chunk left the host tier since the lookup,
nothing is pinned, and the caller fails the load so that the request recomputes.
The keys of a planned load count as being loaded into the engine (`lookup`
waits for them rather than load them twice) until its completion
(`completions`).
"""

from __future__ import annotations

from kvoffload.connector.base import ChunkObserver, ConnectorStats
from kvoffload.connector.config import ConnectorConfig
from kvoffload.connector.observe import observe_load
from kvoffload.connector.request_state import RequestState
from kvoffload.connector.transfers import load_tokens, plan_load
from kvoffload.keys import OffloadKey
from kvoffload.tiers.base import OffloadingManager
from kvoffload.worker.base import GroupTransfer


class LoadPlanner:
    """Plans the load of one request at a time; the connector makes it a job."""

    def __init__(
        self,
        config: ConnectorConfig,
        manager: OffloadingManager,
        stats: ConnectorStats,
        loading: dict[OffloadKey, int],
        observer: ChunkObserver | None,
    ) -> None:
        self._config = config
        self._manager = manager
        self._stats = stats
        # Shared with the lookup, which reads it, and the completions, which
        # count a load's keys out again.
        self._loading = loading
        self._observer = observer

    def plan(
        self, state: RequestState, start_token: int, end_token: int
    ) -> tuple[tuple[OffloadKey, ...], tuple[GroupTransfer, ...]] | None:
        """The keys and transfers of a load of tokens [start, end), its chunks
        pinned; `None`, pinning nothing, when a chunk is no longer readable."""
        planned = plan_load(
            self._manager, state, start_token, end_token, self._config.null_block_id
        )
        if planned is None:
            return None
        keys = planned[0]
        self._manager.on_load_planned(
            load_tokens(state, start_token, end_token), state.ctx
        )
        if not self._config.engine_prefix_caching:
            # The engine drops these blocks with the request: the host copy is the
            # only one its conversation will have, so the load is a use now and
            # the request's own stores must not evict it (stop 17).
            self._manager.touch(keys, state.ctx)
        if self._observer is not None:
            observe_load(self._observer, state, start_token, end_token)
        loading = self._loading
        for key in keys:
            loading[key] = loading.get(key, 0) + 1
        self._stats.hit_tokens += end_token - start_token
        return planned

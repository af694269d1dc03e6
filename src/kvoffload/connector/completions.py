"""What a load or store job's completion changes: the tiers, its request, the counters.

A job completes once every rank has reported it (`jobs`), successful only if all
of them succeeded. A current job's completion reaches the manager
(`complete_load` unpins, `complete_store` makes the chunks readable, or drops
them when the store failed); a job planned before a reset touches the tiers no
more, and its load counts as failed: the chunks it read were dropped, maybe as
KV of the weights the reset was for. A failed load leaves its request to
recompute, and it loads nothing more (retrying could fail the same way forever).
A store's keys that its request no longer has (a rewrite voided them while the
job was in flight) complete as failed, never readable.
"""

from __future__ import annotations

import logging

from kvoffload.connector.base import ConnectorStats
from kvoffload.connector.fences import StoreFences
from kvoffload.connector.jobs import JobRecord
from kvoffload.connector.request_state import RequestState
from kvoffload.connector.reuse_guard import ReuseGuard
from kvoffload.keys import OffloadKey
from kvoffload.tiers.base import OffloadingManager, ReqContext
from kvoffload.worker.base import TransferDirection

# Under the connector's name, where these warnings were always logged: filters
# set on it keep hearing them.
logger = logging.getLogger("kvoffload.connector.scheduler")


class JobCompletions:
    """Folds completed jobs into the manager, their requests and the counters,
    and gathers which requests' loads ended (`take_load_results`)."""

    def __init__(
        self,
        manager: OffloadingManager,
        stats: ConnectorStats,
        loading: dict[OffloadKey, int],
        fences: StoreFences,
        guard: ReuseGuard,
    ) -> None:
        self._manager = manager
        self._stats = stats
        # Shared with the connector, which counts a load's keys in when it plans it.
        self._loading = loading
        self._fences = fences
        self._guard = guard
        self._finished_loading: list[str] = []
        self._failed_loading: list[str] = []

    def complete(
        self, record: JobRecord, state: RequestState | None, current: bool
    ) -> None:
        """The job of `record` completed on every rank; `state` is its request's
        (`None` once dropped), `current` whether it was planned since the last
        reset. The request's count of jobs in flight is the caller's."""
        if record.direction is TransferDirection.LOAD:
            self._complete_load(record, state, current)
        else:
            self._complete_store(record, state, current)

    def take_load_results(self) -> tuple[list[str], list[str]]:
        """Requests whose load finished since the last call: (succeeded, failed)."""
        done, failed = self._finished_loading, self._failed_loading
        self._finished_loading, self._failed_loading = [], []
        return done, failed

    def _complete_load(
        self, record: JobRecord, state: RequestState | None, current: bool
    ) -> None:
        stats = self._stats
        stats.load_jobs += 1
        stats.bytes_loaded += record.num_bytes
        stats.load_seconds += record.seconds
        for key in record.keys:
            count = self._loading.pop(key, 0) - 1
            if count > 0:
                self._loading[key] = count
        if current:
            self._manager.complete_load(
                record.keys, state.ctx if state else ReqContext(record.request_id)
            )
        if record.success and current:
            stats.chunks_loaded += len(record.keys)
            self._finished_loading.append(record.request_id)
        else:
            stats.failed_load_jobs += 1
            self._failed_loading.append(record.request_id)
            if current:
                logger.warning(
                    "load job %d of request %s failed; it recomputes",
                    record.job_id,
                    record.request_id,
                )
                if state is not None:
                    # Retrying could fail the same way forever: recompute instead.
                    state.load_failed = True
            else:
                # Its chunks were dropped by the reset, maybe as KV of old weights.
                logger.info(
                    "load job %d of request %s was planned before a reset; "
                    "it recomputes",
                    record.job_id,
                    record.request_id,
                )
        if state is not None and state.load_job == record.job_id:
            state.load_job = None
            self._land_hit(state, record.success and current)

    def _land_hit(self, state: RequestState, loaded: bool) -> None:
        """The request's load ended: if it was the first schedule's and it
        succeeded, its chunks count as hit and its stores start past them."""
        hit, state.load_hit_tokens = state.load_hit_tokens, 0
        if hit and loaded and not state.finished:
            state.pass_hit(hit)
            # Cursors only moved forward, so the guard only drops positions: safe
            # whenever results arrive, before or after a step's `void_reused`.
            self._guard.sync(state)

    def _complete_store(
        self, record: JobRecord, state: RequestState | None, current: bool
    ) -> None:
        stats = self._stats
        stats.store_jobs += 1
        stats.bytes_stored += record.num_bytes
        stats.store_seconds += record.seconds
        void = record.void_keys
        keys = [k for k in record.keys if k not in void] if void else record.keys
        if current:
            ctx = state.ctx if state else ReqContext(record.request_id)
            self._manager.complete_store(keys, ctx, success=record.success)
            if void:
                self._manager.complete_store(
                    [k for k in record.keys if k in void], ctx, success=False
                )
        if record.success:
            stats.chunks_stored += len(keys)
        else:
            stats.failed_store_jobs += 1
        if state is not None:
            state.store_jobs.discard(record.job_id)
        self._fences.remove(record.job_id, record.transfers)

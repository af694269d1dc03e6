"""The scheduler-side connector: a coordinator over lookup, load and store planning.

It runs in the engine's scheduler, once per step, and knows requests, their block
hashes and engine block ids, but nothing engine-specific: an adapter (vLLM's, or the
engine model's) translates. Call order per request: `on_new_request` once;
`get_num_new_matched_tokens` (again while it answers `None`);
`update_state_after_alloc` when the engine allocated its blocks; `build_step` every
step it is scheduled; `request_finished` once. The manager hears `on_request_finished`
once the request's jobs have all completed, as in the seed: every
`complete_load`/`complete_store` of a request reaches it first, after a reset or a
failed job too. An engine that rewrites a request's tokens (vLLM's streaming-input
sessions) calls `on_request_rewritten` before scheduling it again. Job results come
back through `on_job_results` in any step.

Engine blocks are fenced, not held (`fences`). A block the engine allocates afresh
also voids every entry naming it in the chunks of live requests that may still be
stored (vLLM frees a running request's blocks that leave a sliding window): those
chunks are skipped, never stored from someone else's KV (`reuse_guard`).

`reset_cache` does not wait for the jobs in flight: the host slots they touch stay
held until their results arrive from every rank, and their loads are reported failed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace

from kvoffload.connector.base import (
    ChunkObserver,
    Clock,
    ConnectorStats,
    RequestInfo,
    ScheduledRequest,
    StepPlan,
)
from kvoffload.connector.completions import JobCompletions
from kvoffload.connector.config import ConnectorConfig
from kvoffload.connector.fences import StoreFences
from kvoffload.connector.head_bets import HeadBets
from kvoffload.connector.held import HeldChunks
from kvoffload.connector.jobs import JobRecord, JobTracker
from kvoffload.connector.loads import LoadPlanner
from kvoffload.connector.lookup import LookupPlanner
from kvoffload.connector.releases import ReleaseWatch
from kvoffload.connector.request_state import RequestState
from kvoffload.connector.reuse_guard import ReuseGuard
from kvoffload.connector.stores import StorePlanner
from kvoffload.connector.transfers import transfer_slots
from kvoffload.connector.unoffered import UnofferedChunks
from kvoffload.keys import OffloadKey
from kvoffload.tiers.base import (
    OffloadingEvent,
    OffloadingManager,
    ReqContext,
    TierStats,
)
from kvoffload.worker.base import (
    GroupTransfer,
    JobResult,
    TransferDirection,
    TransferJob,
)

logger = logging.getLogger(__name__)


class OffloadConnector:
    """Turns requests into lookups, load jobs and store jobs, step by step."""

    def __init__(
        self,
        config: ConnectorConfig,
        manager: OffloadingManager,
        clock: Clock = time.monotonic,
        observer: ChunkObserver | None = None,
    ) -> None:
        self.config = config
        self.manager = manager
        if config.engine_prefix_caching and config.engine_blocks is not None:
            manager.keep_chains(
                config.engine_blocks // config.groups[0].blocks_per_chunk
            )
        # Tiers are fixed at start-up: what requests may name in kv_*_tiers.
        self._tier_names = manager.tier_names()
        # Keys being loaded into the engine, with the number of loads carrying them.
        self._loading: dict[OffloadKey, int] = {}
        self._lookup = LookupPlanner(config, manager, clock, self._loading)
        self._jobs = JobTracker(config.world_size)
        self._requests: dict[str, RequestState] = {}
        self._pending_loads: list[TransferJob] = []
        self._fences = StoreFences()
        # Loads handed out before a reset: the workers must report them failed.
        self._stale_loads: set[int] = set()
        self._request_of: dict[int, str] = {}
        self._guard = ReuseGuard(config.groups, config.null_block_id)
        self._releases = ReleaseWatch(config.groups, config.null_block_id)
        self._held = HeldChunks(enabled=config.engine_prefix_caching)
        self._stats = ConnectorStats()
        self._loads = LoadPlanner(config, manager, self._stats, self._loading, observer)
        self._bets = HeadBets()
        self._unoffered = UnofferedChunks()
        self._stores = StorePlanner(
            config,
            manager,
            self._guard,
            self._stats,
            observer,
            self._bets,
            self._unoffered,
        )
        self._completions = JobCompletions(
            manager, self._stats, self._loading, self._fences, self._guard
        )

    # -- request lifecycle -------------------------------------------------------

    def on_new_request(self, request: RequestInfo) -> None:
        """First sight of a request: parse its parameters once, ask for its policy."""
        req_id = request.request_id
        if req_id in self._requests:
            return
        ctx = ReqContext.create(req_id, request.kv_transfer_params, self._tier_names)
        policy = self.manager.on_new_request(ctx).policy
        self._requests[req_id] = RequestState.create(request, policy, ctx, self.config)
        self._stats.requests += 1

    def get_num_new_matched_tokens(
        self, request: RequestInfo, num_computed_tokens: int
    ) -> int | None:
        """Tokens the tiers can add past the engine's hit; `None`: ask next step."""
        if request.request_id not in self._requests:
            self.on_new_request(request)
        state = self._requests[request.request_id]
        self._stats.lookups += 1
        found = self._lookup.num_loadable_tokens(state, num_computed_tokens)
        if found is None:
            self._stats.deferrals += 1
        return found

    def update_state_after_alloc(
        self,
        request_id: str,
        block_ids: Sequence[Sequence[int]],
        num_computed_tokens: int,
        num_external_tokens: int,
    ) -> None:
        """The engine allocated the request's blocks; plan the load of its hit.

        `block_ids` is the whole table; blocks past the engine's prefix-cache hit
        (`num_computed_tokens`) are freshly allocated. At the first schedule,
        `CHUNK_LEVEL` stores start past the engine's hit, and past the loaded
        tokens once the load succeeds: after a failed load the request stores the
        chunks it recomputes.
        """
        state = self._requests[request_id]
        state.deferred_since = None  # admitted: a later lookup may wait anew
        self._guard.release(state)
        for group, ids in zip(state.groups, block_ids, strict=True):
            group.block_ids = list(ids)
        self._held.sync(request_id, state.groups)
        self._fences.fence(block_ids)
        self._guard.note_allocated(block_ids, num_computed_tokens)
        self._releases.note_allocated(block_ids, num_computed_tokens)
        self._guard.on_new_table(state)
        hit = num_computed_tokens + num_external_tokens
        first_schedule = not state.cursors_started
        if first_schedule:
            state.cursors_started = True
            state.engine_hit_tokens = num_computed_tokens
            if self.config.engine_prefix_caching:  # the engine may keep heads
                state.refresh_keys()
                self._bets.note_request_scheduled(state)
            # Past the loaded chunks only once they land: if the load fails, the
            # request computes them, and they are its own to store.
            state.pass_hit(num_computed_tokens)
        if num_external_tokens <= 0:
            return
        planned = self._loads.plan(state, num_computed_tokens, hit)
        if planned is None:
            # A chunk the lookup counted has left the host tier since. The engine
            # waits for this load: fail it like any failed load, so it recomputes.
            logger.warning(
                "request %s: a chunk of its hit left the host tier before its "
                "load was planned; it recomputes",
                request_id,
            )
            self._add_load(state, (), (), fail=True)
            return
        self._add_load(state, *planned)
        if first_schedule:
            state.load_hit_tokens = hit

    def _add_load(
        self,
        state: RequestState,
        keys: tuple[OffloadKey, ...],
        transfers: tuple[GroupTransfer, ...],
        fail: bool = False,
    ) -> None:
        record = self._new_job(state, TransferDirection.LOAD, keys, transfers)
        state.load_job = record.job_id
        self._pending_loads.append(
            TransferJob(record.job_id, TransferDirection.LOAD, transfers, fail)
        )

    def _new_job(
        self,
        state: RequestState,
        direction: TransferDirection,
        keys: tuple[OffloadKey, ...],
        transfers: tuple[GroupTransfer, ...],
    ) -> JobRecord:
        """A job of the request, in flight until every rank has reported it."""
        record = self._jobs.new(state.req_id, direction, keys)
        record.transfers = transfers
        state.jobs_in_flight += 1
        self._request_of[record.job_id] = state.req_id
        return record

    def on_request_rewritten(self, request_id: str, num_kept_tokens: int) -> None:
        """The engine replaced the request's tokens past the first `num_kept_tokens`
        (a vLLM streaming-input session took its next input: its last sampled
        token is dropped, and the input joins its prompt).

        `request.block_hashes` already describes the new tokens. Keys of chunks
        past the kept tokens are dropped and the store cursors brought back, so
        those chunks are stored under their new keys; the store limit follows the
        prompt as it is now. A store in flight of a dropped key completes as
        failed: nothing becomes readable under a key of tokens the request no
        longer has. Call it before the request is scheduled again.
        """
        state = self._requests.get(request_id)
        if state is None or state.finished:
            return
        dropped = set(state.rewrite(num_kept_tokens, self.config))
        for job_id in state.store_jobs:
            record = self._jobs.get(job_id)
            if record is not None and not dropped.isdisjoint(record.keys):
                record.void_keys |= dropped.intersection(record.keys)
        # The cursors moved back and the limit moved: index the table afresh.
        self._guard.release(state)
        self._guard.on_new_table(state)
        self._held.sync(request_id, state.groups)

    def on_preempted(self, request_ids: Iterable[str]) -> None:
        """The engine freed these requests' blocks; they will be looked up again."""
        for req_id in request_ids:
            state = self._requests.get(req_id)
            if state is None:
                continue
            state.deferred_since = None
            self._guard.release(state)
            self._held.drop(req_id)
            self._watch_release(state)
            for group in state.groups:
                group.block_ids = []

    def request_finished(self, request_id: str) -> None:
        """The request is done (finished or aborted); the engine may free its blocks.

        It plans nothing more. The manager hears `on_request_finished` exactly
        once, when the request's last job has completed (now, if none is in
        flight), and its state is dropped then.
        """
        state = self._requests.get(request_id)
        if state is None or state.finished:
            return
        state.finished = True
        self._guard.release(state)
        self._held.drop(request_id)
        self._touch_prefix(state)
        state.refresh_keys()
        if self.config.engine_prefix_caching:
            self._bets.note_request_finished(state)
        self._unoffered.note_finished(state)
        if not state.has_jobs():
            self._drop(state)

    def _drop(self, state: RequestState) -> None:
        """A finished request's last job has completed (SPEC §3.4: the manager
        hears it before the request's state is dropped)."""
        self.manager.on_request_finished(state.ctx)
        del self._requests[state.req_id]

    # -- per step ----------------------------------------------------------------

    def build_step(self, scheduled: Sequence[ScheduledRequest]) -> StepPlan:
        """Plan this step's stores; hand out the loads planned since the last step."""
        for item in scheduled:
            hit = item.num_computed_tokens if item.replace_block_ids else 0
            if item.new_block_ids:
                self._guard.note_allocated(item.new_block_ids, hit)
                self._releases.note_allocated(item.new_block_ids, hit)
        # Before any table grows by this step's blocks, and before any store is
        # planned: a block given to a request late in `scheduled` voids entries
        # of one early in it.
        self._guard.void_reused()
        stores: list[TransferJob] = []
        for item in scheduled:
            state = self._requests.get(item.request_id)
            if state is None or state.finished:
                continue
            self._apply_block_ids(state, item)
            self._fences.fence(item.new_block_ids)
            computed = item.num_computed_tokens + item.num_scheduled_tokens
            keys_grew = state.refresh_keys()
            job = self._plan_store(state, computed)
            if keys_grew or item.new_block_ids:
                # What it holds changes only with its keys or its table (most
                # decode steps bring neither): a running batch costs nothing here.
                self._held.sync(item.request_id, state.groups)
            if job is not None:
                stores.append(job)
            if item.new_block_ids:
                self._guard.sync(state)
            if computed >= state.request.num_prompt_tokens:
                self._touch_prefix(state)
        self._guard.end_step()
        # After the step's stores: the chunks of requests the engine let go of
        # this step do not protect themselves against the stores of the request
        # that displaced them from the engine.
        for keys, ctx, stored in self._releases.take_due(self._held):
            self.manager.touch(keys, ctx, stored=stored)
        plan = StepPlan(
            loads=tuple(self._pending_loads),
            stores=tuple(stores),
            wait_for=self._fences.take_wait_for(),
            request_of={
                job.job_id: self._request_of[job.job_id]
                for job in (*self._pending_loads, *stores)
            },
            stale_loads=tuple(sorted(self._stale_loads)),
        )
        self._pending_loads.clear()
        self._stale_loads.clear()
        return plan

    def _apply_block_ids(self, state: RequestState, item: ScheduledRequest) -> None:
        if not item.new_block_ids:
            return
        if item.replace_block_ids:
            self._guard.release(state)
        for group, ids in zip(state.groups, item.new_block_ids, strict=True):
            if item.replace_block_ids:
                group.block_ids = list(ids)
            else:
                group.block_ids.extend(ids)

    def _plan_store(
        self, state: RequestState, computed_tokens: int
    ) -> TransferJob | None:
        """The request's store this step (its keys refreshed by the caller)."""
        planned = self._stores.plan(state, computed_tokens)
        if planned is None:
            return None
        keys, transfers = planned
        record = self._new_job(state, TransferDirection.STORE, keys, transfers)
        state.store_jobs.add(record.job_id)
        self._fences.add(record.job_id, transfers)
        return TransferJob(record.job_id, TransferDirection.STORE, transfers)

    def _touch_prefix(self, state: RequestState) -> None:
        """Recency for the chunks the request hit or offered, once, head last.

        Without an engine prefix cache, once its prompt is computed: its KV leaves
        the engine with it. With one, once the engine lets go of its blocks after
        it finished (`releases`): until then a request with its prefix is served
        by the engine, and the host copy is not what it needs.
        """
        if state.prefix_touched:
            return
        if self.config.engine_prefix_caching:
            if state.finished:
                state.prefix_touched = True
                self._watch_release(state)
            return
        state.prefix_touched = True
        keys = state.seen_keys()
        if keys:
            self.manager.touch(keys, state.ctx)

    def _watch_release(self, state: RequestState) -> None:
        """With an engine prefix cache: touch the request's chunks once the engine
        reallocates one of its blocks (it finished, or was preempted)."""
        if self.config.engine_prefix_caching:
            self._releases.watch_request(state)

    # -- job results -------------------------------------------------------------

    def on_job_results(self, results: Iterable[JobResult], rank: int = 0) -> None:
        """Fold in results reported by one worker rank."""
        for result in results:
            record = self._jobs.report(result, rank)
            if record is not None:
                self._complete(record)

    def _complete(self, record: JobRecord) -> None:
        self._request_of.pop(record.job_id, None)
        current = self._jobs.is_current(record)
        if not current:
            # Planned before a reset: its slots were held until now, on every rank,
            # and a load of it is over, so no step plan need name it stale again.
            self.manager.release_slots(record.held_slots)
            self._stale_loads.discard(record.job_id)
        state = self._requests.get(record.request_id)
        self._completions.complete(record, state, current)
        if state is None:
            return
        state.jobs_in_flight -= 1
        if state.finished and not state.has_jobs():
            self._drop(state)

    def take_load_results(self) -> tuple[list[str], list[str]]:
        """Requests whose load finished since the last call: (succeeded, failed).

        A failed load leaves the engine to recompute those tokens.
        """
        return self._completions.take_load_results()

    def has_pending_jobs(self) -> bool:
        """Whether transfer jobs of this connector are in flight."""
        return len(self._jobs) > 0

    def has_pending_work(self) -> bool:
        """Transfer jobs or the manager's own work (cascades, promotions) in flight."""
        return len(self._jobs) > 0 or self.manager.has_pending_work()

    # -- whole-cache operations --------------------------------------------------

    def reset_cache(self) -> None:
        """Drop every offloaded chunk; jobs in flight keep running.

        Their completions no longer touch the tiers, and the host slots they write
        or read are held (not reused, by stores or promotions) until every rank
        has reported them. Their loads are reported failed, so their requests
        recompute: the chunks they read were dropped, maybe as KV of the weights
        the reset is for. Loads not handed out yet copy nothing.
        """
        ended = self._jobs.start_new_epoch()
        self._fences.wait_for(record.job_id for record in ended)
        pending = {job.job_id for job in self._pending_loads}
        self._stale_loads.update(
            record.job_id
            for record in ended
            if record.direction is TransferDirection.LOAD
            and record.job_id not in pending
        )
        self._pending_loads = [
            replace(job, groups=(), fail=True) for job in self._pending_loads
        ]
        groups = self.config.groups
        for record in ended:
            record.held_slots = transfer_slots(record.transfers, groups)
        self._releases.clear()
        self._bets.clear()
        self._unoffered.clear()
        self.manager.reset_cache(
            [slot for record in ended for slot in record.held_slots]
        )

    def on_schedule_end(self) -> None:
        self.manager.on_schedule_end()

    def take_events(self) -> list[OffloadingEvent]:
        return self.manager.take_events()

    def get_stats(self) -> ConnectorStats:
        return replace(self._stats)

    def get_tier_stats(self) -> dict[str, TierStats]:
        return self.manager.get_stats()

    def num_live_requests(self) -> int:
        return len(self._requests)

    def shutdown(self) -> None:
        self.manager.shutdown()

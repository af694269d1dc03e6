"""The scheduler-side half of the vLLM connector: translate and delegate.

vLLM's requests, block tables and scheduler outputs become kvoffload's
`RequestInfo`, block ids and `ScheduledRequest`s; the engine-agnostic
`OffloadConnector` decides; its `StepPlan` goes to the workers as metadata, and
their job results come back through the worker metadata.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from kvoffload.connector import (
    ConnectorConfig,
    GroupSpec,
    OffloadConnector,
    ScheduledRequest,
    StepPlan,
)
from kvoffload.integrations.vllm.config import KVOffloadSettings
from kvoffload.integrations.vllm.engine_shape import VLLM_NULL_BLOCK, EngineShape
from kvoffload.integrations.vllm.lora_identity import LoraIdentities
from kvoffload.integrations.vllm.messages import KVOffloadWorkerMetadata
from kvoffload.integrations.vllm.requests import VllmRequestView
from kvoffload.integrations.vllm.stats import KVOffloadStats, StatsDelta
from kvoffload.keys import BlockHasher, OffloadKey
from kvoffload.tiers.base import OffloadingManager
from kvoffload.tiers.primary import CPUOffloadingManager
from kvoffload.tiers.secondary import RankedChunkBuffer
from kvoffload.worker import HostPool

if TYPE_CHECKING:
    from vllm.distributed.kv_events import KVCacheEvent

    from kvoffload.integrations.vllm.kv_events import KVEventDescriber

logger = logging.getLogger(__name__)

BlockTable = tuple[tuple[int, ...], ...]


def _table(ids: Iterable[Iterable[int] | None]) -> BlockTable:
    return tuple(tuple(group or ()) for group in ids)


def build_manager(
    settings: KVOffloadSettings, shape: EngineShape, enable_events: bool
) -> tuple[OffloadingManager, list[HostPool], EngineShape]:
    """The primary tier, behind a tiering manager when secondary tiers are set.

    Secondary tiers read and write the workers' host pools, attached by name:
    with tensor parallelism, every rank's, a chunk being all ranks' slices
    (`RankedChunkBuffer`). Returns the manager, the pools attached and `shape`
    with the KV layouts the pools' workers recorded (vLLM registers the
    workers' KV caches before it creates the scheduler).
    """
    geometry = shape.pool_geometry()
    primary = CPUOffloadingManager(
        shape.host_slots(settings.cpu_bytes_to_use),
        settings.eviction_policy,
        store_threshold=settings.store_threshold,
        max_tracker_size=settings.max_tracker_size,
        enable_events=enable_events,
        max_hinted_share=settings.max_hinted_share,
    )
    if not settings.secondary_tiers:
        return primary, [], shape
    from kvoffload.tiering import create_tiering_manager

    pools: list[HostPool] = []
    try:
        for rank in range(shape.tp_size):
            pools.append(
                HostPool.attach(shape.pool_name(rank), geometry, primary.num_chunks)
            )
        buffer = pools[0] if len(pools) == 1 else RankedChunkBuffer(pools)
        shape = shape.with_kv_layouts(pool.layout for pool in pools)
        manager = create_tiering_manager(
            primary,
            settings.secondary_tiers,
            buffer,
            shape.tiers_fingerprint(),
            max_hinted_share=settings.max_hinted_share,
        )
    except BaseException:
        for pool in pools:
            pool.close()
        raise
    return manager, pools, shape


class SchedulerSide:
    """Everything the scheduler-role connector does."""

    def __init__(
        self,
        settings: KVOffloadSettings,
        shape: EngineShape,
        events: KVEventDescriber | None = None,
    ):
        """`events`, with vLLM's KV events on, describes chunks for them."""
        self._events = events
        self.manager, self._pools, shape = build_manager(
            settings, shape, events is not None
        )
        self.shape = shape
        config = ConnectorConfig(
            groups=tuple(
                GroupSpec(g.tokens_per_block, g.blocks_per_chunk) for g in shape.groups
            ),
            hash_block_tokens=shape.hash_block_tokens,
            offload_prompt_only=settings.offload_prompt_only,
            max_defer_s=settings.max_defer_s,
            world_size=shape.tp_size,
            # Without vLLM's prefix cache a load serves only its own request, so
            # waiting for another request's load of the same chunks gains nothing.
            engine_prefix_caching=shape.prefix_caching,
            null_block_id=VLLM_NULL_BLOCK,
            # Less the null block, which vLLM never caches a prefix in.
            engine_blocks=max(1, shape.num_blocks - 1),
        )
        self.connector = OffloadConnector(
            config,
            self.manager,
            observer=self._describe if events is not None else None,
        )
        self._hasher = BlockHasher(shape.hash_block_tokens)
        self._fingerprint = shape.model_fingerprint()
        self._loras = LoraIdentities()
        self._views: dict[str, VllmRequestView] = {}
        self._not_offloaded_told: set[str] = set()
        self._local_hit: dict[str, int] = {}
        self._stats = StatsDelta()

    def _describe(
        self, request_id: str, group: int, chunks: Sequence[tuple[int, OffloadKey]]
    ) -> None:
        view = self._views.get(request_id)
        if view is not None and self._events is not None:
            self._events.describe(view.request, group, chunks)

    def _view(self, request: Any) -> VllmRequestView:
        view = self._views.get(request.request_id)
        if view is None:
            view = VllmRequestView(
                request,
                self._hasher,
                self._fingerprint,
                self._loras,
                mm_by_content=self.shape.mm_by_content,
            )
            self._views[request.request_id] = view
            self._tell_not_offloaded(view)
            self.connector.on_new_request(view)
        return view

    def _tell_not_offloaded(self, view: VllmRequestView) -> None:
        """Log, once per engine and reason, that requests are not offloaded."""
        reason = view.not_offloaded_because
        if reason is None or reason in self._not_offloaded_told:
            return
        self._not_offloaded_told.add(reason)
        logger.warning(
            "kvoffload: request %s, and every request like it, is not offloaded: %s",
            view.request_id,
            reason,
        )

    # -- requests ----------------------------------------------------------------

    def on_new_request(self, request: Any) -> None:
        self._view(request)

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        view = self._view(request)
        self._local_hit[request.request_id] = num_computed_tokens
        found = self.connector.get_num_new_matched_tokens(view, num_computed_tokens)
        if found is None:
            return None, False
        # Loads are asynchronous: the request waits (without computing) until its
        # chunks land, and a failed load is reported for that request alone.
        return found, found > 0

    def update_state_after_alloc(
        self, request: Any, blocks: Any, num_external_tokens: int
    ) -> None:
        req_id = request.request_id
        self._follow_rewrite(request)
        local = self._local_hit.pop(req_id, int(request.num_computed_tokens))
        self.connector.update_state_after_alloc(
            req_id, _table(blocks.get_block_ids()), local, num_external_tokens
        )

    def _follow_rewrite(self, request: Any) -> None:
        """Tell the connector of a streaming-input session's next input: vLLM
        allocates for it, before scheduling it, with no lookup."""
        view = self._views.get(request.request_id)
        kept = view.take_rewrite() if view is not None else None
        if view is None or kept is None:
            return
        self._tell_not_offloaded(view)  # its input may bring an image
        logger.debug(
            "request %s took its next input: tokens from %d on are new",
            request.request_id,
            kept,
        )
        self.connector.on_request_rewritten(request.request_id, kept)

    def request_finished(self, request: Any) -> tuple[bool, dict[str, Any] | None]:
        req_id = request.request_id
        self._local_hit.pop(req_id, None)
        if self._views.pop(req_id, None) is None:
            return False, None
        self.connector.request_finished(req_id)
        # Blocks go back to vLLM at once: reusing one that a store still reads is
        # fenced in a later step's plan.
        return False, None

    # -- per step ----------------------------------------------------------------

    def build_step(self, scheduler_output: Any) -> StepPlan:
        preempted = getattr(scheduler_output, "preempted_req_ids", None) or ()
        if preempted:
            self.connector.on_preempted(preempted)
        return self.connector.build_step(list(self._scheduled(scheduler_output)))

    def _scheduled(self, out: Any) -> Iterable[ScheduledRequest]:
        tokens = out.num_scheduled_tokens
        for new in out.scheduled_new_reqs:
            yield ScheduledRequest(
                new.req_id,
                int(new.num_computed_tokens),
                int(tokens.get(new.req_id, 0)),
                _table(new.block_ids),
                replace_block_ids=True,
            )
        cached = out.scheduled_cached_reqs
        resumed = set(getattr(cached, "resumed_req_ids", ()) or ())
        for i, req_id in enumerate(cached.req_ids):
            new_ids = cached.new_block_ids[i]
            yield ScheduledRequest(
                req_id,
                int(cached.num_computed_tokens[i]),
                int(tokens.get(req_id, 0)),
                _table(new_ids) if new_ids is not None else (),
                replace_block_ids=req_id in resumed,
            )

    def on_worker_results(self, meta: KVOffloadWorkerMetadata | None) -> None:
        if meta is None:
            return
        for rank, results in sorted(meta.results.items()):
            self.connector.on_job_results(results, rank)
        self.connector.take_load_results()  # the workers report loads to vLLM

    def on_schedule_end(self) -> None:
        self.connector.on_schedule_end()

    # -- cache-wide --------------------------------------------------------------

    def take_events(self) -> list[KVCacheEvent]:
        """vLLM KV events for the chunks stored and removed since the last call."""
        events = self.connector.take_events()
        return self._events.translate(events) if self._events is not None else []

    def get_stats(self) -> KVOffloadStats:
        return self._stats.take(
            self.connector.get_tier_stats(), self.connector.get_stats()
        )

    def reset_cache(self) -> bool:
        self.connector.reset_cache()
        if self._events is not None:
            self._events.reset()
        return True

    def shutdown(self) -> None:
        try:
            self.connector.shutdown()
        finally:
            for pool in self._pools:
                pool.close()

    def live_requests(self) -> Sequence[str]:
        return list(self._views)

"""`KVOffloadConnector`: kvoffload as a vLLM KV connector.

    kv_transfer_config={"kv_connector": "KVOffloadConnector",
                        "kv_connector_module_path": "kvoffload.integrations.vllm",
                        "kv_role": "kv_both",
                        "kv_connector_extra_config": {"cpu_bytes_to_use": "16GiB"}}

Thin by design: it parses the configuration once, then dispatches each vLLM hook
to the scheduler-side or worker-side half, which translate and delegate to
kvoffload's connector, managers and data plane. Tested on vLLM 0.32.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_events import KVCacheEvent
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    KVConnectorWorkerMetadata,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvoffload.integrations.vllm.config import KVOffloadSettings
from kvoffload.integrations.vllm.describe import log_start_up
from kvoffload.integrations.vllm.engine_shape import EngineShape
from kvoffload.integrations.vllm.in_process import refuse_another_engine, release_worker
from kvoffload.integrations.vllm.kv_events import KVEventDescriber
from kvoffload.integrations.vllm.messages import (
    KVOffloadMetadata,
    KVOffloadWorkerMetadata,
)
from kvoffload.integrations.vllm.scheduler_side import SchedulerSide
from kvoffload.integrations.vllm.stats import KVOffloadPromMetrics, KVOffloadStats
from kvoffload.integrations.vllm.worker_side import WorkerSide

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request


logger = logging.getLogger(__name__)


def _follow_vllm_logging() -> None:
    """kvoffload's log records go where vLLM's go, in vLLM's format and level."""
    ours = logging.getLogger("kvoffload")
    if ours.handlers:
        return
    theirs = logging.getLogger("vllm")
    for handler in theirs.handlers:
        ours.addHandler(handler)
    ours.setLevel(theirs.getEffectiveLevel())
    ours.propagate = not theirs.handlers


def _tp_rank() -> int:
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

    return int(get_tensor_model_parallel_rank())


class KVOffloadConnector(KVConnectorBase_V1, SupportsHMA):
    """Tiered KV offloading (host memory, disk, Redis) behind vLLM's prefix cache."""

    _cache_hit_source = CacheHitSource.HOST

    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig,
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        _follow_vllm_logging()
        transfer = vllm_config.kv_transfer_config
        assert transfer is not None
        if transfer.kv_load_failure_policy != "recompute":
            # A failed load of a cached prefix is a cache miss: the request
            # recomputes it (vLLM's default, "fail", would fail the request).
            logger.info("kvoffload: kv_load_failure_policy set to 'recompute'")
            transfer.kv_load_failure_policy = "recompute"
        self.engine_id = str(transfer.engine_id)
        """Names the engine, its host pools and its connectors in this process."""
        self._scheduler: SchedulerSide | None = None
        self._worker: WorkerSide | None = None
        try:
            self._settings = KVOffloadSettings.from_extra_config(
                transfer.kv_connector_extra_config
            )
            self._start(vllm_config, role, kv_cache_config)
        except BaseException:
            if role == KVConnectorRole.SCHEDULER:
                # In-process, this engine's worker already holds its host pool.
                release_worker(self.engine_id)
            raise

    def _start(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig,
    ) -> None:
        # Only the scheduler names chunks: a worker skips reading the weights.
        shape = EngineShape.from_vllm(
            vllm_config,
            kv_cache_config,
            self._settings,
            identify_model=role == KVConnectorRole.SCHEDULER,
        )
        if role == KVConnectorRole.SCHEDULER:
            events = vllm_config.kv_events_config
            # Stores in flight each hold a host slot: no more are pending.
            slots = shape.host_slots(self._settings.cpu_bytes_to_use)
            describer = (
                KVEventDescriber(kv_cache_config, shape, pending=slots)
                if events is not None and events.enable_kv_cache_events
                else None
            )
            self._scheduler = SchedulerSide(self._settings, shape, describer)
            log_start_up(self._settings)  # once per engine: its scheduler's
        else:
            self._worker = WorkerSide(self._settings, shape, _tp_rank())

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a cache: a dropped store is a later miss, never lost data

    @property
    def scheduler_side(self) -> SchedulerSide:
        assert self._scheduler is not None, "scheduler-side hook called on a worker"
        return self._scheduler

    @property
    def worker_side(self) -> WorkerSide:
        assert self._worker is not None, "worker-side hook called on the scheduler"
        return self._worker

    # -- worker side -------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        refuse_another_engine(self.engine_id, self.shutdown)
        self.worker_side.register_kv_caches(kv_caches)

    def handle_preemptions(self, connector_metadata: KVConnectorMetadata) -> None:
        if isinstance(connector_metadata, KVOffloadMetadata):
            self.worker_side.bind(connector_metadata.plan)

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        assert isinstance(connector_metadata, KVOffloadMetadata)
        self.worker_side.bind(connector_metadata.plan)

    def clear_connector_metadata(self) -> None:
        super().clear_connector_metadata()
        self.worker_side.clear()

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        self.worker_side.start_loads()

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads are asynchronous: their requests are not in the batch

    def save_kv_layer(
        self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return  # stores start after the forward pass, in wait_for_save

    def wait_for_save(self) -> None:
        self.worker_side.start_stores()

    def get_finished(
        self, finished_req_ids: set[str]
    ) -> tuple[set[str] | None, set[str] | None]:
        done, _ = self.worker_side.take_finished()
        return None, done

    def get_transfer_results(
        self, finished_req_ids: set[str]
    ) -> KVConnectorTransferResults:
        done, failed = self.worker_side.take_finished()
        return KVConnectorTransferResults(finished_recving=done, failed_recving=failed)

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        return self.worker_side.take_worker_metadata()

    # -- scheduler side ----------------------------------------------------------

    def on_new_request(self, request: Request) -> None:
        self.scheduler_side.on_new_request(request)

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return self.scheduler_side.get_num_new_matched_tokens(
            request, num_computed_tokens
        )

    def update_state_after_alloc(
        self, request: Request, blocks: Any, num_external_tokens: int
    ) -> None:
        self.scheduler_side.update_state_after_alloc(
            request, blocks, num_external_tokens
        )

    def build_connector_meta(
        self, scheduler_output: SchedulerOutput
    ) -> KVConnectorMetadata:
        plan = self.scheduler_side.build_step(scheduler_output)
        self.scheduler_side.on_schedule_end()
        return KVOffloadMetadata(plan)

    def update_connector_output(self, connector_output: Any) -> None:
        meta = connector_output.kv_connector_worker_meta
        self.scheduler_side.on_worker_results(
            meta if isinstance(meta, KVOffloadWorkerMetadata) else None
        )

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self.scheduler_side.request_finished(request)

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self.scheduler_side.request_finished(request)

    def has_pending_push_work(self) -> bool:
        # Keep the engine stepping while transfer jobs or tier work (cascades to
        # secondary tiers, promotions) run: their completions are taken in the
        # step hooks, so with no request running they would wait for the next one.
        return (
            self._scheduler is not None and self._scheduler.connector.has_pending_work()
        )

    def take_events(self) -> Iterable[KVCacheEvent]:
        return self.scheduler_side.take_events()

    def reset_cache(self) -> bool | None:
        return self.scheduler_side.reset_cache()

    # -- both --------------------------------------------------------------------

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        if self._scheduler is None:
            return None  # job results reach the scheduler side, which counts
        return self._scheduler.get_stats()

    @classmethod
    def build_kv_connector_stats(
        cls, data: dict[str, Any] | None = None
    ) -> KVConnectorStats | None:
        return KVOffloadStats(dict(data or {}))

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KVConnectorPromMetrics | None:
        return KVOffloadPromMetrics(
            vllm_config, metric_types, labelnames, per_engine_labelvalues
        )

    def shutdown(self) -> None:
        if self._scheduler is not None:
            self._scheduler.shutdown()
        if self._worker is not None:
            self._worker.shutdown()

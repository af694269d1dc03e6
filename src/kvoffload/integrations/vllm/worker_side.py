"""The worker-side half of the vLLM connector: run the plan's jobs on the data plane.

Per step: finish the jobs the plan fences (before anything writes their blocks),
start the loads, start the stores once the forward pass has computed their blocks,
then report finished loads to vLLM (per request) and every job result to the
scheduler side (worker metadata). Loads the plan names stale (planned before a
reset) are reported failed to vLLM, which recomputes their requests.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from kvoffload.connector import StepPlan
from kvoffload.integrations.vllm.config import KVOffloadSettings
from kvoffload.integrations.vllm.engine_shape import EngineShape
from kvoffload.integrations.vllm.messages import KVOffloadWorkerMetadata
from kvoffload.worker import HostPool, JobResult, TransferWorker

logger = logging.getLogger(__name__)

_CPU_SWITCH_INTERVAL_S = 0.0005


class WorkerSide:
    """Everything the worker-role connector does, for one rank."""

    def __init__(
        self, settings: KVOffloadSettings, shape: EngineShape, rank: int
    ) -> None:
        self._settings = settings
        self._shape = shape
        self._rank = rank
        self._pool: HostPool | None = None
        self._worker: TransferWorker | None = None
        self._plan: StepPlan | None = None
        self._loads_started = False
        self._stores_started = False
        self._load_owner: dict[int, str] = {}
        # Loads submitted before a reset of the scheduler side: reported failed.
        self._stale_loads: set[int] = set()
        self._results: list[JobResult] = []

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        """Create the data plane for `kv_caches`; registered again, the previous
        one (and its host pool) goes first. A failure once the pool exists
        releases it, so that no start leaves a pool behind in a live process."""
        from kvoffload.worker.factory import create_data_plane
        from kvoffload.worker.layout import GroupSpec

        specs = [
            GroupSpec(
                group=g.index,
                layer_names=tuple(name for name in g.layer_names if name in kv_caches),
                num_blocks=self._shape.num_blocks,
                blocks_per_chunk=g.blocks_per_chunk,
            )
            for g in self._shape.groups
        ]
        self._release_data_plane()
        layout, self._pool, self._worker = create_data_plane(
            kv_caches,
            specs,
            self._settings.cpu_bytes_to_use,
            ranks=self._shape.tp_size,
            pool_name=self._shape.pool_name(self._rank),
        )
        try:
            self._announce(layout.device)
        except BaseException:
            self._release_data_plane()
            raise

    def _announce(self, device: str) -> None:
        assert self._pool is not None
        if device == "cpu":
            # The copy thread takes the GIL back after every copy; with the engine
            # thread busy in Python that wait is the switch interval (5 ms by
            # default) each time, which would dwarf the copies themselves.
            sys.setswitchinterval(min(sys.getswitchinterval(), _CPU_SWITCH_INTERVAL_S))
        logger.info(
            "kvoffload: host pool %s with %d chunk slots of %d bytes",
            self._shape.pool_name(self._rank),
            self._pool.num_slots,
            self._pool.slot_nbytes,
        )

    @property
    def worker(self) -> TransferWorker:
        if self._worker is None:
            raise RuntimeError("kvoffload: register_kv_caches was not called")
        return self._worker

    def bind(self, plan: StepPlan) -> None:
        self._plan = plan
        self._loads_started = self._stores_started = False
        # Those already reported were reported before the reset was known.
        owners = self._load_owner
        self._stale_loads.update(j for j in plan.stale_loads if j in owners)
        self._fence()

    def clear(self) -> None:
        self._plan = None

    def _fence(self) -> None:
        if self._plan is not None and self._plan.wait_for:
            self.worker.wait(self._plan.wait_for)

    def start_loads(self) -> None:
        plan = self._plan
        if plan is None or self._loads_started:
            return
        self._loads_started = True
        self._fence()
        for job in plan.loads:
            self._load_owner[job.job_id] = plan.request_of[job.job_id]
            self.worker.submit(job)

    def start_stores(self) -> None:
        plan = self._plan
        if plan is None or self._stores_started:
            return
        self._stores_started = True
        self.start_loads()  # a step without a forward pass still starts its loads
        for job in plan.stores:
            self.worker.submit(job)

    def take_finished(self) -> tuple[set[str], set[str]]:
        """(loaded, failed) request ids; every result is kept for the scheduler."""
        done: set[str] = set()
        failed: set[str] = set()
        for result in self.worker.get_finished():
            self._results.append(result)
            req_id = self._load_owner.pop(result.job_id, None)
            if req_id is None:
                continue
            done.add(req_id)
            if result.job_id in self._stale_loads:
                self._stale_loads.discard(result.job_id)
                failed.add(req_id)
            elif not result.success:
                failed.add(req_id)
                logger.warning(
                    "kvoffload: load for request %s failed; it recomputes", req_id
                )
        return done, failed

    def take_worker_metadata(self) -> KVOffloadWorkerMetadata | None:
        if not self._results:
            return None
        results, self._results = self._results, []
        return KVOffloadWorkerMetadata({self._rank: results})

    def shutdown(self) -> None:
        self._release_data_plane()

    def _release_data_plane(self) -> None:
        worker, pool = self._worker, self._pool
        self._worker = self._pool = None
        try:
            if worker is not None:
                worker.shutdown()
        finally:
            if pool is not None:
                pool.close()

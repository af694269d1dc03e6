"""The CPU data plane: copies chunks between CPU KV tensors and the host pool.

Both sides are plain memory, so each job is a series of numpy gathers (store)
and scatters (load) over `uint8` views, one per region and run. numpy releases
the GIL while it copies and runs single-threaded, so the worker thread overlaps
the engine without fighting its OpenMP threads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import numpy.typing as npt

from kvoffload.worker.base import JobResult, TransferDirection, TransferJob
from kvoffload.worker.host_pool import HostPool
from kvoffload.worker.layout import KVCaches, KVLayout, engine_block_view, layer_tensors
from kvoffload.worker.plan import GroupPlan, plan_job
from kvoffload.worker.queued import PendingJob, QueuedTransferWorker

logger = logging.getLogger(__name__)

Bytes2D = npt.NDArray[np.uint8]
Bytes3D = npt.NDArray[np.uint8]


class CpuTransferWorker(QueuedTransferWorker):
    """Runs jobs for KV tensors on the CPU on one worker thread.

    The engine's forward pass on CPU is synchronous, so every write to a block
    has landed by the time a job naming it is submitted; jobs need no events.
    With `copy_threads` > 1 the regions of a job are split between that many
    threads: faster where one core cannot saturate memory, at the cost of cores
    the engine computes on.
    """

    def __init__(
        self,
        kv_caches: KVCaches,
        layout: KVLayout,
        pool: HostPool,
        *,
        clock: Callable[[], float] = time.perf_counter,
        copy_threads: int = 1,
    ) -> None:
        if type(copy_threads) is not int or copy_threads < 1:
            raise ValueError(f"copy_threads: {copy_threads!r} is not an integer >= 1")
        if layout.device != "cpu":
            raise ValueError(f"CpuTransferWorker: KV tensors are on {layout.device}")
        check_pool(layout, pool)
        self._layout = layout
        self._pool = pool
        self._host = pool.array
        self._clock = clock
        # Per group and region: the engine's blocks [num_blocks, bytes] and the
        # pool seen as [num_slots, blocks_per_chunk, bytes] for that region.
        self._regions: dict[int, list[tuple[Bytes2D, Bytes3D]]] = {}
        for group in layout.groups:
            self._regions[group.group] = [
                (
                    engine_block_view(
                        layer_tensors(kv_caches, region.layer)[region.part],
                        region,
                        group.num_blocks,
                    ).numpy(),
                    np.lib.stride_tricks.as_strided(
                        self._host[offset:],
                        (pool.num_slots, group.blocks_per_chunk, region.block_nbytes),
                        (pool.slot_nbytes, region.block_nbytes, 1),
                    ),
                )
                for region, offset in zip(
                    group.regions, group.chunk_offsets, strict=True
                )
            ]
        self._helpers = (
            ThreadPoolExecutor(copy_threads - 1, "kvoffload-cpu-copy")
            if copy_threads > 1
            else None
        )
        self._copy_threads = copy_threads
        super().__init__("kvoffload-cpu-transfer")

    def _execute(self, job: TransferJob, ticket: object) -> JobResult | PendingJob:
        start = self._clock()
        try:
            plans = plan_job(job, self._layout, self._pool.num_slots)
            for plan in plans:
                self._copy(plan, job.direction is TransferDirection.STORE)
        except (ValueError, IndexError, RuntimeError) as exc:
            logger.warning("transfer job %s failed: %s", job.job_id, exc)
            return JobResult(job.job_id, success=False)
        nbytes = sum(plan.num_bytes for plan in plans)
        return JobResult(job.job_id, True, nbytes, self._clock() - start)

    def _copy(self, plan: GroupPlan, store: bool) -> None:
        regions = self._regions[plan.layout.group]
        if self._helpers is None:
            _copy_regions(plan, regions, store)
            return
        share = -(-len(regions) // self._copy_threads)
        helped = [
            self._helpers.submit(_copy_regions, plan, regions[i : i + share], store)
            for i in range(share, len(regions), share)
        ]
        _copy_regions(plan, regions[:share], store)
        for future in helped:
            future.result()

    def _release(self) -> None:
        if self._helpers is not None:
            self._helpers.shutdown()


def _copy_regions(
    plan: GroupPlan, regions: list[tuple[Bytes2D, Bytes3D]], store: bool
) -> None:
    """Copy `plan`'s runs for `regions` (engine view, pool view) one by one."""
    for run in plan.runs:
        slot, first, count = run.slot, run.first, len(run.engine_blocks)
        start = run.engine_start
        if start is not None:
            for device, pool in regions:
                host, blocks = (
                    pool[slot, first : first + count],
                    device[start : start + count],
                )
                if store:
                    np.copyto(host, blocks)
                else:
                    np.copyto(blocks, host)
            continue
        indices = np.asarray(run.engine_blocks, dtype=np.intp)
        for device, pool in regions:
            host = pool[slot, first : first + count]
            if store:
                # The method skips np.take's Python wrapper (a microsecond a
                # call); "clip" lets numpy write into `out` without a buffer,
                # and the plan has checked every index, so nothing is clipped.
                device.take(indices, 0, host, "clip")
            else:
                device[indices] = host


def check_pool(layout: KVLayout, pool: HostPool) -> None:
    """`ValueError` unless `pool` was sized for `layout`."""
    if pool.geometry != layout.geometry:
        raise ValueError(
            f"host pool geometry {pool.geometry} does not match the KV layout's "
            f"{layout.geometry}"
        )

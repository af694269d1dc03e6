"""The CUDA data plane: copies chunks between GPU KV tensors and the host pool.

Loads and stores run on two streams of their own, so neither queues behind the
other or behind the engine's compute. Each job first waits for an event recorded
on the engine's current stream at submit time: the engine's writes to the blocks
a job reads or overwrites are ordered before its copies. The bytes move through
a device staging tensor in host order (`staging`), so a whole chunk of every
layer is one asynchronous copy to or from page-locked host memory. A job's end
event tells when its bytes have landed.
"""

from __future__ import annotations

import logging

import torch

from kvoffload.worker.base import JobResult, TransferDirection, TransferJob
from kvoffload.worker.cpu_worker import check_pool
from kvoffload.worker.host_pool import HostPool
from kvoffload.worker.layout import KVCaches, KVLayout, engine_block_view, layer_tensors
from kvoffload.worker.pinning import host_register, host_unregister
from kvoffload.worker.plan import GroupPlan, plan_job
from kvoffload.worker.queued import PendingJob, QueuedTransferWorker
from kvoffload.worker.staging import batches, load_staged, store_staged, upload

logger = logging.getLogger(__name__)


class _CudaJob:
    """A job issued on a stream; finished when its end event has completed."""

    def __init__(
        self, job_id: int, nbytes: int, start: torch.cuda.Event, end: torch.cuda.Event
    ) -> None:
        self._job_id = job_id
        self._nbytes = nbytes
        self._start = start
        self._end = end
        self._error: str | None = None

    def done(self) -> bool:
        try:
            return bool(self._end.query())  # type: ignore[no-untyped-call]
        except RuntimeError as exc:  # an asynchronous CUDA error of the copies
            self._error = str(exc)
            return True

    def wait(self) -> None:
        try:
            self._end.synchronize()
        except RuntimeError as exc:
            self._error = str(exc)

    def result(self) -> JobResult:
        if self._error is not None:
            logger.warning("transfer job %s failed: %s", self._job_id, self._error)
            return JobResult(self._job_id, success=False)
        seconds = self._start.elapsed_time(self._end) / 1000.0
        return JobResult(self._job_id, True, self._nbytes, seconds)


class CudaTransferWorker(QueuedTransferWorker):
    """Runs jobs for KV tensors on one CUDA device.

    The worker thread only issues copies; they run on the device. `pin` page-locks
    the host pool (`cudaHostRegister`) so that copies are truly asynchronous; if
    that fails the copies still work, slower, and a warning says so. A job is
    staged on the device `staging_nbytes` at a time (twice that at most is
    allocated from the engine's device memory while it runs).
    """

    def __init__(
        self,
        kv_caches: KVCaches,
        layout: KVLayout,
        pool: HostPool,
        *,
        pin: bool = True,
        staging_nbytes: int = 64 << 20,
    ) -> None:
        device = torch.device(layout.device)
        if device.type != "cuda":
            raise ValueError(f"CudaTransferWorker: KV tensors are on {layout.device}")
        check_pool(layout, pool)
        self._device = device
        self._layout = layout
        self._pool = pool
        self._staging_nbytes = staging_nbytes
        self._engine: dict[int, list[torch.Tensor]] = {
            group.group: [
                engine_block_view(
                    layer_tensors(kv_caches, region.layer)[region.part],
                    region,
                    group.num_blocks,
                )
                for region in group.regions
            ]
            for group in layout.groups
        }
        self._host = torch.from_numpy(pool.array)
        self._pinned = pin and host_register(self._host.data_ptr(), pool.nbytes)
        self._load_stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        self._store_stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        super().__init__("kvoffload-cuda-transfer")

    def _on_submit(self, job: TransferJob) -> object:
        ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
        ready.record(torch.cuda.current_stream(self._device))
        return ready

    def _execute(self, job: TransferJob, ticket: object) -> JobResult | PendingJob:
        assert isinstance(ticket, torch.cuda.Event)
        store = job.direction is TransferDirection.STORE
        stream = self._store_stream if store else self._load_stream
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        try:
            plans = plan_job(job, self._layout, self._pool.num_slots)
            with torch.cuda.device(self._device), torch.cuda.stream(stream):
                stream.wait_event(ticket)
                start.record(stream)
                for plan in plans:
                    self._copy(plan, store)
                end.record(stream)
        except (ValueError, IndexError, RuntimeError) as exc:
            logger.warning("transfer job %s failed: %s", job.job_id, exc)
            return JobResult(job.job_id, success=False)
        return _CudaJob(job.job_id, sum(p.num_bytes for p in plans), start, end)

    def _copy(self, plan: GroupPlan, store: bool) -> None:
        engine = self._engine[plan.layout.group]
        slot_nbytes = self._pool.slot_nbytes
        for piece in batches(plan, self._staging_nbytes):
            blocks = [b for run in piece.runs for b in run.engine_blocks]
            index = upload(blocks, self._device)
            if store:
                store_staged(piece, engine, index, self._host, slot_nbytes, _async_copy)
            else:
                load_staged(piece, engine, index, self._host, slot_nbytes, _async_copy)

    def _release(self) -> None:
        if self._pinned:
            host_unregister(self._host.data_ptr())
            self._pinned = False


def _async_copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.copy_(src, non_blocking=True)

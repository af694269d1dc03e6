"""The CUDA data plane: copies chunks between GPU KV tensors and the host pool.

Each direction has a lane of two streams, so that neither direction queues
behind the other or behind the engine's compute, and a piece's host copies
overlap the next piece's gather or scatter: a store gathers a piece into a
staging buffer on the lane's move stream, then copies it to page-locked host
memory on its copy stream; a load copies to staging first, then scatters. Two
staging buffers per lane alternate, each reused only once the stream that read
it last has finished with it. Every job first waits for an event recorded on the
engine's current stream at submit time, so the engine's writes to the blocks a
job reads or overwrites are ordered before its copies. A job's end event tells
when its bytes have landed; a job that fails after issuing copies is reported
failed only once those copies have ended, so no copy of it writes a slot or an
engine block after its failure is known (and the slot freed).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from kvoffload.worker.base import JobResult, TransferDirection, TransferJob
from kvoffload.worker.cpu_worker import check_pool
from kvoffload.worker.host_pool import HostPool
from kvoffload.worker.layout import KVCaches, KVLayout, engine_block_view, layer_tensors
from kvoffload.worker.pinning import host_register, host_unregister
from kvoffload.worker.plan import plan_job
from kvoffload.worker.queued import PendingJob, QueuedTransferWorker
from kvoffload.worker.staging import (
    ChunkMover,
    StagedPiece,
    batches,
    copy_spans,
    load_partial,
    stage,
    store_partial,
    upload,
)
from kvoffload.worker.triton_mover import chunk_mover

logger = logging.getLogger(__name__)


class _CudaJob:
    """A job issued on the streams; finished when its end event has completed.

    `error` set at issue time (a failure after some copies were issued) is
    reported once the end event has completed, not before."""

    def __init__(
        self,
        job_id: int,
        nbytes: int,
        start: torch.cuda.Event,
        end: torch.cuda.Event,
        error: str | None = None,
    ) -> None:
        self._job_id = job_id
        self._nbytes = nbytes
        self._start = start
        self._end = end
        self._error = error

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


def _event(timing: bool = False) -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=timing)  # type: ignore[no-untyped-call]


@dataclass
class _Lane:
    """One direction's streams and its two alternating staging buffers."""

    move: torch.cuda.Stream
    copy: torch.cuda.Stream
    nbytes: int
    buffers: list[torch.Tensor] = field(default_factory=list)
    free: list[torch.cuda.Event | None] = field(default_factory=lambda: [None, None])
    turn: int = 0

    def next_buffer(self, device: torch.device) -> tuple[int, torch.Tensor]:
        if not self.buffers:
            self.buffers = [
                torch.empty(self.nbytes, dtype=torch.uint8, device=device)
                for _ in range(2)
            ]
        k, self.turn = self.turn, 1 - self.turn
        return k, self.buffers[k]

    def join(self) -> None:
        """Both streams wait for each other's work so far, which also frees
        both buffers (after a piece failed half-issued)."""
        moved = _event()
        moved.record(self.move)
        self.copy.wait_event(moved)
        copied = _event()
        copied.record(self.copy)
        self.move.wait_event(copied)
        self.free = [copied, copied]


class CudaTransferWorker(QueuedTransferWorker):
    """Runs jobs for KV tensors on one CUDA device.

    The worker thread only issues copies; they run on the device. `pin` page-locks
    the host pool (`cudaHostRegister`) so that copies are truly asynchronous; if
    that fails the copies still work, slower, and a warning says so. A job is
    staged on the device `staging_nbytes` at a time (at least one chunk); each
    direction keeps two such buffers from the engine's device memory once it has
    run a job. `mover` picks how chunks are gathered (`triton_mover.chunk_mover`).
    """

    def __init__(
        self,
        kv_caches: KVCaches,
        layout: KVLayout,
        pool: HostPool,
        *,
        pin: bool = True,
        staging_nbytes: int = 32 << 20,
        mover: str = "auto",
    ) -> None:
        device = torch.device(layout.device)
        if device.type != "cuda":
            raise ValueError(f"CudaTransferWorker: KV tensors are on {layout.device}")
        check_pool(layout, pool)
        self._device = device
        self._layout = layout
        self._pool = pool
        self._staging_nbytes = max(staging_nbytes, pool.slot_nbytes)
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
        with torch.cuda.device(device):
            self._movers: dict[int, ChunkMover] = {
                g.group: chunk_mover(g, self._engine[g.group], mover)
                for g in layout.groups
            }
            torch.cuda.synchronize(device)
        self._host = torch.from_numpy(pool.array)
        self._pinned = pin and host_register(self._host.data_ptr(), pool.nbytes)
        self._lanes = {
            direction: _Lane(
                torch.cuda.Stream(device),  # type: ignore[no-untyped-call]
                torch.cuda.Stream(device),  # type: ignore[no-untyped-call]
                self._staging_nbytes,
            )
            for direction in TransferDirection
        }
        super().__init__("kvoffload-cuda-transfer")

    @property
    def mover_names(self) -> dict[int, str]:
        """Each group's chunk mover, by class name (for reports)."""
        return {g: type(m).__name__ for g, m in self._movers.items()}

    def _on_submit(self, job: TransferJob) -> object:
        ready = _event()
        ready.record(torch.cuda.current_stream(self._device))
        return ready

    def _execute(self, job: TransferJob, ticket: object) -> JobResult | PendingJob:
        assert isinstance(ticket, torch.cuda.Event)
        lane = self._lanes[job.direction]
        try:
            plans = plan_job(job, self._layout, self._pool.num_slots)
        except ValueError as exc:
            logger.warning("transfer job %s failed: %s", job.job_id, exc)
            return JobResult(job.job_id, success=False)
        store = job.direction is TransferDirection.STORE
        # A store ends on its copy stream, a load on its move stream.
        first, last = (lane.move, lane.copy) if store else (lane.copy, lane.move)
        start = _event(timing=True)
        end = _event(timing=True)
        error: str | None = None
        with torch.cuda.device(self._device):
            lane.move.wait_event(ticket)  # the engine's writes come first
            start.record(first)
            try:
                for plan in plans:
                    for piece in batches(plan, self._staging_nbytes):
                        staged = stage(piece, self._pool.slot_nbytes)
                        if store:
                            self._store(lane, staged)
                        else:
                            self._load(lane, staged)
            except (RuntimeError, ValueError, IndexError) as exc:
                # Copies already issued may still run: the job ends, and is
                # reported failed, only after all of them (`join`).
                error = str(exc)
                lane.join()
            tail = _event()
            tail.record(first)
            last.wait_event(tail)
            end.record(last)
        return _CudaJob(job.job_id, sum(p.num_bytes for p in plans), start, end, error)

    def _store(self, lane: _Lane, staged: StagedPiece) -> None:
        group = staged.plan.layout.group
        engine = self._engine[group]
        k, buffer = lane.next_buffer(self._device)
        staging = buffer[: staged.staging_nbytes]
        free = lane.free[k]
        if free is not None:
            lane.move.wait_event(free)
        with torch.cuda.stream(lane.move):
            if staged.blocks:
                index = upload(staged.blocks, self._device)
                self._movers[group].gather(index, staging)
            store_partial(
                staged, engine, self._host, self._pool.slot_nbytes, _async_copy
            )
        gathered = _event()
        gathered.record(lane.move)
        lane.copy.wait_event(gathered)
        with torch.cuda.stream(lane.copy):
            copy_spans(staged, staging, self._host, store=True)
        done = _event()
        done.record(lane.copy)
        lane.free[k] = done

    def _load(self, lane: _Lane, staged: StagedPiece) -> None:
        group = staged.plan.layout.group
        engine = self._engine[group]
        k, buffer = lane.next_buffer(self._device)
        staging = buffer[: staged.staging_nbytes]
        free = lane.free[k]
        if free is not None:
            lane.copy.wait_event(free)
        with torch.cuda.stream(lane.copy):
            copy_spans(staged, staging, self._host, store=False)
        landed = _event()
        landed.record(lane.copy)
        lane.move.wait_event(landed)
        with torch.cuda.stream(lane.move):
            if staged.blocks:
                index = upload(staged.blocks, self._device)
                self._movers[group].scatter(index, staging)
            load_partial(
                staged, engine, self._host, self._pool.slot_nbytes, _async_copy
            )
        done = _event()
        done.record(lane.move)
        lane.free[k] = done

    def _release(self) -> None:
        torch.cuda.synchronize(self._device)
        for lane in self._lanes.values():
            lane.buffers = []
        if self._pinned:
            host_unregister(self._host.data_ptr())
            self._pinned = False


def _async_copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.copy_(src, non_blocking=True)

"""Helpers shared by the data-plane tests: build a worker, run a job to its end."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from kvoffload.worker.base import (
    GroupTransfer,
    JobResult,
    TransferDirection,
    TransferJob,
    TransferWorker,
)
from kvoffload.worker.factory import create_data_plane
from kvoffload.worker.host_pool import HostPool
from kvoffload.worker.layout import GroupSpec, KVCaches, describe_kv_caches

STORE, LOAD = TransferDirection.STORE, TransferDirection.LOAD


@contextmanager
def data_plane(
    caches: KVCaches, specs: Sequence[GroupSpec], num_slots: int
) -> Iterator[tuple[HostPool, TransferWorker]]:
    """A pool of `num_slots` slots and a worker for `caches`, shut down after."""
    slot_nbytes = describe_kv_caches(caches, specs).geometry.slot_nbytes
    _, pool, worker = create_data_plane(caches, specs, num_slots * slot_nbytes)
    try:
        yield pool, worker
    finally:
        worker.shutdown()
        pool.close()


def run_job(
    worker: TransferWorker,
    job_id: int,
    direction: TransferDirection,
    *transfers: tuple[int, Sequence[int], Sequence[int]],
) -> JobResult:
    """Submit one job of `(group, engine blocks, host blocks)` and wait for it."""
    groups = tuple(GroupTransfer(g, tuple(e), tuple(h)) for g, e, h in transfers)
    worker.submit(TransferJob(job_id, direction, groups))
    worker.wait([job_id])
    results = worker.get_finished()
    assert [r.job_id for r in results] == [job_id]
    return results[0]


def chunk_blocks(slots: Sequence[int], blocks_per_chunk: int) -> list[int]:
    """The host blocks of whole chunks in `slots`."""
    return [s * blocks_per_chunk + j for s in slots for j in range(blocks_per_chunk)]


def pick(count: int, total: int, generator: torch.Generator) -> list[int]:
    """`count` distinct random indices below `total`."""
    return torch.randperm(total, generator=generator)[:count].tolist()

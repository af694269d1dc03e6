"""The CUDA data plane: round trips on a GPU, and ordering against the engine."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from kvoffload.worker.base import (
    GroupTransfer,
    JobResult,
    TransferDirection,
    TransferJob,
)
from kvoffload.worker.cuda_worker import CudaTransferWorker
from kvoffload.worker.host_pool import HostPool
from kvoffload.worker.layout import GroupSpec, KVCaches, describe_kv_caches
from kvoffload.worker.staging import StagedPiece

from .kv_layouts import (
    GROUPS,
    LAYOUTS,
    GroupShape,
    Layout,
    block_bytes,
    make_caches,
    scramble,
)
from .support import LOAD, STORE, chunk_blocks, pick, run_job

needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device: the CUDA data plane is tested only on a GPU",
)
CUDA = torch.device("cuda")
MOVERS = ("torch", "triton")


@contextmanager
def cuda_plane(
    caches: KVCaches,
    specs: list[GroupSpec],
    num_slots: int,
    mover: str = "auto",
    staging_nbytes: int = 32 << 20,
    worker_class: type[CudaTransferWorker] = CudaTransferWorker,
) -> Iterator[tuple[HostPool, CudaTransferWorker]]:
    layout = describe_kv_caches(caches, specs)
    with HostPool.create(layout.geometry, num_slots) as pool:
        worker = worker_class(
            caches, layout, pool, mover=mover, staging_nbytes=staging_nbytes
        )
        try:
            yield pool, worker
        finally:
            worker.shutdown()


def test_cuda_worker_refuses_cpu_tensors() -> None:
    caches = make_caches(LAYOUTS[0], torch.float16, torch.device("cpu"), GROUPS[:1])
    spec = GroupSpec(0, GROUPS[0].layers, GROUPS[0].num_blocks, 1)
    layout = describe_kv_caches(caches, [spec])
    with (
        HostPool.create(layout.geometry, 1) as pool,
        pytest.raises(ValueError, match="cpu"),
    ):
        CudaTransferWorker(caches, layout, pool)


@needs_cuda
@pytest.mark.parametrize("mover", MOVERS)
@pytest.mark.parametrize("blocks_per_chunk", [1, 2, 4])
@pytest.mark.parametrize(
    "dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str
)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: layout.name)
def test_cuda_store_overwrite_load_restores_bytes(
    layout: Layout, dtype: torch.dtype, blocks_per_chunk: int, mover: str
) -> None:
    """Scenario: as on CPU, two groups stored from a GPU cache, overwritten, and
    loaded into other engine blocks come back byte for byte."""
    gen = torch.Generator().manual_seed(blocks_per_chunk)
    caches = make_caches(layout, dtype, CUDA)
    specs = [
        GroupSpec(g.group, g.layers, g.num_blocks, blocks_per_chunk) for g in GROUPS
    ]
    count = 2 * blocks_per_chunk
    slots = pick(4, 6, gen)
    sources = {g.group: pick(count, g.num_blocks, gen) for g in GROUPS}
    hosts = {0: chunk_blocks(slots[:2], blocks_per_chunk)}
    hosts[1] = chunk_blocks(slots[2:], blocks_per_chunk)
    targets = {g.group: pick(count, g.num_blocks, gen) for g in GROUPS}
    with cuda_plane(caches, specs, 6, mover) as (_, worker):
        assert set(worker.mover_names.values()) == {f"{mover.title()}ChunkMover"}
        stored = {
            g.group: [block_bytes(layout, caches, g, b) for b in sources[g.group]]
            for g in GROUPS
        }
        assert run_job(
            worker, 1, STORE, *((g, sources[g], hosts[g]) for g in (0, 1))
        ).success
        scramble(caches)
        assert run_job(
            worker, 2, LOAD, *((g, targets[g], hosts[g]) for g in (0, 1))
        ).success
        torch.cuda.synchronize()
    for g in GROUPS:
        for index, block in enumerate(targets[g.group]):
            assert torch.equal(
                block_bytes(layout, caches, g, block), stored[g.group][index]
            )


@needs_cuda
@pytest.mark.parametrize("mover", MOVERS)
def test_many_pieces_and_jobs_in_flight_round_trip(mover: str) -> None:
    """Scenario: staging holds one chunk, so every job is many pieces through the
    two alternating buffers; eight stores and then eight loads are all in
    flight at once, with partial chunks at the ends; every byte comes back."""
    layout = LAYOUTS[2]
    group = GroupShape(0, GROUPS[0].layers, tokens=4, num_blocks=96)
    caches = make_caches(layout, torch.bfloat16, CUDA, (group,))
    bpc = 2
    spec = GroupSpec(0, group.layers, group.num_blocks, bpc)
    chunk = describe_kv_caches(caches, [spec]).groups[0].block_nbytes * bpc
    gen = torch.Generator().manual_seed(5)
    order = torch.randperm(group.num_blocks, generator=gen).tolist()
    jobs = []  # disjoint engine blocks: jobs in flight together never share one
    for j in range(8):
        hosts = list(range(j * 3 * bpc + 1, (j + 1) * 3 * bpc))  # starts mid-chunk
        jobs.append((order[5 * j : 5 * j + 5], order[40 + 5 * j : 45 + 5 * j], hosts))
    with cuda_plane(caches, [spec], 24, mover, staging_nbytes=chunk) as (_, worker):
        stored = [
            [block_bytes(layout, caches, group, b) for b in e] for e, _, _ in jobs
        ]
        for job_id, (engine, _, hosts) in enumerate(jobs):
            worker.submit(_job(job_id, STORE, engine, hosts))
        worker.wait(range(len(jobs)))
        assert all(r.success for r in worker.get_finished())
        scramble(caches)
        for job_id, (_, targets, hosts) in enumerate(jobs):
            worker.submit(_job(100 + job_id, LOAD, targets, hosts))
        worker.wait(range(100, 100 + len(jobs)))
        assert all(r.success for r in worker.get_finished())
        torch.cuda.synchronize()
    for (_, targets, _), want in zip(jobs, stored, strict=True):
        for block, data in zip(targets, want, strict=True):
            assert torch.equal(block_bytes(layout, caches, group, block), data)


class _FailingAfterFirstPiece(CudaTransferWorker):
    """Fails a job while issuing its second piece, the first piece's copies
    still queued behind a busy engine."""

    def _store(self, lane: object, staged: StagedPiece) -> None:
        if getattr(self, "_issued", False):
            raise RuntimeError("injected failure mid-copy")
        self._issued = True
        super()._store(lane, staged)  # type: ignore[arg-type]


@needs_cuda
@pytest.mark.parametrize("mover", MOVERS)
def test_a_store_failing_mid_copy_is_reported_after_its_copies_end(
    mover: str,
) -> None:
    """Scenario: a store fails after issuing the copies of its first piece, which
    wait behind the engine's long computation. The failure is reported only
    once those copies have ended: the slot, freed then and rewritten, keeps what
    was written into it after the report."""
    layout = LAYOUTS[2]
    caches = make_caches(layout, torch.float32, CUDA, GROUPS[:1])
    group = GROUPS[0]
    spec = GroupSpec(0, group.layers, group.num_blocks, 1)
    chunk = describe_kv_caches(caches, [spec]).groups[0].block_nbytes
    with cuda_plane(
        caches,
        [spec],
        4,
        mover,
        staging_nbytes=chunk,
        worker_class=_FailingAfterFirstPiece,
    ) as (pool, worker):
        big = torch.randn(4096, 4096, device=CUDA)
        for _ in range(30):  # keep the engine's stream busy for a while
            big = torch.tanh(big @ big)
        worker.submit(_job(1, STORE, [0, 1, 2], [0, 2, 3]))
        result = _finished(worker, 1)
        assert not result.success
        pool.array[:chunk] = 7  # the slot, freed and reused
        torch.cuda.synchronize()
        assert (pool.array[:chunk] == 7).all()


@needs_cuda
def test_store_sees_engine_writes_issued_before_submit() -> None:
    """Scenario: the engine writes a block on its stream and, without
    synchronizing, submits its store; the stored bytes are the new ones."""
    layout = LAYOUTS[2]
    caches = make_caches(layout, torch.float32, CUDA, GROUPS[:1])
    spec = GroupSpec(0, GROUPS[0].layers, GROUPS[0].num_blocks, 1)
    with cuda_plane(caches, [spec], 2) as (pool, worker):
        for tensors in caches.values():
            big = torch.randn(4096, 4096, device=CUDA)
            for _ in range(8):  # keep the engine's stream busy for a while
                big = torch.tanh(big @ big)
            tensors[0][:, 3].fill_(1.5).add_(big[0, 0] * 0)
        assert run_job(worker, 1, STORE, (0, [3], [1])).success
        host = torch.from_numpy(pool.array[pool.slot_nbytes :][: pool.chunk_nbytes(0)])
        assert torch.all(host.view(torch.float32) == 1.5)


@needs_cuda
def test_load_lands_before_the_engine_reads_after_finish() -> None:
    """Scenario: a load reported finished has its bytes in the engine blocks
    for the engine's next kernel on its own stream."""
    layout = LAYOUTS[1]
    caches = make_caches(layout, torch.float32, CUDA, GROUPS[:1])
    group = GROUPS[0]
    spec = GroupSpec(0, group.layers, group.num_blocks, 1)
    with cuda_plane(caches, [spec], 4) as (_, worker):
        want = block_bytes(layout, caches, group, 2)
        assert run_job(worker, 1, STORE, (0, [2], [1])).success
        scramble(caches)
        assert run_job(worker, 2, LOAD, (0, [5], [1])).success
        got = block_bytes(layout, caches, group, 5)  # on the default stream
        assert torch.equal(got, want)


@needs_cuda
def test_pool_is_page_locked_while_the_worker_runs() -> None:
    caches = make_caches(LAYOUTS[0], torch.float16, CUDA, GROUPS[:1])
    spec = GroupSpec(0, GROUPS[0].layers, GROUPS[0].num_blocks, 1)
    with cuda_plane(caches, [spec], 2) as (pool, _):
        assert torch.from_numpy(pool.array).is_pinned()


def _job(
    job_id: int, direction: TransferDirection, engine: list[int], hosts: list[int]
) -> TransferJob:
    return TransferJob(
        job_id, direction, (GroupTransfer(0, tuple(engine), tuple(hosts)),)
    )


def _finished(worker: CudaTransferWorker, job_id: int) -> JobResult:
    while True:
        for result in worker.get_finished():
            if result.job_id == job_id:
                return result

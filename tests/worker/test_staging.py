"""The GPU path's staged copies, run on CPU tensors against the CPU worker.

Both paths must leave the same bytes in the host pool, so the CPU worker is the
oracle for the staging order (whole chunks in host order, partial chunks per
region, adjacent slots merged, jobs cut into bounded pieces).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvoffload.worker.base import GroupTransfer, TransferJob
from kvoffload.worker.host_pool import HostPool
from kvoffload.worker.layout import (
    GroupSpec,
    KVCaches,
    KVLayout,
    describe_kv_caches,
    engine_block_view,
    layer_tensors,
)
from kvoffload.worker.plan import plan_job
from kvoffload.worker.staging import (
    TorchChunkMover,
    batches,
    copy_spans,
    load_partial,
    stage,
    store_partial,
    upload,
)

from .kv_layouts import (
    GROUPS,
    LAYOUTS,
    GroupShape,
    Layout,
    block_bytes,
    make_caches,
    random_tensor,
    scramble,
)
from .support import LOAD, STORE, data_plane, run_job

CPU = torch.device("cpu")
NUM_SLOTS = 8
BIG = GroupShape(0, GROUPS[0].layers, tokens=4, num_blocks=24)


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.copy_(src)


def _staged(
    caches: KVCaches,
    layout: KVLayout,
    pool: HostPool,
    job: TransferJob,
    piece_nbytes: int,
) -> None:
    """`job` through the staging steps, in the order the CUDA worker issues
    them (gather then host copies for a store, the reverse for a load)."""
    host = torch.from_numpy(pool.array)
    for plan in plan_job(job, layout, pool.num_slots):
        group = plan.layout
        views = [
            engine_block_view(
                layer_tensors(caches, r.layer)[r.part], r, group.num_blocks
            )
            for r in group.regions
        ]
        mover = TorchChunkMover(group, views)
        for piece in batches(plan, piece_nbytes):
            staged = stage(piece, pool.slot_nbytes)
            staging = torch.empty(staged.staging_nbytes, dtype=torch.uint8)
            index = upload(staged.blocks, CPU)
            if job.direction is STORE:
                mover.gather(index, staging)
                store_partial(staged, views, host, pool.slot_nbytes, _copy)
                copy_spans(staged, staging, host, store=True)
            else:
                copy_spans(staged, staging, host, store=False)
                mover.scatter(index, staging)
                load_partial(staged, views, host, pool.slot_nbytes, _copy)


# Whole chunks in adjacent slots (merged), apart, and partial chunks at both ends.
HOST_BLOCKS = {
    1: [3, 4, 5, 0],
    2: [6, 7, 8, 9, 1, 2, 3, 12],
    4: [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 20, 21, 22, 23, 28],
}


@pytest.mark.parametrize("piece_nbytes", [1 << 30, 1], ids=["one-piece", "run-by-run"])
@pytest.mark.parametrize("blocks_per_chunk", [1, 2, 4])
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: layout.name)
def test_staged_copies_match_the_cpu_worker(
    layout: Layout, blocks_per_chunk: int, piece_nbytes: int
) -> None:
    torch.manual_seed(blocks_per_chunk)
    group = BIG
    caches = make_caches(layout, torch.bfloat16, CPU, (group,))
    specs = [GroupSpec(0, group.layers, group.num_blocks, blocks_per_chunk)]
    hosts = HOST_BLOCKS[blocks_per_chunk]
    sources = torch.randperm(group.num_blocks)[: len(hosts)].tolist()
    kv_layout = describe_kv_caches(caches, specs)
    store = TransferJob(1, STORE, (GroupTransfer(0, tuple(sources), tuple(hosts)),))
    with data_plane(caches, specs, NUM_SLOTS) as (oracle, worker):
        assert run_job(worker, 1, STORE, (0, sources, hosts)).success
        with HostPool.create(kv_layout.geometry, NUM_SLOTS) as pool:
            _staged(caches, kv_layout, pool, store, piece_nbytes)
            assert np.array_equal(pool.array, oracle.array)

            stored = [block_bytes(layout, caches, group, b) for b in sources]
            scramble(caches)
            targets = sources[::-1]
            load = TransferJob(
                2, LOAD, (GroupTransfer(0, tuple(targets), tuple(hosts)),)
            )
            _staged(caches, kv_layout, pool, load, piece_nbytes)
    for target, want in zip(targets, stored, strict=True):
        assert torch.equal(block_bytes(layout, caches, group, target), want)


def test_regions_of_different_sizes_are_staged_in_host_order() -> None:
    """K and V apart with different head sizes: whole chunks still staged."""
    torch.manual_seed(3)
    caches = {
        f"l{i}": (
            random_tensor((9, 4, 16), torch.float16, CPU),
            random_tensor((9, 4, 8), torch.float16, CPU),
        )
        for i in range(3)
    }
    specs = [GroupSpec(0, ("l0", "l1", "l2"), 9, 2)]
    kv_layout = describe_kv_caches(caches, specs)
    sources, hosts = [4, 1, 7, 0, 2], [0, 1, 4, 5, 7]
    job = TransferJob(1, STORE, (GroupTransfer(0, tuple(sources), tuple(hosts)),))
    with data_plane(caches, specs, 4) as (oracle, worker):
        assert run_job(worker, 1, STORE, (0, sources, hosts)).success
        with HostPool.create(kv_layout.geometry, 4) as pool:
            _staged(caches, kv_layout, pool, job, 1 << 30)
            assert np.array_equal(pool.array, oracle.array)


def _check_against_cpu_worker(
    layout: Layout,
    blocks_per_chunk: int,
    engine_blocks: list[int],
    hosts: list[int],
    piece_blocks: int,
) -> None:
    """Store then load `engine_blocks` <-> `hosts` through the CPU worker and the
    staging path in pieces of at most `piece_blocks` blocks: same bytes."""
    group = BIG
    caches = make_caches(layout, torch.bfloat16, CPU, (group,))
    specs = [GroupSpec(0, group.layers, group.num_blocks, blocks_per_chunk)]
    kv_layout = describe_kv_caches(caches, specs)
    piece_nbytes = piece_blocks * kv_layout.groups[0].block_nbytes
    transfer = (GroupTransfer(0, tuple(engine_blocks), tuple(hosts)),)
    with data_plane(caches, specs, NUM_SLOTS) as (oracle, worker):
        assert run_job(worker, 1, STORE, (0, engine_blocks, hosts)).success
        with HostPool.create(kv_layout.geometry, NUM_SLOTS) as pool:
            store = TransferJob(1, STORE, transfer)
            _staged(caches, kv_layout, pool, store, piece_nbytes)
            assert np.array_equal(pool.array, oracle.array)

            oracle.array[:] = torch.randint(0, 256, oracle.array.shape).numpy()
            pool.array[:] = oracle.array
            staged = {k: tuple(_clone(t) for t in v) for k, v in caches.items()}
            assert run_job(worker, 2, LOAD, (0, engine_blocks, hosts)).success
            load = TransferJob(2, LOAD, transfer)
            _staged(staged, kv_layout, pool, load, piece_nbytes)
    for name, tensors in caches.items():
        for want, got in zip(tensors, staged[name], strict=True):
            assert torch.equal(_storage(want), _storage(got))


def _storage(tensor: torch.Tensor) -> torch.Tensor:
    """All bytes under `tensor`, padding between its blocks included."""
    return torch.empty(0, dtype=torch.uint8).set_(tensor.untyped_storage())


def _clone(tensor: torch.Tensor) -> torch.Tensor:
    """A copy with the same strides over a copy of the storage (padded pages)."""
    copy = torch.empty(0, dtype=tensor.dtype)
    storage = tensor.untyped_storage().clone()
    return copy.set_(storage, tensor.storage_offset(), tensor.shape, tensor.stride())


@pytest.mark.parametrize("chunks", [1, 2])
@pytest.mark.parametrize("blocks_per_chunk", [2, 4])
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: layout.name)
def test_jobs_from_a_chunk_boundary_to_mid_chunk_match_the_cpu_worker(
    layout: Layout, blocks_per_chunk: int, chunks: int
) -> None:
    """A load of a whole cached prefix: whole chunks from host block 0, then a
    partial chunk (16 tokens a block, 4 blocks a chunk, 128 tokens -> 7 blocks)."""
    torch.manual_seed(blocks_per_chunk + chunks)
    hosts = list(range((chunks + 1) * blocks_per_chunk - 1))
    sources = torch.randperm(BIG.num_blocks)[: len(hosts)].tolist()
    _check_against_cpu_worker(layout, blocks_per_chunk, sources, hosts, len(hosts))


def test_random_jobs_match_the_cpu_worker() -> None:
    """Random start and end positions, chunk sizes and piece sizes."""
    rng = torch.Generator().manual_seed(11)
    torch.manual_seed(11)
    for trial in range(48):
        layout = LAYOUTS[trial % len(LAYOUTS)]
        bpc = int(torch.randint(1, 5, (1,), generator=rng))
        start = int(torch.randint(0, NUM_SLOTS * bpc, (1,), generator=rng))
        most = min(BIG.num_blocks, NUM_SLOTS * bpc - start)
        count = int(torch.randint(1, most + 1, (1,), generator=rng))
        hosts = list(range(start, start + count))
        sources = torch.randperm(BIG.num_blocks, generator=rng)[:count].tolist()
        piece_blocks = int(torch.randint(1, count + 1, (1,), generator=rng))
        _check_against_cpu_worker(layout, bpc, sources, hosts, piece_blocks)

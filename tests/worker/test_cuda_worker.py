"""The CUDA data plane: round trips on a GPU, and ordering against the engine."""

from __future__ import annotations

import pytest
import torch

from kvoffload.worker.cuda_worker import CudaTransferWorker
from kvoffload.worker.host_pool import HostPool
from kvoffload.worker.layout import GroupSpec, describe_kv_caches

from .kv_layouts import GROUPS, LAYOUTS, Layout, block_bytes, make_caches, scramble
from .support import LOAD, STORE, chunk_blocks, data_plane, pick, run_job

needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device: the CUDA data plane is tested only on a GPU",
)
CUDA = torch.device("cuda")


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
@pytest.mark.parametrize("blocks_per_chunk", [1, 2, 4])
@pytest.mark.parametrize(
    "dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str
)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: layout.name)
def test_cuda_store_overwrite_load_restores_bytes(
    layout: Layout, dtype: torch.dtype, blocks_per_chunk: int
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
    with data_plane(caches, specs, num_slots=6) as (_, worker):
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
def test_store_sees_engine_writes_issued_before_submit() -> None:
    """Scenario: the engine writes a block on its stream and, without
    synchronizing, submits its store; the stored bytes are the new ones."""
    layout = LAYOUTS[2]
    caches = make_caches(layout, torch.float32, CUDA, GROUPS[:1])
    spec = GroupSpec(0, GROUPS[0].layers, GROUPS[0].num_blocks, 1)
    with data_plane(caches, [spec], num_slots=2) as (pool, worker):
        for tensors in caches.values():
            big = torch.randn(4096, 4096, device=CUDA)
            for _ in range(8):  # keep the engine's stream busy for a while
                big = torch.tanh(big @ big)
            tensors[0][:, 3].fill_(1.5).add_(big[0, 0] * 0)
        assert run_job(worker, 1, STORE, (0, [3], [1])).success
        host = torch.from_numpy(pool.array[pool.slot_nbytes :][: pool.chunk_nbytes(0)])
        assert torch.all(host.view(torch.float32) == 1.5)


@needs_cuda
def test_pool_is_page_locked_while_the_worker_runs() -> None:
    caches = make_caches(LAYOUTS[0], torch.float16, CUDA, GROUPS[:1])
    spec = GroupSpec(0, GROUPS[0].layers, GROUPS[0].num_blocks, 1)
    with data_plane(caches, [spec], num_slots=2) as (pool, _):
        assert torch.from_numpy(pool.array).is_pinned()

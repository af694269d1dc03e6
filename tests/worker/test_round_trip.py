"""Round trips through the host pool for every layout, dtype and chunk size."""

from __future__ import annotations

import pytest
import torch

from kvoffload.worker.factory import create_data_plane
from kvoffload.worker.layout import GroupSpec, describe_kv_caches

from .kv_layouts import GROUPS, LAYOUTS, Layout, block_bytes, make_caches, scramble
from .support import LOAD, STORE, chunk_blocks, data_plane, pick, run_job

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
CPU = torch.device("cpu")


@pytest.mark.parametrize("blocks_per_chunk", [1, 2, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: layout.name)
def test_store_overwrite_load_restores_bytes(
    layout: Layout, dtype: torch.dtype, blocks_per_chunk: int
) -> None:
    """Scenario: two groups of random KV are stored as two chunks each, every
    engine block is overwritten, and loading the chunks into other engine blocks
    brings back the stored bytes while leaving all other blocks alone."""
    gen = torch.Generator().manual_seed(blocks_per_chunk)
    torch.manual_seed(blocks_per_chunk)
    caches = make_caches(layout, dtype, CPU)
    specs = [
        GroupSpec(g.group, g.layers, g.num_blocks, blocks_per_chunk) for g in GROUPS
    ]
    count = 2 * blocks_per_chunk
    slots = pick(4, 6, gen)
    g0, g1 = GROUPS
    # Group 0 from scattered engine blocks, group 1 from consecutive ones.
    sources = {0: pick(count, g0.num_blocks, gen), 1: list(range(1, 1 + count))}
    hosts = {0: chunk_blocks(slots[:2], blocks_per_chunk)}
    hosts[1] = chunk_blocks(slots[2:], blocks_per_chunk)
    with data_plane(caches, specs, num_slots=6) as (_, worker):
        stored = {
            g.group: [block_bytes(layout, caches, g, b) for b in sources[g.group]]
            for g in GROUPS
        }
        result = run_job(worker, 1, STORE, *((g, sources[g], hosts[g]) for g in (0, 1)))
        expected_nbytes = sum(len(s) * s[0].numel() for s in stored.values())
        assert result.success and result.num_bytes == expected_nbytes

        scramble(caches)
        before = {
            g.group: [block_bytes(layout, caches, g, b) for b in range(g.num_blocks)]
            for g in GROUPS
        }
        targets = {
            0: list(range(g0.num_blocks - count, g0.num_blocks)),
            1: pick(count, g1.num_blocks, gen),
        }
        result = run_job(worker, 2, LOAD, *((g, targets[g], hosts[g]) for g in (0, 1)))
        assert result.success and result.num_bytes == expected_nbytes

    for g in GROUPS:
        for index, block in enumerate(targets[g.group]):
            assert torch.equal(
                block_bytes(layout, caches, g, block), stored[g.group][index]
            )
        for block in set(range(g.num_blocks)) - set(targets[g.group]):
            assert torch.equal(
                block_bytes(layout, caches, g, block), before[g.group][block]
            )


def test_copies_split_between_threads_round_trip() -> None:
    """Scenario: with copy_threads=3 each job's regions are shared by three
    threads; a store and a load into other engine blocks still round-trip."""
    layout = LAYOUTS[4]  # K and V apart: ten regions, an uneven split
    caches = make_caches(layout, torch.float16, CPU)
    specs = [GroupSpec(g.group, g.layers, g.num_blocks, 2) for g in GROUPS]
    slot_nbytes = describe_kv_caches(caches, specs).geometry.slot_nbytes
    _, pool, worker = create_data_plane(caches, specs, 4 * slot_nbytes, copy_threads=3)
    try:
        g0 = GROUPS[0]
        stored = [block_bytes(layout, caches, g0, b) for b in (3, 8, 1, 0)]
        assert run_job(worker, 1, STORE, (0, [3, 8, 1, 0], [2, 3, 6, 7])).success
        scramble(caches)
        assert run_job(worker, 2, LOAD, (0, [4, 5, 6, 7], [2, 3, 6, 7])).success
    finally:
        worker.shutdown()
        pool.close()
    for block, want in zip((4, 5, 6, 7), stored, strict=True):
        assert torch.equal(block_bytes(layout, caches, g0, block), want)

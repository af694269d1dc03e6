"""Failed jobs: reported as `success=False`, nothing half-copied, the worker lives on."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvoffload.worker.base import GroupTransfer, TransferJob
from kvoffload.worker.factory import create_data_plane
from kvoffload.worker.layout import GroupSpec

from .kv_layouts import GROUPS, LAYOUTS, block_bytes, make_caches, scramble
from .support import LOAD, STORE, data_plane, run_job

LAYOUT = LAYOUTS[0]
SPECS = [GroupSpec(g.group, g.layers, g.num_blocks, 2) for g in GROUPS]
NUM_SLOTS = 4


def _caches() -> dict[str, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return make_caches(LAYOUT, torch.bfloat16, torch.device("cpu"))


def test_invalid_slot_fails_the_job_and_later_jobs_succeed() -> None:
    """Scenario: a store names a slot past the pool; it fails, and the next
    store and load round-trip as usual."""
    caches = _caches()
    with data_plane(caches, SPECS, NUM_SLOTS) as (_, worker):
        bad = run_job(worker, 1, STORE, (0, [0, 1], [2 * NUM_SLOTS, 2 * NUM_SLOTS + 1]))
        assert not bad.success and bad.num_bytes == 0
        want = block_bytes(LAYOUT, caches, GROUPS[0], 5)
        assert run_job(worker, 2, STORE, (0, [5], [0])).success
        scramble(caches)
        assert run_job(worker, 3, LOAD, (0, [7], [0])).success
    assert torch.equal(block_bytes(LAYOUT, caches, GROUPS[0], 7), want)


def test_a_failed_store_writes_nothing_to_the_pool() -> None:
    """A store whose last pair is invalid does not copy its valid pairs."""
    caches = _caches()
    with data_plane(caches, SPECS, NUM_SLOTS) as (pool, worker):
        before = pool.array.copy()
        result = run_job(worker, 1, STORE, (0, [0, 1, 99], [0, 1, 2]))
        assert not result.success
        assert np.array_equal(pool.array, before)


def test_a_failed_load_writes_nothing_to_the_engine() -> None:
    """A load naming an unknown group after a valid one leaves the KV alone."""
    caches = _caches()
    with data_plane(caches, SPECS, NUM_SLOTS) as (_, worker):
        assert run_job(worker, 1, STORE, (0, [0, 1], [0, 1])).success
        scramble(caches)
        before = [block_bytes(LAYOUT, caches, GROUPS[0], b) for b in (2, 3)]
        result = run_job(worker, 2, LOAD, (0, [2, 3], [0, 1]), (7, [0], [4]))
        assert not result.success
        after = [block_bytes(LAYOUT, caches, GROUPS[0], b) for b in (2, 3)]
    assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True))


def test_a_job_marked_fail_copies_nothing_and_is_reported_failed() -> None:
    """A load planned as failed (its chunks left the host tier) leaves the KV
    alone and is reported like any failed load; the worker carries on."""
    caches = _caches()
    with data_plane(caches, SPECS, NUM_SLOTS) as (_, worker):
        assert run_job(worker, 1, STORE, (0, [0, 1], [0, 1])).success
        scramble(caches)
        before = block_bytes(LAYOUT, caches, GROUPS[0], 2)
        worker.submit(TransferJob(2, LOAD, (GroupTransfer(0, (2,), (0,)),), True))
        worker.wait([2])
        (result,) = worker.get_finished()
        assert result.job_id == 2 and not result.success
        assert torch.equal(block_bytes(LAYOUT, caches, GROUPS[0], 2), before)
        assert run_job(worker, 3, LOAD, (0, [2], [0])).success


def test_negative_and_out_of_range_engine_blocks_fail() -> None:
    caches = _caches()
    with data_plane(caches, SPECS, NUM_SLOTS) as (_, worker):
        assert not run_job(worker, 1, LOAD, (1, [-1], [0])).success
        assert not run_job(worker, 2, STORE, (1, [GROUPS[1].num_blocks], [0])).success
        assert not run_job(worker, 3, STORE, (1, [0], [-1])).success
        assert run_job(worker, 4, STORE, (1, [0], [0])).success


def test_results_are_reported_once_and_wait_returns_for_unknown_ids() -> None:
    caches = _caches()
    with data_plane(caches, SPECS, NUM_SLOTS) as (_, worker):
        for job_id in (1, 2, 3):
            groups = (GroupTransfer(0, (job_id,), (job_id,)),)
            worker.submit(TransferJob(job_id, STORE, groups))
        worker.wait([3, 1, 2, 12345])
        first = worker.get_finished()
        assert sorted(r.job_id for r in first) == [1, 2, 3]
        assert all(r.success and r.seconds >= 0 for r in first)
        assert worker.get_finished() == []


def test_jobs_submitted_after_shutdown_fail_without_raising() -> None:
    caches = _caches()
    layout_spec = SPECS
    _, pool, worker = create_data_plane(caches, layout_spec, 1 << 20)
    worker.shutdown()
    worker.submit(TransferJob(9, STORE, (GroupTransfer(0, (0,), (0,)),)))
    (result,) = worker.get_finished()
    pool.close()
    assert result.job_id == 9 and not result.success


def test_copy_threads_must_be_positive_and_cpu_only() -> None:
    caches = _caches()
    with pytest.raises(ValueError, match="copy_threads"):
        create_data_plane(caches, SPECS, 1 << 20, copy_threads=0)

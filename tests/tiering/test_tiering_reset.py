"""reset_cache over real tiers: a file tier and a Redis server, two engines.

After a reset nothing stored before it is served by any tier, whether it was
readable, being cascaded, or being promoted when the reset came (SPEC §3.3: a
reset drops everything; after an in-place weight update the model's fingerprint
may not change, so a kept chunk would be stale KV).
"""

from __future__ import annotations

from pathlib import Path

from kvoffload import LookupResult, ReqContext
from kvoffload.tiering import TieringManager
from kvoffload.tiers.secondary import (
    ArrayChunkBuffer,
    FileTier,
    FileTierConfig,
    RedisTierConfig,
)
from kvoffload.tiers.secondary.redis_server import RedisServer
from kvoffload.tiers.secondary.redis_tier import RedisTier
from tests.tiering.tiering_support import (
    FINGERPRINT,
    SLOT,
    Clock,
    Engine,
    chunk_files,
    keys,
    make_manager,
)

W = ReqContext("writer")
R = ReqContext("reader")


def engine_on(
    path: Path, url: str
) -> tuple[TieringManager, Engine, FileTier, RedisTier]:
    """An engine whose file tier is `path` and whose Redis tier is `url`."""
    buf = ArrayChunkBuffer(8, SLOT)
    disk = FileTier(FileTierConfig(str(path), "1MiB"), buf, FINGERPRINT)
    remote = RedisTier(RedisTierConfig(url, timeout_s=2.0), buf, FINGERPRINT)
    m, engine = make_manager([disk, remote], num_chunks=8, buffer=buf, clock=Clock())
    m.on_new_request(W)
    m.on_new_request(R)
    return m, engine, disk, remote


def settled(engine: Engine, tier: FileTier | RedisTier, k: bytes) -> LookupResult:
    """One tier's own answer for `k`, once its checks are answered."""
    engine.settle()
    result = tier.lookup(k, R)  # type: ignore[arg-type]
    while result is LookupResult.RETRY:
        engine.step()
        tier.drain()
        result = tier.lookup(k, R)  # type: ignore[arg-type]
    return result


def test_reset_drops_chunks_readable_cascading_and_promoting_in_every_tier(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Scenario: engine A stores chunks 1, 2 and 4 into both tiers and resets
    with the cascade of chunk 3 in flight; engine B, started on both tiers
    after A stored, has just started promoting chunk 4 and resets too. Every
    chunk then misses in every tier of both engines; no chunk file is left."""
    a, engine_a, disk_a, remote_a = engine_on(tmp_path, redis_server.url)
    engine_a.store(keys(1, 2, 4), W)
    engine_a.settle()
    b, engine_b, disk_b, remote_b = engine_on(tmp_path, redis_server.url)
    assert engine_b.lookup_until_known(keys(1)[0], R) is LookupResult.HIT
    assert b.lookup(keys(4)[0], R) is LookupResult.HIT_PENDING  # from the file tier
    engine_b.step()  # the promotion's load is submitted
    engine_a.store(keys(3), W)  # its cascade is submitted
    a.reset_cache()
    b.reset_cache()
    for m, engine, tiers in (
        (a, engine_a, (disk_a, remote_a)),
        (b, engine_b, (disk_b, remote_b)),
    ):
        for k in keys(1, 2, 3, 4):
            assert engine.lookup_until_known(k, R) is LookupResult.MISS
            for tier in tiers:
                assert settled(engine, tier, k) is LookupResult.MISS
        assert m.primary.num_free_slots() == m.primary.num_chunks
    assert [f for f in chunk_files(tmp_path / FINGERPRINT) if f.endswith(".kvc")] == []
    a.shutdown()
    b.shutdown()

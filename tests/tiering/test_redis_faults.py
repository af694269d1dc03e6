"""Redis tier behind the tiering manager: sharing, server killed, server slow.

Each scenario ends with the engine-side view correct: lookups never claim what is
not there, loads return the engine's exact bytes, primary slots are not leaked.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import redis

from kvoffload import LookupResult, PrefixLookup, ReqContext
from kvoffload.tiering import TieringManager
from kvoffload.tiers.secondary import ArrayChunkBuffer, RedisTierConfig
from kvoffload.tiers.secondary.redis_server import RedisServer
from kvoffload.tiers.secondary.redis_tier import RedisTier
from tests.tiering.tiering_support import (
    SLOT,
    Clock,
    Engine,
    key,
    keys,
    make_manager,
    wait_until,
)

W = ReqContext("writer")
R = ReqContext("reader")


def redis_engine(
    url: str, clock: Clock, timeout_s: float = 2.0
) -> tuple[TieringManager, Engine]:
    buf = ArrayChunkBuffer(8, SLOT)
    config = RedisTierConfig(url, timeout_s=timeout_s, backoff_initial_s=5.0)
    tier = RedisTier(config, buf, "fp-redis", clock)
    m, engine = make_manager([tier], num_chunks=8, buffer=buf, clock=clock)
    m.on_new_request(W)
    m.on_new_request(R)
    return m, engine


def quick(call: Callable[[], object], limit_s: float = 0.1) -> object:
    """Run a scheduler-side call and check that it did not block."""
    start = time.monotonic()
    result = call()
    assert time.monotonic() - start < limit_s, "scheduler thread blocked"
    return result


def test_another_engine_finds_a_whole_prefix_in_one_round_trip(
    redis_server: RedisServer,
) -> None:
    """Scenario: engine A stores four chunks; engine B's prefix lookup answers
    RETRY once, then promotes all four together and loads identical bytes."""
    clock = Clock()
    a, engine_a = redis_engine(redis_server.url, clock)
    b, engine_b = redis_engine(redis_server.url, clock)
    engine_a.store(keys(1, 2, 3, 4), W)
    engine_a.settle()
    assert b.lookup_prefix(keys(1, 2, 3, 4, 5), R).retry
    engine_b.step()  # sends one EXISTS batch for the whole prefix
    wait_until(lambda: not b.has_pending_work(), engine_b.step)
    assert b.lookup_prefix(keys(1, 2, 3, 4, 5), R) == PrefixLookup(0, 4)
    engine_b.settle()
    assert b.lookup_prefix(keys(1, 2, 3, 4, 5), R) == PrefixLookup(4, 4)
    engine_b.load(keys(1, 2, 3, 4), R)
    a.shutdown()
    b.shutdown()


def test_server_killed_then_restarted(redis_server: RedisServer) -> None:
    """Scenario: the server dies mid-run: a store in flight fails, later stores are
    dropped without calls, lookups become misses; the engine keeps serving from
    host memory. After a restart (empty, no persistence) and the backoff, stores
    and hits resume."""
    clock = Clock()
    a, engine_a = redis_engine(redis_server.url, clock)
    c, engine_c = redis_engine(redis_server.url, clock)
    engine_a.store(keys(1), W)
    engine_a.settle()

    redis_server.kill()
    engine_a.store(keys(2), W)
    engine_a.settle()
    assert a.get_stats()["redis"].failures == 1
    engine_a.store(keys(3), W)
    engine_a.settle()
    assert a.get_stats()["redis"].drops == 1
    engine_a.load(keys(1, 2, 3), W)
    for k in keys(1, 2):
        assert engine_c.lookup_until_known(k, R) is LookupResult.MISS
    assert c.primary.num_free_slots() == 8

    redis_server.start()
    clock.advance(60)
    engine_a.store(keys(4), W)
    engine_a.settle()
    assert a.get_stats()["redis"].chunks_stored == 2
    assert engine_c.lookup_until_known(key(4), R) is LookupResult.HIT
    engine_c.load(keys(4), R)
    assert (
        engine_c.lookup_until_known(key(1), R) is LookupResult.MISS
    )  # lost with the server
    a.shutdown()
    c.shutdown()


def test_slow_server_beyond_the_timeout(redis_server: RedisServer) -> None:
    """Scenario: the server stops answering for 1.5 s (CLIENT PAUSE) while the
    tier's timeout is 0.2 s: scheduler calls never block, lookups turn into
    misses, the store is counted as failed; when the server answers again and the
    backoff has passed, everything works."""
    clock = Clock()
    a, engine_a = redis_engine(redis_server.url, clock, timeout_s=0.2)
    c, engine_c = redis_engine(redis_server.url, clock, timeout_s=0.2)
    admin = redis.Redis(port=redis_server.port)
    admin.execute_command("CLIENT", "PAUSE", "1500", "ALL")
    paused_at = time.monotonic()

    assert quick(lambda: c.lookup(key(1), R)) is LookupResult.RETRY
    quick(engine_c.step)
    wait_until(
        lambda: quick(lambda: c.lookup(key(1), R)) is LookupResult.MISS,
        lambda: quick(engine_c.step),
    )
    quick(lambda: engine_a.store(keys(2), W))
    wait_until(
        lambda: a.get_stats()["redis"].failures == 1, lambda: quick(engine_a.step)
    )
    assert time.monotonic() - paused_at < 1.5, "the timeout did not cut the wait short"
    engine_a.load(keys(2), W)

    wait_until(lambda: bool(admin.ping()), timeout_s=10)
    clock.advance(60)
    engine_a.store(keys(3), W)
    engine_a.settle()
    assert engine_c.lookup_until_known(key(3), R) is LookupResult.HIT
    engine_c.load(keys(3), R)
    assert c.primary.num_free_slots() == 7
    a.shutdown()
    c.shutdown()


def test_corrupt_value_is_a_miss_and_is_deleted(redis_server: RedisServer) -> None:
    """Scenario: one byte of a stored value flips on the server: the promotion
    fails its checksum, the key misses, and the value is deleted."""
    clock = Clock()
    a, engine_a = redis_engine(redis_server.url, clock)
    c, engine_c = redis_engine(redis_server.url, clock)
    engine_a.store(keys(1), W)
    engine_a.settle()
    tier = a.tiers[0]
    assert isinstance(tier, RedisTier)
    name = tier.redis_key(key(1))
    admin = redis.Redis(port=redis_server.port)
    value = bytearray(admin.get(name))  # type: ignore[arg-type]
    value[-7] ^= 0x40
    admin.set(name, bytes(value))
    assert engine_c.lookup_until_known(key(1), R) is LookupResult.MISS
    assert c.primary.num_free_slots() == 8
    assert admin.exists(name) == 0
    a.shutdown()
    c.shutdown()

"""The Redis tier under faults, against a real redis-server of its own per
test: paused (`CLIENT PAUSE`), killed and restarted, a wrong password, emptied
under the tier (`FLUSHALL`), values tampered with. Each ends in misses and
counted drops or failures, never a hang, a crash or wrong data."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from kvoffload import LookupResult
from kvoffload.tiers.secondary import (
    ArrayChunkBuffer,
    RedisTierConfig,
    TierJob,
    TierJobResult,
)
from kvoffload.tiers.secondary.redis_server import RedisServer, find_redis_server
from kvoffload.tiers.secondary.redis_tier import RedisTier
from tests.tiers.secondary.secondary_support import (
    CTX,
    GROUPS,
    Jobs,
    key,
    payload,
    resolve,
    settle,
)

NUM_QUEUED = 32
PAUSE_MS = 2000


class Clock:
    """Frozen unless advanced: a backoff ends only when a test says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    if find_redis_server() is None:
        pytest.skip("redis-server binary not found (Debian package redis-server)")
    with RedisServer(str(tmp_path)) as running:
        yield running


def stored(tier: RedisTier, buffer: ArrayChunkBuffer, i: int) -> None:
    buffer.slot_view(0)[: GROUPS[0]] = payload(key(i), GROUPS[0])
    assert Jobs(tier).store([key(i)], [0]).success


def connections(admin: redis.Redis) -> int:
    """Connections the server has accepted so far. A call that times out
    drops its connection (redis-py does not reuse a socket that may still
    get a reply), so the next call opens another: new connections count
    the calls that reached the server."""
    return int(admin.info("stats")["total_connections_received"])


def run_all(tier: RedisTier, jobs: list[TierJob], store: bool) -> list[TierJobResult]:
    """Submit every job at once (queued behind each other on the tier's
    threads) and wait for their results."""
    for job in jobs:
        (tier.submit_store if store else tier.submit_load)(job)
    results: dict[int, TierJobResult] = {}
    while len(results) < len(jobs):
        tier.drain()
        results.update((r.job_id, r) for r in tier.get_finished_jobs())
    return [results[job.job_id] for job in jobs]


def pause(admin: redis.Redis, mode: str = "ALL") -> None:
    """Pause the server's clients for `PAUSE_MS`; the next call of `admin`
    waits for the pause to end (so give it a socket timeout past it)."""
    admin.execute_command("CLIENT", "PAUSE", str(PAUSE_MS), mode)


def paused_tier(
    server: RedisServer, buffer: ArrayChunkBuffer, clock: Clock
) -> tuple[RedisTier, redis.Redis]:
    config = RedisTierConfig(
        server.url, timeout_s=0.1, num_threads=1, backoff_initial_s=1.0
    )
    tier = RedisTier(config, buffer, "m", clock)
    stored(tier, buffer, 0)
    admin = redis.Redis(port=server.port, socket_timeout=PAUSE_MS / 1000 + 5)
    return tier, admin


@pytest.mark.parametrize("mode", ["ALL", "WRITE"])
def test_queued_stores_on_a_paused_server_cost_one_timeout(
    server: RedisServer, buffer: ArrayChunkBuffer, mode: str
) -> None:
    """Scenario: the server is paused (every client, or writes only) while 32
    stores are queued on one I/O thread, each a timeout of 0.1 s away from
    failing. The first times out; the other 31 are dropped at once, without a
    call, and counted as drops."""
    clock = Clock()
    tier, admin = paused_tier(server, buffer, clock)
    before = connections(admin)
    pause(admin, mode)
    jobs = [TierJob(i, (key(100 + i),), (i % 16,), CTX) for i in range(NUM_QUEUED)]
    results = run_all(tier, jobs, store=True)
    assert all(r.failed_keys == job.keys for r, job in zip(results, jobs, strict=True))
    assert connections(admin) - before <= 3, "each queued store waited for a timeout"
    stats = tier.get_stats()
    assert (stats.failures, stats.drops) == (1, NUM_QUEUED - 1)
    tier.shutdown()


def test_queued_loads_and_checks_on_a_paused_server_cost_one_timeout_then_resume(
    server: RedisServer, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: the server is paused while 32 loads and 32 existence checks
    are queued: one call times out, the rest fail at once (failed loads,
    misses). While the backoff lasts nothing reaches the server. After it, the
    next call probes the server, which answers: loads and hits resume."""
    clock = Clock()
    tier, admin = paused_tier(server, buffer, clock)
    before = connections(admin)
    pause(admin)
    for i in range(NUM_QUEUED):  # one check batch per step, queued
        assert tier.lookup(key(200 + i), CTX) is LookupResult.RETRY
        tier.on_schedule_end()
    jobs = [TierJob(i, (key(0),), (i % 16,), CTX) for i in range(NUM_QUEUED)]
    results = run_all(tier, jobs, store=False)
    assert all(r.failed_keys == (key(0),) for r in results)
    settle(tier)
    assert [tier.lookup(key(200 + i), CTX) for i in range(NUM_QUEUED)] == [
        LookupResult.MISS
    ] * NUM_QUEUED
    assert connections(admin) - before <= 3, "each queued call waited for a timeout"
    assert admin.ping()  # the pause is over; the tier still backs off
    assert Jobs(tier).load([key(0)], [1]).failed_keys == (key(0),)
    clock.now += 1.0
    assert Jobs(tier).load([key(0)], [1]).success
    assert bytes(buffer.slot_view(1)[: GROUPS[0]]) == payload(key(0), GROUPS[0])
    assert resolve(tier, key(0)) is LookupResult.HIT
    assert tier.connected
    tier.shutdown()

"""The Redis tier under faults, against a real redis-server of its own per
test: paused (`CLIENT PAUSE`), killed and restarted, a wrong password, emptied
under the tier (`FLUSHALL`), values tampered with. Each ends in misses and
counted drops or failures, never a hang, a crash or wrong data. (Glob characters
in key prefixes: test_redis_namespace.py; secrets: test_redis_secrets.py.)"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
PAUSE_MS = 5000  # long enough for a loaded machine to queue the calls inside it


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


def test_server_killed_then_restarted_reconnects_after_the_backoff(
    server: RedisServer, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: the server dies (SIGKILL) with a chunk stored: a load fails,
    the chunk is not reported removed (an unreachable server says nothing of
    it), stores drop without calls, lookups miss. It restarts, empty, on the
    same port: within the backoff still nothing is called; after it a probe
    reconnects and stores, hits and loads resume."""
    clock = Clock()
    config = RedisTierConfig(server.url, timeout_s=0.5, backoff_initial_s=1.0)
    tier = RedisTier(config, buffer, "m", clock)
    stored(tier, buffer, 1)
    server.kill()
    jobs = Jobs(tier)
    assert jobs.load([key(1)], [1]).failed_keys == (key(1),)
    assert not tier.connected
    assert tier.lookup(key(2), CTX) is LookupResult.MISS
    buffer.slot_view(0)[: GROUPS[0]] = payload(key(2), GROUPS[0])
    assert jobs.store([key(2)], [0]).failed_keys == (key(2),)
    assert tier.get_stats().drops == 1
    server.start()
    assert jobs.store([key(2)], [0]).failed_keys == (key(2),)  # backing off
    clock.now += 1.0
    assert jobs.store([key(2)], [0]).success
    assert tier.connected
    assert resolve(tier, key(2)) is LookupResult.HIT
    assert jobs.load([key(2)], [1]).success
    assert bytes(buffer.slot_view(1)[: GROUPS[0]]) == payload(key(2), GROUPS[0])
    # Chunk 1 went with the server: its load fails and it is a miss from then.
    assert jobs.load([key(1)], [1]).failed_keys == (key(1),)
    assert tier.lookup(key(1), CTX) is LookupResult.MISS
    tier.shutdown()


@pytest.mark.parametrize("given", ["wrong", None])
def test_a_wrong_or_missing_password_gives_misses_and_one_clear_warning(
    server: RedisServer,
    buffer: ArrayChunkBuffer,
    caplog: pytest.LogCaptureFixture,
    given: str | None,
) -> None:
    """Scenario: the server asks for a password and the tier gives a wrong
    one, or none: AUTH fails. Lookups miss, stores and loads fail, nothing
    stays pending or crashes, and one warning says that the server refused
    the credentials, without showing the password given."""
    redis.Redis(port=server.port).config_set("requirepass", "right-pw")
    url = server.url if given is None else server.url.replace("//", f"//:{given}-pw@")
    tier = RedisTier(RedisTierConfig(url, timeout_s=0.5), buffer, "m", Clock())
    jobs = Jobs(tier)
    with caplog.at_level(logging.WARNING, logger="kvoffload"):
        assert resolve(tier, key(1)) is LookupResult.MISS
        buffer.slot_view(0)[: GROUPS[0]] = payload(key(1), GROUPS[0])
        assert jobs.store([key(1)], [0]).failed_keys == (key(1),)
        assert jobs.load([key(1)], [1]).failed_keys == (key(1),)
        settle(tier)
    assert not tier.connected
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "refused the credentials" in warnings[0]
    assert "wrong-pw" not in caplog.text
    tier.shutdown()


def test_flushall_under_the_tier_gives_misses_then_stores_again(
    server: RedisServer, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: the server is emptied (FLUSHALL) while the tier believes two
    chunks present. A load fails (no error, no wrong bytes) and the chunk is a
    miss from then on; a store of the other is sent again, not skipped as
    held, and loads back whole."""
    tier = RedisTier(RedisTierConfig(server.url), buffer, "m", Clock())
    stored(tier, buffer, 1)
    stored(tier, buffer, 2)
    assert resolve(tier, key(1)) is LookupResult.HIT
    redis.Redis(port=server.port).flushall()
    jobs = Jobs(tier)
    assert jobs.load([key(1)], [1]).failed_keys == (key(1),)
    assert tier.lookup(key(1), CTX) is LookupResult.MISS
    assert tier.connected
    stored(tier, buffer, 2)
    assert redis.Redis(port=server.port).exists(tier.redis_key(key(2))) == 1
    assert jobs.load([key(2)], [1]).success
    assert bytes(buffer.slot_view(1)[: GROUPS[0]]) == payload(key(2), GROUPS[0])
    tier.shutdown()


def _tampered(value: bytes, other: bytes, how: str) -> bytes:
    if how == "flip":
        return value[:-7] + bytes([value[-7] ^ 0x40]) + value[-6:]
    if how == "truncate":
        return value[:-1]
    if how == "extend":
        return value + b"\0"
    if how == "header only":
        return value[:64]
    if how == "empty":
        return b""
    if how == "another chunk's value":
        return other
    return b"not a chunk at all" * 100


TAMPERINGS = [
    "flip",
    "truncate",
    "extend",
    "header only",
    "empty",
    "another chunk's value",
    "garbage",
]


@pytest.mark.parametrize("how", TAMPERINGS)
def test_a_tampered_value_is_a_miss_and_is_deleted(
    server: RedisServer, buffer: ArrayChunkBuffer, how: str
) -> None:
    """Scenario: a value on the server is changed behind the tier's back. The
    load fails its checks (never fills the slot as loaded), the value is
    deleted, and the chunk is a miss."""
    tier = RedisTier(RedisTierConfig(server.url), buffer, "m", Clock())
    stored(tier, buffer, 1)
    stored(tier, buffer, 2)
    admin = redis.Redis(port=server.port)
    name = tier.redis_key(key(1))
    value, other = admin.get(name), admin.get(tier.redis_key(key(2)))
    assert isinstance(value, bytes) and isinstance(other, bytes)
    admin.set(name, _tampered(value, other, how))
    assert Jobs(tier).load([key(1)], [1]).failed_keys == (key(1),)
    assert admin.exists(name) == 0
    assert tier.lookup(key(1), CTX) is LookupResult.MISS
    assert tier.get_stats().chunks_loaded == 0
    tier.shutdown()


def test_a_value_of_another_type_is_a_miss_and_is_replaced_by_a_store(
    server: RedisServer, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: another application put a list where a chunk's value
    belongs (PTTL answers for any type, so a check may say present): the load
    fails, as MGET gives nothing for a list, and the next store of the chunk
    overwrites it."""
    tier = RedisTier(RedisTierConfig(server.url), buffer, "m", Clock())
    admin = redis.Redis(port=server.port)
    admin.rpush(tier.redis_key(key(1)), b"x")
    jobs = Jobs(tier)
    assert jobs.load([key(1)], [1]).failed_keys == (key(1),)
    stored(tier, buffer, 1)
    assert admin.type(tier.redis_key(key(1))) == b"string"
    assert jobs.load([key(1)], [1]).success
    tier.shutdown()


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_a_value_changed_anyhow_never_loads_wrong_bytes(
    redis_url: str, buffer: ArrayChunkBuffer, data: st.DataObject
) -> None:
    """Generated changes to a stored value (bytes overwritten, cut, inserted):
    a load either fails or, if the value is unchanged, gives the exact bytes."""
    tier = RedisTier(RedisTierConfig(redis_url), buffer, "m", Clock())
    stored(tier, buffer, 1)
    admin = redis.Redis.from_url(redis_url)
    name = tier.redis_key(key(1))
    value = admin.get(name)
    assert isinstance(value, bytes)
    changed = bytearray(value)
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, max(0, len(changed) - 1)))
        action = data.draw(st.sampled_from(["set", "cut", "insert"]))
        if action == "set" and changed:
            changed[at] = data.draw(st.integers(0, 255))
        elif action == "cut":
            del changed[at : at + data.draw(st.integers(1, 64))]
        else:
            changed[at:at] = data.draw(st.binary(min_size=1, max_size=8))
    admin.set(name, bytes(changed))
    buffer.slot_view(1)[:] = b"\xee" * len(buffer.slot_view(1))
    result = Jobs(tier).load([key(1)], [1])
    if bytes(changed) == value:
        assert result.success
    else:
        assert result.failed_keys == (key(1),)
    if result.success:
        assert bytes(buffer.slot_view(1)[: GROUPS[0]]) == payload(key(1), GROUPS[0])
    tier.shutdown()


def test_a_server_that_stops_answering_while_a_corrupt_value_is_deleted_is_down(
    server: RedisServer, buffer: ArrayChunkBuffer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario: a load finds a tampered value, and the server stops answering
    before its deletion: the deletion's timeout marks the server down, so the
    loads queued behind fail at once instead of each waiting a timeout."""
    tier = RedisTier(RedisTierConfig(server.url), buffer, "m", Clock())
    stored(tier, buffer, 1)
    stored(tier, buffer, 2)
    admin = redis.Redis(port=server.port)
    admin.set(tier.redis_key(key(1)), b"tampered")

    def timed_out(*names: object) -> None:
        raise redis.TimeoutError("Timeout reading from socket")

    monkeypatch.setattr(redis.Redis, "delete", timed_out)
    jobs = Jobs(tier)
    assert jobs.load([key(1)], [1]).failed_keys == (key(1),)
    assert not tier.connected
    assert jobs.load([key(2)], [1]).failed_keys == (key(2),)  # without a call
    tier.shutdown()

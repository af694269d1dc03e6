"""RedisTier specifics: namespaces, TTL, an unreachable server, backoff, and the
removed events of failed loads."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from typing import Any

import pytest
import redis

from kvoffload import LookupResult
from kvoffload.tiers.secondary import ArrayChunkBuffer, RedisTierConfig, redis_tier
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


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def stored(tier: RedisTier, buffer: ArrayChunkBuffer, i: int) -> None:
    buffer.slot_view(0)[: GROUPS[0]] = payload(key(i), GROUPS[0])
    assert Jobs(tier).store([key(i)], [0]).success


def test_fingerprints_namespace_the_keys(
    redis_url: str, buffer: ArrayChunkBuffer
) -> None:
    a = RedisTier(RedisTierConfig(redis_url), buffer, "model-a")
    b = RedisTier(RedisTierConfig(redis_url), buffer, "model-b")
    stored(a, buffer, 1)
    assert resolve(a, key(1)) is LookupResult.HIT
    assert resolve(b, key(1)) is LookupResult.MISS
    assert a.redis_key(key(1)) == f"kvoffload:model-a:{key(1).hex()}"
    a.shutdown()
    b.shutdown()


def test_values_carry_the_ttl(redis_url: str, buffer: ArrayChunkBuffer) -> None:
    tier = RedisTier(RedisTierConfig(redis_url, ttl_s=120), buffer, "m")
    stored(tier, buffer, 1)
    ttl_ms = redis.Redis.from_url(redis_url).pttl(tier.redis_key(key(1)))
    assert 0 < ttl_ms <= 120_000  # type: ignore[operator]
    tier.shutdown()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


def test_unreachable_server_gives_misses_and_drops_then_backs_off(
    buffer: ArrayChunkBuffer,
) -> None:
    """Scenario: no server at the URL: the first lookup's check fails, later
    lookups miss and stores are dropped without calls until the backoff ends;
    the backoff doubles on each failed probe."""
    clock = Clock()
    config = RedisTierConfig(closed_port_url(), timeout_s=0.2, backoff_initial_s=1.0)
    tier = RedisTier(config, buffer, "m", clock)
    assert tier.lookup(key(1), CTX) is LookupResult.RETRY
    assert resolve(tier, key(1)) is LookupResult.MISS
    assert not tier.connected
    jobs = Jobs(tier)
    assert jobs.store([key(2)], [0]).failed_keys == (key(2),)
    assert tier.get_stats().drops == 1
    assert jobs.load([key(2)], [1]).failed_keys == (key(2),)
    clock.now += 1.0  # first backoff over: the next call probes, fails, doubles
    assert resolve(tier, key(1)) is LookupResult.MISS
    clock.now += 1.5
    assert tier.lookup(key(1), CTX) is LookupResult.MISS  # still within 2 s
    clock.now += 0.6
    assert tier.lookup(key(1), CTX) is LookupResult.RETRY
    tier.shutdown()


def test_the_unreachable_server_warning_does_not_show_the_password(
    buffer: ArrayChunkBuffer, caplog: pytest.LogCaptureFixture
) -> None:
    url = closed_port_url().replace("redis://", "redis://app:s3cret@")
    tier = RedisTier(RedisTierConfig(url, timeout_s=0.2), buffer, "m", Clock())
    with caplog.at_level(logging.WARNING):
        assert resolve(tier, key(1)) is LookupResult.MISS
    tier.shutdown()
    redacted = url.replace("s3cret", "***")
    assert any(redacted in r.getMessage() for r in caplog.records)
    assert not any("s3cret" in r.getMessage() for r in caplog.records)


def test_absent_value_on_load_fails_and_is_remembered_as_absent(
    redis_url: str, buffer: ArrayChunkBuffer
) -> None:
    tier = RedisTier(RedisTierConfig(redis_url), buffer, "m")
    stored(tier, buffer, 1)
    assert resolve(tier, key(1)) is LookupResult.HIT
    redis.Redis.from_url(redis_url).delete(
        tier.redis_key(key(1))
    )  # evicted by the server
    assert Jobs(tier).load([key(1)], [1]).failed_keys == (key(1),)
    assert tier.lookup(key(1), CTX) is LookupResult.MISS
    tier.shutdown()


def test_chunks_a_load_finds_absent_or_corrupt_are_reported_removed(
    redis_url: str, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: of three stored chunks, the server evicts one and another's
    value is corrupted: the load fails both and reports both removed, so that
    KV-event consumers stop counting on them; the intact one loads."""
    tier = RedisTier(RedisTierConfig(redis_url), buffer, "m")
    for i in (1, 2, 3):
        stored(tier, buffer, i)
    tier.take_events()
    admin = redis.Redis.from_url(redis_url)
    admin.delete(tier.redis_key(key(1)))
    name = tier.redis_key(key(2))
    value = bytearray(admin.get(name))  # type: ignore[arg-type]
    value[-1] ^= 0xFF
    admin.set(name, bytes(value))
    result = Jobs(tier).load([key(1), key(2), key(3)], [1, 2, 3])
    assert result.failed_keys == (key(1), key(2))
    assert [(set(e.keys), e.removed) for e in tier.take_events()] == [
        ({key(1), key(2)}, True)
    ]
    tier.shutdown()


def test_a_load_that_cannot_reach_the_server_reports_nothing_removed(
    buffer: ArrayChunkBuffer,
) -> None:
    """An unreachable server says nothing about what it holds: a miss, not a
    removal."""
    config = RedisTierConfig(closed_port_url(), timeout_s=0.2)
    tier = RedisTier(config, buffer, "m", Clock())
    assert Jobs(tier).load([key(1)], [1]).failed_keys == (key(1),)
    assert not tier.connected, "the load did call the server"
    assert tier.take_events() == []
    tier.shutdown()


@pytest.mark.parametrize("batch_bytes", [1, 1 << 20])
def test_large_jobs_are_split_into_pipelined_batches(
    redis_url: str, batch_bytes: int
) -> None:
    buffer = ArrayChunkBuffer(24, 2048)
    tier = RedisTier(RedisTierConfig(redis_url, batch_bytes=batch_bytes), buffer, "m")
    ks = [key(i) for i in range(12)]
    for slot, k in enumerate(ks):
        buffer.slot_view(slot)[:] = payload(k, 2048)
    jobs = Jobs(tier)
    assert jobs.store(ks, list(range(12))).success
    result = jobs.load(ks, list(range(12, 24)))
    assert result.success and result.num_bytes == 12 * 2048
    assert all(
        bytes(buffer.slot_view(12 + i)) == payload(k, 2048) for i, k in enumerate(ks)
    )
    tier.shutdown()


def test_reset_deletes_its_namespace_only(
    redis_url: str, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: one server holds this engine's namespace (prefix "kv*", so the
    prefix is matched literally), another engine's chunk in the same namespace,
    the same model under another prefix, another model, and an unrelated key.
    A reset deletes the namespace's keys, the other engine's too (it would be
    served as this engine's), and nothing else: no FLUSHDB."""
    server = redis.Redis.from_url(redis_url)
    mine = RedisTier(RedisTierConfig(redis_url, key_prefix="kv*"), buffer, "m")
    peer = RedisTier(RedisTierConfig(redis_url, key_prefix="kv*"), buffer, "m")
    other_prefix = RedisTier(RedisTierConfig(redis_url, key_prefix="kvx"), buffer, "m")
    other_model = RedisTier(RedisTierConfig(redis_url, key_prefix="kv*"), buffer, "m2")
    stored(mine, buffer, 1)
    stored(peer, buffer, 2)
    for tier in (other_prefix, other_model):
        stored(tier, buffer, 1)
    server.set("unrelated", b"x")
    mine.reset_cache()
    settle(mine)
    assert server.exists(mine.redis_key(key(1)), mine.redis_key(key(2))) == 0
    kept = [other_prefix.redis_key(key(1)), other_model.redis_key(key(1))]
    assert server.exists(*kept, "unrelated") == 3
    assert resolve(mine, key(1)) is LookupResult.MISS
    assert Jobs(peer).load([key(2)], [1]).failed_keys == (key(2),)
    for tier in (mine, peer, other_prefix, other_model):
        tier.shutdown()


def test_a_reset_while_a_reset_is_deleting_neither_waits_nor_keeps_later_chunks(
    redis_url: str, buffer: ArrayChunkBuffer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario: a reset's deletion has gone through the namespace but not yet
    reported its end (held here) when another engine stores chunk 2 there and
    this engine resets again. The second reset returns without waiting for the
    first deletion; stores are refused until the namespace is cleared; then
    neither chunk 1 (stored before the first reset) nor chunk 2 (before the
    second) is served or left on the server, and stores work again."""
    deleted, release = threading.Event(), threading.Event()
    released: list[bool] = []  # per deletion: released by the test, not timed out
    real_delete = redis_tier.delete_namespace

    def held_delete(*args: Any) -> bool:
        done = real_delete(*args)
        deleted.set()
        released.append(release.wait(10.0))
        return done

    monkeypatch.setattr(redis_tier, "delete_namespace", held_delete)
    server = redis.Redis.from_url(redis_url)
    mine = RedisTier(RedisTierConfig(redis_url), buffer, "m")
    peer = RedisTier(RedisTierConfig(redis_url), buffer, "m")
    stored(mine, buffer, 1)
    mine.reset_cache()
    assert deleted.wait(10.0)
    stored(peer, buffer, 2)

    mine.drain()  # as TieringManager.reset_cache does
    mine.reset_cache()
    buffer.slot_view(0)[: GROUPS[0]] = payload(key(3), GROUPS[0])
    assert Jobs(mine).store([key(3)], [0]).failed_keys == (key(3),)
    release.set()
    settle(mine)
    assert released[0], "the second reset waited for the first deletion"
    names = [mine.redis_key(key(i)) for i in (1, 2, 3)]
    assert server.exists(*names) == 0
    assert [resolve(mine, key(i)) for i in (1, 2)] == [LookupResult.MISS] * 2
    stored(mine, buffer, 3)
    assert resolve(mine, key(3)) is LookupResult.HIT
    for tier in (mine, peer):
        tier.shutdown()


def test_reset_while_the_server_is_unresponsive_is_retried(
    redis_url: str, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: the server stops answering (SIGSTOP) as a reset starts: its
    deletion times out, and until it has succeeded the tier serves nothing of
    the old namespace, nor stores (drops). Once the server answers again and
    the backoff is over, the next step retries; the old chunk is gone."""
    clock = Clock()
    config = RedisTierConfig(redis_url, timeout_s=0.2, backoff_initial_s=1.0)
    tier = RedisTier(config, buffer, "m", clock)
    stored(tier, buffer, 1)
    admin = redis.Redis.from_url(redis_url)
    pid = int(admin.info("server")["process_id"])  # type: ignore[index]
    os.kill(pid, signal.SIGSTOP)
    try:
        tier.reset_cache()
        settle(tier)  # the attempt timed out
        assert not tier.connected
        assert tier.lookup(key(1), CTX) is LookupResult.MISS
        buffer.slot_view(0)[: GROUPS[0]] = payload(key(2), GROUPS[0])
        assert Jobs(tier).store([key(2)], [0]).failed_keys == (key(2),)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert admin.exists(tier.redis_key(key(1))) == 1
    tier.on_schedule_end()  # within the backoff: no retry yet
    assert not tier.has_pending_work()
    assert admin.exists(tier.redis_key(key(1))) == 1
    clock.now += 1.0
    settle(tier)
    assert admin.exists(tier.redis_key(key(1))) == 0
    assert resolve(tier, key(1)) is LookupResult.MISS
    stored(tier, buffer, 3)
    assert resolve(tier, key(3)) is LookupResult.HIT
    tier.shutdown()


def test_a_client_that_fails_outside_redis_errors_gives_misses_not_endless_retries(
    redis_url: str, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: an option value redis-py accepts but cannot use (keep-alive
    options of the wrong type) makes every connection attempt raise TypeError,
    not a Redis error. Lookups still settle as misses, the tier backs off as
    for a server that is down, and nothing stays pending (an engine would
    otherwise keep stepping for it); a reset gives up the same way."""
    options = {"socket_keepalive": True, "socket_keepalive_options": {"x": 1}}
    tier = RedisTier(RedisTierConfig(redis_url, options=options), buffer, "m")
    assert tier.lookup(key(1), CTX) is LookupResult.RETRY
    assert resolve(tier, key(1)) is LookupResult.MISS
    assert not tier.connected
    tier.drain()
    assert not tier.has_pending_work()
    tier.reset_cache()
    settle(tier)  # gives up, as checks do: nothing stays pending
    tier.shutdown()


def test_a_cached_hit_is_trusted_no_longer_than_the_value_lives(
    redis_url: str, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: `ttl_s` (1 s) is shorter than `hit_cache_s` (30 s). Once the
    server may have expired chunk 1, a lookup asks it again rather than answer
    the hit its store left; a hit the server answers is trusted for the time
    the value has left there, not for `hit_cache_s`."""
    clock = Clock()
    tier = RedisTier(RedisTierConfig(redis_url, ttl_s=1.0), buffer, "m", clock)
    stored(tier, buffer, 1)
    clock.now += 1.0
    assert tier.lookup(key(1), CTX) is LookupResult.RETRY
    admin = redis.Redis.from_url(redis_url)
    admin.pexpire(tier.redis_key(key(1)), 10_000)  # 10 s left, by the server
    assert resolve(tier, key(1)) is LookupResult.HIT
    clock.now += 5.0
    assert tier.lookup(key(1), CTX) is LookupResult.HIT
    clock.now += 5.0
    assert tier.lookup(key(1), CTX) is LookupResult.RETRY
    tier.shutdown()


def test_a_chunk_the_server_dropped_is_stored_again(
    redis_url: str, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: the server evicts chunk 1 while the tier still remembers it
    present. A new cascade of chunk 1 stores it again rather than trust that
    memory (a request-level tier, prefill/decode, would lose the context);
    a cascade of a chunk the server still holds sends no value again, but
    renews its expiry as a store would."""
    tier = RedisTier(RedisTierConfig(redis_url, ttl_s=120), buffer, "m")
    admin = redis.Redis.from_url(redis_url)
    name = tier.redis_key(key(1))
    stored(tier, buffer, 1)
    admin.delete(name)
    stored(tier, buffer, 1)
    assert admin.exists(name)
    assert tier.get_stats().chunks_stored == 2
    admin.pexpire(name, 5_000)
    tier.take_events()
    stored(tier, buffer, 1)
    stats = tier.get_stats()
    assert (stats.chunks_stored, stats.bytes_stored) == (2, 2 * GROUPS[0])
    assert tier.take_events() == []
    assert admin.pttl(name) > 100_000  # type: ignore[operator]
    tier.shutdown()

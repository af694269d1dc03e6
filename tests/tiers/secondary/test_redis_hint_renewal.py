"""A store that finds a Redis value present under an earlier hint rewrites the
value's header, so another engine loading it reads the renewed deadline; an
earlier deadline is never written; a renewal racing a deletion or a
replacement of the value changes nothing (real redis-server on loopback)."""

from __future__ import annotations

import time

import pytest
import redis

from kvoffload import ReqContext
from kvoffload.tiers.secondary import (
    ArrayChunkBuffer,
    RedisTierConfig,
    TierJob,
    TierJobResult,
    codec,
)
from kvoffload.tiers.secondary.redis_link import RedisLink
from kvoffload.tiers.secondary.redis_renewal import HeaderRead, renew_headers
from kvoffload.tiers.secondary.redis_tier import RedisTier
from tests.tiers.secondary.secondary_support import (
    FINGERPRINT,
    GROUPS,
    key,
    payload,
    settle,
)

N = GROUPS[0]


def run(tier: RedisTier, job: TierJob) -> TierJobResult:
    (tier.submit_store if job.slots[0] == 0 else tier.submit_load)(job)
    deadline = time.monotonic() + 10
    while True:
        for result in tier.get_finished_jobs():
            assert result.job_id == job.job_id
            return result
        assert time.monotonic() < deadline, "job did not finish in time"
        time.sleep(0.001)


def store(tier: RedisTier, buffer: ArrayChunkBuffer, hint: float | None) -> None:
    buffer.slot_view(0)[:N] = payload(key(1), N)
    job = TierJob(1, (key(1),), (0,), ReqContext("w"), hints=(hint,))
    assert run(tier, job).success
    settle(tier)


def hint_loaded(tier: RedisTier) -> float:
    """The hint a load of the chunk hands back (seconds left)."""
    result = run(tier, TierJob(2, (key(1),), (1,), ReqContext("r")))
    assert result.success and result.hints is not None
    return result.hints[key(1)]


@pytest.mark.parametrize("ttl_s", [None, 30])
def test_a_store_of_a_held_value_under_a_later_hint_renews_its_header(
    redis_url: str, buffer: ArrayChunkBuffer, ttl_s: float | None
) -> None:
    """Scenario: engine A stores a chunk under 60 s; engine B stores it under
    6,000 s (not sent again: `SET NX` finds it); A, storing it once more
    under 9,000 s, believes it present and renews it; a third engine loading
    it reads the latest, whichever renewed it."""
    config = RedisTierConfig(redis_url, ttl_s=ttl_s)
    a, b, c = (RedisTier(config, buffer, FINGERPRINT) for _ in range(3))
    store(a, buffer, 60)
    store(b, buffer, 6000)
    assert b.get_stats().chunks_stored == 0
    assert 5990 < hint_loaded(c) <= 6000
    store(a, buffer, 9000)  # believed present: checked, held, renewed
    assert a.get_stats().chunks_stored == 1
    assert 8990 < hint_loaded(c) <= 9000
    client = redis.Redis.from_url(redis_url)
    pttl = client.pttl(a.redis_key(key(1)))
    assert pttl == -1 if ttl_s is None else pttl > 8_990_000
    for tier in (a, b, c):
        tier.shutdown()


@pytest.mark.parametrize("seconds", [60, 6000, 7400])
def test_a_deadline_moving_earlier_or_barely_later_is_never_written(
    redis_url: str, buffer: ArrayChunkBuffer, seconds: float
) -> None:
    a = RedisTier(RedisTierConfig(redis_url), buffer, FINGERPRINT)
    b = RedisTier(RedisTierConfig(redis_url), buffer, FINGERPRINT)
    store(a, buffer, 6000)
    client = redis.Redis.from_url(redis_url)
    before = client.get(a.redis_key(key(1)))
    store(b, buffer, seconds)
    assert client.get(a.redis_key(key(1))) == before
    a.shutdown()
    b.shutdown()


def header_read(tier: RedisTier, client: redis.Redis, until: float) -> HeaderRead:
    name = tier.redis_key(key(1))
    size = codec.header_size(len(key(1)), FINGERPRINT)
    return HeaderRead(key(1), name, until, client.getrange(name, 0, size - 1))


@pytest.mark.parametrize("race", ["deleted", "stored again", "not a string"])
def test_a_renewal_racing_a_change_of_the_value_changes_nothing(
    redis_url: str, buffer: ArrayChunkBuffer, race: str
) -> None:
    """Between a header's read and its renewal the value is deleted (evicted,
    a reset), stored again from other bytes by another engine, or replaced by
    another application's list: the value is left as that made it."""
    tier = RedisTier(RedisTierConfig(redis_url), buffer, FINGERPRINT)
    store(tier, buffer, 60)
    client = redis.Redis.from_url(redis_url)
    name, now = tier.redis_key(key(1)), time.time()
    read = header_read(tier, client, now + 6000)
    client.delete(name)
    if race == "stored again":
        other = bytes(N)  # other bytes under the same key: another checksum
        crc = codec.payload_checksum([other])
        head = codec.encode_header(key(1), FINGERPRINT, N, crc, 60, now)
        client.set(name, head + other)
    elif race == "not a string":
        client.rpush(name, b"x")
    before = client.dump(name)
    link = RedisLink(RedisTierConfig(redis_url), time.monotonic)
    assert renew_headers(link, FINGERPRINT, [read], now) == 0
    assert client.dump(name) == before  # absent stays absent (None)
    link.close()
    tier.shutdown()


def test_a_renewal_of_the_value_as_read_writes_only_its_header(
    redis_url: str, buffer: ArrayChunkBuffer
) -> None:
    tier = RedisTier(RedisTierConfig(redis_url), buffer, FINGERPRINT)
    store(tier, buffer, 60)
    client = redis.Redis.from_url(redis_url)
    name, now = tier.redis_key(key(1)), time.time()
    before = client.get(name)
    assert isinstance(before, bytes)
    link = RedisLink(RedisTierConfig(redis_url), time.monotonic)
    assert renew_headers(
        link, FINGERPRINT, [header_read(tier, client, now + 6000)], now
    )
    after = client.get(name)
    assert isinstance(after, bytes) and len(after) == len(before)
    size = codec.header_size(len(key(1)), FINGERPRINT)
    assert after[size:] == before[size:]  # the payload untouched
    assert 5990 < hint_loaded(tier) <= 6000
    link.close()
    tier.shutdown()


def test_a_cluster_renews_headers_too(
    redis_cluster_url: str, buffer: ArrayChunkBuffer
) -> None:
    """The renewal script names its one key: a cluster runs it on the key's
    node, from a cluster pipeline."""
    config = RedisTierConfig(redis_cluster_url, cluster=True, timeout_s=2.0)
    a, b = (RedisTier(config, buffer, FINGERPRINT) for _ in range(2))
    store(a, buffer, 60)
    store(b, buffer, 6000)
    assert 5990 < hint_loaded(a) <= 6000
    a.shutdown()
    b.shutdown()

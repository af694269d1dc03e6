"""A Redis server that is up but refuses commands with error replies (full, or an
ACL that forbids some keys): the refused chunks fail or are skipped, and the
server is not taken for one that is down."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import redis

from kvoffload import LookupResult
from kvoffload.tiers.secondary import ArrayChunkBuffer, RedisTierConfig
from kvoffload.tiers.secondary.redis_tier import RedisTier
from tests.tiers.secondary.secondary_support import (
    GROUPS,
    Jobs,
    key,
    payload,
    resolve,
)
from tests.tiers.secondary.test_redis_tier import Clock


@contextmanager
def server_full(*admins: redis.Redis) -> Iterator[None]:
    """The servers refuse every write (OOM) and serve reads, as a full server
    that may evict nothing does (`noeviction`, or `volatile-lru` with no TTL
    on the values); their settings come back after."""
    saved = [admin.config_get("maxmemory*") for admin in admins]
    for admin in admins:
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", 1)
    try:
        yield
    finally:
        for admin, settings in zip(admins, saved, strict=True):
            admin.config_set("maxmemory", settings["maxmemory"])
            admin.config_set("maxmemory-policy", settings["maxmemory-policy"])


def fill(buffer: ArrayChunkBuffer, ids: list[int]) -> None:
    """Slot `n` holds chunk `ids[n]`."""
    for slot, i in enumerate(ids):
        buffer.slot_view(slot)[: GROUPS[0]] = payload(key(i), GROUPS[0])


def test_a_full_server_skips_stores_and_keeps_serving(
    redis_url: str, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: the server is full and may evict nothing, so it answers stores
    with OOM. They are skipped and counted (SPEC §4), not failures of a server
    that is down: chunk 1, stored before, is still found and loaded, and the
    next store is tried at once, without a backoff."""
    clock = Clock()
    config = RedisTierConfig(redis_url, backoff_initial_s=1.0)
    tier = RedisTier(config, buffer, "m", clock)
    jobs = Jobs(tier)
    fill(buffer, [1, 2, 3])
    assert jobs.store([key(1)], [0]).success
    with server_full(redis.Redis.from_url(redis_url)):
        assert jobs.store([key(2), key(3)], [1, 2]).failed_keys == (key(2), key(3))
        stats = tier.get_stats()
        assert (stats.store_skipped, stats.failures, stats.drops) == (2, 0, 0)
        assert tier.connected
        clock.now += config.hit_cache_s  # ask the server, not what the store left
        assert resolve(tier, key(1)) is LookupResult.HIT
        assert resolve(tier, key(2)) is LookupResult.MISS
        assert jobs.load([key(1)], [4]).success
        assert jobs.store([key(3)], [2]).failed_keys == (key(3),)
        stats = tier.get_stats()
        assert (stats.store_skipped, stats.failures, stats.drops) == (3, 0, 0)
    assert jobs.store([key(3)], [2]).success
    tier.shutdown()


def test_an_error_reply_fails_only_its_own_chunk(
    redis_url: str, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: the tier's ACL user may use chunk 1's key only, so the server
    answers NOPERM to the rest of a batch. Only chunk 2 fails (counted); chunk
    1 is stored; the server is up, so nothing backs off; a check the server
    refuses is a miss, not a lookup left waiting, and a refused load fails."""
    admin = redis.Redis.from_url(redis_url)
    names = RedisTier(RedisTierConfig(redis_url), buffer, "m")
    admin.acl_setuser(
        "chunk1",
        enabled=True,
        passwords=["+pw"],
        commands=["+@all"],
        keys=[names.redis_key(key(1))],
    )
    names.shutdown()
    try:
        options = {"username": "chunk1", "password": "pw"}
        tier = RedisTier(RedisTierConfig(redis_url, options=options), buffer, "m")
        fill(buffer, [1, 2])
        assert Jobs(tier).store([key(1), key(2)], [0, 1]).failed_keys == (key(2),)
        stats = tier.get_stats()
        assert (stats.chunks_stored, stats.failures) == (1, 1)
        assert tier.connected
        assert resolve(tier, key(2)) is LookupResult.MISS
        assert resolve(tier, key(1)) is LookupResult.HIT
        assert Jobs(tier).load([key(2)], [2]).failed_keys == (key(2),)
        assert tier.connected
        tier.shutdown()
    finally:
        admin.acl_deluser("chunk1")

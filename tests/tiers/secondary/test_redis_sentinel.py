"""The Redis tier through Redis Sentinel (`redis+sentinel://` URLs): the master
is whatever the sentinels name, so a failover costs misses for a moment and no
data. The contract suite runs through a sentinel too (`make_tier`)."""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path

import pytest
import redis

from kvoffload import LookupResult
from kvoffload.tiers.secondary import ArrayChunkBuffer, RedisTierConfig
from kvoffload.tiers.secondary.redis_sentinel import (
    SentinelAddress,
    parse_sentinel_url,
)
from kvoffload.tiers.secondary.redis_tier import RedisTier
from kvoffload.tiers.secondary.redis_topologies import RedisSentinelServers
from tests.tiers.secondary.secondary_support import (
    GROUPS,
    Jobs,
    key,
    payload,
    resolve,
)


def test_sentinel_urls_name_sentinels_service_db_and_master_credentials() -> None:
    assert parse_sentinel_url(
        "rediss+sentinel://app:p%40ss@s1:26380,s2/cache/2"
    ) == SentinelAddress(
        (("s1", 26380), ("s2", 26379)), "cache", 2, "app", "p@ss", ssl=True
    )
    assert parse_sentinel_url("redis+sentinel://s1/cache") == SentinelAddress(
        (("s1", 26379),), "cache"
    )


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+sentinel://s1:26379", r"must end in /service"),
        ("redis+sentinel://s1/cache/x", r"db 'x' is not a number"),
        ("redis+sentinel://:pw@s1:0/cache", r"'s1:0' is not a sentinel host:port"),
        ("redis+sentinel://:secret@s1,/cache", r"\*\*\*@s1,/cache.*'' is not"),
    ],
)
def test_a_bad_sentinel_url_stops_start_up(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RedisTierConfig(url)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://app:s3cret@s1/cache", r"'redis://app:\*\*\*@s1/cache' must start"),
        ("redis+sentinel://app:s3cret@s1/cache/x", r"app:\*\*\*@s1/cache/x'"),
        # A '/' in the password ends what looks like the host list.
        (
            "redis+sentinel://app:s3/cret@s1/cache",
            r"'redis\+sentinel://app:\*\*\*@s1/cache': a '/' in the password",
        ),
    ],
)
def test_sentinel_url_errors_do_not_show_the_password(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        parse_sentinel_url(url)
    assert "s3" not in str(caught.value)


def test_sentinel_kwargs_that_are_not_a_mapping_are_named_by_type_only() -> None:
    with pytest.raises(ValueError, match="sentinel_kwargs is a list") as caught:
        RedisTierConfig(
            "redis+sentinel://s1/cache",
            options={"sentinel_kwargs": [("password", "s3cret")]},
        )
    assert "s3" not in str(caught.value)


def test_cluster_and_sentinels_do_not_mix() -> None:
    with pytest.raises(ValueError, match="not reached through sentinels"):
        RedisTierConfig("redis+sentinel://s1/cache", cluster=True)


def replicated(replica_port: int, name: str, timeout_s: float = 10.0) -> None:
    replica = redis.Redis(port=replica_port)
    deadline = time.monotonic() + timeout_s
    while not replica.exists(name):
        assert time.monotonic() < deadline, "the replica never got the chunk"
        time.sleep(0.02)


def test_after_a_failover_the_chunks_load_from_the_new_master(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    with RedisSentinelServers(str(tmp_path)) as servers:
        assert servers.replica is not None
        config = RedisTierConfig(servers.url, timeout_s=0.5, backoff_initial_s=0.1)
        tier = RedisTier(config, buffer, "m")
        buffer.slot_view(0)[: GROUPS[0]] = payload(key(1), GROUPS[0])
        assert Jobs(tier).store([key(1)], [0]).success
        replicated(servers.replica.port, tier.redis_key(key(1)))

        servers.master.kill()
        new_master = servers.replica.port
        servers.wait_for_master(new_master, timeout_s=30.0)
        # Calls during the failover fail and back off; then the new master
        # serves the chunk, byte for byte.
        deadline = time.monotonic() + 30.0
        while True:
            result = Jobs(tier).load([key(1)], [5])
            if result.success:
                break
            assert time.monotonic() < deadline, "never reached the new master"
            time.sleep(0.1)
        assert bytes(buffer.slot_view(5)[: GROUPS[0]]) == payload(key(1), GROUPS[0])
        # Lookups remember the failed loads as misses for `miss_cache_s`.
        while resolve(tier, key(1)) is not LookupResult.HIT:
            assert time.monotonic() < deadline + 5.0, "lookups never hit again"
            time.sleep(0.1)
        tier.shutdown()


def test_a_silent_sentinel_is_asked_once_per_call_not_again_by_retries(
    buffer: ArrayChunkBuffer,
) -> None:
    """Scenario: the sentinel accepts connections and never answers. A lookup
    settles as a miss after one timeout: redis-py's own retries (each a new
    connection after a backoff, seconds in all) are off for the sentinels as
    for the master, so the sentinel sees one connection."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        port = listener.getsockname()[1]
        config = RedisTierConfig(
            f"redis+sentinel://127.0.0.1:{port}/svc", timeout_s=0.1
        )
        tier = RedisTier(config, buffer, "m", lambda: 100.0)  # no backoff ends
        assert resolve(tier, key(1)) is LookupResult.MISS
        tier.shutdown()
        listener.setblocking(False)
        accepted = 0
        with contextlib.suppress(BlockingIOError):
            while True:
                listener.accept()[0].close()
                accepted += 1
    assert accepted == 1

"""Fixtures: a buffer, a real redis-server on a free loopback port, tier builders."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from kvoffload.tiers.secondary import (
    ArrayChunkBuffer,
    SecondaryTier,
    create_secondary_tier,
)
from kvoffload.tiers.secondary.redis_server import RedisServer, find_redis_server
from kvoffload.tiers.secondary.redis_topologies import (
    RedisClusterServers,
    RedisSentinelServers,
)
from tests.tiers.secondary.secondary_support import (
    FINGERPRINT,
    GROUPS,
    SLOT,
    TierFactory,
)


@pytest.fixture
def buffer() -> ArrayChunkBuffer:
    return ArrayChunkBuffer(16, SLOT, GROUPS)


def _require_redis_server() -> None:
    if find_redis_server() is None:
        pytest.skip(
            "redis-server binary not found (Debian package redis-server; `make test` installs it)"
        )


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    _require_redis_server()
    server = RedisServer(str(tmp_path_factory.mktemp("redis")))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    redis.Redis(port=redis_server.port).flushall()
    return redis_server.url


@pytest.fixture(scope="session")
def redis_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RedisClusterServers]:
    """Three redis-server nodes joined into a Redis Cluster on loopback."""
    _require_redis_server()
    with RedisClusterServers(str(tmp_path_factory.mktemp("cluster"))) as cluster:
        yield cluster


@pytest.fixture
def redis_cluster_url(redis_cluster: RedisClusterServers) -> str:
    for node in redis_cluster.nodes:
        redis.Redis(port=node.port).flushall()
    return redis_cluster.url


@pytest.fixture(scope="session")
def redis_sentinel(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RedisSentinelServers]:
    """A master and a replica watched by one sentinel, on loopback."""
    _require_redis_server()
    with RedisSentinelServers(str(tmp_path_factory.mktemp("sentinel"))) as servers:
        yield servers


@pytest.fixture
def redis_sentinel_url(redis_sentinel: RedisSentinelServers) -> str:
    redis.Redis(port=redis_sentinel.master.port).flushall()
    return redis_sentinel.url


@pytest.fixture(params=["memory", "file", "redis", "redis-cluster", "redis-sentinel"])
def make_tier(
    request: pytest.FixtureRequest, tmp_path: Path, buffer: ArrayChunkBuffer
) -> Iterator[TierFactory]:
    """Builds a tier of the parametrized type on the shared buffer."""
    kind = request.param
    built: list[SecondaryTier] = []
    url = ""
    if kind == "redis":
        url = request.getfixturevalue("redis_url")
    elif kind == "redis-cluster":
        url = request.getfixturevalue("redis_cluster_url")
    elif kind == "redis-sentinel":
        url = request.getfixturevalue("redis_sentinel_url")

    def make(**overrides: Any) -> SecondaryTier:
        mapping: dict[str, Any] = {"type": kind}
        if kind == "memory":
            mapping["capacity_chunks"] = 64
        elif kind == "file":
            mapping.update(path=str(tmp_path / "tier"), capacity="1MiB")
        else:
            mapping.update(type="redis", url=url, timeout_s=2.0)
            if kind == "redis-cluster":
                mapping["cluster"] = True
        mapping.update(overrides)
        tier = create_secondary_tier(mapping, buffer, FINGERPRINT)
        built.append(tier)
        return tier

    yield make
    for tier in built:
        tier.shutdown()

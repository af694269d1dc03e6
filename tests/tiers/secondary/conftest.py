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
from tests.tiers.secondary.secondary_support import (
    FINGERPRINT,
    GROUPS,
    SLOT,
    TierFactory,
)


@pytest.fixture
def buffer() -> ArrayChunkBuffer:
    return ArrayChunkBuffer(16, SLOT, GROUPS)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    if find_redis_server() is None:
        pytest.skip(
            "redis-server binary not found (Debian package redis-server; `make test` installs it)"
        )
    server = RedisServer(str(tmp_path_factory.mktemp("redis")))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    redis.Redis(port=redis_server.port).flushall()
    return redis_server.url


@pytest.fixture(params=["memory", "file", "redis"])
def make_tier(
    request: pytest.FixtureRequest, tmp_path: Path, buffer: ArrayChunkBuffer
) -> Iterator[TierFactory]:
    """Builds a tier of the parametrized type on the shared buffer."""
    kind = request.param
    built: list[SecondaryTier] = []
    url = request.getfixturevalue("redis_url") if kind == "redis" else ""

    def make(**overrides: Any) -> SecondaryTier:
        mapping: dict[str, Any] = {"type": kind}
        if kind == "memory":
            mapping["capacity_chunks"] = 64
        elif kind == "file":
            mapping.update(path=str(tmp_path / "tier"), capacity="1MiB")
        else:
            mapping.update(url=url, timeout_s=2.0)
        mapping.update(overrides)
        tier = create_secondary_tier(mapping, buffer, FINGERPRINT)
        built.append(tier)
        return tier

    yield make
    for tier in built:
        tier.shutdown()

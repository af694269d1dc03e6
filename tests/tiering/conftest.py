"""Fixtures: a real redis-server on a free loopback port, one per test (killable)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kvoffload.tiers.secondary.redis_server import RedisServer, find_redis_server


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    if find_redis_server() is None:
        pytest.skip(
            "redis-server binary not found (Debian package redis-server; "
            "`make test` installs it)"
        )
    server = RedisServer(str(tmp_path))
    server.start()
    yield server
    server.stop()

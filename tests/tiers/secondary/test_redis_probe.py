"""The start-up probe of a Redis tier, against a real redis-server on loopback:
a server that answers, a dead port, a wrong password and a silent listener; and
the engine's start-up log with a live and a dead tier."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from kvoffload.integrations.vllm.config import KVOffloadSettings
from kvoffload.integrations.vllm.describe import log_start_up
from kvoffload.tiers.secondary import RedisTierConfig
from kvoffload.tiers.secondary.redis_probe import probe_redis
from kvoffload.tiers.secondary.redis_server import (
    RedisServer,
    find_redis_server,
    free_port,
)

pytestmark = pytest.mark.redis
PASSWORD = "pr0be-Secret"


def config(url: str, **settings: object) -> RedisTierConfig:
    return RedisTierConfig.from_mapping({"type": "redis", "url": url, **settings})


@pytest.fixture
def dead_url() -> str:
    """A loopback port nothing listens on."""
    return f"redis://app:{PASSWORD}@127.0.0.1:{free_port()}/0"


def test_a_server_that_answers_passes(redis_url: str) -> None:
    assert probe_redis(config(redis_url)) is None


def test_a_dead_port_is_named_without_the_password(dead_url: str) -> None:
    reason = probe_redis(config(dead_url))
    assert reason is not None
    assert "refused" in reason.lower(), reason
    assert PASSWORD not in reason


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[RedisServer]:
    if find_redis_server() is None:
        pytest.skip("redis-server binary not found (Debian package redis-server)")
    with RedisServer(str(tmp_path)) as server:
        redis.Redis(port=server.port).config_set("requirepass", PASSWORD)
        yield server


def test_a_refused_password_is_a_reason_without_it(guarded: RedisServer) -> None:
    url = f"redis://default:wrong-{PASSWORD}@127.0.0.1:{guarded.port}/0"
    reason = probe_redis(config(url))
    assert reason is not None
    assert PASSWORD not in reason
    right = f"redis://default:{PASSWORD}@127.0.0.1:{guarded.port}/0"
    assert probe_redis(config(right)) is None


def test_a_silent_server_costs_the_probes_timeout_not_the_tiers() -> None:
    """A listener that accepts and never answers, with a tier timeout of 300 s:
    the probe gives up after its own, so start-up is not held for minutes."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        started = time.monotonic()
        reason = probe_redis(
            config(f"redis://127.0.0.1:{port}/0", timeout_s=300), timeout_s=0.2
        )
        waited = time.monotonic() - started
    assert reason is not None
    assert waited < 30, waited


def test_start_up_logs_each_tier_and_warns_of_the_dead_one(
    redis_url: str, dead_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = KVOffloadSettings.from_extra_config(
        {
            "cpu_bytes_to_use": "1GiB",
            "secondary_tiers": [
                {"type": "redis", "url": redis_url, "name": "live"},
                {"type": "redis", "url": dead_url, "name": "dead"},
            ],
        }
    )
    with caplog.at_level(logging.INFO, logger="kvoffload"):
        log_start_up(settings)
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(info) == 3, info
    assert info[1].startswith(f"kvoffload: tier 'live' (redis, remote): {redis_url}")
    assert info[2].startswith(
        "kvoffload: tier 'dead' (redis, remote): redis://app:***@"
    )
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("kvoffload: tier 'dead': redis://app:***@127.0.0.1:")
    assert "serving starts anyway" in warnings[0]
    assert all(PASSWORD not in r.getMessage() for r in caplog.records)

"""Redis secrets: the URL or the password read from environment variables, so
that the config an engine logs holds none; and no password in any error, log
line or repr, redis-py's exceptions included."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from kvoffload import LookupResult
from kvoffload.config import messages_of
from kvoffload.tiers.secondary import ArrayChunkBuffer, RedisTierConfig
from kvoffload.tiers.secondary.redis_server import RedisServer, find_redis_server
from kvoffload.tiers.secondary.redis_tier import RedisTier
from tests.tiers.secondary.secondary_support import (
    GROUPS,
    Jobs,
    key,
    payload,
    resolve,
)

PASSWORD = "s3cret-Pw/+="  # a '/' and a '+', as base64 ones have
QUOTED = "s3cret-Pw%2F%2B%3D"


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[RedisServer]:
    """A server that asks for `PASSWORD`."""
    if find_redis_server() is None:
        pytest.skip("redis-server binary not found (Debian package redis-server)")
    with RedisServer(str(tmp_path)) as server:
        redis.Redis(port=server.port).config_set("requirepass", PASSWORD)
        yield server


def mapping(**settings: Any) -> dict[str, Any]:
    return {"type": "redis", **settings}


def round_trip(config: RedisTierConfig, buffer: ArrayChunkBuffer) -> None:
    """A store, a hit and a load of the same bytes through `config`."""
    tier = RedisTier(config, buffer, "m")
    buffer.slot_view(0)[: GROUPS[0]] = payload(key(1), GROUPS[0])
    jobs = Jobs(tier)
    assert jobs.store([key(1)], [0]).success
    assert resolve(tier, key(1)) is LookupResult.HIT
    assert jobs.load([key(1)], [1]).success
    assert bytes(buffer.slot_view(1)[: GROUPS[0]]) == payload(key(1), GROUPS[0])
    tier.shutdown()


def assert_no_secret(text: str) -> None:
    assert PASSWORD not in text and QUOTED not in text and "s3cret" not in text


def test_the_whole_url_from_an_environment_variable(
    guarded: RedisServer, buffer: ArrayChunkBuffer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario: the config names `KV_REDIS_URL`, which holds a URL with the
    password (percent-encoded): the tier reaches the server, and neither the
    config nor its repr holds the password."""
    url = f"redis://default:{QUOTED}@127.0.0.1:{guarded.port}/0"
    monkeypatch.setenv("KV_REDIS_URL", url)
    settings = mapping(url_env="KV_REDIS_URL")
    config = RedisTierConfig.from_mapping(settings)
    assert_no_secret(repr(settings) + repr(config))
    round_trip(config, buffer)


def test_the_password_from_an_environment_variable(
    guarded: RedisServer, buffer: ArrayChunkBuffer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KV_REDIS_PASSWORD", PASSWORD)
    settings = mapping(url=guarded.url, password_env="KV_REDIS_PASSWORD")
    config = RedisTierConfig.from_mapping(settings)
    assert_no_secret(repr(settings) + repr(config))
    round_trip(config, buffer)


def test_repr_hides_passwords_given_in_the_config() -> None:
    config = RedisTierConfig.from_mapping(
        mapping(url=f"redis://app:{QUOTED}@cache", options={"username": "app"})
    )
    assert_no_secret(repr(config))
    assert "redis://app:***@cache" in repr(config)


@pytest.mark.parametrize(
    ("settings", "env", "message"),
    [
        (
            {"url_env": "KV_UNSET"},
            {},
            r"^url_env: the environment variable 'KV_UNSET' is not set",
        ),
        (
            {"url_env": "KV_EMPTY"},
            {"KV_EMPTY": ""},
            r"^url_env: the environment variable 'KV_EMPTY' is empty",
        ),
        (
            {"url": "redis://c", "password_env": "KV_UNSET"},
            {},
            r"^password_env: the environment variable 'KV_UNSET' is not set",
        ),
        ({"url_env": 5}, {}, r"^url_env: 5 must be the name of an environment"),
        ({"url_env": "A=B"}, {}, r"^url_env: 'A=B' must be the name of an"),
        ({"password_env": ""}, {}, r"^url: required"),
        ({}, {}, r"^url: required \(or url_env"),
        (
            {"url": "redis://c", "url_env": "KV_URL"},
            {"KV_URL": "redis://d"},
            r"^url_env: 'KV_URL' and url \('redis://c'\) are both given",
        ),
        (
            {"url_env": "KV_URL"},
            {"KV_URL": f"http://app:{PASSWORD}@cache"},
            r"^url: 'http://app:\*\*\*@cache' must start with one of",
        ),
        (
            {"url": f"redis://:{QUOTED}@c", "password_env": "KV_PW"},
            {"KV_PW": PASSWORD},
            r"^password: given in url and password_env; give it in one place",
        ),
        (
            {
                "url": "redis://c",
                "options": {"password": PASSWORD},
                "password_env": "P",
            },
            {"P": PASSWORD},
            r"^password: given in options.password and password_env",
        ),
        (
            {"url": f"redis://c/0?password={QUOTED}", "options": {"password": "x"}},
            {},
            r"^password: given in url and options.password",
        ),
    ],
)
def test_secrets_settings_are_checked_at_start_up_without_showing_a_secret(
    settings: dict[str, Any],
    env: dict[str, str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KV_UNSET", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as caught:
        RedisTierConfig.from_mapping(mapping(**settings))
    # One of the errors (all are reported at once) is the one expected.
    errors = messages_of(caught.value)
    assert any(re.search(message, error) for error in errors), errors
    assert_no_secret(str(caught.value))


def test_redis_py_errors_that_echo_the_url_or_password_are_masked_in_logs(
    guarded: RedisServer,
    buffer: ArrayChunkBuffer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Scenario: redis-py fails calls with messages that quote the URL (with
    its password) or the password alone, as a Redis error and as an
    unexpected exception: lookups miss, loads fail, and no log line (nor its
    traceback) shows the password."""
    url = f"redis://app:{QUOTED}@127.0.0.1:{guarded.port}/0"
    config = RedisTierConfig(url)
    echoes: list[Exception] = [
        redis.ConnectionError(f"cannot reach {url} as app/{PASSWORD}"),
        TypeError(f"bad option for {url}: {PASSWORD!r}"),
    ]
    raised: list[Exception] = []

    def fail(*args: object, **kwargs: object) -> None:
        raise raised[-1]

    monkeypatch.setattr(redis.client.Pipeline, "execute", fail)
    monkeypatch.setattr(redis.Redis, "mget", fail)
    with caplog.at_level(logging.DEBUG, logger="kvoffload"):
        for echo in echoes:
            raised.append(echo)
            tier = RedisTier(config, buffer, "m")
            assert resolve(tier, key(1)) is LookupResult.MISS
            tier.shutdown()
            tier = RedisTier(config, buffer, "m")
            assert Jobs(tier).load([key(1)], [1]).failed_keys == (key(1),)
            tier.shutdown()
    text = "\n".join(caplog.messages) + caplog.text
    assert "cannot reach redis://app:***@127.0.0.1" in text
    assert "bad option for" in text
    assert_no_secret(text)

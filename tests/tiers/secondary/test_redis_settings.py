"""Start-up checks of the Redis tier's settings: durations Redis and the
platform accept, TLS options only with TLS, options the tier's client takes
with its URL, and counts in range. Each error names the key and the value."""

from __future__ import annotations

import math
from typing import Any

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from kvoffload.config import messages_of
from kvoffload.tiers.secondary import ArrayChunkBuffer, RedisTierConfig
from kvoffload.tiers.secondary.redis_settings import MAX_TTL_S, safe_repr
from kvoffload.tiers.secondary.redis_tier import RedisTier
from tests.tiers.secondary.secondary_support import GROUPS, Jobs, key, payload

DURATIONS = (
    "timeout_s",
    "ttl_s",
    "hit_cache_s",
    "miss_cache_s",
    "backoff_initial_s",
    "backoff_max_s",
)
BAD_SECONDS = [
    math.nan,
    math.inf,
    -math.inf,
    -1,
    0,
    1e-300,
    1e300,
    10**400,
    -(10**5000),
    True,
    "1",
    "1s",
    [1],
    None,
]


def config(**settings: Any) -> RedisTierConfig:
    return RedisTierConfig.from_mapping(
        {"type": "redis", "url": "redis://c", **settings}
    )


@pytest.mark.parametrize("name", DURATIONS)
@pytest.mark.parametrize("value", BAD_SECONDS, ids=safe_repr)
def test_a_bad_duration_names_the_key_and_the_value(name: str, value: object) -> None:
    if value is None and name == "ttl_s":
        return  # null: no expiry
    # An int past any setting's range is refused where the mapping enters, by
    # the check every config shares; either way the message names key and value.
    expected = rf"^{name}: .* (must be a number of seconds|is out of range)"
    with pytest.raises(ValueError, match=expected):
        config(**{name: value})


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        # Redis refuses an expiry past 2**63 - 1 ms less its clock: every store
        # would fail.
        ({"ttl_s": 1e300}, r"ttl_s: 1e\+300 must be .* to 4\.6\d*e\+15 or null"),
        ({"ttl_s": MAX_TTL_S * 1.01}, r"ttl_s: .* must be"),
        ({"ttl_s": 0.0001}, r"ttl_s: 0.0001 must be a number of seconds from 0.001"),
        ({"timeout_s": 301}, r"timeout_s: 301 must be .* from 0.001 to 300"),
        ({"backoff_max_s": 86400}, r"backoff_max_s: 86400 must be .* to 3600"),
        ({"miss_cache_s": 1e9}, r"miss_cache_s: 1000000000.0 must be .* to 86400"),
        ({"num_threads": 10**6}, r"num_threads: 1000000 must be an int from 1 to 256"),
        (
            {"num_threads": 10**5000},
            r"num_threads: <an int of about 5001 digits> is out of range",
        ),
        ({"max_inflight_chunks": 0}, r"max_inflight_chunks: 0 must be an int from 1"),
        ({"key_prefix": "k" * 2000}, r"key_prefix: 'kkk.* must be at most 1024"),
        ({"key_prefix": b"kv"}, r"key_prefix: b'kv' must be a non-empty string"),
        (
            {"batch_bytes": -(10**5000)},
            r"batch_bytes: <a negative int of about 5001 digits> is out of range",
        ),
        ({"batch_bytes": "2TiB"}, r"batch_bytes: '2TiB' must be from 1 to"),
        # Fewer connections than threads: calls fail as if the server were down.
        (
            {"options": {"max_connections": 4}},
            r"options: max_connections 4 must be an int >= num_threads \+ 2 \(6\)",
        ),
    ],
)
def test_useless_values_are_refused(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config(**settings)


def test_the_longest_ttl_allowed_is_one_redis_accepts(
    redis_url: str, buffer: ArrayChunkBuffer
) -> None:
    """The largest `ttl_s` the config takes is one a real server takes for
    both `SET PX` (a store) and `PEXPIRE` (a store of a chunk it holds)."""
    tier = RedisTier(RedisTierConfig(redis_url, ttl_s=MAX_TTL_S), buffer, "m")
    buffer.slot_view(0)[: GROUPS[0]] = payload(key(1), GROUPS[0])
    jobs = Jobs(tier)
    assert jobs.store([key(1)], [0]).success
    assert jobs.store([key(1)], [0]).success  # renewed with PEXPIRE
    ttl_ms = redis.Redis.from_url(redis_url).pttl(tier.redis_key(key(1)))
    assert ttl_ms > 2**61  # type: ignore[operator]
    assert tier.get_stats().failures == 0
    tier.shutdown()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        # TLS options on a URL without TLS: redis-py hands them to a plain
        # connection, which raises TypeError on every call.
        ({"options": {"ssl_ca_certs": "/ca.pem"}}, r"options: 'ssl_ca_certs' with"),
        (
            {"url": "unix:///run/redis.sock", "options": {"ssl_certfile": "/c"}},
            r"options: 'ssl_certfile' with the url 'unix:///run/redis.sock': TLS",
        ),
        (
            {"url": "redis://c/0?ssl_cert_reqs=none"},
            r"url query: 'ssl_cert_reqs' with the url .*rediss://",
        ),
        (
            {"url": "redis+sentinel://s1/cache", "options": {"ssl_keyfile": "/k"}},
            r"options: 'ssl_keyfile' with .*rediss\+sentinel://",
        ),
        (
            {"url": "rediss://c", "options": {"ssl": False}},
            r"options: 'ssl': TLS is turned on by the url's scheme",
        ),
        # Settings in the URL's query override the tier's own.
        ({"url": "redis://c/0?socket_timeout=1e9"}, r"url query: 'socket_timeout' is"),
        ({"url": "redis://c/0?retry_on_timeout=y"}, r"url query: 'retry_on_timeout'"),
        ({"url": "redis://c/0?colour=red"}, r"url query: 'colour' is not an option"),
        ({"url": "redis://c/cache"}, r"url: 'redis://c/cache': the path must be a"),
        ({"url": "redis://c/\u0661"}, r"url: 'redis://c/\u0661': the path must be a"),
        ({"url": "redis://c?db=x"}, r"url: 'redis://c\?db=x': the database \(db=\)"),
        ({"url": "redis://c/2", "cluster": True}, r"Cluster has database 0 only"),
        ({"url": "redis://c/0?db=2", "cluster": True}, r"database 0 only"),
        ({"url": "redis+sentinel://s1/cache?db=1"}, r"sentinel:// URL takes no query"),
        # Options the URL or the tier sets, or the other kind of client takes.
        ({"options": {"host": "other"}}, r"options: 'host' is set by the tier or"),
        ({"options": {"connection_pool": 1}}, r"options: 'connection_pool' is set"),
        (
            {"options": {"read_from_replicas": True}},
            r"options: 'read_from_replicas' is not an option of .*redis.Redis",
        ),
        (
            {"cluster": True, "options": {"health_check_interval": 5}},
            r"'health_check_interval' is not an option of .*RedisCluster",
        ),
        (
            {"options": {"sentinel_kwargs": {"password": "x"}}},
            r"options: sentinel_kwargs .* with a redis\+sentinel:// URL only",
        ),
        (
            {
                "url": "redis+sentinel://s1/cache",
                "options": {"sentinel_kwargs": {"socket_timeout": 1e9}},
            },
            r"sentinel_kwargs: 'socket_timeout' is set by the tier",
        ),
        (
            {
                "url": "redis+sentinel://s1/cache",
                "options": {"sentinel_kwargs": {"pasword": "x"}},
            },
            r"sentinel_kwargs: 'pasword' is not an option.*'password'",
        ),
    ],
)
def test_options_the_client_cannot_use_with_the_url_are_refused(
    settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        config(**settings)


@pytest.mark.parametrize(
    "settings",
    [
        {"url": "rediss://c", "options": {"ssl_ca_certs": "/ca.pem"}},
        {"url": "rediss://c/0?ssl_cert_reqs=none"},
        {"url": "rediss+sentinel://s1/cache", "options": {"ssl_keyfile": "/k"}},
        {
            "url": "redis+sentinel://s1/cache",
            "options": {"sentinel_kwargs": {"ssl": True, "password": "x"}},
        },
        {"url": "redis://c/3?db=3"},
        {"url": "redis://c", "cluster": True, "options": {"read_from_replicas": True}},
        {"options": {"health_check_interval": 5, "max_connections": 6}},
        {"ttl_s": MAX_TTL_S, "timeout_s": 300, "backoff_max_s": 3600},
    ],
)
def test_settings_the_client_can_use_are_taken(settings: dict[str, Any]) -> None:
    config(**settings)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            [
                *DURATIONS,
                "num_threads",
                "max_inflight_chunks",
                "batch_bytes",
                "cluster",
                "key_prefix",
                "options",
                "url",
            ]
        ),
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(),
            st.integers(min_value=-(10**5000), max_value=10**5000).map(lambda i: i**3),
            st.floats(),
            st.text(max_size=8),
            st.lists(st.integers(), max_size=2),
            st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
        ),
        max_size=4,
    )
)
def test_any_setting_is_taken_or_refused_with_a_value_error(
    settings: dict[str, Any],
) -> None:
    """Generated values of every kind for the tier's settings: each config is
    taken, or refused with a ValueError that names one of the keys given."""
    try:
        config(**settings)
    except ValueError as exc:
        for error in messages_of(exc):  # every error, reported at once
            assert any(error.startswith(name) for name in ("url", *settings)), exc

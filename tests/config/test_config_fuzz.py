"""Fuzzing the configuration edges with arbitrary JSON-like values (and shapes JSON
cannot have: int keys, 5,000-digit ints, deep nesting) per key, plus unknown keys.

Property: a valid configuration, or a `ValueError`/`TypeError` that names a key,
is short and never comes from Python's own int conversion. Bounded to seconds.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvoffload.config import messages_of, shown
from kvoffload.connector.config import ConnectorConfig, GroupSpec
from kvoffload.integrations.vllm.config import KEYS, KVOffloadSettings
from kvoffload.tiering import TieringConfig
from kvoffload.tiers.secondary import parse_tier_config

from .strategies import JSONISH, KEYS_ANY, either

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

POLICIES = either("lru", "arc", "split")
FILE_TIER = {
    "type": st.just("file"),
    "path": either("/tmp/kvoffload-fuzz"),
    "capacity": either("1GiB", 4096, "1.5 GiB"),
    "eviction_policy": POLICIES,
    "name": either("file", "disk", "cpu", "local"),
    "locality": either("local", "remote"),
    "offload_policy": either("chunk_level", "block_level", "request_level"),
    "num_threads": either(1, 4),
    "max_inflight_chunks": either(1, 256),
    "fsync": either(True, False),
    "rescan_interval_s": either(0, 1.5),
}
REDIS_TIER = {
    "type": st.just("redis"),
    "url": either(
        "redis://cache:6379/0",
        "rediss://:pw@cache",
        "unix:///tmp/redis.sock",
        "redis+sentinel://s1:26379/master",
        "redis://cache:notaport",
    ),
    "name": either("redis", "remote"),
    "timeout_s": either(0.5, 1e300),
    "ttl_s": either(None, 60),
    "key_prefix": either("kv", "kv*"),
    "batch_bytes": either("64MiB", 1),
    "hit_cache_s": either(30.0),
    "backoff_initial_s": either(0.5),
    "backoff_max_s": either(30),
    "cluster": either(True, False),
    "options": either({}, {"password": "pw"}, {"socket_timeout": 1}, {"db": 1}),
}
MEMORY_TIER = {
    "type": st.just("memory"),
    "capacity_chunks": either(4),
    "eviction_policy": POLICIES,
    "name": either("memory"),
}


def mapping(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """Some of `fields` with their values, maybe an unknown key or two."""
    return st.builds(
        lambda known, unknown: {**unknown, **known},
        st.fixed_dictionaries({}, optional=fields),
        st.dictionaries(KEYS_ANY, JSONISH, max_size=2),
    )


TIER = (
    mapping(FILE_TIER)
    | mapping(REDIS_TIER)
    | mapping(MEMORY_TIER)
    | mapping({"type": JSONISH})
    | JSONISH
)
EXTRA = {
    "cpu_bytes_to_use": either("1GiB", 1 << 20, "0.5 GiB"),
    "block_size": either(None, 16, 256),
    "blocks_per_chunk": either(None, 1, 4),
    "eviction_policy": POLICIES,
    "store_threshold": either(0, 2),
    "max_tracker_size": either(1000),
    "offload_prompt_only": either(True, False),
    "secondary_tiers": st.lists(TIER, max_size=2) | JSONISH,
    "max_defer_s": either(0, 0.5),
    "model_tag": either("v1"),
}


def _names_a_key(message: str, keys: list[str]) -> bool:
    return any(key in message for key in keys)


def _check_error(error: Exception, keys: list[str]) -> None:
    message = str(error)
    assert _names_a_key(message, keys), message
    assert "int_max_str_digits" not in message, message
    # Every error is reported at once (`ConfigError`): each one stays short.
    for each in messages_of(error):
        assert len(each) < 2500, each


def _keys_of(value: Any) -> list[str]:
    """How an error names the keys of `value`, if it is a mapping."""
    return [shown(key) for key in value] if isinstance(value, dict) else []


@FUZZ
@given(extra=mapping(EXTRA) | JSONISH)
def test_connector_extra_config_is_valid_or_a_named_error(extra: Any) -> None:
    """The key is vLLM's (`kv_connector_extra_config`), and within it the
    setting at fault: one of the valid keys, or one given."""
    try:
        KVOffloadSettings.from_extra_config(extra)
    except (ValueError, TypeError) as error:
        _check_error(error, ["kv_connector_extra_config"])
        if isinstance(extra, dict):
            names = [*KEYS, *_keys_of(extra), *(k for k in extra if type(k) is str)]
            _check_error(error, names)


@FUZZ
@given(tier=TIER)
def test_tier_config_is_valid_or_a_named_error(tier: Any) -> None:
    try:
        parse_tier_config(tier)
    except (ValueError, TypeError) as error:
        fields = [*FILE_TIER, *REDIS_TIER, *MEMORY_TIER]
        if isinstance(tier, dict):
            names = [*fields, *_keys_of(tier), *(k for k in tier if type(k) is str)]
            _check_error(error, names)
        else:
            _check_error(error, ["secondary tier"])


@FUZZ
@given(
    config=mapping(
        {
            "promotion_failure_ttl_s": either(30.0, 1),
            "max_remembered_failures": either(65_536),
        }
    )
    | JSONISH
)
def test_tiering_config_is_valid_or_a_named_error(config: Any) -> None:
    try:
        TieringConfig.from_mapping(config)
    except (ValueError, TypeError) as error:
        _check_error(
            error,
            ["tiering", "promotion_failure_ttl_s", "max_remembered_failures"],
        )


GROUPS = st.lists(
    st.builds(GroupSpec, either(4, 16), either(1, 3), either(True, False)),
    min_size=1,
    max_size=2,
).map(tuple)


@FUZZ
@given(data=st.data())
def test_connector_config_is_valid_or_a_named_error(data: st.DataObject) -> None:
    """The same through the Python API: `GroupSpec` and `ConnectorConfig` built
    with arbitrary values."""
    fields = {
        "groups": GROUPS | JSONISH,
        "hash_block_tokens": either(0, 4),
        "offload_prompt_only": either(True, False),
        "max_defer_s": either(1.0, 0),
        "world_size": either(1, 2),
        "engine_prefix_caching": either(True, False),
        "null_block_id": either(None, 0),
    }
    names = [*fields, "tokens_per_block", "blocks_per_chunk", "offloaded"]
    try:
        kwargs = data.draw(st.fixed_dictionaries({}, optional=fields))
        ConnectorConfig(**kwargs)
    except (ValueError, TypeError) as error:
        _check_error(error, names)

"""`kv_connector_extra_config` at start-up: good values parse, a bad one raises
an error that names the key and the value (SPEC §4)."""

from __future__ import annotations

from typing import Any

import pytest

from kvoffload.config import ConfigError
from kvoffload.integrations.vllm.config import KVOffloadSettings


def parse(**extra: Any) -> KVOffloadSettings:
    return KVOffloadSettings.from_extra_config({"cpu_bytes_to_use": "1GiB", **extra})


def test_good_values_parse() -> None:
    settings = parse(
        block_size=256,
        eviction_policy="split",
        store_threshold=2,
        offload_prompt_only=False,
        secondary_tiers=[{"type": "file", "path": "/tmp/kv", "capacity": "8GiB"}],
        max_defer_s=0.5,
        model_tag="llama-ft-v3",
    )
    assert settings.cpu_bytes_to_use == 1 << 30
    assert settings.blocks_per_chunk_for(16) == 16
    assert settings.eviction_policy == "split"
    assert settings.store_threshold == 2
    assert settings.offload_prompt_only is False
    assert settings.max_defer_s == 0.5
    assert settings.model_tag == "llama-ft-v3"
    assert parse().model_tag is None


def test_offload_prompt_only_is_on_unless_turned_off() -> None:
    """SPEC §3.7: the default is true (the seed measured 82% fewer writes)."""
    assert parse().offload_prompt_only is True
    assert parse(offload_prompt_only=True).offload_prompt_only is True
    assert parse(offload_prompt_only=False).offload_prompt_only is False


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"block_size": 0}, r"\['block_size'\]: 0 is not an integer >= 1"),
        ({"blocks_per_chunk": "2"}, r"\['blocks_per_chunk'\]: '2' is not an integer"),
        (
            {"block_size": 32, "blocks_per_chunk": 2},
            r"not both \(block_size=32, blocks_per_chunk=2\)",
        ),
        ({"eviction_policy": "mru"}, r"\['eviction_policy'\]: .*mru"),
        ({"store_threshold": -1}, r"\['store_threshold'\]: -1"),
        ({"offload_prompt_only": "yes"}, r"\['offload_prompt_only'\]: 'yes'"),
        ({"secondary_tiers": "file"}, r"\['secondary_tiers'\]: 'file' is not a list"),
        ({"secondary_tiers": [{"type": "tape"}]}, r"\['secondary_tiers'\]\[0\]"),
        ({"max_defer_s": -1}, r"\['max_defer_s'\]: -1 is not a finite number"),
        ({"max_defer_s": True}, r"\['max_defer_s'\]: True"),
        ({"max_defer_s": float("nan")}, r"\['max_defer_s'\]: nan is not a finite"),
        ({"max_defer_s": float("inf")}, r"\['max_defer_s'\]: inf is not a finite"),
        ({"model_tag": ""}, r"\['model_tag'\]: '' is not a non-empty string"),
        ({"model_tag": 3}, r"\['model_tag'\]: 3 is not a non-empty string"),
        (
            {"cpu_bytes": "1GiB"},
            r"unknown key 'cpu_bytes' \(did you mean 'cpu_bytes_to_use'\?\)",
        ),
    ],
)
def test_a_bad_value_names_the_key_and_the_value(
    extra: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        parse(**extra)


HUGE = 10**400  # more than a float holds: float(HUGE) raises OverflowError


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"cpu_bytes_to_use": 0},
            r"\['cpu_bytes_to_use'\]: 0 must be > 0 bytes.*e\.g\. '16GiB'",
        ),
        (
            {"cpu_bytes_to_use": "0GiB"},
            r"\['cpu_bytes_to_use'\]: '0GiB' must be > 0 bytes.*e\.g\. '16GiB'",
        ),
        (
            {"cpu_bytes_to_use": "0.5"},
            r"\['cpu_bytes_to_use'\]: '0\.5' is not a whole number of bytes",
        ),
        ({"cpu_bytes_to_use": [1]}, r"\['cpu_bytes_to_use'\]: cannot parse \[1\]"),
        ({"cpu_bytes_to_use": float("nan")}, r"\['cpu_bytes_to_use'\]: .*nan"),
        ({"cpu_bytes_to_use": -1}, r"\['cpu_bytes_to_use'\]: -1 is negative"),
        ({"block_size": 32.0}, r"\['block_size'\]: 32\.0 is not an integer"),
        ({"blocks_per_chunk": True}, r"\['blocks_per_chunk'\]: True is not an"),
        (
            {"eviction_policy": "..x"},
            r"\['eviction_policy'\]: cannot import '\.\.x'.*expected one of",
        ),
        (
            {"eviction_policy": ":x"},
            r"\['eviction_policy'\]: cannot import ':x'.*expected one of",
        ),
        ({"eviction_policy": ["lru"]}, r"\['eviction_policy'\]: \['lru'\] is not a"),
        (
            {"secondary_tiers": [{"type": ["file"]}]},
            r"\[0\]: type: \['file'\] is not a secondary tier type; expected one "
            r"of \('file', 'memory', 'redis'\)",
        ),
        (
            {"secondary_tiers": [{"type": {"file": 1}}]},
            r"\[0\]: type: \{'file': 1\} is not a secondary tier type",
        ),
        ({"max_defer_s": HUGE}, r"\['max_defer_s'\]: 1000.* is not a finite number"),
        ({"max_defer_s": -HUGE}, r"\['max_defer_s'\]: -1000.* is not a finite"),
        ({"max_defer_s": [1]}, r"\['max_defer_s'\]: \[1\] is not a finite"),
        ({"store_threshold": 0.5}, r"\['store_threshold'\]: 0\.5 is not an integer"),
        ({"max_tracker_size": {}}, r"\['max_tracker_size'\]: \{\} is not an integer"),
        ({"offload_prompt_only": None}, r"\['offload_prompt_only'\]: None is not"),
        ({"model_tag": ["x"]}, r"\['model_tag'\]: \['x'\] is not a non-empty"),
    ],
)
def test_a_value_of_the_wrong_kind_names_the_key_the_value_and_what_is_allowed(
    extra: dict[str, Any], message: str
) -> None:
    """Scenario: lists, dicts, bools, NaN, ints too large for a float, negative
    and empty values, each a ValueError naming the key and the value, never an
    exception of Python's own (OverflowError, a TypeError from importlib)."""
    with pytest.raises(ValueError, match=message):
        parse(**extra)


@pytest.mark.parametrize(
    ("tier", "message"),
    [
        ({"timeout_s": HUGE}, r"timeout_s: an int of 1329 bits must be a number of"),
        ({"timeout_s": 1e300}, r"timeout_s: 1e\+300 must be a number of .* to 300"),
        ({"ttl_s": HUGE}, r"ttl_s: an int of 1329 bits must be a number of"),
        ({"hit_cache_s": -HUGE}, r"hit_cache_s: an int of 1329 bits must be a"),
        ({"backoff_max_s": HUGE}, r"backoff_max_s: an int of 1329 bits must be"),
        ({"batch_bytes": "0MiB"}, r"batch_bytes: '0MiB' must be from 1 to"),
        ({"cluster": [True]}, r"cluster: \[True\] must be true or false"),
    ],
)
def test_a_bad_redis_tier_value_names_the_key_and_the_value(
    tier: dict[str, Any], message: str
) -> None:
    redis = {"type": "redis", "url": "redis://cache:6379", **tier}
    with pytest.raises(ValueError, match=r"\['secondary_tiers'\]\[0\]: " + message):
        parse(secondary_tiers=[redis])


@pytest.mark.parametrize(
    ("tier", "message"),
    [
        ({"rescan_interval_s": HUGE}, r"rescan_interval_s: 1000.* must be a positive"),
        ({"rescan_interval_s": float("nan")}, r"rescan_interval_s: nan must be"),
        ({"capacity": "0GiB"}, r"capacity: '0GiB' must be > 0 bytes"),
        ({"capacity": {"GiB": 1}}, r"capacity: cannot parse \{'GiB': 1\} as a size"),
        ({"num_threads": 1e300}, r"num_threads: 1e\+300 must be an int >= 1"),
        ({"path": ["/kv"]}, r"path: \['/kv'\] must be a non-empty directory path"),
    ],
)
def test_a_bad_file_tier_value_names_the_key_and_the_value(
    tier: dict[str, Any], message: str
) -> None:
    file = {"type": "file", "path": "/tmp/kv", "capacity": "1GiB", **tier}
    with pytest.raises(ValueError, match=r"\['secondary_tiers'\]\[0\]: " + message):
        parse(secondary_tiers=[file])


@pytest.mark.parametrize(
    ("tiers", "message"),
    [
        ({"type": "redis", "url": "redis://:s3cret@cache"}, "a value of type dict"),
        ("redis://:s3cret@cache", r"'redis://:\*\*\*@cache' is not a list"),
        (["redis://:s3cret@cache"], r"\[0\]: .*'redis://:\*\*\*@cache'"),
    ],
)
def test_secondary_tiers_errors_do_not_show_a_redis_password(
    tiers: object, message: str
) -> None:
    """Scenario: the tier's mapping, or its URL alone, given where the list of
    tiers or a tier belongs."""
    with pytest.raises(ValueError, match=message) as caught:
        parse(secondary_tiers=tiers)
    assert "s3" not in str(caught.value)


@pytest.mark.parametrize("name", ["connector", "cpu"])
def test_a_secondary_tier_may_not_take_a_reserved_name(name: str) -> None:
    """Scenario: a file tier named like the connector's (or host memory's) own
    stats would have its metrics overwritten by (or mixed with) theirs; it stops
    start-up, and the error lists the reserved names."""
    tier = {"type": "file", "path": "/tmp/kv", "capacity": "1GiB", "name": name}
    with pytest.raises(
        ValueError,
        match=rf"\['secondary_tiers'\]\[0\]: name: '{name}' is reserved "
        r".*\('cpu', 'connector'\)",
    ):
        parse(secondary_tiers=[tier])


@pytest.mark.parametrize(
    ("extra", "engine_blocks_per_chunk"),
    [
        ({"block_size": None}, 1),
        ({"blocks_per_chunk": None}, 1),
        ({"block_size": None, "blocks_per_chunk": None}, 1),
        ({"block_size": None, "blocks_per_chunk": 4}, 4),
        ({"block_size": 64, "blocks_per_chunk": None}, 4),
    ],
)
def test_a_null_chunk_size_means_unset(
    extra: dict[str, Any], engine_blocks_per_chunk: int
) -> None:
    """Scenario: a config written for vLLM's OffloadingConnector, which reads
    `block_size` and `blocks_per_chunk` with `extra_config.get(...)`, so null is
    unset there; here too, and not 'both given'."""
    assert parse(**extra).blocks_per_chunk_for(16) == engine_blocks_per_chunk


def test_host_memory_is_required() -> None:
    with pytest.raises(ValueError, match=r"\['cpu_bytes_to_use'\] is required"):
        KVOffloadSettings.from_extra_config({})


def test_every_error_is_reported_at_once() -> None:
    """Scenario: a config with a typo at the top, a bad value, a typo in a tier
    and a bad tier value. One start-up reports all four (a `ConfigError`, a
    ValueError), each naming its key, the typos with what was meant."""
    extra = {
        "cpu_bytes_to_use": "1GiB",
        "evicton_policy": "arc",
        "max_defer_s": -1,
        "secondary_tiers": [
            {"type": "file", "path": "/tmp/kv", "capacity": "1GiB", "num_thread": 2},
            {"type": "file", "path": "/tmp/kv2", "capacity": "0", "name": "disk"},
        ],
    }
    with pytest.raises(ConfigError) as caught:
        KVOffloadSettings.from_extra_config(extra)
    errors = caught.value.messages
    assert len(errors) == 4, errors
    assert errors[0].startswith(
        "kv_connector_extra_config: unknown key 'evicton_policy' "
        "(did you mean 'eviction_policy'?)"
    )
    assert any(
        e.startswith("kv_connector_extra_config['max_defer_s']: -1") for e in errors
    )
    assert any(
        "['secondary_tiers'][0]: file tier: unknown key 'num_thread' "
        "(did you mean 'num_threads'?)" in e
        for e in errors
    )
    assert any("['secondary_tiers'][1]: capacity: '0' must be > 0" in e for e in errors)
    assert str(caught.value).startswith("4 configuration errors:\n  - ")


def test_one_error_reads_as_before() -> None:
    with pytest.raises(ConfigError) as caught:
        parse(max_defer_s=-1)
    assert str(caught.value) == caught.value.messages[0]
    assert str(caught.value).startswith("kv_connector_extra_config['max_defer_s']")


def test_a_key_far_from_any_valid_one_gets_no_suggestion() -> None:
    with pytest.raises(ValueError) as caught:
        parse(zzz=1)
    assert "did you mean" not in str(caught.value)
    assert "valid keys: ['block_size'," in str(caught.value)


def test_two_tiers_of_one_name_are_refused_at_start_up() -> None:
    """Checked with the rest, before the engine starts (their stats and
    metrics are keyed by name)."""
    tier = {"type": "memory", "capacity_chunks": 4}
    with pytest.raises(
        ValueError,
        match=r"\['secondary_tiers'\]\[1\]: name: 'memory' is also the name of tier 0",
    ):
        parse(secondary_tiers=[tier, tier])

"""Tier configurations and the factory: parsing, validation, error messages."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvoffload import OffloadPolicy
from kvoffload.tiering import TieringConfig
from kvoffload.tiers.secondary import (
    ArrayChunkBuffer,
    FileTierConfig,
    RedisTierConfig,
    create_secondary_tier,
    create_secondary_tiers,
    make_fingerprint,
)
from kvoffload.tiers.secondary.factory import parse_tier_config
from tests.tiers.secondary.secondary_support import FINGERPRINT


def test_file_config_from_mapping_parses_sizes_and_policies(tmp_path: Path) -> None:
    config = FileTierConfig.from_mapping(
        {
            "type": "file",
            "path": str(tmp_path),
            "capacity": "10GiB",
            "offload_policy": "block_level",
        }
    )
    assert config.capacity_bytes == 10 << 30
    assert config.offload_policy is OffloadPolicy.CHUNK_LEVEL
    assert (config.name, config.locality, config.eviction_policy) == (
        "file",
        "local",
        "lru",
    )


@pytest.mark.parametrize(
    ("value", "mode"), [("0600", 0o600), ("0660", 0o660), (0o600, 0o600), (432, 0o660)]
)
def test_file_mode_takes_the_two_modes_as_strings_or_ints(
    tmp_path: Path, value: object, mode: int
) -> None:
    mapping = {"path": str(tmp_path), "capacity": "1GiB", "file_mode": value}
    assert FileTierConfig.from_mapping(mapping).file_mode == mode
    assert FileTierConfig(str(tmp_path), 1 << 30).file_mode == 0o600


@pytest.mark.parametrize("seconds", [0, 1, 1.0, 60, 86400])
def test_rescan_interval_takes_zero_or_one_second_to_a_day(
    tmp_path: Path, seconds: float
) -> None:
    config = FileTierConfig(str(tmp_path), 1 << 30, rescan_interval_s=seconds)
    assert config.rescan_interval_s == seconds


def test_unknown_key_lists_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError,
        match=r"file tier: unknown key 'capcity' \(did you mean 'capacity'\?\); "
        r"valid keys: \[.*'capacity'.*'path'",
    ):
        FileTierConfig.from_mapping({"path": str(tmp_path), "capcity": "1GiB"})
    with pytest.raises(ValueError, match=r"redis tier: unknown key 'host'; .*'url'"):
        RedisTierConfig.from_mapping({"url": "redis://x", "host": "x"})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"capacity_bytes": "lots"}, r"capacity: cannot parse 'lots'"),
        ({"capacity_bytes": 0}, r"capacity: 0 must be > 0"),
        ({"eviction_policy": "fifo"}, r"eviction_policy: unknown policy 'fifo'"),
        ({"locality": "mars"}, r"locality: 'mars' must be one of"),
        ({"offload_policy": "all"}, r"offload_policy: 'all' must be one of"),
        ({"num_threads": 0}, r"num_threads: 0 must be an int >= 1"),
        ({"name": "cpu"}, r"name: 'cpu' is reserved .*\('cpu', 'connector'\)"),
        ({"name": "connector"}, r"name: 'connector' is reserved .*'connector'"),
        ({"name": "remote"}, r"name: 'remote' must .* other than a medium"),
        ({"name": "storage"}, r"name: 'storage' must .* other than a medium"),
        ({"name": "nvme:0"}, r"name: 'nvme:0' must .* without ':' or ','"),
        ({"name": "a,b"}, r"name: 'a,b' must .* without ':' or ','"),
        ({"name": " disk"}, r"name: ' disk' must .* spaces at its ends"),
        ({"path": ""}, r"path: '' must be"),
        ({"rescan_interval_s": -1}, r"rescan_interval_s: -1 must be a positive"),
        ({"rescan_interval_s": "5s"}, r"rescan_interval_s: '5s' must be a positive"),
        ({"rescan_interval_s": False}, r"rescan_interval_s: False must be a positive"),
        # Values that make the tier useless, or absurd: refused with the range.
        (
            {"rescan_interval_s": 1e-300},
            r"rescan_interval_s: 1e-300 .* from 1 to 86400",
        ),
        (
            {"rescan_interval_s": 0.5},
            r"rescan_interval_s: 0.5 .* from 1 to 86400, or 0",
        ),
        ({"rescan_interval_s": 86401}, r"rescan_interval_s: 86401 .* from 1 to 86400"),
        ({"rescan_interval_s": float("inf")}, r"rescan_interval_s: inf must be"),
        (
            {"rescan_interval_s": 10**5000},
            r"rescan_interval_s: <an int of about 5001 digits>",
        ),
        ({"num_threads": 257}, r"num_threads: 257 must be an int >= 1 and <= 256"),
        (
            {"num_threads": 10**5000},
            r"num_threads: <an int of about 5001 digits> must be",
        ),
        ({"num_threads": 2.0}, r"num_threads: 2.0 must be an int >= 1"),
        (
            {"max_inflight_chunks": 2**20 + 1},
            r"max_inflight_chunks: 1048577 must be an int >= 1 and <= 1,048,576",
        ),
        (
            {"capacity_bytes": 2**63},
            r"capacity: 9223372036854775808 is more bytes .* at most 9223372036854775807",
        ),
        (
            {"capacity_bytes": "9" * 5000 + "TiB"},
            r"capacity: '9+\.\.\.9+TiB' has more digits than any size",
        ),
        (
            {"capacity_bytes": 10**5000},
            r"capacity: <an int of about 5001 digits> is more bytes than any",
        ),
        ({"path": "/kv\0"}, r"path: '/kv\\x00' must be .*without NUL"),
        ({"file_mode": "0644"}, r"file_mode: '0644' must be '0600' .* or '0660'"),
        ({"file_mode": 0o644}, r"file_mode: 420 must be '0600' .* or '0660'"),
        ({"file_mode": "rw-------"}, r"file_mode: 'rw-------' must be '0600'"),
        ({"file_mode": True}, r"file_mode: True must be '0600'"),
    ],
)
def test_file_config_errors_name_field_value_and_what_is_allowed(
    tmp_path: Path, overrides: dict[str, object], message: str
) -> None:
    kwargs: dict[str, object] = {
        "path": str(tmp_path),
        "capacity_bytes": 1024,
        **overrides,
    }
    with pytest.raises(ValueError, match=message):
        FileTierConfig(**kwargs)  # type: ignore[arg-type]


def test_missing_required_key_is_a_value_error() -> None:
    with pytest.raises(
        ValueError, match=r"file tier: missing required key\(s\) \['capacity'\]"
    ):
        FileTierConfig.from_mapping({"type": "file", "path": "/x"})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"url": "http://x"}, r"url: 'http://x' must start with one of"),
        (
            {"timeout_s": 0},
            r"timeout_s: 0 must be a number of seconds from 0.001 to 300",
        ),
        (
            {"ttl_s": -1},
            r"ttl_s: -1 must be a number of seconds from 0.001 to .* or null",
        ),
        (
            {"options": {"socket_timeout": 3}},
            r"options: 'socket_timeout' is set by the tier",
        ),
        (
            {"backoff_initial_s": 10, "backoff_max_s": 1},
            r"backoff_max_s: 1 must be >= ",
        ),
        ({"batch_bytes": "1MB", "key_prefix": ""}, r"key_prefix: '' must be"),
        ({"cluster": "yes"}, r"cluster: 'yes' must be true or false"),
        (
            {"cluster": True, "url": "unix:///run/redis.sock"},
            r"cluster: a Redis Cluster is reached over TCP",
        ),
        (
            {"options": {"cluster_error_retry_attempts": 3}},
            r"options: 'cluster_error_retry_attempts' is set by the tier",
        ),
        (
            {"options": {"passwrd": "secret"}},
            r"options: 'passwrd' is not an option of redis-py's client.*'password'",
        ),
    ],
)
def test_redis_config_errors(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RedisTierConfig(**{"url": "redis://localhost", **overrides})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        (
            {"url": "http://app:s3cret@cache:6379/0"},
            r"url: 'http://app:\*\*\*@cache:6379/0' must start with one of",
        ),
        # An unescaped '/' in the password: redis-py would quote part of it as
        # the port.
        (
            {"url": "redis://app:s3/cret@cache:6379/0"},
            r"url: 'redis://app:\*\*\*@cache:6379/0': the port is not a number.*"
            "percent-encode",
        ),
        (
            {"url": "redis+sentinel://app:s3cret@s1:0/cache"},
            r"url: 'redis\+sentinel://app:\*\*\*@s1:0/cache': 's1:0' is not",
        ),
        ({"url": {"password": "s3cret"}}, r"url: a value of type dict is not a"),
        (
            {"options": {"password": "s3cret", 1: 2}},
            r"options: key 1 \(int\) is not a string",
        ),
        ({"options": [("password", "s3cret")]}, r"options: a value of type list"),
    ],
)
def test_redis_config_errors_do_not_show_the_password(
    mapping: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        RedisTierConfig.from_mapping({"type": "redis", "url": "redis://x", **mapping})
    assert "s3" not in str(caught.value)


def test_a_redis_url_given_for_a_tier_mapping_does_not_show_its_password() -> None:
    with pytest.raises(ValueError, match=r"'redis://:\*\*\*@cache' is not a mapping"):
        create_secondary_tier(
            "redis://:s3cret@cache",  # type: ignore[arg-type]
            ArrayChunkBuffer(2, 64),
            FINGERPRINT,
        )


def test_redis_config_passes_options_through_and_parses_sizes() -> None:
    config = RedisTierConfig.from_mapping(
        {
            "type": "redis",
            "url": "rediss://:pw@cache:6380/1",
            "options": {"ssl_ca_certs": "/ca.pem"},
            "batch_bytes": "8MiB",
            "ttl_s": 3600,
        }
    )
    assert dict(config.options) == {"ssl_ca_certs": "/ca.pem"}
    assert config.batch_bytes == 8 << 20
    assert config.locality == "remote" and config.ttl_s == 3600


def test_factory_builds_by_type_and_rejects_unknown_types_and_duplicate_names(
    tmp_path: Path,
) -> None:
    buf = ArrayChunkBuffer(2, 64)
    tier = create_secondary_tier(
        {"type": "memory", "capacity_chunks": 4}, buf, FINGERPRINT
    )
    assert (tier.name, tier.medium) == ("memory", "cpu")
    with pytest.raises(
        ValueError, match=r"type: 's3' is not a secondary tier type; expected one of"
    ):
        create_secondary_tier({"type": "s3"}, buf, FINGERPRINT)
    with pytest.raises(ValueError, match=r"name: 'memory' is used by two"):
        create_secondary_tiers(
            [{"type": "memory", "capacity_chunks": 4}] * 2, buf, FINGERPRINT
        )
    file_tier = create_secondary_tier(
        {"type": "file", "path": str(tmp_path), "capacity": "1MiB"}, buf, FINGERPRINT
    )
    assert (file_tier.medium, file_tier.locality) == ("storage", "local")
    file_tier.shutdown()


def test_fingerprint_must_be_a_safe_name(tmp_path: Path) -> None:
    buf = ArrayChunkBuffer(2, 64)
    with pytest.raises(ValueError, match=r"fingerprint: '../x' is not allowed"):
        create_secondary_tier(
            {"type": "file", "path": str(tmp_path), "capacity": 4096}, buf, "../x"
        )
    fp = make_fingerprint({"model": "m", "dtype": "bfloat16", "blocks_per_chunk": 4})
    assert fp == make_fingerprint(
        {"blocks_per_chunk": 4, "dtype": "bfloat16", "model": "m"}
    )
    assert fp != make_fingerprint(
        {"model": "m", "dtype": "float16", "blocks_per_chunk": 4}
    )
    assert len(fp) == 32


def test_tiering_config_validation() -> None:
    assert (
        TieringConfig.from_mapping(
            {"promotion_failure_ttl_s": 5}
        ).promotion_failure_ttl_s
        == 5
    )
    with pytest.raises(ValueError, match=r"unknown tiering keys \['ttl'\]; valid keys"):
        TieringConfig.from_mapping({"ttl": 5})
    with pytest.raises(ValueError, match="promotion_failure_ttl_s: 0"):
        TieringConfig(promotion_failure_ttl_s=0)


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ({"promotion_failure_ttl_s": 10**400}, r"promotion_failure_ttl_s: 1000.* must"),
        ({"promotion_failure_ttl_s": [30]}, r"promotion_failure_ttl_s: \[30\] must"),
        ({"max_remembered_failures": 1.5}, r"max_remembered_failures: 1\.5 must be"),
    ],
)
def test_tiering_config_errors_name_the_key_and_the_value(
    mapping: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        TieringConfig.from_mapping(mapping)


def test_a_redis_tier_without_redis_py_names_the_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Scenario: redis-py is not installed; the Redis tier fails validation at
    start-up, naming what to install, not with a bare ModuleNotFoundError."""
    for name in [m for m in sys.modules if m == "redis" or m.startswith("redis.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "redis", None)  # `import redis` fails
    with pytest.raises(ValueError, match=r"kvoffload\[redis\]"):
        parse_tier_config({"type": "redis", "url": "redis://localhost:6379/0"})

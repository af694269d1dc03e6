"""Config given through the Python API in shapes JSON cannot have: a list or a
string for a mapping, keys that are not strings, ints too long to write, deep or
circular nesting. Each is a short error naming where it is, at every level and
through every edge that takes a mapping (SPEC §4)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvoffload.config import config_mapping, shown
from kvoffload.connector.config import ConnectorConfig, GroupSpec
from kvoffload.integrations.vllm.config import KVOffloadSettings
from kvoffload.tiering import TieringConfig
from kvoffload.tiers.secondary import (
    FileTierConfig,
    MemoryTierConfig,
    RedisTierConfig,
    create_secondary_tiers,
    parse_tier_config,
)

HUGE = 10**5000  # repr() and str() raise past Python's int-str digit limit


def _nested(depth: int) -> list[Any]:
    outer: list[Any] = []
    inner = outer
    for _ in range(depth):
        inner.append([])
        inner = inner[0]
    return outer


def _circular() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


FILE = {"type": "file", "path": "/tmp/kv", "capacity": "1GiB"}
REDIS = {"type": "redis", "url": "redis://cache:6379"}
MEMORY = {"type": "memory", "capacity_chunks": 4}


def extra(**settings: object) -> KVOffloadSettings:
    return KVOffloadSettings.from_extra_config({"cpu_bytes_to_use": "1GiB", **settings})


def tier(base: dict[str, Any], **settings: object) -> KVOffloadSettings:
    return extra(secondary_tiers=[{**base, **settings}])


CASES: list[tuple[str, Callable[[], object], str]] = [
    # The whole config of the wrong kind.
    ("extra as a list", lambda: KVOffloadSettings.from_extra_config([1]), "kv_conn"),
    ("extra as a str", lambda: KVOffloadSettings.from_extra_config("x=1"), "kv_conn"),
    ("tiering as a list", lambda: TieringConfig.from_mapping([1]), "tiering"),
    ("tiering as a str", lambda: TieringConfig.from_mapping("ab"), "tiering"),
    ("tier as a list", lambda: parse_tier_config([FILE]), "secondary tier"),
    ("file tier as a str", lambda: FileTierConfig.from_mapping("x"), "file tier"),
    ("tiers as a mapping", lambda: extra(secondary_tiers=FILE), "secondary_tiers"),
    (
        "a tier as a str",
        lambda: extra(secondary_tiers=["file"]),
        "secondary_tiers'][0]",
    ),
    ("options as a list", lambda: tier(REDIS, options=[1]), "options"),
    (
        "tiers as a str",
        lambda: create_secondary_tiers("file", None, "fp"),  # type: ignore[arg-type]
        "secondary_tiers",
    ),
    # Keys that are not strings, at every level.
    ("int key", lambda: KVOffloadSettings.from_extra_config({1: 2}), "key 1"),
    ("tuple key", lambda: KVOffloadSettings.from_extra_config({(1,): 2}), "key (1,)"),
    ("tier int key", lambda: extra(secondary_tiers=[{**FILE, 3: 4}]), "key 3"),
    (
        "huge key",
        lambda: extra(secondary_tiers=[{**MEMORY, HUGE: 1}]),
        "key <an int of",
    ),
    ("options int key", lambda: tier(REDIS, options={"db": 0, 5: 1}), "key 5"),
    ("tiering int key", lambda: TieringConfig.from_mapping({1: 2, "a": 3}), "key 1"),
    (
        "memory tier key",
        lambda: MemoryTierConfig.from_mapping({**MEMORY, None: 1}),
        "key None",
    ),
    # Ints too long to write, anywhere; sizes of 5,000 digits.
    (
        "huge cpu bytes",
        lambda: KVOffloadSettings.from_extra_config({"cpu_bytes_to_use": HUGE}),
        "cpu_bytes_to_use",
    ),
    ("huge negative", lambda: extra(store_threshold=-HUGE), "store_threshold"),
    (
        "huge str size",
        lambda: KVOffloadSettings.from_extra_config({"cpu_bytes_to_use": "9" * 5000}),
        "cpu_bytes_to_use",
    ),
    ("huge str capacity", lambda: tier(FILE, capacity="1" * 5000 + "GiB"), "capacity"),
    ("huge in a list", lambda: extra(max_defer_s=[HUGE]), "max_defer_s"),
    ("huge tier name", lambda: tier(FILE, name=HUGE), "name"),
    ("huge threads", lambda: tier(FILE, num_threads=HUGE), "num_threads"),
    ("huge batch", lambda: tier(REDIS, batch_bytes=HUGE), "batch_bytes"),
    ("huge option", lambda: tier(REDIS, options={"db": HUGE}), "options"),
    ("huge policy", lambda: extra(eviction_policy=HUGE), "eviction_policy"),
    (
        "huge ttl",
        lambda: TieringConfig.from_mapping({"promotion_failure_ttl_s": HUGE}),
        "promotion_failure_ttl_s",
    ),
    ("past 2**63", lambda: extra(max_tracker_size=2**63), "max_tracker_size"),
    ("size past 2**63", lambda: tier(REDIS, batch_bytes=2**64), "batch_bytes"),
    # Bools where numbers belong.
    (
        "bool size",
        lambda: KVOffloadSettings.from_extra_config({"cpu_bytes_to_use": True}),
        "cpu_bytes_to_use",
    ),
    ("bool count", lambda: extra(max_tracker_size=True), "max_tracker_size"),
    ("bool seconds", lambda: tier(REDIS, timeout_s=True), "timeout_s"),
    ("bool capacity", lambda: tier(FILE, capacity=True), "capacity"),
    ("bool chunks", lambda: tier(MEMORY, capacity_chunks=True), "capacity_chunks"),
    (
        "bool ttl",
        lambda: TieringConfig.from_mapping({"max_remembered_failures": False}),
        "max_remembered_failures",
    ),
    # Nested wrong kinds, deep and circular nesting.
    ("dict for an int", lambda: extra(block_size={"a": 1}), "block_size"),
    ("list for a str", lambda: tier(FILE, path=["/kv"]), "path"),
    ("dict for a bool", lambda: tier(FILE, fsync={}), "fsync"),
    (
        "list for a policy",
        lambda: tier(MEMORY, offload_policy=["chunk_level"]),
        "offload_policy",
    ),
    ("deep", lambda: extra(store_threshold=_nested(100_000)), "store_threshold"),
    ("circular", lambda: tier(REDIS, options={"x": _circular()}), "options"),
]


@pytest.mark.parametrize(
    ("build", "key"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_a_config_of_the_wrong_shape_is_a_short_error_naming_the_key(
    build: Callable[[], object], key: str
) -> None:
    with pytest.raises((ValueError, TypeError)) as caught:
        build()
    message = str(caught.value)
    assert key in message
    assert "int_max_str_digits" not in message
    assert len(message) < 1000


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: GroupSpec(HUGE), "tokens_per_block"),
        (lambda: GroupSpec(4, -HUGE), "blocks_per_chunk"),
        (lambda: GroupSpec(4, 2**63), "blocks_per_chunk"),
        (lambda: ConnectorConfig((GroupSpec(4),), world_size=HUGE), "world_size"),
        (lambda: ConnectorConfig((GroupSpec(4),), max_defer_s=-HUGE), "max_defer_s"),
        (lambda: ConnectorConfig((GroupSpec(4),), null_block_id=HUGE), "null_block_id"),
        (lambda: ConnectorConfig([HUGE]), "groups"),
        (
            lambda: ConnectorConfig((GroupSpec(4),), max_defer_s=_nested(10_000)),
            "max_defer_s",
        ),
        (lambda: FileTierConfig("/kv", HUGE), "capacity"),
        (lambda: RedisTierConfig("redis://x", num_threads=HUGE), "num_threads"),
        (lambda: RedisTierConfig("redis://x", key_prefix=_circular()), "key_prefix"),
        (lambda: MemoryTierConfig(HUGE), "capacity_chunks"),
        (
            lambda: TieringConfig(max_remembered_failures=HUGE),
            "max_remembered_failures",
        ),
    ],
)
def test_config_classes_built_directly_name_the_field_of_a_huge_value(
    build: Callable[[], object], field: str
) -> None:
    """Scenario: the frozen config classes built in Python, not from a mapping:
    a value whose `repr` raises or recurses is described, never re-raised."""
    with pytest.raises(ValueError, match=field) as caught:
        build()
    assert "int_max_str_digits" not in str(caught.value)
    assert len(str(caught.value)) < 1000


def test_config_mapping_returns_a_copy_of_a_good_mapping() -> None:
    given = {"a": [1, {"b": (2.5, None, True)}], "c": "x" * 10_000, "d": 2**62}
    checked = config_mapping(given, "where")
    assert checked == given
    assert checked is not given


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (HUGE, "<an int of about 5001 digits>"),
        (-HUGE, "<a negative int of about 5001 digits>"),
        ([HUGE], "[<an int of about 5001 digits>]"),
        ("x" * 10_000, None),
        (_nested(100_000), "[[[[...]]]]"),
        (_circular(), "[[[[...]]]]"),
    ],
    ids=["huge", "negative", "in a list", "long str", "deep", "circular"],
)
def test_shown_never_raises_and_stays_short(
    value: object, expected: str | None
) -> None:
    text = shown(value)
    assert len(text) <= 100
    if expected is not None:
        assert text == expected


def test_shown_survives_a_broken_repr() -> None:
    class Broken:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    assert "Broken" in shown(Broken())

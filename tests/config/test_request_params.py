"""Per-request parameters: strict ints, one warning per bad value, tier selectors."""

from __future__ import annotations

import logging

import pytest

from kvoffload.config import RequestParams


@pytest.mark.parametrize(
    ("raw", "expected", "warns"),
    [
        (None, None, False),
        (0, 0, False),
        (128, 128, False),
        ("128", None, True),
        (12.0, None, True),
        (-1, None, True),
        (True, None, True),
        (False, None, True),
        ([4], None, True),
    ],
)
@pytest.mark.parametrize("name", ["max_offload_tokens", "max_load_tokens"])
def test_token_caps_accept_only_plain_non_negative_ints(
    name: str,
    raw: object,
    expected: int | None,
    warns: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        params = RequestParams.parse("req-7", {name: raw})
    assert getattr(params, name) == expected
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == (1 if warns else 0)
    if warns:
        assert "req-7" in warnings[0].getMessage()
        assert repr(raw) in warnings[0].getMessage()


@pytest.mark.parametrize(
    ("params", "name"),
    [
        ({"max_offload_tokens": "x" * 100_000}, "max_offload_tokens"),
        ({"max_load_tokens": -(10**5000)}, "max_load_tokens"),  # repr() raises
        ({"kv_load_tiers": "y" * 100_000}, "kv_load_tiers"),
        ({"kv_store_tiers": ["cpu", "z" * 100_000]}, "kv_store_tiers"),
        ({"kv_store_tiers": ["w" * 1000] * 100}, "kv_store_tiers"),
        (["v" * 100_000], "kv_transfer_params"),
    ],
)
def test_a_huge_bad_value_gives_a_short_warning_naming_the_parameter(
    params: object, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario: a client sends a 100,000-character value; the warning shows
    the start of it, not all of it."""
    with caplog.at_level(logging.WARNING):
        RequestParams.parse("req-9", params, tier_names=["disk"])
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warning) < 500
    assert "request req-9: ignoring " in warning and f"{name}=" in warning


def test_tier_selectors() -> None:
    params = RequestParams.parse(
        "r", {"kv_load_tiers": ["disk", "storage:remote"], "kv_store_tiers": "cpu"}
    )
    assert params.load_tiers.allows("disk", "storage", "local")
    assert params.load_tiers.allows("redis", "storage", "remote")
    assert not params.load_tiers.allows("nvme2", "storage", "local")
    assert params.store_tiers.allows("anything", "cpu", "remote")
    assert not params.store_tiers.allows("disk", "storage", "local")
    none = RequestParams.parse("r", {"kv_store_tiers": []})
    assert not none.store_tiers.allows("disk", "storage", "local")


def test_bad_tier_selector_warns_and_allows_all(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        params = RequestParams.parse("r9", {"kv_load_tiers": ["ssd:far"]})
    assert params.load_tiers.allows("disk", "storage", "local")
    assert any("r9" in r.getMessage() for r in caplog.records)


TIERS = frozenset({"cpu", "disk", "shared"})


@pytest.mark.parametrize(
    ("raw", "disk", "shared", "ignored"),
    [
        (["disk", "dsik"], True, False, "['dsik'] in kv_load_tiers"),
        ("disk, shraed", True, False, "['shraed'] in kv_load_tiers"),
        (["dsik"], True, True, "kv_load_tiers=['dsik']"),  # none good: as if absent
        (["storage:far", 3], True, True, "kv_load_tiers=['storage:far', 3]"),
        (["remote", "nvme"], False, True, "['nvme'] in kv_load_tiers"),
        ({"disk": 1}, True, True, "kv_load_tiers={'disk': 1}"),
    ],
)
def test_unknown_tier_names_warn_once_and_are_ignored(
    raw: object,
    disk: bool,
    shared: bool,
    ignored: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Scenario: a request names tiers, one misspelt: one warning naming the
    request, what is ignored and the tiers there are; the good names still
    restrict the request, and a value with no good name is ignored as if absent."""
    with caplog.at_level(logging.WARNING):
        params = RequestParams.parse("r5", {"kv_load_tiers": raw}, TIERS)
    assert params.load_tiers.allows("disk", "storage", "local") is disk
    assert params.load_tiers.allows("shared", "cpu", "remote") is shared
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "r5" in warnings[0] and f"ignoring {ignored}" in warnings[0]
    assert "['cpu', 'disk', 'shared']" in warnings[0]


def test_known_tier_names_media_and_localities_do_not_warn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    good = {
        "kv_load_tiers": ["disk", "storage", "remote", "cpu:local"],
        "kv_store_tiers": [],
    }
    with caplog.at_level(logging.WARNING):
        params = RequestParams.parse("r6", good, TIERS)
    assert caplog.records == []
    assert params.load_tiers.allows("disk", "storage", "local")
    assert not params.store_tiers.allows("disk", "storage", "local")


def test_each_bad_tier_parameter_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    bad = {"kv_load_tiers": ["dsik", "sahred"], "kv_store_tiers": "dsik,disk"}
    with caplog.at_level(logging.WARNING):
        params = RequestParams.parse("r8", bad, TIERS)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2
    assert "kv_load_tiers" in warnings[0] and "kv_store_tiers" in warnings[1]
    assert params.load_tiers.allows("shared", "cpu", "remote")
    assert not params.store_tiers.allows("shared", "cpu", "remote")


@pytest.mark.parametrize(
    ("raw", "expected", "warns"),
    [
        (None, None, False),
        (0, 0.0, False),
        (0.0, 0.0, False),
        (300, 300.0, False),
        (2.5, 2.5, False),
        ("300", None, True),
        (-1, None, True),
        (-0.5, None, True),
        (float("nan"), None, True),
        (float("inf"), None, True),
        (10**400, None, True),  # no float holds it
        (True, None, True),
        ([300], None, True),
        ({"s": 300}, None, True),
    ],
)
def test_retention_hint_accepts_only_finite_seconds_at_least_zero(
    raw: object,
    expected: float | None,
    warns: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Scenario: a client sends `kv_retention_s`; a bad value is one warning
    naming the request and the parameter, and the request has no hint."""
    with caplog.at_level(logging.WARNING):
        params = RequestParams.parse("req-9", {"kv_retention_s": raw})
    assert params.retention_s == expected
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == (1 if warns else 0)
    if warns:
        assert "req-9" in warnings[0] and "kv_retention_s" in warnings[0]

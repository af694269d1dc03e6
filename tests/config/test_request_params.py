"""Per-request parameters: strict ints, one warning per bad value, tier selectors."""

from __future__ import annotations

import logging

import pytest

from kvoffload.config import RequestParams, parse_size


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


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (4096, 4096),
        ("4096", 4096),
        ("64GiB", 64 * 2**30),
        ("1.5 KiB", 1536),
        ("2mb", 2 * 10**6),
    ],
)
def test_parse_size(value: object, expected: int) -> None:
    assert parse_size(value, "cpu_bytes_to_use") == expected


@pytest.mark.parametrize("value", ["lots", "-5", -5, "4 parsecs", None, True])
def test_parse_size_errors_name_the_field(value: object) -> None:
    with pytest.raises(ValueError, match="cpu_bytes_to_use"):
        parse_size(value, "cpu_bytes_to_use")

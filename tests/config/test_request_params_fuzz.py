"""Fuzzing `kv_transfer_params`: arbitrary JSON-like values (and ones JSON cannot
carry) for each parameter, unknown parameters, and values that are no mapping.

Property: never an exception; each bad value is ignored (as if absent) with at
most one warning, which names the request and the parameter and is short; good
values are taken. Bounded to seconds.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from kvoffload.config import ALL_TIERS, RequestParams
from kvoffload.config.request_params import LOCALITIES, MEDIA

from .strategies import JSONISH, PARAMS, TIER_NAMES

CAPS = ("max_offload_tokens", "max_load_tokens")
SELECTORS = {"kv_load_tiers": "load_tiers", "kv_store_tiers": "store_tiers"}
FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def _good_entry(entry: object) -> bool:
    if not isinstance(entry, str):
        return False
    medium, colon, locality = entry.partition(":")
    if colon:
        return medium in MEDIA and locality in LOCALITIES
    return entry in (*MEDIA, *LOCALITIES, *TIER_NAMES)


def _good_retention(raw: object) -> bool:
    """A finite number of seconds >= 0 as a float: an int or a float, not a bool."""
    if not isinstance(raw, int | float) or isinstance(raw, bool):
        return False
    try:
        return math.isfinite(float(raw)) and raw >= 0
    except OverflowError:
        return False


@FUZZ
@given(params=PARAMS | JSONISH)
def test_kv_transfer_params_never_fail_and_warn_once_per_bad_value(
    params: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kvoffload"):
        parsed = RequestParams.parse("req-f", params, TIER_NAMES)
    warnings = [r.getMessage() for r in caplog.records]
    assert all("req-f" in w and len(w) < 800 for w in warnings), warnings
    if not isinstance(params, dict):
        assert parsed == RequestParams()
        assert len(warnings) == (0 if params is None else 1), warnings
        return
    for cap in CAPS:
        raw = params.get(cap)
        about = [w for w in warnings if cap in w]
        if raw is None or (type(raw) is int and raw >= 0):
            assert getattr(parsed, cap) == raw
            assert about == []
        else:
            assert getattr(parsed, cap) is None, "a bad value is ignored"
            assert len(about) == 1, warnings
    raw = params.get("kv_retention_s")
    about = [w for w in warnings if "kv_retention_s" in w]
    if raw is None or _good_retention(raw):
        assert parsed.retention_s == (None if raw is None else float(raw))
        assert about == []
    else:
        assert parsed.retention_s is None, "a bad value is ignored"
        assert len(about) == 1, warnings
    for name, field in SELECTORS.items():
        raw = params.get(name)
        selector = getattr(parsed, field)
        about = [w for w in warnings if name in w]
        assert len(about) <= 1, warnings
        if raw is None:
            assert selector == ALL_TIERS and about == []
            continue
        if selector.entries is not None:
            assert all(_good_entry(entry) for entry in selector.entries)
    assert len(warnings) <= len(CAPS) + len(SELECTORS) + 1

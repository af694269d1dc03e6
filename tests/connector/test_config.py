"""ConnectorConfig at start-up: a bad value raises, naming the field and the value."""

from __future__ import annotations

import pytest

from kvoffload.connector.config import ConnectorConfig, GroupSpec

GROUPS = (GroupSpec(4, 2),)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -0.5, True, "1"])
def test_max_defer_s_must_be_a_finite_number_of_seconds(value: object) -> None:
    """Scenario: NaN would never end a deferral by comparison and inf never ends
    one at all; both, like negatives, bools and strings, stop start-up."""
    with pytest.raises(ValueError, match=rf"max_defer_s .* got {value!r}"):
        ConnectorConfig(GROUPS, max_defer_s=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [0, 0.0, 0.5, 3])
def test_max_defer_s_accepts_zero_and_finite_seconds(value: float) -> None:
    assert ConnectorConfig(GROUPS, max_defer_s=value).max_defer_s == value


@pytest.mark.parametrize("value", [10**400, -(10**400)], ids=["huge", "-huge"])
def test_max_defer_s_too_large_for_a_float_is_a_value_error(value: int) -> None:
    """Scenario: an int past what a float holds, where `math.isfinite` raises
    OverflowError."""
    with pytest.raises(ValueError, match=r"max_defer_s .* got -?1000"):
        ConnectorConfig(GROUPS, max_defer_s=value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"groups": [4]},
            r"groups must be a non-empty sequence of GroupSpec, got \[4\]",
        ),
        (
            {"groups": "ab"},
            r"groups must be a non-empty sequence of GroupSpec, got 'ab'",
        ),
        (
            {"hash_block_tokens": False},
            r"hash_block_tokens must be an int >= 1 \(up to 2\*\*63 - 1\), got False",
        ),
        (
            {"engine_prefix_caching": "no"},
            r"engine_prefix_caching must be true or false",
        ),
        (
            {"null_block_id": -1},
            r"null_block_id must be an int >= 0 \(up to .*\) or None, got -1",
        ),
        (
            {"null_block_id": True},
            r"null_block_id must be an int >= 0 \(up to .*\) or None, got True",
        ),
    ],
)
def test_a_value_of_the_wrong_kind_names_the_field_and_the_value(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ConnectorConfig(**{"groups": GROUPS, **kwargs})  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [1, None, [True], "yes"])
def test_a_group_is_offloaded_or_not(value: object) -> None:
    with pytest.raises(ValueError, match=r"offloaded must be true or false, got"):
        GroupSpec(16, offloaded=value)  # type: ignore[arg-type]

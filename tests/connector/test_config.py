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

"""Byte sizes in config: whole numbers of bytes, written with ASCII digits."""

from __future__ import annotations

import pytest

from kvoffload.config import parse_size, shown


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (4096, 4096),
        ("4096", 4096),
        ("64GiB", 64 * 2**30),
        ("1.5 KiB", 1536),
        ("2mb", 2 * 10**6),
        # Exact, not through a float: no rounding.
        ("9223372036854775807", 2**63 - 1),
        ("8388607.5TiB", 2**63 - 2**39),
        ("0" * 5000 + "1GiB", 2**30),  # int() raises past 4,300 digits
        ("1.5GiB", 3 * 2**29),
        ("0.5KiB", 512),
    ],
)
def test_parse_size(value: object, expected: int) -> None:
    assert parse_size(value, "cpu_bytes_to_use") == expected


@pytest.mark.parametrize(
    "value",
    # Past Python's 4,300 digits, int() raises an error of its own.
    ["lots", "-5", -5, "4 parsecs", None, True, "9" * 5000 + "TiB", "1." + "0" * 5000],
)
def test_parse_size_errors_name_the_field(value: object) -> None:
    with pytest.raises(ValueError, match="cpu_bytes_to_use"):
        parse_size(value, "cpu_bytes_to_use")


@pytest.mark.parametrize("value", ["1.5B", "0.5", "0.1TiB", "1.0000001KB", "1.0001 KB"])
def test_a_size_that_is_not_a_whole_number_of_bytes_is_refused(value: str) -> None:
    """Scenario: "1.5B" was rounded down to 1 byte, "0.1TiB" to 109951162777."""
    with pytest.raises(
        ValueError,
        match=rf"cpu_bytes_to_use: {value!r} is not a whole number of bytes",
    ):
        parse_size(value, "cpu_bytes_to_use")


@pytest.mark.parametrize("value", ["\u0661\u0660GiB", "\uff16\uff14GiB", "6\u00a0GiB"])
def test_a_size_takes_ascii_digits_only(value: str) -> None:
    """Scenario: Arabic-Indic or full-width digits (or a no-break space) that a
    Unicode-aware pattern read as "10GiB" or "64GiB"."""
    with pytest.raises(ValueError, match=r"cpu_bytes_to_use: cannot parse"):
        parse_size(value, "cpu_bytes_to_use")


@pytest.mark.parametrize(
    "value",
    [
        2**63,
        "9223372036854775808",
        "18446744073709551617",
        "1" + "0" * 400 + "B",
        1e300,
        10**5000,  # repr() raises past Python's int-str digit limit
        "9" * 5000,  # int() raises there
    ],
    ids=lambda value: shown(value)[:30],
)
def test_a_size_past_what_any_memory_or_disk_holds_is_refused(value: object) -> None:
    """Scenario: sizes of 2**64 bytes and more, an int of 5,000 digits and a
    string of 5,000 digits: each a short error naming the field, never an
    error from Python's int conversion."""
    with pytest.raises(ValueError, match=r"^cpu_bytes_to_use: ") as caught:
        parse_size(value, "cpu_bytes_to_use")
    assert "int_max_str_digits" not in str(caught.value)
    assert len(str(caught.value)) < 400

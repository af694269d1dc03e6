"""Byte sizes written as numbers or strings such as "64GiB", "512MB", "1.5 GiB".

A size is a whole number of bytes ("1.5B" is refused, not rounded), written with
ASCII digits, and at most `MAX_INT` bytes: more than any memory or disk holds is
a mistake, and past it a size no longer fits a file offset.
"""

from __future__ import annotations

import re
from fractions import Fraction

from kvoffload.config.shapes import MAX_INT, shown

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
# ASCII only: with Unicode `\d`, "١٠GiB" (Arabic-Indic digits) read as 10 GiB.
_SIZE_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", re.ASCII)
# More digits than any size up to MAX_INT needs (19, plus a fraction): reading
# thousands of them as an int would raise past Python's int-str digit limit.
_MAX_DIGITS = 40


def parse_size(value: object, field: str) -> int:
    """Bytes in `value` (an int, or a string with an optional unit), a whole
    number of them: "1.5GiB" is, "1.5B" and "0.1TiB" are not.

    Raises `ValueError` naming `field`, the value and what is allowed.
    """
    allowed = (
        "a non-negative integer or a string like '64GiB', '512MB', '4096', "
        f"at most {MAX_INT} bytes"
    )
    size = _bytes(value, field, allowed)
    if size > MAX_INT:
        raise ValueError(
            f"{field}: {shown(value)} is more bytes than any memory or disk holds; "
            f"expected {allowed}"
        )
    return size


def _bytes(value: object, field: str, allowed: str) -> int:
    if type(value) is int:
        if value < 0:
            raise ValueError(f"{field}: {shown(value)} is negative; expected {allowed}")
        return value
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    if isinstance(value, str):
        match = _SIZE_RE.fullmatch(value)
        if match:
            number, unit = match.groups()
            factor = _UNITS.get(unit.lower())
            if factor is not None:
                if len(number.lstrip("0")) > _MAX_DIGITS:
                    raise ValueError(
                        f"{field}: {shown(value)} has more digits than any size; "
                        f"expected {allowed}"
                    )
                # Exact: a float would round large sizes and overflow huge ones.
                size = Fraction(number.lstrip("0") or "0") * factor
                if size.denominator != 1:
                    raise ValueError(
                        f"{field}: {shown(value)} is not a whole number of bytes; "
                        f"expected {allowed}"
                    )
                return int(size)
    raise ValueError(
        f"{field}: cannot parse {shown(value)} as a size; expected {allowed}"
    )


def format_size(nbytes: int) -> str:
    """`nbytes` as people size memory and disks: `64 GiB`, `1.5 TiB`, `512 B`."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):.4g} {unit}"
    return f"{nbytes} B"

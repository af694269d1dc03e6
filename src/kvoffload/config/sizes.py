"""Byte sizes written as numbers or strings such as "64GiB", "512MB", "1.5 GiB".

A size is a whole number of bytes ("1.5B" is refused, not rounded), written with
ASCII digits.
"""

from __future__ import annotations

import re
from fractions import Fraction

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


def parse_size(value: object, field: str) -> int:
    """Bytes in `value` (an int, or a string with an optional unit), a whole
    number of them: "1.5GiB" is, "1.5B" and "0.1TiB" are not.

    Raises `ValueError` naming `field`, the value and what is allowed.
    """
    allowed = "a non-negative integer or a string like '64GiB', '512MB', '4096'"
    if type(value) is int:
        if value < 0:
            raise ValueError(f"{field}: {value!r} is negative; expected {allowed}")
        return value
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    if isinstance(value, str):
        match = _SIZE_RE.fullmatch(value)
        if match:
            number, unit = match.groups()
            factor = _UNITS.get(unit.lower())
            if factor is not None:
                # Exact: a float would round large sizes and overflow huge ones.
                try:
                    size = Fraction(number) * factor
                except ValueError:  # past Python's 4,300 digits for an int
                    raise ValueError(
                        f"{field}: a size of {len(number):,} digits is not a size "
                        f"any storage holds; expected {allowed}"
                    ) from None
                if size.denominator != 1:
                    raise ValueError(
                        f"{field}: {value!r} is not a whole number of bytes; "
                        f"expected {allowed}"
                    )
                return int(size)
    raise ValueError(f"{field}: cannot parse {value!r} as a size; expected {allowed}")

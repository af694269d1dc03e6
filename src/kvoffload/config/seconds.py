"""Durations in seconds as config values give them: ints or floats, never bools."""

from __future__ import annotations

import math


def finite_seconds(value: object) -> float | None:
    """`value` as a float if it is an int or a float (not a bool) that is finite
    as a float, else `None`.

    An int too large for a float (`10**400`) is `None`, not an `OverflowError`,
    so a check built on this names the key and the value as for any bad one.
    """
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        seconds = float(value)
    except OverflowError:
        return None
    return seconds if math.isfinite(seconds) else None

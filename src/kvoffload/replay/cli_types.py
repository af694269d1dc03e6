"""Argument types for `kvoffload replay`: a bad value is a usage error naming it.

argparse calls each with the option's text; `ArgumentTypeError` becomes
`kvoffload replay: error: argument --flag: <message>` and exit status 2, never a
traceback from deep inside a replay (or a replay that never ends, for NaN).
"""

from __future__ import annotations

import argparse
import math

from kvoffload.policies import get_policy_class


def _int(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an integer >= {minimum}"
        ) from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{value} is not an integer >= {minimum}")
    return value


def positive_int(text: str) -> int:
    return _int(text, 1)


def non_negative_int(text: str) -> int:
    return _int(text, 0)


def _float(text: str, positive: bool) -> float:
    allowed = "a finite number " + ("> 0" if positive else ">= 0")
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {allowed}") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not {allowed}")
    return value


def positive_float(text: str) -> float:
    return _float(text, positive=True)


def non_negative_float(text: str) -> float:
    return _float(text, positive=False)


def time_scale(text: str) -> str | float:
    """'auto', or a finite factor > 0 to stretch arrival times by."""
    if text == "auto":
        return text
    try:
        return positive_float(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not 'auto' or a finite number > 0"
        ) from None


def policy_name(text: str) -> str:
    """'all', a registered policy or an importable `module:Class`."""
    if text != "all":
        try:
            get_policy_class(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return text

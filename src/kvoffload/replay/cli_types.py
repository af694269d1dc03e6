"""Argument types for `kvoffload replay`: a bad value is a usage error naming it.

argparse calls each with the option's text; `ArgumentTypeError` becomes
`kvoffload replay: error: argument --flag: <message>` and exit status 2, never a
traceback from deep inside a replay (or a replay that never ends, for NaN). Every
number has both bounds (from `kvoffload.replay.limits`), so no option can make a
replay's clock or memory run away.
"""

from __future__ import annotations

import argparse
import math
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

from kvoffload.config.sizes import format_size, parse_size
from kvoffload.policies import get_policy_class
from kvoffload.replay.limits import MAX_TIME_SCALE, MIN_TIME_SCALE
from kvoffload.replay.routers import ROUTERS
from kvoffload.replay.tier_specs import TierSpec, check_shareable, parse_tier_spec


def int_in(minimum: int, maximum: int) -> Callable[[str], int]:
    """An argparse type: an integer in [minimum, maximum]."""
    allowed = f"an integer from {minimum:,} to {maximum:,}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:  # also past Python's limit on an int's digits
            raise argparse.ArgumentTypeError(
                f"{_clip(text)} is not {allowed}"
            ) from None
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"{_clip(text)} is not {allowed}")
        return value

    return parse


def float_in(
    minimum: float, maximum: float, *, open_minimum: bool = False
) -> Callable[[str], float]:
    """An argparse type: a finite number in [minimum, maximum] (or (minimum,
    maximum] with `open_minimum`)."""
    allowed = (
        f"a finite number {'>' if open_minimum else '>='} {minimum:g} "
        f"and <= {maximum:g}"
    )

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{_clip(text)} is not {allowed}"
            ) from None
        below = value <= minimum if open_minimum else value < minimum
        if not math.isfinite(value) or below or value > maximum:
            raise argparse.ArgumentTypeError(f"{_clip(text)} is not {allowed}")
        return value

    return parse


def size_in(minimum: int, maximum: int) -> Callable[[str], int]:
    """An argparse type: bytes written with a unit (`16GiB`, `512MB`, `4096B`) in
    [minimum, maximum]. A bare number is refused: next to options that count
    chunks and tokens, it is more likely one of those than bytes."""
    allowed = (
        "a size with a unit such as 16GiB or 512MB (B, kB, MB, GB, TB, KiB, MiB, "
        f"GiB, TiB), from {format_size(minimum)} to {format_size(maximum)}"
    )

    def parse(text: str) -> int:
        if text.strip().replace(".", "", 1).isdigit():
            raise argparse.ArgumentTypeError(
                f"{_clip(text)} has no unit; expected {allowed}"
            )
        try:
            value = parse_size(text, "size")
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{_clip(text)} is not {allowed}"
            ) from None
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"{_clip(text)} is not {allowed}")
        return value

    return parse


_time_scale = float_in(MIN_TIME_SCALE, MAX_TIME_SCALE)


def time_scale(text: str) -> str | float:
    """'auto', or a factor to stretch arrival times by."""
    if text == "auto":
        return text
    try:
        return _time_scale(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc}, or 'auto'") from None


class HelpFormatter(argparse.HelpFormatter):
    """argparse's, with each option's default after its help where the help does
    not already say what it is (defaults of None are written out by hand: what
    happens when the option is not given), and lines not broken at hyphens."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        unset = any(action.default is v for v in (None, False, argparse.SUPPRESS))
        if "default" in text or not action.option_strings or unset:
            return text
        return f"{text} (default: %(default)s)"

    def _split_lines(self, text: str, width: int) -> list[str]:
        # Whole option names: argparse broke `--kv-bytes-per-token` at a hyphen.
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class AtLeastOne(argparse.Action):
    """`nargs="+"` that holds: argparse drops a lone `--` (`--store-threshold=--`)
    and would hand on an empty list."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        if not values:
            raise argparse.ArgumentError(self, "expected at least one value")
        setattr(namespace, self.dest, values)


def policy_name(text: str) -> str:
    """'all', a registered policy or an importable `module:Class`."""
    if text != "all":
        try:
            get_policy_class(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _clip(text: str) -> str:
    """`text` quoted for a one-line message, at most about 40 characters."""
    return repr(text[:40]) + ("..." if len(text) > 40 else "")


def tier_spec(text: str) -> TierSpec:
    """`KIND:CAPACITY[:GBPS][:back]`: a modeled secondary tier (see `tier_specs`)."""
    try:
        return parse_tier_spec(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def shared_tier_spec(text: str) -> TierSpec:
    """A `tier_spec` every engine of a fleet shares: written through."""
    spec = tier_spec(text)
    try:
        check_shareable(spec)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return spec


def router_name(text: str) -> str:
    """A fleet router: round-robin, least-loaded, session or prefix."""
    if text not in ROUTERS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a router; expected one of {', '.join(ROUTERS)}"
        )
    return text

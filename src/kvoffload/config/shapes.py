"""The shape every level of a configuration mapping must have, and values in messages.

Configuration arrives as JSON (an engine's command line) or as Python objects
through the API, where nothing stops a list or a string in place of a mapping, an
int or a tuple as a key, an int of 5,000 digits (whose `repr` raises) or a list
nested 10,000 deep (whose `repr` recurses). `config_mapping` checks the whole tree
once at the edge, so that the checks of each setting see plain values only, and
`shown` writes any value into an error message or a warning, cut short.
"""

from __future__ import annotations

import math
import reprlib
import sys
from collections.abc import Mapping
from typing import Any, TypeGuard

MAX_INT = 2**63 - 1
"""No setting takes an int past this (in either sign): sizes in bytes must fit a
file offset, and counts a C `long`."""

MAX_DEPTH = 8
"""Levels of nesting a configuration may have: `kv_connector_extra_config` ->
`secondary_tiers` -> a tier -> `options` -> an option's value uses five."""

# How much of a value a message shows: enough to recognise it, never a line as
# long as what was given.
MAX_SHOWN = 100


def _too_long_to_write(x: int) -> bool:
    """Whether `repr(x)` raises: past `sys.get_int_max_str_digits()` digits (a
    bound on the count, so the test itself writes nothing)."""
    limit = sys.get_int_max_str_digits()
    return bool(limit) and _digits(x) >= limit


def _digits(x: int) -> int:
    return 1 + int(abs(x).bit_length() * math.log10(2))


class _ShortRepr(reprlib.Repr):
    """`reprlib` cuts long strings and containers; an int too long for `repr`
    is described by its length instead."""

    def repr_int(self, x: int, level: int) -> str:
        if _too_long_to_write(x):
            sign = "a negative" if x < 0 else "an"
            return f"<{sign} int of about {_digits(x)} digits>"
        return super().repr_int(x, level)


_REPR = _ShortRepr()
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = MAX_SHOWN
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 8
_REPR.maxlevel = 3


def shown(value: object) -> str:
    """`repr(value)` cut to about `MAX_SHOWN` characters, for a message: never
    raises, whatever the value (a huge int, deep nesting, a broken `__repr__`)."""
    text = _REPR.repr(value)
    if len(text) > MAX_SHOWN:
        text = text[: MAX_SHOWN - 3] + "..."
    return text


def is_count(value: object, minimum: int) -> TypeGuard[int]:
    """Whether `value` is a plain int (not a bool, whose type is a subclass)
    from `minimum` to `MAX_INT`."""
    return type(value) is int and minimum <= value <= MAX_INT


def kind(value: object) -> str:
    """The kind of a value, for a message that must not show the value itself
    (a Redis URL with its password, say)."""
    return f"a value of type {type(value).__name__}"


def config_mapping(
    value: object, where: str, *, bare_keys: bool = False
) -> dict[str, Any]:
    """`value` as a dict, once every level of it is of a shape settings can take.

    `value` must be a mapping; in it and in every mapping and list nested in it,
    keys are strings, no int is too long to write as text (whatever reads it
    next, a log line or a client library, would raise), and nesting stops at
    `MAX_DEPTH` levels. Anything else is a `ValueError` naming where it is
    (`where`, then the keys and indices down to it) and what it is; string
    values are never shown (they may be passwords), keys are. The range of
    each setting is its own check's, which says what that setting takes.
    With `bare_keys`, a setting of `value` itself is named by its key alone
    (`ttl_s: ...`), as the component's own checks name it.
    """
    if not isinstance(value, Mapping):
        raise ValueError(
            f"{where}: {kind(value)} is not a mapping of setting names to values"
        )
    if bare_keys:
        _check_keys(value, where)
        for key, child in value.items():
            _check_level(child, key, 2)
    else:
        _check_level(value, where, 1)
    return dict(value)


def _check_keys(value: Mapping[Any, Any], where: str) -> None:
    for key in value:
        if not isinstance(key, str):
            raise ValueError(
                f"{where}: key {shown(key)} ({type(key).__name__}) is not a "
                "string; setting names are strings"
            )


def _check_level(value: object, where: str, depth: int) -> None:
    """Walk one level: recursion is bounded by `MAX_DEPTH`, so a list that
    holds itself, or one nested 100,000 deep, ends here too."""
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        if _too_long_to_write(value):
            raise ValueError(
                f"{where}: {shown(value)} is out of range; no setting takes an int "
                f"beyond +-{MAX_INT} (2**63 - 1)"
            )
        return
    if isinstance(value, Mapping):
        _check_keys(value, where)
        children = [(f"{where}[{shown(key)}]", child) for key, child in value.items()]
    elif isinstance(value, list | tuple):
        children = [(f"{where}[{i}]", child) for i, child in enumerate(value)]
    else:
        return
    if children and depth >= MAX_DEPTH:
        raise ValueError(
            f"{where}: nested more than {MAX_DEPTH} levels deep; no setting is"
        )
    for path, child in children:
        _check_level(child, path, depth + 1)

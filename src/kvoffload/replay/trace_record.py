"""One line of a Mooncake trace, parsed and checked field by field.

A line is a JSON object with `timestamp` (milliseconds, a finite number),
`input_length` and `output_length` (integers) and `hash_ids` (an array of distinct
integers, one per 512-token block of the prompt); other fields are ignored. Every
value is checked against the bounds of `kvoffload.replay.limits`, so what passes
replays in bounded time and memory. A line that does not pass raises `RecordError`
naming the field and the problem in one line; no other exception leaves
`parse_record`.
"""

from __future__ import annotations

import json
import math
from typing import NamedTuple

from kvoffload.replay.limits import (
    MAX_HASH_ID,
    MAX_OUTPUT_TOKENS,
    MAX_PROMPT_TOKENS,
    MAX_TIMESTAMP_MS,
)

FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")

# Longer integer literals are out of every bound; not converting them also keeps
# clear of Python's limit on the digits of an int.
_MAX_INT_DIGITS = 40


class RecordError(ValueError):
    """What is wrong with one trace line: `field` (None for the line as a whole)
    and the problem, as one line of text."""

    def __init__(self, field: str | None, problem: str) -> None:
        super().__init__(problem if field is None else f"{field}: {problem}")
        self.field = field


class TraceRecord(NamedTuple):
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


class _HugeInt(NamedTuple):
    """An integer literal too long to be any field's value."""

    digits: int


def parse_record(raw: bytes, block_tokens: int) -> TraceRecord:
    """The record on `raw` (one line, without its end), or `RecordError`.

    `block_tokens` is the prompt tokens each hash id covers."""
    value = _decode(raw)
    if not isinstance(value, dict):
        raise RecordError(None, f"expected a JSON object, got {_show(value)}")
    for name in FIELDS:
        if name not in value:
            raise RecordError(name, "missing")
    timestamp = _number(value["timestamp"], "timestamp", MAX_TIMESTAMP_MS)
    input_length = _integer(value["input_length"], "input_length", 1, MAX_PROMPT_TOKENS)
    output_length = _integer(
        value["output_length"], "output_length", 0, MAX_OUTPUT_TOKENS
    )
    hash_ids = _hash_ids(value["hash_ids"], input_length, block_tokens)
    return TraceRecord(timestamp, input_length, output_length, hash_ids)


def _decode(raw: bytes) -> object:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordError(
            None,
            f"not UTF-8 text (byte {raw[exc.start]:#04x} at column {exc.start + 1})",
        ) from None
    try:
        return json.loads(text, object_pairs_hook=_object, parse_int=_int_literal)
    except RecursionError:
        raise RecordError(None, "not JSON: nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise RecordError(None, f"not JSON: {exc.msg} at column {exc.colno}") from None


def _object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            # json keeps the last silently; which one the writer meant is unknown.
            raise RecordError(_show_key(key), "appears twice")
        out[key] = value
    return out


def _int_literal(text: str) -> int | _HugeInt:
    digits = len(text.lstrip("-"))
    return _HugeInt(digits) if digits > _MAX_INT_DIGITS else int(text)


def _number(value: object, field: str, maximum: int) -> float:
    """A finite number of milliseconds in [0, maximum]."""
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 <= value <= maximum
    ):
        return float(value)
    raise RecordError(
        field,
        f"expected a number of milliseconds in [0, {maximum:,}], got {_show(value)}",
    )


def _integer(value: object, field: str, minimum: int, maximum: int) -> int:
    if type(value) is not int or not minimum <= value <= maximum:
        raise RecordError(
            field,
            f"expected an integer in [{minimum:,}, {maximum:,}], got {_show(value)}",
        )
    return value


def _hash_ids(value: object, input_length: int, block_tokens: int) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise RecordError(
            "hash_ids", f"expected an array of integers, got {_show(value)}"
        )
    seen: dict[int, int] = {}
    for i, item in enumerate(value):
        hash_id = _integer(item, f"hash_ids[{i}]", 0, MAX_HASH_ID)
        if hash_id in seen:
            # An id names a whole prefix: one request cannot hold it twice.
            raise RecordError(
                f"hash_ids[{i}]", f"{hash_id} repeats hash_ids[{seen[hash_id]}]"
            )
        seen[hash_id] = i
    # One id per block; the id of a partial last block may be left out (a
    # trace may hash whole blocks only).
    whole, needed = input_length // block_tokens, -(-input_length // block_tokens)
    if not whole <= len(value) <= needed:
        count = f"{needed:,}" if whole == needed else f"{whole:,} or {needed:,}"
        raise RecordError(
            "hash_ids",
            f"{len(value):,} ids for input_length {input_length:,}; one per "
            f"{block_tokens}-token block needs {count}",
        )
    return tuple(value)


def _show(value: object) -> str:
    """`value` for a one-line message: numbers as they are, other kinds by name."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, _HugeInt):
        return f"an integer of {value.digits:,} digits"
    if value is None:
        return "null"
    if isinstance(value, str):
        return f"the string {_clip(value)}"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _show_key(key: str) -> str:
    return key if key.isidentifier() and len(key) <= 40 else _clip(key)


def _clip(text: str) -> str:
    return repr(text[:40]) + ("..." if len(text) > 40 else "")

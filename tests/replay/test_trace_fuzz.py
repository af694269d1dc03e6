"""Fuzzing the trace reader and the numeric options of `kvoffload replay`.

Property: a trace is either read, with every value within the bounds of
`kvoffload.replay.limits`, or refused with one `TraceError` line naming the file
(and the line and field where there is one); never another exception. Bounded to
seconds: few examples, small values.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvoffload.replay import load_mooncake
from kvoffload.replay.cli import add_replay_arguments
from kvoffload.replay.limits import (
    MAX_ARRIVAL_S,
    MAX_HASH_ID,
    MAX_OUTPUT_TOKENS,
    MAX_PROMPT_TOKENS,
    MAX_REQUEST_TOKENS,
    MAX_TIMESTAMP_MS,
)
from kvoffload.replay.mooncake import MOONCAKE_BLOCK_TOKENS, TraceError
from kvoffload.replay.trace_record import FIELDS

FUZZ = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# Numbers near every bound, and the kinds a field must not have.
edge_ints = st.sampled_from(
    [
        *(0, 1, -1, 511, 512, 513, 600, MAX_PROMPT_TOKENS, MAX_PROMPT_TOKENS + 1),
        *(MAX_OUTPUT_TOKENS + 1, MAX_TIMESTAMP_MS, MAX_TIMESTAMP_MS + 1),
        *(2**63, MAX_HASH_ID, MAX_HASH_ID + 1, 10**30, -(10**30)),
    ]
)
edge_floats = st.sampled_from(
    [math.nan, math.inf, -math.inf, 0.5, 600.0, -0.0, 1e300, 5e-324]
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    edge_ints,
    st.floats(allow_nan=True, allow_infinity=True),
    edge_floats,
    st.text(max_size=8),
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def records(draw: st.DrawFn) -> dict[str, Any]:
    """A valid record, or one with a field one step past a bound or of a kind one
    step off, or with one or two fields arbitrary or missing; maybe with an
    unknown field."""
    n = draw(st.integers(1, 5))
    ids = draw(
        st.lists(st.integers(0, MAX_HASH_ID), min_size=n, max_size=n, unique=True)
    )
    length = draw(st.integers((n - 1) * 512 + 1, n * 512))
    output = draw(st.integers(0, 3000))
    # (valid value, values one step past a bound or of a kind one step off)
    fields: dict[str, tuple[Any, list[Any]]] = {
        "timestamp": (
            draw(st.integers(0, 10_000) | st.floats(0, 1e4)),
            [-0.001, MAX_TIMESTAMP_MS + 0.5, True, math.nan, "0"],
        ),
        "input_length": (
            length,
            [length - 512, length + 512, 0, True, float(length), str(length)],
        ),
        "output_length": (output, [-1, MAX_OUTPUT_TOKENS + 1, True, float(output)]),
        "hash_ids": (
            ids,
            [
                [*ids[:-1], ids[0]] if n > 1 else [*ids, ids[0]],  # a repeated id
                [*ids, MAX_HASH_ID - ids[0]],  # one id too many (or repeated)
                [-1, *ids[1:]],
                [MAX_HASH_ID + 1, *ids[1:]],
                [True, *ids[1:]],
                [float(ids[0]), *ids[1:]],
                " ".join(map(str, ids)),
            ],
        ),
    }
    out: dict[str, Any] = {name: valid for name, (valid, _) in fields.items()}
    mode = draw(st.sampled_from(["valid", "near", "near", "wild"]))
    if mode == "near":
        nears = [(name, v) for name, (_, values) in fields.items() for v in values]
        name, value = draw(st.sampled_from(nears))
        out[name] = value
    elif mode == "wild":
        for _ in range(draw(st.integers(1, 2))):
            name = draw(st.sampled_from(sorted(fields)))
            if draw(st.booleans()):
                out.pop(name, None)
            elif name == "hash_ids" and draw(st.booleans()):
                out[name] = draw(st.lists(json_values, max_size=n + 1))
            else:
                out[name] = draw(json_values)
    if draw(st.booleans()):
        out[draw(st.text(max_size=5))] = draw(json_values)
    return out


def first_bad_field(record: dict[str, Any]) -> str | None:
    """The oracle: the field the reader must name first (missing fields first,
    then values in the order of the format), or None if it must accept `record`."""

    def integer(v: object, lo: int, hi: int) -> bool:
        return type(v) is int and lo <= v <= hi

    for name in FIELDS:
        if name not in record:
            return name
    ts = record["timestamp"]
    number = isinstance(ts, int | float) and not isinstance(ts, bool)
    if not (number and math.isfinite(ts) and 0 <= ts <= MAX_TIMESTAMP_MS):
        return "timestamp"
    length = record["input_length"]
    if not integer(length, 1, MAX_PROMPT_TOKENS):
        return "input_length"
    if not integer(record["output_length"], 0, MAX_OUTPUT_TOKENS):
        return "output_length"
    ids = record["hash_ids"]
    valid_ids = (
        isinstance(ids, list)
        and all(integer(h, 0, MAX_HASH_ID) for h in ids)
        and len(set(ids)) == len(ids)
        and length // MOONCAKE_BLOCK_TOKENS
        <= len(ids)
        <= -(-length // MOONCAKE_BLOCK_TOKENS)
    )
    return None if valid_ids else "hash_ids"


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "trace.jsonl"


def read(path: Path, partial: str = "pad") -> list[Any] | TraceError:
    """The requests read, or the one TraceError; any other exception fails."""
    try:
        return list(load_mooncake(path, partial=partial).requests)  # type: ignore[arg-type]
    except TraceError as exc:
        message = str(exc)
        assert message.startswith(f"{path}") and "\n" not in message, message
        return exc


def check_within_bounds(requests: list[Any]) -> None:
    for r in requests:
        assert math.isfinite(r.arrival) and 0 <= r.arrival <= MAX_ARRIVAL_S
        assert 1 <= r.num_prompt_tokens <= MAX_PROMPT_TOKENS + 1
        assert 1 <= r.num_output_tokens <= MAX_OUTPUT_TOKENS
        assert r.num_prompt_tokens + r.num_output_tokens <= MAX_REQUEST_TOKENS
        assert len(r.hashes) >= r.num_prompt_tokens // MOONCAKE_BLOCK_TOKENS


@FUZZ
@given(
    lines=st.lists(records(), min_size=1, max_size=3),
    partial=st.sampled_from(["pad", "drop"]),
)
def test_arbitrary_field_values_are_read_within_bounds_or_named(
    trace_path: Path, lines: list[dict[str, Any]], partial: str
) -> None:
    trace_path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    outcome = read(trace_path, partial)
    bad = [(i, f) for i, r in enumerate(lines, start=1) if (f := first_bad_field(r))]
    if bad:
        assert isinstance(outcome, TraceError), lines
        line, field = bad[0]
        assert outcome.line == line and outcome.field is not None
        assert outcome.field.split("[")[0] == field, (outcome, lines[line - 1])
    else:
        assert not isinstance(outcome, TraceError), outcome
        assert len(outcome) == len(lines)
        check_within_bounds(outcome)


@FUZZ
@given(
    st.lists(st.binary(max_size=60) | st.text(max_size=60).map(str.encode), max_size=5)
)
def test_arbitrary_lines_are_read_within_bounds_or_named(
    trace_path: Path, lines: list[bytes]
) -> None:
    trace_path.write_bytes(b"\n".join(lines))
    outcome = read(trace_path)
    if not isinstance(outcome, TraceError):
        check_within_bounds(outcome)


NUMERIC_OPTIONS = {
    "--capacity-chunks": (1, None),
    "--capacity-tokens": (1, None),
    "--capacity": (1, None),  # bytes
    "--chunk-tokens": (1, None),
    "--device-tokens": (0, None),
    "--store-threshold": (0, None),
    "--limit": (1, None),
    "--seed": (0, None),
    "--jobs": (1, None),
    "--kv-bytes-per-token": (1, None),
    "--time-scale": (0, "auto"),
    "--target-load": (0, None),
    "--prefill-us-per-token": (0, None),
    "--decode-ms": (0, None),
    "--link-gbps": (0, None),
}
option_texts = st.one_of(
    st.integers(-(2**80), 2**80).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["nan", "inf", "-inf", "1e400", "0", "-0", "1" * 5000, "auto", ""]),
    st.sampled_from(["16GiB", "0.5KiB", "1.5B", "0GiB", "1e3GB", "9" * 60 + "TiB"]),
    st.text(max_size=10),
)


@FUZZ
@given(option=st.sampled_from(sorted(NUMERIC_OPTIONS)), text=option_texts)
def test_numeric_options_are_finite_and_in_bounds_or_a_usage_error(
    option: str, text: str
) -> None:
    parser = argparse.ArgumentParser(prog="kvoffload replay")
    add_replay_arguments(parser)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            args = parser.parse_args([f"{option}={text}"])
        except SystemExit as stop:
            assert stop.code == 2
            assert f"argument {option}: " in err.getvalue()
            assert "Traceback" not in err.getvalue()
            return
    value = getattr(args, option[2:].replace("-", "_"))
    if isinstance(value, list):
        (value,) = value
    minimum, special = NUMERIC_OPTIONS[option]
    if value == special:
        return
    assert isinstance(value, int | float) and not isinstance(value, bool)
    assert math.isfinite(value) and value >= minimum

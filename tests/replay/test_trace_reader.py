"""Malformed Mooncake traces: each is one `TraceError` naming the file, the line
and the field, never another exception, a hang or a silently wrong workload."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvoffload.replay import load_mooncake
from kvoffload.replay.limits import (
    MAX_ARRIVAL_S,
    MAX_LINE_BYTES,
    MAX_OUTPUT_TOKENS,
    MAX_PROMPT_TOKENS,
    MAX_TIMESTAMP_MS,
)
from kvoffload.replay.mooncake import TraceError

GOOD = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}'


def line_with(**fields: str) -> str:
    """GOOD with some fields' JSON text replaced (or removed, for "")."""
    values = {
        "timestamp": "0",
        "input_length": "600",
        "output_length": "5",
        "hash_ids": "[1, 2]",
    }
    values.update(fields)
    return "{" + ", ".join(f'"{k}": {v}' for k, v in values.items() if v) + "}"


def trace_error(tmp_path: Path, content: bytes | str, **kwargs: object) -> TraceError:
    path = tmp_path / "t.jsonl"
    if isinstance(content, str):
        content = content.encode()
    path.write_bytes(content)
    with pytest.raises(TraceError) as caught:
        load_mooncake(path, **kwargs)  # type: ignore[arg-type]
    message = str(caught.value)
    assert message.startswith(f"{path}:") and "\n" not in message
    return caught.value


@pytest.mark.parametrize(
    ("field", "text"),
    [
        ("timestamp", "NaN"),  # the replay looped forever
        ("timestamp", "Infinity"),  # NaN TTFTs in the JSON output
        ("timestamp", "-Infinity"),
        ("timestamp", "1e400"),
        ("timestamp", "-1"),
        ("timestamp", str(MAX_TIMESTAMP_MS + 1)),
        ("timestamp", "true"),
        ("timestamp", '"0"'),
        ("timestamp", "null"),
        ("input_length", "0"),  # IndexError with --partial-block drop
        ("input_length", "-512"),
        ("input_length", "600.5"),
        ("input_length", "600.0"),
        ("input_length", "1e400"),
        ("input_length", str(MAX_PROMPT_TOKENS + 1)),
        ("input_length", "false"),
        ("input_length", "[600]"),
        ("output_length", "100000000000"),  # the replay ran unbounded
        ("output_length", str(MAX_OUTPUT_TOKENS + 1)),
        ("output_length", "-1"),
        ("output_length", "NaN"),
        ("output_length", "1" * 5000),  # past Python's digit limit for int()
        ("output_length", '{"n": 5}'),
        ("hash_ids", '"12"'),  # was read as the ids 1 and 2
        ("hash_ids", "{}"),
        ("hash_ids", "7"),
        ("hash_ids", "[]"),  # 600 tokens need one whole-block id at least
        ("hash_ids", "[1, 2, 3]"),
        ("hash_ids[1]", "[1, 1]"),
        ("hash_ids[1]", "[1, -2]"),
        ("hash_ids[0]", f"[{2**64}, 2]"),  # OverflowError from to_bytes
        ("hash_ids[1]", "[1, 1e400]"),
        ("hash_ids[1]", "[1, 2.0]"),
        ("hash_ids[0]", "[true, 2]"),
        ("hash_ids[1]", '[1, "2"]'),
        ("hash_ids[0]", "[[1], 2]"),
        ("hash_ids", ""),  # missing
        ("timestamp", ""),
    ],
)
def test_a_bad_field_names_the_file_the_line_and_the_field(
    tmp_path: Path, field: str, text: str
) -> None:
    name = field.split("[")[0]
    error = trace_error(tmp_path, GOOD + "\n" + line_with(**{name: text}) + "\n")
    assert error.line == 2 and error.field == field
    assert f"t.jsonl:2: {field}: " in str(error)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("[" * 100_000, "nested too deeply"),  # was RecursionError
        ("[1, 2]", "expected a JSON object, got an array"),
        ('"text"', "expected a JSON object, got the string"),
        ("null", "expected a JSON object, got null"),
        ("{", "not JSON"),
        ("{'timestamp': 0}", "not JSON"),
        (GOOD[:-1] + ', "timestamp": 5}', "timestamp: appears twice"),
    ],
)
def test_a_line_that_is_no_record_is_named(
    tmp_path: Path, content: str, problem: str
) -> None:
    error = trace_error(tmp_path, content + "\n")
    assert error.line == 1 and problem in str(error)


def test_bytes_that_are_not_utf8_are_named_with_their_line(tmp_path: Path) -> None:
    error = trace_error(tmp_path, GOOD.encode() + b"\n\n" + b'{"timestamp": \xff}\n')
    assert error.line == 3 and "not UTF-8" in str(error)


def test_a_line_past_the_length_limit_is_refused_without_reading_it_whole(
    tmp_path: Path,
) -> None:
    error = trace_error(tmp_path, " " * (MAX_LINE_BYTES + 10) + GOOD + "\n")
    assert error.line == 1 and "longer than" in str(error)


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_an_empty_trace_is_refused(tmp_path: Path, content: str) -> None:
    error = trace_error(tmp_path, content)
    assert "empty" in str(error) and error.line is None


def test_a_directory_or_a_missing_file_is_named(tmp_path: Path) -> None:
    for path in (tmp_path, tmp_path / "missing.jsonl"):
        with pytest.raises(TraceError, match="cannot read the trace") as caught:
            load_mooncake(path)
        assert str(caught.value).startswith(f"{path}: ")


def test_a_stretch_past_the_arrival_limit_names_the_timestamp(tmp_path: Path) -> None:
    line = line_with(timestamp=str(MAX_TIMESTAMP_MS))
    error = trace_error(tmp_path, line + "\n", time_scale=1000.0)
    assert error.field == "timestamp" and f"{MAX_ARRIVAL_S:g} s" in str(error)


def test_lines_past_the_limit_are_not_read(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(GOOD + "\n" + "garbage\n")
    assert len(load_mooncake(path, limit=1)) == 1


def test_values_at_their_bounds_are_read(tmp_path: Path) -> None:
    """The bounds are inclusive and a BOM before the first line is allowed."""
    ids = list(range(MAX_PROMPT_TOKENS // 512))
    record = {
        "timestamp": MAX_TIMESTAMP_MS,
        "input_length": MAX_PROMPT_TOKENS,
        "output_length": MAX_OUTPUT_TOKENS,
        "hash_ids": [2**64 - 1, *ids[1:]],
        "extra": {"ignored": [1, 2]},
    }
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(record).encode() + b"\n")
    (request,) = load_mooncake(path, partial="drop").requests
    assert request.arrival == MAX_TIMESTAMP_MS / 1000
    assert request.num_prompt_tokens == MAX_PROMPT_TOKENS
    assert request.num_output_tokens == MAX_OUTPUT_TOKENS


def test_ids_below_2_63_keep_their_keys(tmp_path: Path) -> None:
    """Ids are unsigned now; the keys of every id the signed form took are the same
    bytes, so figures measured before do not move."""
    path = tmp_path / "t.jsonl"
    path.write_text(line_with(hash_ids=f"[{2**63 - 1}, 0]") + "\n")
    (request,) = load_mooncake(path).requests
    assert request.hashes[0] == b"mc" + (2**63 - 1).to_bytes(8, "big", signed=True)
    assert request.hashes[1] == b"mc" + (0).to_bytes(8, "big", signed=True)


@pytest.mark.parametrize("ids", [[1], [1, 2]], ids=["whole blocks only", "all"])
def test_the_id_of_a_partial_last_block_may_be_left_out(
    tmp_path: Path, ids: list[int]
) -> None:
    """Scenario: a trace that hashes whole blocks only (600 tokens, one id) is
    read as one whose last id covers the partial block: both replay."""
    path = tmp_path / "t.jsonl"
    line = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": ids}
    path.write_text(json.dumps(line) + "\n")
    (padded,) = load_mooncake(path).requests
    assert padded.num_prompt_tokens == len(ids) * 512 + 1
    (dropped,) = load_mooncake(path, partial="drop").requests
    assert dropped.num_prompt_tokens == 600

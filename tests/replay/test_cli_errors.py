"""Bad input to `kvoffload replay` and `kvoffload demo`: a usage error naming the
option and the value (exit status 2), never a traceback or a replay that hangs."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from kvoffload.cli import main as kvoffload_main
from kvoffload.engine_model import TimeModel

SMALL = ["replay", "--workload", "chat-agents", "--limit", "20", "--jobs", "1"]


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The error line of a run that must stop as a usage error."""
    with pytest.raises(SystemExit) as stopped:
        kvoffload_main(argv)
    assert stopped.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("option", "value", "allowed"),
    [
        ("--time-scale", "abc", "'auto' or a finite number > 0"),
        ("--time-scale", "0", "'auto' or a finite number > 0"),  # was ZeroDivisionError
        ("--time-scale", "nan", "'auto' or a finite number > 0"),  # replay never ended
        ("--time-scale", "-1", "'auto' or a finite number > 0"),
        ("--decode-ms", "nan", "a finite number >= 0"),  # replay never ended
        ("--link-gbps", "0", "a finite number > 0"),  # was ZeroDivisionError
        ("--target-load", "-1", "a finite number > 0"),
        ("--capacity-chunks", "0", "an integer >= 1"),
        ("--chunk-tokens", "0", "an integer >= 1"),  # was the default, silently
        ("--limit", "-1", "an integer >= 1"),  # dropped the last request
        ("--jobs", "0", "an integer >= 1"),
        ("--store-threshold", "-1", "an integer >= 0"),
        ("--kv-bytes-per-token", "x", "an integer >= 1"),
    ],
)
def test_a_bad_option_value_names_the_option_the_value_and_what_is_allowed(
    option: str, value: str, allowed: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = usage_error([*SMALL, option, value], capsys)
    assert f"argument {option}: " in err
    assert value in err and allowed in err
    assert "Traceback" not in err


def test_an_unknown_policy_is_a_usage_error_listing_the_known_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = usage_error([*SMALL, "--policy", "lru", "--policy", "fifo"], capsys)
    assert "argument --policy: " in err and "'fifo'" in err and "'arc'" in err


def test_trace_files_that_cannot_be_replayed_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.jsonl"
    assert str(missing) in usage_error(["replay", str(missing)], capsys)
    garbled = tmp_path / "garbled.jsonl"
    garbled.write_text('{"timestamp": 0}\n')
    assert f"{garbled}:1: input_length: missing" in usage_error(
        ["replay", str(garbled), "--jobs", "1"], capsys
    )
    assert str(missing) in usage_error(["demo", "--trace", str(missing)], capsys)


def test_a_trace_and_a_workload_together_are_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("")
    err = usage_error(["replay", str(trace), "--workload", "reasoning"], capsys)
    assert "a trace or --workload, not both" in err


@pytest.mark.parametrize(
    "fields",
    [
        {"decode_step_s": math.nan},
        {"prefill_s_per_token": math.inf},
        {"transfer_bytes_per_s": 0.0},
        {"kv_bytes_per_token": True},
    ],
)
def test_time_model_refuses_what_would_stall_or_divide_by_zero(
    fields: dict[str, float],
) -> None:
    (name,) = fields
    with pytest.raises(ValueError, match=re.escape(name)):
        TimeModel(**fields)

"""Bad input to `kvoffload replay` and `kvoffload demo`: a usage error naming the
option and the value (exit status 2), never a traceback or a replay that hangs."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from kvoffload.cli import main as kvoffload_main
from kvoffload.engine_model import TimeModel

# Every command here must stop before it replays; one that once hung then fails.
pytestmark = pytest.mark.usefixtures("no_replay")

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
        ("--time-scale", "abc", "a finite number >= 1e-06 and <= 1e+06, or 'auto'"),
        ("--time-scale", "0", "or 'auto'"),  # was ZeroDivisionError
        ("--time-scale", "nan", "or 'auto'"),  # replay never ended
        ("--time-scale", "-1", "or 'auto'"),
        ("--time-scale", "1e300", "or 'auto'"),  # arrivals past any float clock
        ("--decode-ms", "nan", "a finite number >= 0 and <= 1e+06"),  # never ended
        ("--decode-ms", "1e300", "a finite number >= 0 and <= 1e+06"),  # inf clock
        ("--prefill-us-per-token", "inf", "a finite number >= 0 and <= 1e+06"),
        ("--link-gbps", "0", "a finite number >= 1e-06"),  # was ZeroDivisionError
        ("--link-gbps", "1e-300", "a finite number >= 1e-06"),  # inf transfer times
        ("--target-load", "-1", "a finite number > 0 and <= 100"),
        ("--capacity-chunks", "0", "an integer from 1 to "),
        ("--capacity-tokens", "-5", "an integer from 1 to "),
        ("--chunk-tokens", "0", "an integer from 1 to "),  # was the default, silently
        ("--chunk-tokens", "99999999999", "an integer from 1 to 2,097,152"),
        ("--device-tokens", "-1", "an integer from 0 to "),
        ("--limit", "-1", "an integer from 1 to "),  # dropped the last request
        ("--jobs", "0", "an integer from 1 to 1,024"),
        ("--store-threshold", "-1", "an integer from 0 to "),
        ("--kv-bytes-per-token", "x", "an integer from 1 to "),
        ("--seed", "-1", "an integer from 0 to "),  # numpy's error, unnamed
        ("--kv-bytes-per-token", "1" * 5000, "an integer from 1 to "),
    ],
)
def test_a_bad_option_value_names_the_option_the_value_and_what_is_allowed(
    option: str, value: str, allowed: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = usage_error([*SMALL, option, value], capsys)
    assert f"argument {option}: " in err
    assert value[:40] in err and allowed in err
    assert "Traceback" not in err


def test_an_unknown_policy_is_a_usage_error_listing_the_known_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = usage_error([*SMALL, "--policy", "lru", "--policy", "fifo"], capsys)
    assert "argument --policy: " in err and "'fifo'" in err and "'arc'" in err


def trace_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line a run with a trace that cannot be replayed prints (status 1)."""
    assert kvoffload_main(argv) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    (line,) = captured.err.splitlines()
    return line


def test_trace_files_that_cannot_be_read_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.jsonl"
    line = trace_error(["replay", str(missing)], capsys)
    assert line == (
        f"kvoffload replay: error: {missing}: cannot read the trace: "
        "No such file or directory"
    )
    assert "cannot read the trace" in trace_error(["replay", str(tmp_path)], capsys)
    garbled = tmp_path / "garbled.jsonl"
    garbled.write_text('{"timestamp": 0}\n')
    assert f"{garbled}:1: input_length: missing" in trace_error(
        ["replay", str(garbled), "--jobs", "1"], capsys
    )
    assert str(missing) in trace_error(["demo", "--trace", str(missing)], capsys)


@pytest.mark.parametrize(
    ("line", "field"),
    [
        (
            '{"timestamp": NaN, "input_length": 600, "output_length": 5, '
            '"hash_ids": [1, 2]}',
            "timestamp",
        ),  # the replay looped forever
        (
            '{"timestamp": 0, "input_length": 600, "output_length": 1048577, '
            '"hash_ids": [1, 2]}',
            "output_length",
        ),  # 100000000000 ran unbounded (and filled memory)
        (
            '{"timestamp": Infinity, "input_length": 600, "output_length": 5, '
            '"hash_ids": [1, 2]}',
            "timestamp",
        ),  # NaN in the JSON output
        (
            '{"timestamp": 0, "input_length": 0, "output_length": 5, "hash_ids": []}',
            "input_length",
        ),  # IndexError with drop
    ],
)
def test_a_malformed_trace_line_is_one_line_naming_file_line_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, field: str
) -> None:
    trace = tmp_path / "t.jsonl"
    good = (
        '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}'
    )
    trace.write_text(good + "\n" + line + "\n")
    argv = ["replay", str(trace), "--json", "--jobs", "1", "--partial-block", "drop"]
    message = trace_error(argv, capsys)
    assert message.startswith(f"kvoffload replay: error: {trace}:2: {field}: ")


def test_an_empty_trace_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "empty.jsonl"
    trace.write_text("")
    assert "the trace is empty" in trace_error(["replay", str(trace)], capsys)


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


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (  # one of the two was ignored silently
            ["--capacity-chunks", "5", "--capacity-tokens", "5000"],
            "argument --capacity-tokens: not allowed with argument --capacity-chunks",
        ),
        (["--partial-block", "drop"], "--partial-block applies to a trace"),
        (
            ["--time-scale", "2", "--target-load", "0.9"],
            "--target-load applies to --time-scale auto only",
        ),
    ],
)
def test_options_that_one_another_would_void_are_refused(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in usage_error([*SMALL, *extra], capsys)


def test_a_seed_with_a_trace_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("")
    err = usage_error(["replay", str(trace), "--seed", "3"], capsys)
    assert "--seed applies to a generated --workload, not to a trace" in err


def test_a_device_too_small_for_the_longest_request_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It waited for room forever."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 1600, "output_length": 5, '
        '"hash_ids": [1, 2, 3, 4]}\n'
    )
    err = usage_error(["replay", str(trace), "--device-tokens", "1024"], capsys)
    assert "--device-tokens 1,024 cannot hold the longest request" in err
    assert "at least 2,560" in err


@pytest.mark.parametrize(
    "option", ["--store-threshold", "--capacity-chunks", "--capacity-tokens"]
)
def test_an_option_of_several_values_given_none_is_refused(
    option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """argparse drops a lone `--`: `--store-threshold=--` gave no thresholds and
    an IndexError (found by the fuzz suite)."""
    err = usage_error([*SMALL, f"{option}=--"], capsys)
    assert f"argument {option}: expected at least one value" in err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--tier", "tape:100"], "'tape' is not a tier kind"),
        (["--tier", "file:0"], "capacity '0' is not"),
        (["--tier", "file:-3GiB"], "capacity '-3GiB' is not"),
        (["--tier", "redis:100:nan"], "bandwidth 'nan' is not a finite number"),
        (["--tier", "redis:100:inf"], "bandwidth 'inf' is not a finite number"),
        (["--tier", "file:100:0"], "bandwidth '0' is not a finite number"),
        (["--tier", "file"], "is not KIND:CAPACITY[:GBPS][:back]"),
        (["--tier", "redis:100:back"], "only a file tier can be written back"),
        (["--tier", "file:100:back:5"], "is not KIND:CAPACITY"),
        (["--shared-tier", "file:100:back"], "a tier the engines share is written"),
        (["--shared-tier", "memcached:10"], "'memcached' is not a tier kind"),
        (["--shared-tier", "redis:10:-1"], "bandwidth '-1' is not"),
        (["--engines", "0"], "'0' is not an integer from 1 to 4,096"),
        (["--engines", "many"], "'many' is not an integer from 1 to 4,096"),
        (["--router", "random"], "'random' is not a router"),
        (["--max-defer-s", "nan"], "'nan' is not a finite number >= 0"),
        (["--requests", "0"], "'0' is not an integer from 1"),
    ],
)
def test_bad_tier_and_fleet_options_are_one_clear_line(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = usage_error([*SMALL, *argv], capsys)
    (line,) = [x for x in err.splitlines() if "error:" in x]
    assert f"argument {argv[0]}: " in line and says in line
    assert "Traceback" not in err


def test_sizes_and_workloads_that_cannot_be_modeled_are_usage_errors(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A size that holds no chunk of this model (512 tokens x 128 KiB).
    err = usage_error([*SMALL, "--chunk-tokens", "256", "--tier", "file:1MiB"], capsys)
    assert "cannot hold one chunk" in err
    err = usage_error([*SMALL, "--engines", "2", "--shared-tier", "redis:1MiB"], capsys)
    assert "cannot hold one chunk" in err
    err = usage_error([*SMALL, "--requests", "10"], capsys)
    assert "--requests 10: only synth-* workloads" in err
    err = usage_error([*SMALL, "--engines", "2", "--belady"], capsys)
    assert "--belady is for single-engine replays" in err

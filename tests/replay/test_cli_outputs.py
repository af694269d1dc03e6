"""Where `kvoffload replay` writes: report and plot paths checked before the run,
strict JSON, a reader that goes away, and a trace that can be read only once."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvoffload.cli import main as kvoffload_main
from kvoffload.replay import report

ROOT = Path(__file__).resolve().parents[2]
LINES = [
    '{"timestamp": 0, "input_length": 1500, "output_length": 10, "hash_ids": [0, 1, 2]}',
    '{"timestamp": 1000, "input_length": 2100, "output_length": 10, '
    '"hash_ids": [0, 1, 2, 3, 4]}',
]
TRACE_TEXT = "".join(line + "\n" for line in LINES)


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text(TRACE_TEXT)
    return path


def replay(*argv: str) -> int:
    return kvoffload_main(["replay", *argv, "--capacity-chunks", "4", "--jobs", "1"])


def test_plot_into_a_directory_writes_inside_it(trace: Path, tmp_path: Path) -> None:
    """It wrote DIR.png beside the directory."""
    plots = tmp_path / "plots"
    plots.mkdir()
    assert replay(str(trace), "--plot", str(plots)) == 0
    assert (plots / "hit_ratio.png").read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path / "plots.png").exists()


def test_plot_to_a_png_file_writes_it_and_its_directory(
    trace: Path, tmp_path: Path
) -> None:
    target = tmp_path / "new" / "figure.png"
    assert replay(str(trace), "--plot", str(target)) == 0
    assert target.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("name", ["plot", "plot.txt"])
def test_plot_to_a_path_that_is_neither_is_refused(
    trace: Path, tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        replay(str(trace), "--plot", str(tmp_path / name))
    assert stopped.value.code == 2
    assert "expected a directory or a file ending in .png" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [trace]


@pytest.mark.usefixtures("no_replay")
def test_an_unwritable_report_dir_is_refused_before_the_run(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was reported only after the whole replay."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    for directory in (blocker, blocker / "sub"):
        with pytest.raises(SystemExit) as stopped:
            replay(str(trace), "--report-dir", str(directory))
        assert stopped.value.code == 2
        err = capsys.readouterr().err
        assert f"--report-dir {directory}: cannot write there" in err


@pytest.mark.usefixtures("no_replay")
def test_a_report_file_that_is_a_directory_is_refused_before_the_run(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "report" / "table.txt").mkdir(parents=True)
    with pytest.raises(SystemExit):
        replay(str(trace), "--report-dir", str(tmp_path / "report"))
    assert "table.txt is not a regular file" in capsys.readouterr().err


@pytest.mark.usefixtures("no_replay")
def test_an_unwritable_plot_directory_is_refused_before_the_run(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SystemExit):
        replay(str(trace), "--plot", str(blocker / "figure.png"))
    assert f"--plot {blocker}: cannot write there" in capsys.readouterr().err


def test_json_lines_are_strict_json(
    trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert replay(str(trace), "--json", "--belady") == 0

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in the JSON output")

    for line in capsys.readouterr().out.splitlines():
        json.loads(line, parse_constant=refuse)


def test_a_record_that_is_not_finite_is_never_written() -> None:
    out: list[str] = []

    class Sink:
        def write(self, text: str) -> None:
            out.append(text)

    with pytest.raises(ValueError):
        report.write_json_lines([{"est_ttft_s": math.nan}], Sink())  # type: ignore[arg-type]
    assert out == []


def _kvoffload(*argv: str, **kwargs: object) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-m", "kvoffload.cli", *argv], env=env, **kwargs
    )


def test_a_reader_that_goes_away_ends_the_run_quietly(trace: Path) -> None:
    """`--json | head -1` printed the usage and `Broken pipe`."""
    proc = _kvoffload(
        "replay",
        str(trace),
        "--json",
        "--jobs",
        "1",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the replay has written anything
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert err == ""


def test_a_trace_that_can_be_read_once_replays(trace: Path) -> None:
    """A pipe (`kvoffload replay <(zcat t.gz)`) was read twice with --time-scale
    auto: the second read found it empty."""
    proc = _kvoffload(
        "replay",
        "/dev/stdin",
        "--json",
        "--jobs",
        "1",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = proc.communicate(TRACE_TEXT.encode(), timeout=120)
    assert proc.returncode == 0, err.decode()
    first = json.loads(out.decode().splitlines()[0])
    assert first["requests"] == 2

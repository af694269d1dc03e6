"""Progress of `kvoffload replay`: it showed a bar on a terminal only, with no
rate nor ETA, and nothing at all in a log or CI. Now: a bar with rate and ETA on
a terminal, a plain line every 10 s off one, nothing with `--progress off`."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from kvoffload.cli import main as kvoffload_main
from kvoffload.replay import progress
from kvoffload.replay.progress import BarProgress, LineProgress, progress_for

SMALL = ["replay", "--workload", "chat-agents", "--limit", "30"]
CAPACITIES = ["--capacity-chunks", "4", "40"]
LINE = re.compile(
    r"replaying (\d+) runs?: ([\d,]+)/([\d,]+) requests \(\d+%\), [\d,]+ "
    r"requests/s, \d+:\d\d:\d\d elapsed, ETA (\d+:\d\d:\d\d|unknown)"
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_off_a_terminal_a_line_every_interval_with_rate_and_eta() -> None:
    clock, out = FakeClock(), io.StringIO()
    with LineProgress(1000, 2, out, clock, interval=10) as shown:
        clock.now += 4
        shown.advance(100)  # 4 s: not yet
        assert out.getvalue() == ""
        clock.now += 6
        shown.advance(150)  # 10 s: 250 done, 25/s, 750 left: 30 s
        clock.now += 5
        shown.poll()  # 15 s: not yet
        clock.now += 5
        shown.poll()  # 20 s, waiting on workers: 12.5/s, 60 s left
        shown.advance(750)
    assert out.getvalue().splitlines() == [
        "replaying 2 runs: 250/1,000 requests (25%), 25 requests/s, 0:00:10 "
        "elapsed, ETA 0:00:30",
        "replaying 2 runs: 250/1,000 requests (25%), 12 requests/s, 0:00:20 "
        "elapsed, ETA 0:01:00",
        "replayed 1,000 requests in 0:00:20 (50 requests/s)",
    ]


def test_a_run_shorter_than_the_interval_prints_nothing() -> None:
    clock, out = FakeClock(), io.StringIO()
    with LineProgress(10, 1, out, clock, interval=10) as shown:
        clock.now += 9
        shown.advance(10)
    assert out.getvalue() == ""


def test_a_failed_replay_gets_no_closing_line() -> None:
    clock, out = FakeClock(), io.StringIO()
    with pytest.raises(RuntimeError), LineProgress(10, 1, out, clock, 1) as shown:
        clock.now += 2
        shown.advance(3)
        raise RuntimeError
    (line,) = out.getvalue().splitlines()
    assert LINE.fullmatch(line)


def test_before_any_request_the_eta_is_unknown() -> None:
    clock, out = FakeClock(), io.StringIO()
    shown = LineProgress(10, 1, out, clock, interval=1)
    clock.now += 1
    shown.poll()
    assert out.getvalue().rstrip().endswith("ETA unknown")


def test_on_a_terminal_a_bar_with_rate_and_eta_fits_80_columns() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=80, color_system=None)
    bar = BarProgress(60_155, 18, console)
    bar.advance(12_000)
    bar.close(completed=True)
    rendered = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    lines = [line for line in rendered.splitlines() if "replaying" in line]
    assert lines
    assert all(len(line) <= 80 for line in lines)
    last = lines[-1]
    assert "replaying 18 runs" in last and "12,000/60,155" in last
    assert "req/s" in last and "ETA" in last


def test_auto_is_a_bar_on_a_terminal_and_lines_off_one() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    bar = progress_for("auto", 10, 1, Terminal())
    assert isinstance(bar, BarProgress)
    bar.close(completed=True)
    assert isinstance(progress_for("auto", 10, 1, io.StringIO()), LineProgress)
    assert isinstance(progress_for("lines", 10, 1, Terminal()), LineProgress)
    off = progress_for("off", 10, 1, Terminal())
    assert not isinstance(off, LineProgress | BarProgress)


@pytest.mark.parametrize(
    ("argv", "runs"),
    [
        (["--policy", "lru", "--policy", "arc", *CAPACITIES, "--jobs", "1"], 4),
        (["--policy", "lru", "--policy", "arc", *CAPACITIES, "--jobs", "2"], 4),
        (["--engines", "2", "--router", "session", *CAPACITIES, "--jobs", "1"], 2),
    ],
)
def test_the_replay_command_prints_progress_lines_to_stderr_off_a_terminal(
    argv: list[str],
    runs: int,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(progress, "LINE_INTERVAL_S", 0.0)  # a line at each report
    assert kvoffload_main([*SMALL, *argv, "--json"]) == 0
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) >= 2
    total = runs * 30
    done = []
    for line in lines[:-1]:
        match = LINE.fullmatch(line)
        assert match, line
        assert int(match[1]) == runs and int(match[3].replace(",", "")) == total
        done.append(int(match[2].replace(",", "")))
    assert done == sorted(done) and 0 < done[-1] <= total
    assert re.fullmatch(rf"replayed {total} requests in .*requests/s\)", lines[-1])
    assert captured.out.count("\n") >= runs  # stdout: the JSON records only


def test_progress_off_prints_nothing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress, "LINE_INTERVAL_S", 0.0)
    assert kvoffload_main([*SMALL, "--jobs", "1", "--progress", "off"]) == 0
    assert capsys.readouterr().err == ""

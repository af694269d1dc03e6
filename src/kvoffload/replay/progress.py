"""How far a replay has got, on stderr: a live bar with rate and ETA on a
terminal, a plain line every `LINE_INTERVAL_S` off one (a log file, CI), or
nothing (`--progress off`).

Progress counts requests replayed over all runs of a sweep. A run shorter than
one interval prints nothing off a terminal, so scripts see no stderr from it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import Literal, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

ProgressMode = Literal["auto", "lines", "off"]
PROGRESS_MODES: tuple[ProgressMode, ...] = ("auto", "lines", "off")
LINE_INTERVAL_S = 10.0
"""Seconds between two plain progress lines."""

Clock = Callable[[], float]


class ReplayProgress:
    """Counts requests replayed out of `total`; shows nothing. Subclasses show
    it. Use as a context manager: leaving it ends the display."""

    def __init__(self, total: int, runs: int) -> None:
        self.total = total
        self.runs = runs
        self.done = 0

    def advance(self, requests: int) -> None:
        """`requests` more were replayed."""
        self.done += requests

    def poll(self) -> None:
        """Called while waiting for worker processes, so that time-driven
        output comes even when no request finished."""

    def close(self, completed: bool) -> None:
        """End the display; `completed` is False when the replay failed."""

    def __enter__(self) -> ReplayProgress:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(completed=kind is None)


def clock_time(seconds: float) -> str:
    """`seconds` as H:MM:SS, as the bar shows times."""
    whole = max(0, int(seconds))
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


class LineProgress(ReplayProgress):
    """A plain line to `stream` every `interval` seconds of `clock`, and one at
    the end if any came before it."""

    def __init__(
        self,
        total: int,
        runs: int,
        stream: TextIO,
        clock: Clock = time.monotonic,
        interval: float | None = None,
    ) -> None:
        super().__init__(total, runs)
        self._stream = stream
        self._clock = clock
        self._interval = LINE_INTERVAL_S if interval is None else interval
        self._start = clock()
        self._last = self._start
        self._printed = False

    def advance(self, requests: int) -> None:
        super().advance(requests)
        self.poll()

    def poll(self) -> None:
        now = self._clock()
        if now - self._last >= self._interval:
            self._last = now
            self._write(self.line(now - self._start))

    def line(self, elapsed: float) -> str:
        """The progress line after `elapsed` seconds."""
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = clock_time((self.total - self.done) / rate) if rate > 0 else "unknown"
        share = self.done / self.total if self.total else 1.0
        return (
            f"replaying {self.runs} run{'s' * (self.runs != 1)}: {self.done:,}/"
            f"{self.total:,} requests ({share:.0%}), {rate:,.0f} requests/s, "
            f"{clock_time(elapsed)} elapsed, ETA {eta}"
        )

    def close(self, completed: bool) -> None:
        if completed and self._printed:
            elapsed = self._clock() - self._start
            rate = self.total / elapsed if elapsed > 0 else 0.0
            self._write(
                f"replayed {self.total:,} requests in {clock_time(elapsed)} "
                f"({rate:,.0f} requests/s)"
            )

    def _write(self, line: str) -> None:
        self._printed = True
        print(line, file=self._stream, flush=True)


class _RateColumn(ProgressColumn):
    """Requests a second, over rich's recent window."""

    def render(self, task: Task) -> Text:
        speed = task.speed
        return Text("- req/s" if speed is None else f"{speed:,.0f} req/s")


class BarProgress(ReplayProgress):
    """A live bar on `console` (a terminal) with the count, the rate, the time
    elapsed and the time left; it disappears when the replay ends."""

    def __init__(self, total: int, runs: int, console: Console) -> None:
        super().__init__(total, runs)
        self._bar = Progress(
            TextColumn(f"replaying {runs} run{'s' * (runs != 1)}"),
            BarColumn(bar_width=None),
            TextColumn("{task.completed:,.0f}/{task.total:,.0f}"),
            _RateColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        )
        self._task = self._bar.add_task("replay", total=total)
        self._bar.start()

    def advance(self, requests: int) -> None:
        super().advance(requests)
        self._bar.advance(self._task, requests)

    def close(self, completed: bool) -> None:
        self._bar.stop()


def progress_for(
    mode: ProgressMode,
    total: int,
    runs: int,
    stream: TextIO | None = None,
) -> ReplayProgress:
    """The display `mode` asks for on `stream` (stderr): `auto` is a bar on a
    terminal and lines off one."""
    stream = stream or sys.stderr
    if mode == "off":
        return ReplayProgress(total, runs)
    if mode == "auto" and stream.isatty():
        return BarProgress(total, runs, Console(file=stream))
    return LineProgress(total, runs, stream)

"""A modeled transfer link for the planner: a fixed bandwidth and start-up latency,
jobs served one after another, and what it moved over simulated time.

A secondary tier model has one link per direction (reads, writes); a shared tier's
links are shared by every engine, so one engine's transfers queue behind another's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

WINDOW_S = 1.0
"""Peak bandwidth is the most bytes moved in one window of simulated time."""


@dataclass(frozen=True)
class LinkUsage:
    """What a link moved: bytes, busy seconds, and its mean and peak rate in
    bytes per second (mean over `span_s`, peak over any `WINDOW_S` window)."""

    num_bytes: int
    jobs: int
    busy_s: float
    mean_bytes_per_s: float
    peak_bytes_per_s: float


class Link:
    """Jobs run in order, each `latency_s + bytes / bytes_per_s` long.

    `reserve` is given the time a job is ready to start and returns when it ends;
    it starts once the jobs before it have ended. Bytes are spread over the
    windows the job spans, so that the peak is a rate the link really held.
    """

    __slots__ = (
        "_buckets",
        "_free",
        "busy_s",
        "bytes_per_s",
        "jobs",
        "latency_s",
        "num_bytes",
    )  # fmt: skip

    def __init__(self, bytes_per_s: float, latency_s: float) -> None:
        if not math.isfinite(bytes_per_s) or bytes_per_s <= 0:
            raise ValueError(
                f"bytes_per_s must be a finite number > 0, got {bytes_per_s!r}"
            )
        if not math.isfinite(latency_s) or latency_s < 0:
            raise ValueError(
                f"latency_s must be a finite number >= 0, got {latency_s!r}"
            )
        self.bytes_per_s = bytes_per_s
        self.latency_s = latency_s
        self._free = 0.0
        self._buckets: dict[int, float] = {}
        self.num_bytes = 0
        self.jobs = 0
        self.busy_s = 0.0

    def reserve(self, ready: float, num_bytes: int) -> float:
        """Queue a job of `num_bytes` ready at `ready`; returns when it ends."""
        begin = max(ready, self._free)
        moving = begin + self.latency_s
        end = moving + num_bytes / self.bytes_per_s
        self._free = end
        self.jobs += 1
        self.busy_s += end - begin
        if num_bytes:
            self.num_bytes += num_bytes
            self._account(moving, end, num_bytes)
        return end

    def _account(self, start: float, end: float, num_bytes: int) -> None:
        window = int(start // WINDOW_S)
        buckets = self._buckets
        if end <= start:  # too fast to measure: all in one window
            buckets[window] = buckets.get(window, 0.0) + num_bytes
            return
        rate = num_bytes / (end - start)
        while start < end:
            edge = min(end, (window + 1) * WINDOW_S)
            buckets[window] = buckets.get(window, 0.0) + (edge - start) * rate
            start = edge
            window += 1

    def usage(self, span_s: float) -> LinkUsage:
        """What the link moved, its mean rate over `span_s` seconds of simulated time."""
        peak = max(self._buckets.values(), default=0.0) / WINDOW_S
        mean = self.num_bytes / span_s if span_s > 0 else 0.0
        return LinkUsage(self.num_bytes, self.jobs, self.busy_s, mean, peak)

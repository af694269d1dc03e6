"""Running many (policy, capacity, settings) replays, in parallel processes, with
progress bars, plus the offline bounds for the same capacities."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from kvoffload.replay.belady import OfflineResult, belady, infinite
from kvoffload.replay.runner import ReplayResult, ReplaySettings, run_replay
from kvoffload.replay.workload import Workload


@dataclass(frozen=True)
class Run:
    policy: str
    capacity_chunks: int
    settings: ReplaySettings


# Set before the worker processes fork, so they share the workload without pickling.
_WORKLOAD: Workload | None = None
_PROGRESS: mp.Queue[int] | None = None


def _report(n: int) -> None:
    if _PROGRESS is not None:
        _PROGRESS.put(n)


def _run(run: Run) -> ReplayResult:
    assert _WORKLOAD is not None
    return run_replay(_WORKLOAD, run.policy, run.capacity_chunks, run.settings, _report)


def run_sweep(
    workload: Workload,
    runs: Sequence[Run],
    jobs: int | None = None,
    show_progress: bool = True,
) -> list[ReplayResult]:
    """Replay every run; results in the order of `runs`."""
    global _WORKLOAD, _PROGRESS
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(runs)))
    _WORKLOAD = workload
    ctx = mp.get_context("fork")
    _PROGRESS = ctx.Queue()
    total = len(runs) * len(workload)
    columns = (
        TextColumn("replaying"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    try:
        with Progress(*columns, disable=not show_progress, transient=True) as bar:
            task = bar.add_task("requests", total=total)
            if jobs == 1:
                out = []
                for run in runs:
                    out.append(
                        run_replay(
                            workload,
                            run.policy,
                            run.capacity_chunks,
                            run.settings,
                            lambda n: bar.advance(task, n),
                        )
                    )
                return out
            with ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
                futures: list[Future[ReplayResult]] = [
                    pool.submit(_run, run) for run in runs
                ]
                while not all(f.done() for f in futures):
                    with contextlib.suppress(queue.Empty):
                        bar.advance(task, _PROGRESS.get(timeout=0.2))
                return [f.result() for f in futures]
    finally:
        _WORKLOAD = None
        _PROGRESS = None


def offline_bounds(
    workload: Workload, chunk_tokens: int, capacities: Sequence[int], with_belady: bool
) -> tuple[dict[int, OfflineResult], OfflineResult]:
    """Belady at each capacity (if asked) and the infinite-cache bound."""
    chunks = workload.chunk_sequence(chunk_tokens)
    bounds = (
        {c: belady(chunks, c) for c in sorted(set(capacities))} if with_belady else {}
    )
    return bounds, infinite(chunks)

"""Running many (policy, capacity, settings) replays, in parallel processes,
reporting progress, plus the offline bounds for the same capacities."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from kvoffload.replay.belady import OfflineResult, belady, infinite
from kvoffload.replay.progress import ReplayProgress
from kvoffload.replay.runner import ReplayResult, ReplaySettings, run_replay
from kvoffload.replay.workload import Workload

Item = TypeVar("Item")
Result = TypeVar("Result")
Report = Callable[[int], None]
"""Called by a replay with the number of requests it finished since last time."""


@dataclass(frozen=True)
class Run:
    policy: str
    capacity_chunks: int
    settings: ReplaySettings


# Set before the worker processes fork, so they share the task (and the workload
# it holds) without pickling; only item indices and results cross processes.
_TASK: Callable[[int, Report], Any] | None = None
_PROGRESS: mp.Queue[int] | None = None


def _report(n: int) -> None:
    if _PROGRESS is not None:
        _PROGRESS.put(n)


def _run_item(index: int) -> Any:
    assert _TASK is not None
    return _TASK(index, _report)


def run_parallel(
    task: Callable[[Item, Report], Result],
    items: Sequence[Item],
    jobs: int | None,
    progress: ReplayProgress,
) -> list[Result]:
    """`task(item, report)` for every item, in up to `jobs` forked processes (the
    CPU count by default); results in the order of `items`. Each task reports
    the requests it replayed, which advance `progress` in this process."""
    global _TASK, _PROGRESS
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(items)))
    if jobs == 1:
        return [task(item, progress.advance) for item in items]
    ctx = mp.get_context("fork")

    def run_item(index: int, report: Report) -> Result:
        return task(items[index], report)

    _TASK = run_item
    _PROGRESS = ctx.Queue()
    try:
        with ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
            futures: list[Future[Any]] = [
                pool.submit(_run_item, i) for i in range(len(items))
            ]
            while not all(f.done() for f in futures):
                try:
                    progress.advance(_PROGRESS.get(timeout=0.2))
                except queue.Empty:
                    progress.poll()
            with contextlib.suppress(queue.Empty):
                while True:  # what the last replays reported after the check
                    progress.advance(_PROGRESS.get_nowait())
            return [cast(Result, f.result()) for f in futures]
    finally:
        _TASK = None
        _PROGRESS = None


def run_sweep(
    workload: Workload,
    runs: Sequence[Run],
    jobs: int | None = None,
    progress: ReplayProgress | None = None,
) -> list[ReplayResult]:
    """Replay every run; results in the order of `runs`. `progress` counts
    `len(runs) * len(workload)` requests (none shown by default)."""
    progress = progress or ReplayProgress(len(runs) * len(workload), len(runs))

    def replay(run: Run, report: Report) -> ReplayResult:
        return run_replay(
            workload, run.policy, run.capacity_chunks, run.settings, report
        )

    return run_parallel(replay, runs, jobs, progress)


def offline_bounds(
    workload: Workload, chunk_tokens: int, capacities: Sequence[int], with_belady: bool
) -> tuple[dict[int, OfflineResult], OfflineResult]:
    """Belady at each capacity (if asked) and the infinite-cache bound."""
    chunks = workload.chunk_sequence(chunk_tokens)
    bounds = (
        {c: belady(chunks, c) for c in sorted(set(capacities))} if with_belady else {}
    )
    return bounds, infinite(chunks)

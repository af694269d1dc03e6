"""A thread pool that runs a tier's jobs as parallel batches and queues results.

A job is split by its tier into tasks, each covering some of the job's chunks
(by index); tasks run in parallel and the job's result is queued when its last
task ends. The scheduler thread only submits and takes results, never waits,
except in `drain`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import NamedTuple

logger = logging.getLogger(__name__)


class BatchOutcome(NamedTuple):
    """What one task did: indices of its chunks that failed, bytes moved, which
    of the failed loads turned out gone from the tier (absent or corrupt), not
    merely unreachable, which of the failed stores the tier had no room for
    (to count as skipped, not as failures), which stores it found the tier
    already held (neither moved nor failed), and the retention hints the loaded
    chunks carried (by index: seconds left, or 0)."""

    failed: Sequence[int]
    num_bytes: int
    lost: Sequence[int] = ()
    full: Sequence[int] = ()
    held: Sequence[int] = ()
    hints: Mapping[int, float] | None = None


class Task(NamedTuple):
    """`run` moves the chunks at `indices` of a job; it reports failures in its
    outcome and raises only for bugs (then all of `indices` count as failed)."""

    indices: Sequence[int]
    run: Callable[[], BatchOutcome]


class ExecutorResult(NamedTuple):
    job_id: int
    failed: frozenset[int]
    num_bytes: int
    seconds: float
    lost: frozenset[int] = frozenset()
    full: frozenset[int] = frozenset()
    held: frozenset[int] = frozenset()
    hints: Mapping[int, float] | None = None


class _Progress:
    __slots__ = (
        "failed",
        "full",
        "held",
        "hints",
        "lost",
        "num_bytes",
        "remaining",
        "start",
    )

    def __init__(self, remaining: int, start: float) -> None:
        self.remaining = remaining
        self.start = start
        self.failed: set[int] = set()
        self.lost: set[int] = set()
        self.full: set[int] = set()
        self.held: set[int] = set()
        self.hints: dict[int, float] | None = None
        self.num_bytes = 0


def split_indices(n: int, parts: int) -> list[range]:
    """`range(n)` cut into at most `parts` contiguous, nearly equal ranges."""
    parts = max(1, min(parts, n))
    step, extra = divmod(n, parts)
    out, start = [], 0
    for i in range(parts):
        end = start + step + (1 if i < extra else 0)
        if end > start:
            out.append(range(start, end))
        start = end
    return out


class JobExecutor:
    """Runs tasks on `num_threads` threads named after the tier."""

    def __init__(self, name: str, num_threads: int) -> None:
        self.name = name
        self.num_threads = num_threads
        self._pool = ThreadPoolExecutor(
            num_threads, thread_name_prefix=f"kvoffload-{name}"
        )
        self._lock = threading.Lock()
        self._finished: list[ExecutorResult] = []
        self._futures: set[Future[None]] = set()
        self._closed = False

    def submit(self, job_id: int, tasks: Sequence[Task]) -> None:
        """Start a job; its `ExecutorResult` is queued when every task has ended."""
        start = time.perf_counter()
        if not tasks or self._closed:
            failed = frozenset(i for task in tasks for i in task.indices)
            with self._lock:
                self._finished.append(ExecutorResult(job_id, failed, 0, 0.0))
            return
        progress = _Progress(len(tasks), start)
        for task in tasks:
            self._track(self._pool.submit(self._run_task, job_id, task, progress))

    def submit_call(self, what: str, fn: Callable[[], None]) -> None:
        """Run `fn` on the pool (it queues its own outcome); `drain` waits for it."""
        if self._closed:
            return
        self._track(self._pool.submit(self._run_call, what, fn))

    def take_finished(self) -> list[ExecutorResult]:
        with self._lock:
            out, self._finished = self._finished, []
        return out

    def busy(self) -> bool:
        """Whether any job or call is still running."""
        with self._lock:
            return bool(self._futures)

    def drain(self) -> None:
        """Block until every submitted job and call has ended."""
        while True:
            with self._lock:
                pending = list(self._futures)
            if not pending:
                return
            wait(pending)

    def shutdown(self) -> None:
        self._closed = True
        self.drain()
        self._pool.shutdown(wait=True)

    # -- on the pool's threads ---------------------------------------------------

    def _track(self, future: Future[None]) -> None:
        with self._lock:
            self._futures.add(future)
        future.add_done_callback(self._untrack)

    def _untrack(self, future: Future[None]) -> None:
        with self._lock:
            self._futures.discard(future)

    def _run_task(self, job_id: int, task: Task, progress: _Progress) -> None:
        try:
            outcome = task.run()
        except Exception:  # thread root: a bug must not kill the pool or hang the job
            logger.exception(
                "%s: job %s failed unexpectedly on %d chunks",
                self.name,
                job_id,
                len(task.indices),
            )
            outcome = BatchOutcome(task.indices, 0)
        with self._lock:
            progress.failed.update(outcome.failed)
            progress.lost.update(outcome.lost)
            progress.full.update(outcome.full)
            progress.held.update(outcome.held)
            progress.num_bytes += outcome.num_bytes
            if outcome.hints:
                if progress.hints is None:
                    progress.hints = {}
                progress.hints.update(outcome.hints)
            progress.remaining -= 1
            if progress.remaining == 0:
                self._finished.append(
                    ExecutorResult(
                        job_id,
                        frozenset(progress.failed),
                        progress.num_bytes,
                        time.perf_counter() - progress.start,
                        frozenset(progress.lost),
                        frozenset(progress.full),
                        frozenset(progress.held),
                        progress.hints,
                    )
                )

    def _run_call(self, what: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:  # thread root
            logger.exception("%s: %s failed unexpectedly", self.name, what)

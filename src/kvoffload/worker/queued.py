"""A transfer worker that runs jobs on its own thread, loads before stores.

Subclasses say how one job is copied (`_execute`); this class owns the queue, the
thread, the bookkeeping of jobs in flight, `get_finished`, `wait` and `shutdown`.
"""

from __future__ import annotations

import logging
import threading
from abc import abstractmethod
from collections import deque
from collections.abc import Collection
from typing import Protocol

from kvoffload.worker.base import (
    JobResult,
    TransferDirection,
    TransferJob,
    TransferWorker,
)

logger = logging.getLogger(__name__)


class PendingJob(Protocol):
    """A job whose copies were issued but may still be running (on a device)."""

    def done(self) -> bool: ...

    def wait(self) -> None: ...

    def result(self) -> JobResult: ...


class QueuedTransferWorker(TransferWorker):
    """Runs jobs one at a time on a worker thread, queued loads first.

    Loads overtake queued stores because a load is on a request's critical path.
    That is safe under the managers' contracts: a chunk is loaded only once its
    store has completed, and a slot or engine block is not reused while a job
    that reads it is in flight. `submit` raises `ValueError` only for a job id
    already in flight (a caller bug); copy failures are results.
    """

    def __init__(self, thread_name: str) -> None:
        self._cond = threading.Condition()
        self._loads: deque[tuple[TransferJob, object]] = deque()
        self._stores: deque[tuple[TransferJob, object]] = deque()
        # None while queued or running on the thread; a PendingJob once issued.
        self._in_flight: dict[int, PendingJob | None] = {}
        self._finished: list[JobResult] = []
        self._closed = False
        self._thread = threading.Thread(
            target=self._loop, name=thread_name, daemon=True
        )
        self._thread.start()

    @abstractmethod
    def _execute(self, job: TransferJob, ticket: object) -> JobResult | PendingJob:
        """Copy `job` on the worker thread; failures are results, not raises."""

    def _on_submit(self, job: TransferJob) -> object:
        """Called on the submitting thread; the ticket is handed to `_execute`."""
        return None

    def _release(self) -> None:
        """Release resources after the thread and all pending jobs have ended."""

    def submit(self, job: TransferJob) -> None:
        if job.fail:
            with self._cond:
                self._finished.append(JobResult(job.job_id, success=False))
            return
        ticket = self._on_submit(job)
        with self._cond:
            if job.job_id in self._in_flight:
                raise ValueError(f"job {job.job_id} is already in flight")
            if self._closed:
                logger.warning(
                    "job %s submitted after shutdown; failing it", job.job_id
                )
                self._finished.append(JobResult(job.job_id, success=False))
                return
            self._in_flight[job.job_id] = None
            queue = (
                self._loads if job.direction is TransferDirection.LOAD else self._stores
            )
            queue.append((job, ticket))
            self._cond.notify_all()

    def get_finished(self) -> list[JobResult]:
        with self._cond:
            self._collect_done()
            finished, self._finished = self._finished, []
        return finished

    def wait(self, job_ids: Collection[int]) -> None:
        """Block until the jobs have finished; ids not in flight return at once."""
        for job_id in job_ids:
            with self._cond:
                while job_id in self._in_flight and self._in_flight[job_id] is None:
                    self._cond.wait()
                pending = self._in_flight.get(job_id)
            if pending is not None:
                pending.wait()

    def shutdown(self) -> None:
        """Finish the queued jobs, wait for issued ones, then release resources."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        with self._cond:
            pending = [p for p in self._in_flight.values() if p is not None]
        for job in pending:
            job.wait()
        self._release()

    def _collect_done(self) -> None:
        done = [
            job_id
            for job_id, pending in self._in_flight.items()
            if pending is not None and pending.done()
        ]
        for job_id in done:
            pending = self._in_flight.pop(job_id)
            assert pending is not None
            self._finished.append(pending.result())

    def _next(self) -> tuple[TransferJob, object] | None:
        with self._cond:
            self._cond.wait_for(lambda: self._loads or self._stores or self._closed)
            if self._loads:
                return self._loads.popleft()
            if self._stores:
                return self._stores.popleft()
            return None

    def _loop(self) -> None:
        while (item := self._next()) is not None:
            job, ticket = item
            outcome: JobResult | PendingJob
            try:
                outcome = self._execute(job, ticket)
            except Exception:
                logger.exception("transfer job %s failed unexpectedly", job.job_id)
                outcome = JobResult(job.job_id, success=False)
            with self._cond:
                if isinstance(outcome, JobResult):
                    del self._in_flight[job.job_id]
                    self._finished.append(outcome)
                else:
                    self._in_flight[job.job_id] = outcome
                self._cond.notify_all()

"""A simulated data plane: jobs take modeled time on a host link and move no bytes.

Loads (host to device) and stores (device to host) each run in order on their own
direction of the link. A `fail` predicate injects failed copies for fault tests.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from kvoffload.connector.base import Clock
from kvoffload.engine_model.timing import TimeModel
from kvoffload.worker.base import (
    JobResult,
    TransferDirection,
    TransferJob,
    TransferWorker,
)


class SimulatedWorker(TransferWorker):
    """Completes each job after the time the `TimeModel` gives for its bytes."""

    def __init__(
        self,
        time_model: TimeModel,
        tokens_per_block: Collection[int] | list[int],
        clock: Clock,
        fail: Callable[[TransferJob], bool] | None = None,
    ) -> None:
        self._time = time_model
        self._tokens_per_block = list(tokens_per_block)
        self._clock = clock
        self._fail = fail
        self._link_free = {TransferDirection.LOAD: 0.0, TransferDirection.STORE: 0.0}
        self._running: dict[int, tuple[float, JobResult]] = {}

    def submit(self, job: TransferJob, start: float | None = None) -> None:
        """Queue `job` on its link, starting no earlier than `start` (default: now)."""
        now = self._clock() if start is None else start
        tokens = sum(
            len(g.engine_blocks) * self._tokens_per_block[g.group] for g in job.groups
        )
        begin = max(now, self._link_free[job.direction])
        seconds = self._time.transfer_seconds(tokens)
        end = begin + seconds
        self._link_free[job.direction] = end
        ok = not job.fail and (self._fail is None or not self._fail(job))
        num_bytes = tokens * self._time.kv_bytes_per_token if ok else 0
        self._running[job.job_id] = (end, JobResult(job.job_id, ok, num_bytes, seconds))

    def finish_time(self, job_ids: Collection[int]) -> float:
        """When the last of `job_ids` completes (now, if none is running)."""
        ends = [self._running[j][0] for j in job_ids if j in self._running]
        return max(ends, default=self._clock())

    def next_completion(self) -> float | None:
        return min((end for end, _ in self._running.values()), default=None)

    def get_finished(self) -> list[JobResult]:
        now = self._clock()
        done = [job_id for job_id, (end, _) in self._running.items() if end <= now]
        done.sort(key=lambda j: self._running[j][0])
        return [self._running.pop(j)[1] for j in done]

    def wait(self, job_ids: Collection[int]) -> None:
        """The engine model advances its clock to `finish_time` instead."""

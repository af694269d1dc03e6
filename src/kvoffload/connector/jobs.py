"""Bookkeeping of in-flight transfer jobs: ids, owners, per-rank completion.

With several worker ranks (tensor parallelism) each rank reports every job; a job
completes when all ranks have reported, and succeeds only if every rank succeeded.
Jobs planned before a `reset_cache` keep their records (their requests still need
to hear about them, and the host slots they touch stay held until they end) but
are marked stale, so their completions do not touch the new tier state.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from kvoffload.keys import OffloadKey
from kvoffload.worker.base import GroupTransfer, JobResult, TransferDirection


@dataclass
class JobRecord:
    """One planned job and what its completion must update."""

    job_id: int
    request_id: str
    direction: TransferDirection
    keys: tuple[OffloadKey, ...]
    epoch: int
    pending_ranks: int
    success: bool = True
    num_bytes: int = 0
    seconds: float = 0.0
    ranks_seen: set[int] = field(default_factory=set)
    transfers: tuple[GroupTransfer, ...] = ()
    """What the job copies. A store's engine blocks stay fenced until it
    completes; after a reset, the host slots of any job stay held."""
    held_slots: tuple[int, ...] = ()
    """Set by a reset: the host slots held until the job completes (worked out
    then, not per job: resets are rare)."""
    void_keys: frozenset[OffloadKey] = frozenset()
    """Keys of a store that its request no longer has (its tokens were rewritten
    while the job was in flight): they complete as failed, never readable."""


class JobTracker:
    """Issues job ids and folds per-rank results into completions."""

    def __init__(self, world_size: int) -> None:
        self._world_size = world_size
        self._next_id = 1
        self._epoch = 0
        self._jobs: dict[int, JobRecord] = {}

    @property
    def epoch(self) -> int:
        return self._epoch

    def __iter__(self) -> Iterator[JobRecord]:
        return iter(list(self._jobs.values()))

    def __len__(self) -> int:
        return len(self._jobs)

    def new(
        self,
        request_id: str,
        direction: TransferDirection,
        keys: tuple[OffloadKey, ...],
    ) -> JobRecord:
        record = JobRecord(
            job_id=self._next_id,
            request_id=request_id,
            direction=direction,
            keys=keys,
            epoch=self._epoch,
            pending_ranks=self._world_size,
        )
        self._next_id += 1
        self._jobs[record.job_id] = record
        return record

    def get(self, job_id: int) -> JobRecord | None:
        """The record of a job in flight."""
        return self._jobs.get(job_id)

    def report(self, result: JobResult, rank: int = 0) -> JobRecord | None:
        """Fold in one rank's result; the record once every rank has reported.

        Unknown jobs and repeated reports from the same rank are ignored.
        """
        record = self._jobs.get(result.job_id)
        if record is None or rank in record.ranks_seen:
            return None
        record.ranks_seen.add(rank)
        record.success = record.success and result.success
        record.num_bytes += result.num_bytes
        record.seconds = max(record.seconds, result.seconds)
        record.pending_ranks -= 1
        if record.pending_ranks > 0:
            return None
        del self._jobs[result.job_id]
        return record

    def is_current(self, record: JobRecord) -> bool:
        return record.epoch == self._epoch

    def start_new_epoch(self) -> list[JobRecord]:
        """Mark every in-flight job stale; returns those current until now (the
        others were made stale by an earlier reset)."""
        ended = [r for r in self._jobs.values() if r.epoch == self._epoch]
        self._epoch += 1
        return ended

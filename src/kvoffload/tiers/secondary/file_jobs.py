"""The file tier's store and load jobs on the scheduler thread: what each job
hands to the I/O threads (`FileBatches`) and what is refused before any I/O,
the index's reservations, pins and commits around them, and the results, stats
and events when they finish.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from kvoffload.keys import OffloadKey
from kvoffload.tiers.base import TierStats
from kvoffload.tiers.secondary.base import TierJob, TierJobResult
from kvoffload.tiers.secondary.executor import (
    ExecutorResult,
    JobExecutor,
    Task,
    split_indices,
)
from kvoffload.tiers.secondary.file_batches import FileBatches
from kvoffload.tiers.secondary.file_index import FileIndex
from kvoffload.tiers.secondary.file_renewals import HeaderRenewals
from kvoffload.tiers.secondary.file_space import TierSpace


@dataclass(frozen=True)
class _JobRecord:
    job: TierJob
    is_store: bool
    started: tuple[int, ...]
    """Indices of the job's keys handed to the I/O threads."""
    refused: tuple[OffloadKey, ...]
    """Keys failed before any I/O: no room or an evicted file still being
    deleted (store), not readable (load)."""
    victims: tuple[OffloadKey, ...] = ()


class FileJobs:
    """The jobs of one file tier, from submission to result. `record_event`
    queues the tier's stored and removed events; `capacity` is the tier's
    capacity in force, given to the index as jobs finish."""

    def __init__(
        self,
        index: FileIndex,
        io: FileBatches,
        executor: JobExecutor,
        stats: TierStats,
        renewals: HeaderRenewals,
        space: TierSpace,
        file_size: Callable[[OffloadKey], int],
        record_event: Callable[[Sequence[OffloadKey], bool], None],
        capacity: Callable[[], int],
    ) -> None:
        self._index = index
        self._io = io
        self._executor = executor
        self._stats = stats
        self._renewals = renewals
        self._space = space
        self._file_size = file_size
        self._record_event = record_event
        self._capacity = capacity
        self._jobs: dict[int, _JobRecord] = {}

    def pending(self) -> bool:
        """Whether a job is submitted and its result not taken yet."""
        return bool(self._jobs)

    def submit_store(self, job: TierJob) -> None:
        started: list[int] = []
        refused: list[OffloadKey] = []
        victims: list[OffloadKey] = []
        # Evicted files are reused for new chunks of the same size (see ChunkFiles).
        spare: dict[int, list[OffloadKey]] = {}
        recycle: dict[int, OffloadKey] = {}
        for i, key in enumerate(job.keys):
            if self._index.is_deleting(key):
                # The removal of its evicted file may land after a new write:
                # not in the tier, so failed and counted, not skipped as held.
                refused.append(key)
                continue
            if self._index.is_known(key):
                self._renew(key, job.hint(i))  # held already
                continue
            size = self._file_size(key)
            reservation = self._index.reserve(key, size)
            for victim in reservation.victims:
                spare.setdefault(self._file_size(victim), []).append(victim)
            victims.extend(reservation.victims)
            if not reservation.ok:
                refused.append(key)
                continue
            started.append(i)
            self._index.retain((key,), job.hint(i))
            self._renewals.wrote(key, job.hint(i))
            if spare.get(size):
                recycle[i] = spare[size].pop()
        self._stats.store_skipped += len(refused)
        self._stats.evictions += len(victims)
        self._record_event(victims, True)
        self._jobs[job.job_id] = _JobRecord(
            job, True, tuple(started), tuple(refused), tuple(victims)
        )
        unused = tuple(v for group in spare.values() for v in group)
        if unused:
            # Their room is for this job's files: the directory's ledger
            # counts them until they are gone, so they go first.
            writes = tuple(started)
            run = partial(self._io.delete_then_write, job, writes, recycle, unused)
            tasks = [Task(writes, run)]
        else:
            tasks = [
                Task(batch, partial(self._io.write, job, batch, recycle))
                for batch in self._batches(started)
            ]
        self._executor.submit(job.job_id, tasks)

    def _renew(self, key: OffloadKey, hint: float | None) -> None:
        """A cascade of a chunk held already renews a positive hint, as a
        touch does (a 0 is for chunks a request stores, not ones it finds)."""
        if hint is not None and hint > 0:
            self._index.retain((key,), hint)
            self._renewals.request((key,), hint)

    def submit_load(self, job: TierJob) -> None:
        started: list[int] = []
        refused: list[OffloadKey] = []
        for i, key in enumerate(job.keys):
            if self._index.is_readable(key):
                self._index.pin(key)
                started.append(i)
            else:
                refused.append(key)
        self._index.hints.note_hit([job.keys[i] for i in started])
        self._jobs[job.job_id] = _JobRecord(job, False, tuple(started), tuple(refused))
        tasks = [
            Task(batch, partial(self._io.read, job, batch))
            for batch in self._batches(started)
        ]
        self._executor.submit(job.job_id, tasks)

    def _batches(self, indices: list[int]) -> list[tuple[int, ...]]:
        return [
            tuple(indices[r.start : r.stop])
            for r in split_indices(len(indices), self._executor.num_threads)
        ]

    def take_finished(self) -> list[TierJobResult]:
        """The results of the jobs whose I/O is done, since the last call."""
        out = []
        for result in self._executor.take_finished():
            record = self._jobs.pop(result.job_id)
            if record.is_store:
                out.append(self._finish_store(record, result))
            else:
                out.append(self._finish_load(record, result))
        return out

    def _finish_store(
        self, record: _JobRecord, result: ExecutorResult
    ) -> TierJobResult:
        keys = record.job.keys
        stored = [keys[i] for i in record.started if i not in result.failed]
        failed = [keys[i] for i in record.started if i in result.failed]
        for key in stored:
            self._index.commit(key, True)
        for key in failed:
            self._index.commit(key, False)
        self._index.deleted(record.victims)
        self._space.job_done(record.job.job_id, self._index.used_bytes)
        self._index.capacity_bytes = self._capacity()
        stats = self._stats
        stats.chunks_stored += len(stored)
        stats.bytes_stored += result.num_bytes
        # No room on the disk: skipped, as on a full tier, not failed.
        stats.store_skipped += len(result.full)
        stats.failures += len(failed) - len(result.full)
        stats.transfer_seconds += result.seconds
        self._record_event(stored, False)
        return TierJobResult(
            record.job.job_id,
            (*record.refused, *failed),
            result.num_bytes,
            result.seconds,
        )

    def _finish_load(self, record: _JobRecord, result: ExecutorResult) -> TierJobResult:
        keys = record.job.keys
        bad: list[OffloadKey] = []
        for i in record.started:
            self._index.unpin(keys[i])
            if i in result.lost and self._index.forget(keys[i]):
                bad.append(keys[i])
        self._record_event(bad, True)
        failed = (
            *record.refused,
            *(keys[i] for i in record.started if i in result.failed),
        )
        stats = self._stats
        stats.chunks_loaded += len(record.started) - len(result.failed)
        stats.bytes_loaded += result.num_bytes
        stats.failures += len(failed)
        stats.transfer_seconds += result.seconds
        hints = None
        if result.hints:
            hints = {keys[i]: hint for i, hint in result.hints.items()}
        return TierJobResult(
            record.job.job_id, failed, result.num_bytes, result.seconds, hints
        )

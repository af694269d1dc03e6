"""Byte-less secondary tiers for the planner: the tiers' own bookkeeping, modeled time.

A modeled tier is a `SecondaryTier` the production `TieringManager` drives as it
drives the real ones: lookups, cascaded stores, promotions, backpressure. It moves
no bytes; each job takes the time its bytes need on the tier's `Link`, in the
engine model's simulated time, and its result is handed over once that time has
come. The backend (a directory's index, a Redis server and their links) is a
separate object, so that one backend can stand behind every engine of a fleet
while each engine has its own tier object, job ids and event stream, as each
engine runs its own tier in production.

`ModeledFileTier` keeps chunks in the file tier's own `FileIndex` (byte capacity,
eviction by policy, pins while read, evicted files deleted before their key is
written again); the Redis model is in `redis_model.py`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import replace

from kvoffload.keys import OffloadKey
from kvoffload.policies import create_policy
from kvoffload.replay.links import Link
from kvoffload.replay.tier_specs import TierSpec
from kvoffload.tiers.base import LookupResult, ReqContext, TierStats
from kvoffload.tiers.secondary.base import (
    Clock,
    SecondaryTier,
    TierJob,
    TierJobResult,
)
from kvoffload.tiers.secondary.file_index import FileIndex

FILE_MAX_INFLIGHT = 256
"""`FileTierConfig.max_inflight_chunks`'s default: the cascade backpressure bound."""


class TierBackend:
    """What a modeled tier's chunks live on: a capacity, a chunk size and a link
    per direction. One instance per tier, or one for a whole fleet when shared."""

    def __init__(self, spec: TierSpec, capacity_chunks: int, chunk_bytes: int) -> None:
        self.spec = spec
        self.capacity_chunks = capacity_chunks
        self.chunk_bytes = chunk_bytes
        latency = spec.defaults.latency_s
        self.reads = Link(spec.bytes_per_s, latency)
        self.writes = Link(spec.bytes_per_s, latency)


class FileBackend(TierBackend):
    """A directory: the file tier's index over `capacity_chunks` chunk files."""

    def __init__(
        self, spec: TierSpec, capacity_chunks: int, chunk_bytes: int, policy: str
    ) -> None:
        super().__init__(spec, capacity_chunks, chunk_bytes)
        self.index = FileIndex(
            capacity_chunks * chunk_bytes, create_policy(policy, capacity_chunks)
        )


class ModeledTier(SecondaryTier):
    """A secondary tier whose jobs end at modeled times on the engine's clock.

    Subclasses decide what a job does when it is submitted and when it ends
    (`_finish_at`); this class hands results over once their time has come,
    tells the engine when the next one is due (`next_completion`), and keeps
    stored and removed events only when asked to (a router listens).
    """

    def __init__(
        self,
        name: str,
        backend: TierBackend,
        clock: Clock,
        max_inflight_chunks: int,
        record_events: bool,
    ) -> None:
        defaults = backend.spec.defaults
        super().__init__(
            name,
            defaults.medium,
            defaults.locality,
            max_inflight_chunks=max_inflight_chunks,
            write_back=backend.spec.write_back,
        )
        self.backend = backend
        self._clock = clock
        self._records_events = record_events
        self._due: list[tuple[float, int, Callable[[], TierJobResult | None]]] = []
        self._seq = 0
        self._stats = TierStats(capacity=backend.capacity_chunks)

    def _record_event(self, keys: Sequence[OffloadKey], removed: bool) -> None:
        if self._records_events:
            super()._record_event(keys, removed)

    def _finish_at(
        self, end: float, finish: Callable[[], TierJobResult | None]
    ) -> None:
        """Call `finish` once the clock reaches `end`; hand over its result (a
        job's; `None` for an answer that is no job, as a Redis check's)."""
        self._seq += 1
        heapq.heappush(self._due, (end, self._seq, finish))

    def next_completion(self) -> float | None:
        """When the next job (or check) ends; `None` if none is running."""
        return self._due[0][0] if self._due else None

    def get_finished_jobs(self) -> list[TierJobResult]:
        now = self._clock()
        out: list[TierJobResult] = []
        while self._due and self._due[0][0] <= now:
            result = heapq.heappop(self._due)[2]()
            if result is not None:
                out.append(result)
        return out

    def has_pending_work(self) -> bool:
        return bool(self._due)

    def drain(self) -> None:
        """Ends every job now (only a reset drains, and a replay never resets)."""
        self._due = [(self._clock(), seq, f) for _, seq, f in self._due]
        heapq.heapify(self._due)

    def get_stats(self) -> TierStats:
        return replace(self._stats, occupancy=self._occupancy())

    def _occupancy(self) -> int:
        return 0

    def _bytes(self, n: int) -> int:
        return n * self.backend.chunk_bytes


class ModeledFileTier(ModeledTier):
    """The file tier's scheduler-side rules (`FileTier`) over a `FileBackend`."""

    def __init__(
        self,
        name: str,
        backend: FileBackend,
        clock: Clock,
        record_events: bool = False,
    ) -> None:
        super().__init__(name, backend, clock, FILE_MAX_INFLIGHT, record_events)
        self._index = backend.index

    def holds(self, key: OffloadKey) -> bool:
        return self._index.holds(key)

    def lookup(self, key: OffloadKey, ctx: ReqContext) -> LookupResult:
        self._stats.lookups += 1
        if self._index.is_readable(key):
            self._stats.hits += 1
            return LookupResult.HIT
        return LookupResult.MISS

    def submit_store(self, job: TierJob) -> None:
        index = self._index
        started: list[OffloadKey] = []
        refused: list[OffloadKey] = []
        victims: list[OffloadKey] = []
        for key in job.keys:
            if index.is_deleting(key):
                refused.append(key)  # its evicted file may still be removed
                continue
            if index.is_known(key):
                continue  # held, or being written by someone else
            reservation = index.reserve(key, self.backend.chunk_bytes)
            victims += reservation.victims
            if reservation.ok:
                started.append(key)
            else:
                refused.append(key)
        self._stats.store_skipped += len(refused)
        self._stats.evictions += len(victims)
        self._record_event(victims, True)
        num_bytes = self._bytes(len(started))
        end = self.backend.writes.reserve(self._clock(), num_bytes)

        def finish() -> TierJobResult:
            for key in started:
                index.commit(key, True)
            index.deleted(victims)
            self._stats.chunks_stored += len(started)
            self._stats.bytes_stored += num_bytes
            self._record_event(started, False)
            return TierJobResult(job.job_id, tuple(refused), num_bytes)

        self._finish_at(end, finish)

    def submit_load(self, job: TierJob) -> None:
        index = self._index
        started = [key for key in job.keys if index.is_readable(key)]
        refused = tuple(key for key in job.keys if not index.is_readable(key))
        for key in started:
            index.pin(key)
        num_bytes = self._bytes(len(started))
        end = self.backend.reads.reserve(self._clock(), num_bytes)

        def finish() -> TierJobResult:
            for key in started:
                index.unpin(key)
            self._stats.chunks_loaded += len(started)
            self._stats.bytes_loaded += num_bytes
            self._stats.failures += len(refused)
            return TierJobResult(job.job_id, refused, num_bytes)

        self._finish_at(end, finish)

    def touch(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        self._index.touch(keys)

    def reset_cache(self) -> None:
        self._record_event(self._index.clear(), True)

    def _occupancy(self) -> int:
        return self._index.num_readable

"""The vocabulary of secondary tiers: the tier interface, its jobs and results.

A secondary tier (local disk, a shared store) holds chunks behind the primary
(host-memory) tier and exchanges bytes only with the primary tier's slots, through
a `ChunkBuffer`. The tiering manager drives it from the scheduler thread.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from kvoffload.keys import OffloadKey
from kvoffload.tiers.base import (
    LookupResult,
    OffloadingEvent,
    OffloadPolicy,
    ReqContext,
    RequestOffloadingContext,
    TierStats,
)

Medium = Literal["cpu", "storage"]
Locality = Literal["local", "remote"]


class Clock(Protocol):
    """Monotonic seconds; injected so that tests control backoff and expiry."""

    def __call__(self) -> float: ...


@dataclass(frozen=True)
class TierJob:
    """One asynchronous transfer between primary slots and a secondary tier.

    `keys[i]` lives in primary slot `slots[i]`. For a store the slots are pinned
    readable chunks; for a load they are allocated slots being written. Either
    way the slots stay reserved for the job until its result is taken.
    `hints[i]` (stores) is the retention hint `keys[i]` is under in the primary
    tier, as a request gives one (seconds left, 0, or `None`); `None` for none
    at all.
    """

    job_id: int
    keys: tuple[OffloadKey, ...]
    slots: tuple[int, ...]
    ctx: ReqContext
    hints: tuple[float | None, ...] | None = None

    def __post_init__(self) -> None:
        if len(self.keys) != len(self.slots):
            raise ValueError(
                f"job {self.job_id}: {len(self.keys)} keys but {len(self.slots)} slots"
            )
        if self.hints is not None and len(self.hints) != len(self.keys):
            raise ValueError(
                f"job {self.job_id}: {len(self.keys)} keys but {len(self.hints)} hints"
            )

    def hint(self, index: int) -> float | None:
        """The retention hint of `keys[index]` (see the class docstring)."""
        return None if self.hints is None else self.hints[index]


@dataclass(frozen=True)
class TierJobResult:
    """How a job ended, chunk by chunk.

    `failed_keys` did not move. For a load they must not be made readable; for a
    store they are not in the tier (failed, dropped, or skipped for lack of room
    or because the tier is still removing the key's evicted copy). `hints`
    (loads) are the retention hints loaded chunks were under in the tier
    (seconds left, or 0), for the primary tier to keep.
    """

    job_id: int
    failed_keys: tuple[OffloadKey, ...] = ()
    num_bytes: int = 0
    seconds: float = 0.0
    hints: Mapping[OffloadKey, float] | None = None

    @property
    def success(self) -> bool:
        return not self.failed_keys


class SecondaryTier(ABC):
    """A tier behind the primary tier: it stores chunks read from primary slots
    and loads chunks into primary slots, asynchronously.

    Contract:
    - Every method is called from the scheduler thread and returns quickly: I/O
      runs on the tier's own threads. A tier never raises for an I/O failure; it
      reports failed keys in its job results and counts them.
    - `lookup` answers `HIT` (readable now), `MISS` or `RETRY` (an asynchronous
      existence check is in flight; ask again next step). Never `HIT_PENDING`.
      A `HIT` is a promise that may still fail on load (a corrupt chunk, a store
      that evicted it): the load then reports the key failed.
    - `submit_store(job)` reads each chunk's bytes from its slot; the caller
      keeps those slots pinned until the job's result is taken. Chunks keep
      their retention hints (`job.hints`) in the tier: its evictions honour
      them, and a load reports them (`TierJobResult.hints`). Keys the tier
      already holds are skipped (not failed). Eviction to make room follows the
      tier's policy; if nothing can be evicted, keys are skipped and counted
      (`store_skipped`), as are keys whose evicted copy the tier is still
      removing; such keys are failed keys, never reported stored.
    - `submit_load(job)` writes each chunk into its slot; a key reported as
      loaded has passed every integrity check. Bytes in the slot of a failed
      key are garbage and must never be made readable.
    - Each submitted job produces exactly one result, from `get_finished_jobs`,
      in any order; `drain` blocks until every submitted job has a result
      queued; after `shutdown` no thread touches the buffer.
    - A write-back tier (`write_back`) is not written when host memory stores
      a chunk, and does not follow host memory's touches: the manager writes
      it the chunks host memory is about to evict (`holds` tells which it
      has), so it holds what host memory does not.
    - `on_new_request` is called once per request before any lookup, and
      returns the tier's offload policy for it; `on_request_finished` once,
      after the last job submitted for that request.
    """

    def __init__(
        self,
        name: str,
        medium: Medium,
        locality: Locality,
        offload_policy: OffloadPolicy = OffloadPolicy.CHUNK_LEVEL,
        max_inflight_chunks: int = 256,
        write_back: bool = False,
    ) -> None:
        self.name = name
        self.medium: Medium = medium
        self.locality: Locality = locality
        self.offload_policy = offload_policy
        self.max_inflight_chunks = max_inflight_chunks
        """Cascaded chunks the manager may have in flight to this tier at once;
        beyond that it sheds cascades (backpressure)."""
        self.write_back = write_back
        """Written with the chunks host memory is about to evict, not those it
        stores (`tiering/demotion.py`); such a tier implements `holds`."""
        self._events: list[OffloadingEvent] = []
        """Stored and removed events for `take_events`; tiers append to it."""

    def holds(self, key: OffloadKey) -> bool:
        """Whether the tier has `key` or is writing it: no I/O, nothing counted
        (a write-back tier must answer it)."""
        del key
        return False

    @abstractmethod
    def lookup(self, key: OffloadKey, ctx: ReqContext) -> LookupResult:
        """`HIT`, `MISS` or `RETRY` (still asking); counts lookups and hits."""

    def prefetch(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        """Hint that `keys` will be looked up soon: start asynchronous checks.

        Tiers that answer `RETRY` batch these with the pending lookup, so that a
        long prefix is resolved in one round trip rather than one per chunk.
        """
        del keys, ctx

    @abstractmethod
    def submit_store(self, job: TierJob) -> None:
        """Start copying the job's chunks from their slots into the tier."""

    @abstractmethod
    def submit_load(self, job: TierJob) -> None:
        """Start copying the job's chunks from the tier into their slots."""

    @abstractmethod
    def get_finished_jobs(self) -> list[TierJobResult]:
        """Results of the jobs finished since the last call (applies them to the
        tier's own bookkeeping first)."""

    def on_new_request(self, ctx: ReqContext) -> RequestOffloadingContext:
        """This tier's offload policy for a new request."""
        del ctx
        return RequestOffloadingContext(self.offload_policy)

    def on_request_finished(self, ctx: ReqContext) -> None:
        """No more jobs will be submitted for this request (results may follow)."""
        del ctx

    def touch(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        """Mark chunks as recently used (prefix order, head most recent)."""
        del keys, ctx

    def on_schedule_end(self) -> None:
        """Once per scheduler step: a good moment to flush batched requests."""

    def _record_event(self, keys: Sequence[OffloadKey], removed: bool) -> None:
        """Queue a stored (or, with `removed`, removed) event for `keys`, if any."""
        if keys:
            self._events.append(
                OffloadingEvent(tuple(keys), self.medium, removed, self.name)
            )

    def take_events(self) -> list[OffloadingEvent]:
        """Stored and removed events since the last call."""
        out, self._events = self._events, []
        return out

    def has_pending_work(self) -> bool:
        """Whether submitted jobs or checks are still running."""
        return False

    @abstractmethod
    def drain(self) -> None:
        """Block until every submitted job has finished (results stay queued).

        Never aborts a transfer midway: a half-copied chunk would corrupt a slot
        or the tier. Used before the primary tier's slots are reused wholesale,
        on the scheduler thread, so it waits for jobs (and checks), each bounded
        by the tier's call timeouts, never for upkeep that touches no slot (a
        reset's deletion, a rescan), which `reset_cache` voids or redoes.
        """

    @abstractmethod
    def reset_cache(self) -> None:
        """Drop every chunk this tier could serve, with removed events for them.

        That is its whole namespace (model and layout fingerprint), chunks other
        engines sharing it wrote included: after an in-place weight update the
        fingerprint may not change, and any of them would be served as stale
        KV. Nothing outside the namespace is touched. Called on the scheduler
        thread with no job in flight (after `drain` and `get_finished_jobs`).
        Lookups miss from the call on; deleting may go on on the tier's own
        threads, and stores submitted meanwhile may be dropped (counted).
        """

    def shutdown(self) -> None:
        """Finish running jobs and release threads and connections."""
        self.drain()

    @abstractmethod
    def get_stats(self) -> TierStats:
        """A snapshot of this tier's counters (no side effects)."""

"""Jobs the tiering manager sends to secondary tiers, and cascades of host
memory's chunks into them.

A cascade stores readable primary chunks into secondary tiers from their slots,
pinned until each job ends. Each tier has at most `max_inflight_chunks`
cascaded chunks in flight; beyond that, cascades are shed and counted (the
tier's `drops`). A chunk carries the retention hint host memory holds it under
when the cascade starts (`TierJob.hints`). Promotions use the same job ids, so
one table says which tier and which kind every finished job was.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvoffload.keys import OffloadKey
from kvoffload.tiers.base import ReqContext
from kvoffload.tiers.primary import CPUOffloadingManager
from kvoffload.tiers.secondary.base import SecondaryTier, TierJob

Sent = set[tuple[OffloadKey, int]]
"""(key, tier index) pairs one completion has offered to the secondary tiers."""


@dataclass(frozen=True)
class SentJob:
    """A job in flight: the tier it went to, and whether it is a promotion."""

    tier: int
    promotion: bool
    job: TierJob


class Cascades:
    """The jobs in flight to secondary tiers, their bounds and shed counts."""

    def __init__(
        self, primary: CPUOffloadingManager, tiers: Sequence[SecondaryTier]
    ) -> None:
        self._primary = primary
        self._tiers = tuple(tiers)
        self._jobs: dict[int, SentJob] = {}
        self._next_job_id = 0
        self._inflight = [0] * len(self._tiers)
        self.shed = [0] * len(self._tiers)
        """Chunks each tier was not offered for its in-flight bound (only grows)."""

    def __bool__(self) -> bool:
        """Whether any job is in flight."""
        return bool(self._jobs)

    def new_job(self, tier: int, promotion: bool, keys: Sequence[OffloadKey],
                slots: Sequence[int], ctx: ReqContext,
                hints: tuple[float | None, ...] | None = None) -> TierJob:  # fmt: skip
        """A job for `tier`, remembered until `finished` takes it."""
        job = TierJob(self._next_job_id, tuple(keys), tuple(slots), ctx, hints)
        self._next_job_id += 1
        self._jobs[job.job_id] = SentJob(tier, promotion, job)
        return job

    def finished(self, tier: int, job_id: int) -> SentJob:
        """The job `tier` reports finished; a cascade's chunks are unpinned and
        leave the tier's in-flight count."""
        record = self._jobs.pop(job_id)
        assert record.tier == tier, "a tier reported another tier's job"
        if not record.promotion:
            self._primary.unpin(record.job.keys)
            self._inflight[tier] -= len(record.job.keys)
        return record

    def room(self, tier: int) -> int:
        """Chunks `tier` may still be sent before its in-flight bound."""
        return max(0, self._tiers[tier].max_inflight_chunks - self._inflight[tier])

    def cascade(
        self,
        keys: list[OffloadKey],
        ctx: ReqContext,
        tiers: Iterable[int],
        sent: Sent | None = None,
        demoting: bool = False,
    ) -> None:
        """Store readable primary chunks into `tiers`, pinned until the job ends.
        Write-back tiers only when `demoting`, and only they then.

        `sent` holds the (key, tier) pairs the same completion already offered,
        stored or shed: those are skipped, and the pairs offered here are added.
        A chunk its writer cascades and another request parked for the same tier
        would otherwise be written, counted and announced twice, and take twice
        its share of the tier's in-flight bound.
        """
        if not keys:
            return
        allowed = ctx.params.store_tiers
        for index in tiers:
            tier = self._tiers[index]
            if tier.write_back != demoting:
                continue
            if not allowed.allows(tier.name, tier.medium, tier.locality):
                continue
            offered = keys
            if sent is not None:
                offered = [k for k in keys if (k, index) not in sent]
                sent.update((k, index) for k in offered)
            batch = offered[: self.room(index)]
            self.shed[index] += len(offered) - len(batch)
            if not batch:
                continue
            slots = self._primary.pin(batch)
            self._inflight[index] += len(batch)
            # Each chunk's hint as the primary tier holds it now (another
            # request's may have extended the writer's).
            hints = self._primary.hints_of(batch)
            tier.submit_store(self.new_job(index, False, batch, slots, ctx, hints))

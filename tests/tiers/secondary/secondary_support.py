"""Helpers for secondary-tier tests: payloads, running one job to completion."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable

from kvoffload import LookupResult, OffloadKey, ReqContext, make_offload_key
from kvoffload.tiers.secondary import SecondaryTier, TierJob, TierJobResult

CTX = ReqContext("r")
FINGERPRINT = "fp-a"
SLOT = 4096
GROUPS = (4096, 1536)  # group 1 chunks are smaller than a slot
TierFactory = Callable[..., SecondaryTier]


def key(i: int, group: int = 0) -> OffloadKey:
    return make_offload_key(hashlib.sha256(i.to_bytes(8, "big")).digest(), group)


def payload(k: OffloadKey, n: int) -> bytes:
    return hashlib.shake_128(k).digest(n)


class Jobs:
    """Submits jobs to one tier with fresh ids and waits for their results."""

    def __init__(self, tier: SecondaryTier) -> None:
        self.tier = tier
        self.next_id = 0
        self.results: dict[int, TierJobResult] = {}

    def _run(
        self, store: bool, ks: list[OffloadKey], slots: list[int], timeout_s: float
    ) -> TierJobResult:
        job = TierJob(self.next_id, tuple(ks), tuple(slots), CTX)
        self.next_id += 1
        (self.tier.submit_store if store else self.tier.submit_load)(job)
        deadline = time.monotonic() + timeout_s
        while job.job_id not in self.results:
            assert time.monotonic() < deadline, "job did not finish in time"
            for result in self.tier.get_finished_jobs():
                self.results[result.job_id] = result
            time.sleep(0.001)
        return self.results.pop(job.job_id)

    def store(
        self, ks: list[OffloadKey], slots: list[int], timeout_s: float = 10.0
    ) -> TierJobResult:
        return self._run(True, ks, slots, timeout_s)

    def load(
        self, ks: list[OffloadKey], slots: list[int], timeout_s: float = 10.0
    ) -> TierJobResult:
        return self._run(False, ks, slots, timeout_s)


def resolve(
    tier: SecondaryTier, k: OffloadKey, timeout_s: float = 10.0
) -> LookupResult:
    """A lookup's settled answer: steps while the tier says RETRY."""
    deadline = time.monotonic() + timeout_s
    result = tier.lookup(k, CTX)
    while result is LookupResult.RETRY:
        assert time.monotonic() < deadline, "lookup still RETRY"
        tier.on_schedule_end()
        time.sleep(0.001)
        result = tier.lookup(k, CTX)
    return result


def settle(tier: SecondaryTier, timeout_s: float = 10.0) -> None:
    """Step a tier with no job in flight until nothing is pending: its checks
    answered, a reset's deletion (which `drain` does not wait for) done."""
    deadline = time.monotonic() + timeout_s
    tier.drain()
    while True:
        tier.on_schedule_end()
        assert not tier.get_finished_jobs(), "settle with jobs in flight"
        if not tier.has_pending_work():
            return
        assert time.monotonic() < deadline, "tier work still pending"
        time.sleep(0.001)

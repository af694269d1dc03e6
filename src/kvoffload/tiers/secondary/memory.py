"""The in-memory reference tier: a bounded dict of chunk bytes.

It copies on the calling thread (a memory copy, no I/O) and reports results at the
next `get_finished_jobs`, so it behaves like an asynchronous tier whose jobs end
within one step. Tests use it as the simplest correct tier; simulations use it as
a tier with a capacity and a policy but no I/O cost. Retention hints order its
evictions as in the primary tier (`RetentionPolicy`), and a load hands a chunk's
hint back.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from kvoffload.keys import OffloadKey, offload_key_group
from kvoffload.policies import create_policy
from kvoffload.policies.retention import DEFAULT_MAX_HINTED_SHARE, RetentionPolicy
from kvoffload.tiers.base import (
    LookupResult,
    ReqContext,
    TierStats,
)
from kvoffload.tiers.secondary.base import (
    Clock,
    SecondaryTier,
    TierJob,
    TierJobResult,
)
from kvoffload.tiers.secondary.buffer import scatter
from kvoffload.tiers.secondary.config import MemoryTierConfig
from kvoffload.worker import ChunkBuffer


class MemoryTier(SecondaryTier):
    """Chunks as `bytes` in a dict, evicted by a registry policy."""

    def __init__(
        self,
        config: MemoryTierConfig,
        buffer: ChunkBuffer,
        clock: Clock = time.monotonic,
        max_hinted_share: float = DEFAULT_MAX_HINTED_SHARE,
    ) -> None:
        super().__init__(
            config.name,
            "cpu",
            config.locality,
            config.offload_policy,
            config.max_inflight_chunks,
            write_back=config.write == "back",
        )
        self.config = config
        self._buffer = buffer
        self._chunks: dict[OffloadKey, bytes] = {}
        self._policy = RetentionPolicy(
            create_policy(config.eviction_policy, config.capacity_chunks),
            clock,
            max_hinted_share,
        )
        self._finished: list[TierJobResult] = []
        self._stats = TierStats(capacity=config.capacity_chunks)

    def holds(self, key: OffloadKey) -> bool:
        return key in self._chunks

    def lookup(self, key: OffloadKey, ctx: ReqContext) -> LookupResult:
        self._stats.lookups += 1
        if key in self._chunks:
            self._stats.hits += 1
            return LookupResult.HIT
        return LookupResult.MISS

    def submit_store(self, job: TierJob) -> None:
        failed: list[OffloadKey] = []
        stored: list[OffloadKey] = []
        num_bytes = 0
        for i, (key, slot) in enumerate(zip(job.keys, job.slots, strict=True)):
            if key in self._chunks:
                continue
            if not self._make_room(key):
                self._stats.store_skipped += 1
                failed.append(key)
                continue
            data = b"".join(self._buffer.chunk_views(slot, offload_key_group(key)))
            self._chunks[key] = data
            self._policy.insert(key)
            hint = job.hint(i)
            if hint is not None:
                self._policy.retain((key,), hint)
            stored.append(key)
            num_bytes += len(data)
        self._stats.chunks_stored += len(stored)
        self._stats.bytes_stored += num_bytes
        self._record_event(stored, False)
        self._finished.append(TierJobResult(job.job_id, tuple(failed), num_bytes))

    def _make_room(self, key: OffloadKey) -> bool:
        if len(self._chunks) < self.config.capacity_chunks:
            return True
        victims = self._policy.evict(1, (key,), lambda k: True)
        if victims is None:
            return False
        for victim in victims:
            del self._chunks[victim]
        self._stats.evictions += len(victims)
        self._record_event(victims, True)
        return True

    def submit_load(self, job: TierJob) -> None:
        failed: list[OffloadKey] = []
        hints: dict[OffloadKey, float] = {}
        num_bytes = 0
        for key, slot in zip(job.keys, job.slots, strict=True):
            data = self._chunks.get(key)
            if data is None:
                failed.append(key)
                continue
            scatter(data, self._buffer.chunk_views(slot, offload_key_group(key)))
            num_bytes += len(data)
            hint = self._policy.hint_of(key)
            if hint is not None:
                hints[key] = hint
        self._policy.note_hit([k for k in job.keys if k in self._chunks])
        self._stats.chunks_loaded += len(job.keys) - len(failed)
        self._stats.bytes_loaded += num_bytes
        self._stats.failures += len(failed)
        self._finished.append(
            TierJobResult(job.job_id, tuple(failed), num_bytes, hints=hints or None)
        )

    def get_finished_jobs(self) -> list[TierJobResult]:
        out, self._finished = self._finished, []
        return out

    def touch(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        """Recency, and the request's retention hint, as in the primary tier."""
        self._policy.touch(keys)
        hint = ctx.params.retention_s
        if hint is not None:
            self._policy.retain([k for k in keys if k in self._chunks], hint)

    def has_pending_work(self) -> bool:
        return bool(self._finished)

    def drain(self) -> None:
        """Nothing runs in the background."""

    def reset_cache(self) -> None:
        self._record_event(list(self._chunks), True)
        self._chunks.clear()
        self._policy.clear()

    def get_stats(self) -> TierStats:
        policy = self._policy
        return replace(
            self._stats,
            occupancy=len(self._chunks),
            hinted_chunks=policy.num_hinted(),
            hint_room=policy.hint_room,
            hints_honoured=policy.counts.honoured,
            hints_expired_unused=policy.counts.expired_unused,
            hints_dropped=policy.counts.dropped,
        )

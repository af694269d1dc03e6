"""A byte-less Redis/Valkey tier for the planner, with the Redis tier's own rules.

The server (`RedisServerModel`) holds at most its capacity of chunks and evicts the
least recently used one silently, as `maxmemory` with `allkeys-lru` does: no tier
hears of it. `ModeledRedisTier` follows `RedisTier` on the scheduler side: a key
it has no fresh answer for is `RETRY`, and the keys asked about in a step are
checked in one batch that answers a round trip later; answers are trusted for
`hit_cache_s` (present) or `miss_cache_s` (absent); a stored key is believed
present; a key the server already holds is not sent again, its LRU clock renewed;
a load that finds a value gone fails and announces it removed. Values become
visible when their `SET` ends; a `GET` reads the server when its job ends.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import fields
from typing import cast

from kvoffload.keys import OffloadKey
from kvoffload.policies import create_policy
from kvoffload.replay.tier_models import ModeledTier, TierBackend
from kvoffload.replay.tier_specs import TierSpec
from kvoffload.tiers.base import LookupResult, ReqContext
from kvoffload.tiers.secondary.base import Clock, TierJob, TierJobResult
from kvoffload.tiers.secondary.redis_config import RedisTierConfig
from kvoffload.tiers.secondary.redis_presence import PresenceCache

_DEFAULTS = {f.name: f.default for f in fields(RedisTierConfig)}
"""The Redis tier's defaults, read from the class: building a config would ask
for redis-py, which the planner does not need."""
MAX_INFLIGHT_CHUNKS = int(cast(int, _DEFAULTS["max_inflight_chunks"]))
HIT_CACHE_S = float(cast(float, _DEFAULTS["hit_cache_s"]))
MISS_CACHE_S = float(cast(float, _DEFAULTS["miss_cache_s"]))


class RedisServerModel(TierBackend):
    """A server at `maxmemory` with `allkeys-lru`: stores never fail for room."""

    def __init__(self, spec: TierSpec, capacity_chunks: int, chunk_bytes: int) -> None:
        super().__init__(spec, capacity_chunks, chunk_bytes)
        self._lru = create_policy("lru", capacity_chunks)
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._lru)

    def holds(self, key: OffloadKey) -> bool:
        """Whether the value is there (`PTTL`: the LRU clock is not touched)."""
        return key in self._lru

    def renew(self, key: OffloadKey) -> bool:
        """A read or a `SET` of a value the server holds: renews its LRU clock."""
        if key not in self._lru:
            return False
        self._lru.touch((key,))
        return True

    def put(self, key: OffloadKey) -> None:
        if self.renew(key):
            return
        if len(self._lru) >= self.capacity_chunks:
            victims = self._lru.evict(1, (key,), lambda k: True)
            assert victims, "an LRU with nothing pinned always yields a victim"
            self.evictions += len(victims)
        self._lru.insert(key)

    def clear(self) -> None:
        self._lru.clear()


class ModeledRedisTier(ModeledTier):
    """`RedisTier`'s scheduler-side rules over a `RedisServerModel`."""

    def __init__(
        self,
        name: str,
        server: RedisServerModel,
        clock: Clock,
        record_events: bool = False,
    ) -> None:
        super().__init__(name, server, clock, MAX_INFLIGHT_CHUNKS, record_events)
        self._server = server
        self._presence = PresenceCache(HIT_CACHE_S, MISS_CACHE_S)

    # -- lookups -----------------------------------------------------------------

    def lookup(self, key: OffloadKey, ctx: ReqContext) -> LookupResult:
        present = self._presence.answer(key, self._clock())
        if present is None:
            self._presence.ask(key)
            return LookupResult.RETRY  # counted once answered
        self._stats.lookups += 1
        if present:
            self._stats.hits += 1
            return LookupResult.HIT
        return LookupResult.MISS

    def prefetch(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        self._presence.ask_stale(keys, self._clock())

    def on_schedule_end(self) -> None:
        """Send the step's checks as one batch: answered a round trip later."""
        if not self._presence.queued:
            return
        keys = self._presence.take_questions()
        end = self._clock() + self.backend.spec.defaults.latency_s

        def answer() -> None:
            now = self._clock()
            self._presence.answered(keys)
            for key in keys:
                self._remember(key, self._server.holds(key), now)

        self._finish_at(end, answer)

    def _remember(self, key: OffloadKey, present: bool, now: float) -> None:
        self._presence.remember(key, math.inf if present else 0.0, now)

    def has_pending_work(self) -> bool:
        return super().has_pending_work() or self._presence.queued

    # -- jobs --------------------------------------------------------------------

    def submit_store(self, job: TierJob) -> None:
        # Held values are renewed, not sent (RedisTier checks them first).
        sent = [key for key in job.keys if not self._server.renew(key)]
        num_bytes = self._bytes(len(sent))
        submitted = self._clock()
        end = self.backend.writes.reserve(submitted, num_bytes)

        def finish() -> TierJobResult:
            for key in sent:
                self._server.put(key)
            for key in job.keys:
                self._remember(key, True, submitted)
            self._stats.chunks_stored += len(sent)
            self._stats.bytes_stored += num_bytes
            self._record_event(sent, False)
            return TierJobResult(job.job_id, (), num_bytes)

        self._finish_at(end, finish)

    def submit_load(self, job: TierJob) -> None:
        num_bytes = self._bytes(len(job.keys))
        end = self.backend.reads.reserve(self._clock(), num_bytes)

        def finish() -> TierJobResult:
            now = self._clock()
            lost = [key for key in job.keys if not self._server.renew(key)]
            for key in lost:
                self._remember(key, False, now)
            loaded = len(job.keys) - len(lost)
            self._stats.chunks_loaded += loaded
            self._stats.bytes_loaded += self._bytes(loaded)
            self._stats.failures += len(lost)
            self._record_event(lost, True)
            return TierJobResult(job.job_id, tuple(lost), self._bytes(loaded))

        self._finish_at(end, finish)

    def reset_cache(self) -> None:
        self._server.clear()
        self._presence.clear()

    def _occupancy(self) -> int:
        return len(self._server)

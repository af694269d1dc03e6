"""The vocabulary of tier managers: lookup outcomes, request context, results.

`OffloadingManager` is the scheduler-side bookkeeping of a tier (or of a stack of
tiers): which chunks it holds, where, and which are pinned or being written. It
moves no bytes; the worker does, from the slots the manager hands out.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple

from kvoffload.config.request_params import RequestParams
from kvoffload.keys import OffloadKey


class LookupResult(Enum):
    """What a tier knows about one chunk."""

    MISS = "miss"
    """Absent."""
    HIT = "hit"
    """Stored and readable now."""
    HIT_PENDING = "hit_pending"
    """Present, but its write (or promotion) is still in flight."""
    RETRY = "retry"
    """Not known yet (an asynchronous tier is asking); ask again."""


class OffloadPolicy(Enum):
    """Which chunks of a request are offloaded."""

    CHUNK_LEVEL = "chunk_level"
    """Only chunks this request computed; prefix hits already offloaded are skipped."""
    REQUEST_LEVEL = "request_level"
    """Every chunk of the request, hits included (tiers that need whole contexts)."""
    # The seeds' name for CHUNK_LEVEL; an alias, so both names compare equal.
    BLOCK_LEVEL = "chunk_level"

    @classmethod
    def _missing_(cls, value: object) -> OffloadPolicy | None:
        if isinstance(value, str):
            name = value.strip().lower()
            if name == "block_level":
                return cls.CHUNK_LEVEL
            for member in cls:
                if member.value == name:
                    return member
        return None


@dataclass(frozen=True)
class RequestOffloadingContext:
    """A request's offload policy, decided once in `on_new_request`."""

    policy: OffloadPolicy = OffloadPolicy.CHUNK_LEVEL


@dataclass(frozen=True)
class ReqContext:
    """A request's id, its `kv_transfer_params` and the state parsed from them."""

    req_id: str
    kv_transfer_params: Mapping[str, Any] | None = None
    params: RequestParams = field(default_factory=RequestParams)

    @classmethod
    def create(
        cls,
        req_id: str,
        kv_transfer_params: object = None,
        tier_names: Collection[str] | None = None,
    ) -> ReqContext:
        """Parse `kv_transfer_params` once (warning on bad values, and on a
        value that is not a mapping, which is dropped); `tier_names` are the
        tiers a request may name (see `OffloadingManager.tier_names`)."""
        params = RequestParams.parse(req_id, kv_transfer_params, tier_names)
        kept = kv_transfer_params if isinstance(kv_transfer_params, Mapping) else None
        return cls(req_id, kept, params)


class PrefixLookup(NamedTuple):
    """A request's keys looked up in prefix order, stopping at the first miss.

    `ready` leading chunks are readable now; `present >= ready` leading chunks are
    readable or in flight (`HIT_PENDING`); `retry` is true when the walk stopped
    at a chunk the tier could not answer for yet.
    """

    ready: int
    present: int
    retry: bool = False

    @property
    def must_wait(self) -> bool:
        """Whether asking again later may give a longer readable prefix."""
        return self.present > self.ready or self.retry


class PrepareStoreOutput(NamedTuple):
    """What `prepare_store` decided: keys to write, their slots, keys evicted."""

    keys_to_store: tuple[OffloadKey, ...]
    slots: tuple[int, ...]
    evicted_keys: tuple[OffloadKey, ...]


@dataclass(frozen=True)
class OffloadingEvent:
    """Chunks that became readable (`removed=False`) or left a tier (`True`)."""

    keys: tuple[OffloadKey, ...]
    medium: str
    removed: bool
    tier: str = "cpu"


@dataclass
class TierStats:
    """Cumulative counters and current gauges of one tier.

    Counters only grow (Prometheus counters); `occupancy` and `capacity` are
    gauges in chunks. Byte and time counters are filled by whoever moves bytes.
    `hits` counts chunks found by lookups (a request asked again counts again);
    `hit_tokens` counts the tokens loaded for requests whose lookup found their
    chunks in this tier, once per load, summed over KV-cache groups.
    Retention hints (`kv_retention_s`): `hinted_chunks` (a gauge) are chunks
    under an unexpired hint; `hints_honoured` hinted chunks loaded (once per
    hint); `hints_expired_unused` hints that expired before a load;
    `hints_dropped` hints that stopped counting early (past the tier's bound on
    hinted chunks, or evicted when nothing else could be); `hint_room` (a
    gauge) the chunks hints may hold now: the bound, less what the hints proved
    not to be worth to the tier's policy (`policies.hint_worth`).
    """

    lookups: int = 0
    hits: int = 0
    hit_tokens: int = 0
    chunks_stored: int = 0
    bytes_stored: int = 0
    chunks_loaded: int = 0
    bytes_loaded: int = 0
    evictions: int = 0
    store_skipped: int = 0
    admission_rejected: int = 0
    failures: int = 0
    drops: int = 0
    transfer_seconds: float = 0.0
    hints_honoured: int = 0
    hints_expired_unused: int = 0
    hints_dropped: int = 0
    occupancy: int = 0
    capacity: int = 0
    hinted_chunks: int = 0
    hint_room: int = 0

    def as_dict(self) -> dict[str, float]:
        return {name: float(value) for name, value in self.__dict__.items()}


class OffloadingManager(ABC):
    """Scheduler-side bookkeeping of the chunks held in one tier, or a tier stack.

    Call order for one request: `on_new_request` once, before any lookup; then any
    number of `lookup`/`lookup_prefix`, `prepare_load`/`complete_load` and
    `prepare_store`/`complete_store` pairs; `on_request_finished` exactly once,
    after the request's last prepare call and once every job of it has
    completed (as in the seed): its last `complete_load`/`complete_store` comes
    first, and no call for the request follows. Jobs that complete after a
    `reset_cache` complete no pair (the reset dropped their chunks) but still
    come before it.

    Pins and in-flight writes protect chunks from eviction: a chunk passed to
    `prepare_load` stays until the matching `complete_load`; a chunk returned by
    `prepare_store` is not readable, and not evictable, until `complete_store`.
    Expected outcomes are return values (`MISS`, `None`, `success=False`), never
    exceptions.
    """

    @abstractmethod
    def lookup(self, key: OffloadKey, ctx: ReqContext) -> LookupResult:
        """Whether `key` is readable (`HIT`), in flight, unknown yet, or absent."""

    def lookup_prefix(
        self, keys: Sequence[OffloadKey], ctx: ReqContext
    ) -> PrefixLookup:
        """Look up a request's keys in prefix order in one call.

        Counts leading `HIT`s (`ready`) and leading `HIT`/`HIT_PENDING`s
        (`present`); stops at the first `MISS` or `RETRY`. Implementations may
        also observe every key in `keys` (the reuse filter counts them all).
        """
        ready = present = 0
        readable = True
        for key in keys:
            result = self.lookup(key, ctx)
            if result is LookupResult.MISS:
                break
            if result is LookupResult.RETRY:
                return PrefixLookup(ready, present, retry=True)
            present += 1
            if result is LookupResult.HIT and readable:
                ready += 1
            else:
                readable = False
        return PrefixLookup(ready, present)

    def lookup_prefixes(
        self, prefixes: Sequence[Sequence[OffloadKey]], ctx: ReqContext
    ) -> list[PrefixLookup]:
        """Look up one request's prefixes, one per KV-cache group, as
        `lookup_prefix` does each.

        A chunk counted for one prefix stays counted: what looking up another
        starts (a promotion making room) does not evict it. Managers whose
        lookups can evict must override this; the default looks them up in turn.
        """
        return [self.lookup_prefix(keys, ctx) for keys in prefixes]

    @abstractmethod
    def prepare_load(
        self, keys: Sequence[OffloadKey], ctx: ReqContext
    ) -> tuple[int, ...] | None:
        """Pin readable chunks for reading; returns their slots, in order.

        The pins hold until `complete_load`. Atomic: `None`, pinning nothing,
        when a key is not readable (`HIT`) any more; the caller fails that load.
        """

    def keep_chains(self, engine_chunks: int) -> bool:
        """Keep whole chains (`tiers.primary.chains`) if this manager's host pool
        holds more than `engine_chunks`, the engine prefix cache's size in
        chunks; whether it now does. The connector calls it once, at start-up,
        when the engine has a prefix cache. Managers that cannot keep chains
        say `False`."""
        del engine_chunks
        return False

    def holds(self, key: OffloadKey) -> bool | None:
        """Whether `key` is present where `prepare_store` allocates (readable or
        being written: a store offering it leaves it out), without I/O, nothing
        counted or changed; `None` when the manager cannot tell (the chunk may
        be a promotion away, or it does not say). The connector skips a store
        whose chunks follow one that is not held (`False`; see
        `transfers.anchor_store`)."""
        del key
        return None

    def touch(
        self,
        keys: Sequence[OffloadKey],
        ctx: ReqContext,
        *,
        stored: Set[OffloadKey] | None = None,
    ) -> None:
        """Mark chunks as recently used, in prefix order: the head ends most recent.

        Unknown keys are ignored. Chunks the request itself stored count as
        recency only; chunks it found already stored count as reuse. A touch
        after `on_request_finished` (the manager has forgotten the request)
        names the chunks it stored in `stored`.
        """
        del keys, ctx, stored

    def complete_load(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        """Unpin chunks pinned by `prepare_load`."""
        del keys, ctx

    def on_load_planned(
        self, tokens: Mapping[OffloadKey, int], ctx: ReqContext
    ) -> None:
        """After `prepare_load`: the request loads `tokens[key]` tokens of each chunk.

        For statistics only: each is counted as `hit_tokens` of the tier whose
        lookup for this request found the chunk (the managers know which tier
        that was; only the connector knows the tokens).
        """
        del tokens, ctx

    @abstractmethod
    def prepare_store(
        self,
        keys: Sequence[OffloadKey],
        ctx: ReqContext,
        *,
        may_evict: bool = True,
        keep_loaded: bool = True,
    ) -> PrepareStoreOutput | None:
        """Allocate slots for the keys not yet present, evicting if needed.

        Keys already present (readable or in flight) and keys the admission
        filter rejects are left out of `keys_to_store`. Chunks in `keys`, pinned
        chunks and chunks being written are never evicted, nor (by the primary
        tier) chunks its policy ranks at or above the request's own; without
        `keep_loaded`, the chunks the request loaded do not count as its own
        there (the engine is expected to hold them; `connector.head_bets`).
        Without `may_evict`, only free room is taken. Atomic: `None` means there
        is no room even after eviction, and nothing changed.
        """

    def complete_store(
        self, keys: Sequence[OffloadKey], ctx: ReqContext, success: bool = True
    ) -> None:
        """Make stored chunks readable; with `success=False`, free their slots.

        Keys not in flight (already completed, dropped by a reset) are ignored.
        """
        del keys, ctx, success

    @abstractmethod
    def on_new_request(self, ctx: ReqContext) -> RequestOffloadingContext:
        """First sight of a request, before any lookup: returns its offload policy."""

    def on_request_finished(self, ctx: ReqContext) -> None:
        """The request is done and its jobs have completed: no call for it
        follows (see the call order above)."""
        del ctx

    def take_events(self) -> list[OffloadingEvent]:
        """Stored and removed events since the last call (empty if disabled)."""
        return []

    def on_schedule_end(self) -> None:
        """Called once at the end of each scheduler step."""

    def has_pending_work(self) -> bool:
        """Whether jobs of the manager's own (cascades, promotions) are in flight;
        while true, the engine should keep calling `on_schedule_end`."""
        return False

    def reset_cache(self, busy_slots: Iterable[int] = ()) -> None:
        """Drop every chunk and all state; later completions of old jobs are ignored.

        `busy_slots` are host slots that transfer jobs planned before the reset
        may still write or read (the manager cannot see them end): none is handed
        out again, to any store or promotion, until `release_slots` releases it
        once for each time it was named. They count neither as occupied nor as
        free meanwhile.
        """
        del busy_slots

    def release_slots(self, slots: Iterable[int]) -> None:
        """The jobs that made `slots` busy at a reset have ended (on every worker):
        those slots may be reused. Slots not held are ignored."""
        del slots

    @abstractmethod
    def get_stats(self) -> dict[str, TierStats]:
        """A snapshot of each tier's counters, by tier name (no side effects)."""

    def tier_names(self) -> frozenset[str]:
        """The names of the tiers it holds chunks in: what `kv_load_tiers` and
        `kv_store_tiers` may name (by default, the keys of `get_stats`)."""
        return frozenset(self.get_stats())

    def shutdown(self) -> None:
        """Release resources (threads, connections)."""

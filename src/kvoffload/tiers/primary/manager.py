"""The primary tier: host-memory bookkeeping over a fixed pool of chunk slots.

`CPUOffloadingManager` owns `num_chunks` slots, an eviction policy, pins and
in-flight writes, the reuse filter and the event stream. It moves no bytes: the
worker copies into and out of the slots it hands out, so a slot that a copy
planned before a reset may still touch is held out of use until it is released.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import replace

from kvoffload.config import is_count, shown
from kvoffload.keys import OffloadKey
from kvoffload.policies import StopEviction, StopList, create_policy
from kvoffload.policies.retention import DEFAULT_MAX_HINTED_SHARE, RetentionPolicy
from kvoffload.tiers.base import (
    LookupResult,
    OffloadingEvent,
    OffloadingManager,
    PrefixLookup,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    TierStats,
)
from kvoffload.tiers.primary.chains import ChainLinks
from kvoffload.tiers.primary.reuse_filter import ReuseFilter
from kvoffload.tiers.primary.use_floor import UseFloor

_NOTHING_TO_STORE = PrepareStoreOutput((), (), ())
_NONE: frozenset[OffloadKey] = frozenset()


class CPUOffloadingManager(OffloadingManager):
    """Bookkeeping of the host-memory pool: slots, policy, pins and events.

    A chunk is *resident* from `prepare_store` on; it is *readable* once its
    `complete_store(success=True)` arrives; `complete_store(success=False)` and
    `abort_store` free its slot instead. Pinned chunks (being read), chunks
    being written and the keys of the current `prepare_store` call are never
    evicted.

    A request's stores take victims only from chunks its policy ranks below
    every chunk the request loaded or stored here: its new chunks extend that
    prefix and cannot hit without it, so they are worth no more than it. Where
    the policy would give up the request's own prefix first, the store is
    refused instead of evicting it (which would strand the new chunks) or
    chunks the policy values more (docs/policies.md, "Inside a real engine").
    Where the policy keeps a clock of uses (`split`), a store also spares the
    chunks used after the request's own were last used before it arrived
    (conversations served since, likely to return before it does again),
    unless those uses are older than about a round through the tier
    (`use_floor.UseFloor`).
    A store with `keep_loaded=False` may evict what its request loaded: the
    connector says so when the engine is seen to keep such heads until the
    conversation returns (`connector.head_bets`).

    Retention hints (`kv_retention_s`) order evictions over the policy's own
    (`RetentionPolicy`): a request's hint covers the chunks it stores, and those
    it touches (its prefix) from then on; a promoted chunk keeps the hint it had
    in the tier it came from (`retain`). `clock` dates them; `retention` is
    the class that wraps the policy (a benchmark swaps in a bare one,
    `bench.hint_floor`).

    Slots named to `reset_cache` as busy are *held*: neither occupied nor free,
    never handed out, until `release_slots` releases them as many times as they
    were held.
    """

    name = "cpu"
    medium = "cpu"

    def __init__(
        self,
        num_chunks: int,
        eviction_policy: str = "lru",
        store_threshold: int = 0,
        max_tracker_size: int = 64_000,
        enable_events: bool = False,
        max_hinted_share: float = DEFAULT_MAX_HINTED_SHARE,
        clock: Callable[[], float] = time.monotonic,
        *,
        retention: type[RetentionPolicy] = RetentionPolicy,
    ) -> None:
        if not is_count(num_chunks, 1):
            raise ValueError(f"num_chunks must be an int >= 1, got {shown(num_chunks)}")
        self._num_chunks = num_chunks
        self._policy = retention(
            create_policy(eviction_policy, num_chunks), clock, max_hinted_share
        )
        self._filter = ReuseFilter(store_threshold, max_tracker_size)
        self._events: list[OffloadingEvent] | None = [] if enable_events else None
        self._slots: dict[OffloadKey, int] = {}
        self._writing: set[OffloadKey] = set()
        self._pins: dict[OffloadKey, int] = {}
        self._free: list[int] = []
        self._next_fresh = 0
        # Slots that copies planned before a reset may still touch: slot -> holds.
        self._held: Counter[int] = Counter()
        # Keys each live request stored itself (not those promoted for it):
        # recency, not reuse, on touch().
        self._stored_by_request: dict[str, set[OffloadKey]] = {}
        # Keys each live request loaded: with its stored ones, where its stores'
        # victims must rank below.
        self._loaded_by_request: dict[str, set[OffloadKey]] = {}
        self._use_floor = UseFloor(self._policy.inner, num_chunks)
        self._stats = TierStats(capacity=num_chunks)
        self._inserted = 0
        # With `keep_chains`: which resident chunks others continue.
        self._chains: ChainLinks | None = None

    # -- introspection (no side effects) -----------------------------------------

    @property
    def num_chunks(self) -> int:
        return self._num_chunks

    @property
    def policy(self) -> RetentionPolicy:
        """The eviction policy, with retention hints over the configured one."""
        return self._policy

    def keep_chains(self, engine_chunks: int) -> bool:
        """See `OffloadingManager.keep_chains`: on when this pool holds more
        than `engine_chunks` and the policy gives up a chain's tail first (a
        pool no larger than the engine's cache needs the room its refusals
        would keep; docs/policies.md, "Whole chains")."""
        on = (
            self._num_chunks > engine_chunks
            and self._policy.inner.chains_drain_from_tail
        )
        if not on:
            self._chains = None
        elif self._chains is None:
            self._chains = ChainLinks()
        return on

    def get_slot(self, key: OffloadKey) -> int | None:
        """The slot of a readable chunk, or `None`."""
        if key in self._writing:
            return None
        return self._slots.get(key)

    def is_readable(self, key: OffloadKey) -> bool:
        return key in self._slots and key not in self._writing

    def holds(self, key: OffloadKey) -> bool:
        return key in self._slots

    def num_free_slots(self) -> int:
        return len(self._free) + self._num_chunks - self._next_fresh

    # -- lookups -----------------------------------------------------------------

    def lookup(self, key: OffloadKey, ctx: ReqContext) -> LookupResult:
        if self._filter.enabled:
            self._filter.observe((key,), ctx.req_id)
        self._stats.lookups += 1
        if key not in self._slots:
            return LookupResult.MISS
        if key in self._writing:
            return LookupResult.HIT_PENDING
        self._stats.hits += 1
        return LookupResult.HIT

    def lookup_prefix(
        self, keys: Sequence[OffloadKey], ctx: ReqContext
    ) -> PrefixLookup:
        if self._filter.enabled:
            self._filter.observe(keys, ctx.req_id)
        slots, writing = self._slots, self._writing
        ready = present = 0
        for key in keys:
            if key not in slots:
                break
            present += 1
            if ready == present - 1 and key not in writing:
                ready += 1
        stats = self._stats
        stats.lookups += min(present + 1, len(keys))
        stats.hits += ready
        return PrefixLookup(ready, present)

    # -- loads -------------------------------------------------------------------

    def prepare_load(
        self, keys: Sequence[OffloadKey], ctx: ReqContext
    ) -> tuple[int, ...] | None:
        if not all(map(self.is_readable, keys)):
            return None
        slots = self.pin(keys)
        self._stats.chunks_loaded += len(slots)
        self._policy.note_hit(keys)
        # Not an access by itself: when a use counts is the connector's choice
        # (it depends on whether the engine keeps a prefix cache). The request's
        # own stores never evict these chunks (see `prepare_store`).
        self._loaded_by_request.setdefault(ctx.req_id, set()).update(keys)
        return slots

    def complete_load(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        self.unpin(keys)

    def on_load_planned(
        self, tokens: Mapping[OffloadKey, int], ctx: ReqContext
    ) -> None:
        self._stats.hit_tokens += sum(tokens.values())

    def pin(self, keys: Sequence[OffloadKey]) -> tuple[int, ...]:
        """Protect readable chunks from eviction while something reads their slots
        (a load, or a cascade to a secondary tier); returns their slots."""
        slots, pins = self._slots, self._pins
        out: list[int] = []
        for key in keys:
            assert key in slots and key not in self._writing, (
                "pin of a non-readable chunk"
            )
            pins[key] = pins.get(key, 0) + 1
            out.append(slots[key])
        return tuple(out)

    def unpin(self, keys: Sequence[OffloadKey]) -> None:
        """Drop pins taken by `pin`; unknown keys (dropped by a reset) are ignored."""
        pins = self._pins
        for key in keys:
            count = pins.get(key)
            if count is None:
                continue  # dropped by reset_cache
            if count <= 1:
                del pins[key]
            else:
                pins[key] = count - 1

    def touch(
        self,
        keys: Sequence[OffloadKey],
        ctx: ReqContext,
        *,
        stored: Set[OffloadKey] | None = None,
    ) -> None:
        """Tell the policy the request used `keys`; the chunks it stored itself
        (`stored`, or what this tier remembers of the live request) change
        recency but do not count as reused. The request's retention hint
        covers them from now (a 0 on those it stored is judged apart from a 0
        on those it found)."""
        own = (
            self._stored_by_request.get(ctx.req_id, _NONE) if stored is None else stored
        )
        self._policy.touch(keys, own)
        hint = ctx.params.retention_s
        if hint is not None and not self._policy.covers(keys, hint):
            present = list(filter(self._slots.__contains__, keys))
            self._policy.retain(present, hint, own)

    def retain(self, keys: Sequence[OffloadKey], seconds: float) -> None:
        """Put resident `keys` under a retention hint of `seconds` from now, as a
        request's `kv_retention_s` would (a promoted chunk's, say)."""
        self._policy.retain(list(filter(self._slots.__contains__, keys)), seconds)

    def hints_of(self, keys: Sequence[OffloadKey]) -> tuple[float | None, ...] | None:
        """Each key's retention hint now (seconds left, 0, or `None`), or `None`
        when no chunk is under a hint: what a cascade carries to the next tier."""
        policy = self._policy
        if not policy.active:
            return None
        return tuple(map(policy.hint_of, keys))

    # -- stores ------------------------------------------------------------------

    def prepare_store(
        self,
        keys: Sequence[OffloadKey],
        ctx: ReqContext,
        *,
        may_evict: bool = True,
        keep_loaded: bool = True,
        promotion: bool = False,
        protect: Sequence[OffloadKey] = (),
    ) -> PrepareStoreOutput | None:
        """See `OffloadingManager.prepare_store`. `protect` names more keys not to
        evict (a promotion's prefix, already counted as hits by the same lookup).

        Victims come only from chunks the policy ranks below every chunk `ctx`
        loaded or stored here (see the class docstring).

        With `promotion`, the chunks come from a secondary tier, where some
        request stored them earlier: they skip the reuse filter, the policy's
        admission and the rank limit, and are not `ctx`'s own stores, so its
        loads and touches of them count as reuse (SPEC §3.2), as for any chunk it
        found stored."""
        slots = self._slots
        new = list(dict.fromkeys(k for k in keys if k not in slots))
        if not promotion:
            new = self._admitted(new)
        if not new:
            return _NOTHING_TO_STORE

        needed = max(0, len(new) - self.num_free_slots())
        victims: list[OffloadKey] | None = None
        if not needed or may_evict:
            evictable = self._evictable(
                keys, protect, None if promotion else ctx, keep_loaded
            )
            try:
                victims = self._policy.evict(needed, new, evictable)
            except StopEviction:
                victims = None
        if victims is None:
            self._stats.store_skipped += len(new)
            return None
        self._free.extend(map(slots.pop, victims))
        chains = self._chains
        if chains is not None:
            chains.unlink(victims)
            chains.link(keys, set(new))
        new_slots = self._allocate(len(new))
        slots.update(zip(new, new_slots, strict=True))
        self._policy.insert_many(new)
        self._inserted += len(new)
        self._writing.update(new)
        if not promotion:
            self._stored_by_request.setdefault(ctx.req_id, set()).update(new)
            hint = ctx.params.retention_s
            if hint is not None:
                self._policy.retain(new, hint)
        self._stats.evictions += len(victims)
        if victims and self._events is not None:
            self._events.append(
                OffloadingEvent(tuple(victims), self.medium, True, self.name)
            )
        return PrepareStoreOutput(tuple(new), tuple(new_slots), tuple(victims))

    @property
    def num_inserted(self) -> int:
        """Chunks given a slot since start-up, stores and promotions (only grows)."""
        return self._inserted

    def eviction_order(self, n: int) -> list[OffloadKey]:
        """The next `n` readable chunks the policy would give up, in its order,
        pinned ones included (a pin ends). Nothing changes: the policy is asked
        for `n` victims, each named chunk accepted, and stopped at the `n`th,
        before it removes any. Accepting, not refusing, keeps the order the one
        a store of `n` chunks takes: a policy may look further down one list when
        its chunks are refused (`split` goes on through its once segment)."""
        seen: list[OffloadKey] = []
        if n <= 0:
            return seen
        writing = self._writing

        def record(key: OffloadKey) -> bool:
            if key in writing:
                return False
            seen.append(key)
            if len(seen) >= n:
                raise StopEviction
            return True

        with contextlib.suppress(StopEviction):
            self._policy.evict(n, (), record)
        return seen

    def _evictable(
        self,
        keys: Sequence[OffloadKey],
        protect: Sequence[OffloadKey],
        ctx: ReqContext | None,
        keep_loaded: bool = True,
    ) -> Callable[[OffloadKey], bool]:
        """`_may_evict`, less the chunks a resident chunk continues while
        whole chains are kept (`keep_chains`)."""
        evictable = self._may_evict(keys, protect, ctx, keep_loaded)
        if self._chains is None:
            return evictable
        holds_back = self._chains.holds_back

        def keeping_chains(key: OffloadKey) -> bool:
            # The request's own chunks stop the scan first (`StopEviction`).
            return evictable(key) and not holds_back(key)

        return keeping_chains

    def _may_evict(
        self,
        keys: Sequence[OffloadKey],
        protect: Sequence[OffloadKey],
        ctx: ReqContext | None,
        keep_loaded: bool = True,
    ) -> Callable[[OffloadKey], bool]:
        """What a store of `keys` may evict: not them, nor `protect`, pinned or
        in-flight chunks; and, for `ctx`'s stores, nothing from the first of its
        own chunks on, in the policy's order (`StopEviction`); the chunks it
        loaded count as its own only with `keep_loaded`. Where the policy keeps
        a clock of uses, nothing used after the chunks it loaded or found here
        either (`UseFloor`)."""
        protected = set(keys)
        protected.update(protect)
        pins, writing = self._pins, self._writing
        if ctx is None:
            stored = loaded = offered = None
        else:
            stored = self._stored_by_request.get(ctx.req_id)
            loaded = self._loaded_by_request.get(ctx.req_id) if keep_loaded else None
            # The present keys of the store's own offer: its prefix here.
            offered = {key for key in keys if key in self._slots}
        if not stored and not loaded and not offered:

            def evictable(key: OffloadKey) -> bool:
                return key not in protected and key not in pins and key not in writing

            return evictable
        empty: frozenset[OffloadKey] = frozenset()
        stored_keys, loaded_keys = stored or empty, loaded or empty
        offered_keys = offered or empty
        floor = (
            None
            if ctx is None
            else self._use_floor.of(loaded_keys, offered_keys, ctx.req_id)
        )

        def evictable_below_own(key: OffloadKey) -> bool:
            if key in stored_keys or key in loaded_keys or key in offered_keys:
                raise StopList
            return key not in protected and key not in pins and key not in writing

        if floor is None:
            return evictable_below_own
        last_use = self._policy.last_use

        def used_before_own(key: OffloadKey) -> bool:
            return evictable_below_own(key) and last_use(key) <= floor

        return used_before_own

    def _admitted(self, new: list[OffloadKey]) -> list[OffloadKey]:
        """The new keys that pass the reuse filter and the policy's admission.

        Offering a key for store is not a sighting: only lookups count, as in the
        seed (vLLM PR #41727), so a request that never looked a key up (its load
        capped at 0, a decode chunk) adds nothing to its count."""
        if self._filter.enabled and new:
            admitted = self._filter.admitted(new)
            self._stats.admission_rejected += len(new) - len(admitted)
            new = admitted
        return list(self._policy.admit(new)) if new else new

    def _allocate(self, n: int) -> list[int]:
        fresh = min(n, self._num_chunks - self._next_fresh)
        out = list(range(self._next_fresh, self._next_fresh + fresh))
        self._next_fresh += fresh
        reused = n - fresh
        if reused:
            free = self._free
            out += free[-reused:]
            del free[-reused:]
        return out

    def complete_store(
        self, keys: Sequence[OffloadKey], ctx: ReqContext, success: bool = True
    ) -> None:
        done = self._end_writes(keys)
        if not done:
            return
        if success:
            self._stats.chunks_stored += len(done)
            if self._events is not None:
                self._events.append(
                    OffloadingEvent(tuple(done), self.medium, False, self.name)
                )
            return
        self._stats.failures += len(done)
        self._release(done)

    def abort_store(self, keys: Sequence[OffloadKey]) -> None:
        """End writes that failed before they reached this tier: frees their
        slots as `complete_store(success=False)` does, but counts no failure
        here. For a promotion whose load from a secondary tier failed: that tier
        counts the failure; host memory only reserved a slot. Keys not in flight
        (already completed, dropped by a reset) are ignored."""
        self._release(self._end_writes(keys))

    def _end_writes(self, keys: Sequence[OffloadKey]) -> list[OffloadKey]:
        """The keys of `keys` in flight, no longer in flight."""
        writing = self._writing
        done = [key for key in keys if key in writing]
        writing.difference_update(done)
        return done

    def _release(self, keys: list[OffloadKey]) -> None:
        """Free the slots of chunks that never became readable."""
        for key in keys:
            self._free.append(self._slots.pop(key))
            self._policy.remove(key)
        if self._chains is not None:
            self._chains.unlink(keys)

    # -- lifecycle ---------------------------------------------------------------

    def on_new_request(self, ctx: ReqContext) -> RequestOffloadingContext:
        self._use_floor.arrived(ctx.req_id)
        return RequestOffloadingContext()

    def on_request_finished(self, ctx: ReqContext) -> None:
        self._stored_by_request.pop(ctx.req_id, None)
        self._loaded_by_request.pop(ctx.req_id, None)
        self._use_floor.finished(ctx.req_id)
        self._filter.finish_request(ctx.req_id)

    def take_events(self) -> list[OffloadingEvent]:
        if not self._events:
            return []
        events, self._events = self._events, []
        return events

    def reset_cache(self, busy_slots: Iterable[int] = ()) -> None:
        """Drop every chunk; `busy_slots` stay held until `release_slots`.

        Pins and in-flight writes are forgotten, but the copies behind them may
        still be running: a slot handed out again now (to a store, or to a
        promotion written by a tier's I/O thread) could end up with another
        chunk's bytes.
        """
        if self._events is not None:  # what was announced as stored leaves
            readable = tuple(k for k in self._slots if k not in self._writing)
            if readable:
                self._events.append(
                    OffloadingEvent(readable, self.medium, True, self.name)
                )
        self._policy.clear()
        self._filter.clear()
        if self._chains is not None:
            self._chains.clear()
        self._slots.clear()
        self._writing.clear()
        self._pins.clear()
        self._stored_by_request.clear()
        self._loaded_by_request.clear()
        self._held.update(busy_slots)
        assert all(0 <= slot < self._num_chunks for slot in self._held), (
            "a busy slot outside the pool"
        )
        if self._held:
            # Every slot not held is free (the lowest handed out first); a held
            # one joins them when it is released.
            held = self._held
            self._free = [s for s in reversed(range(self._num_chunks)) if s not in held]
            self._next_fresh = self._num_chunks
        else:
            self._free = []
            self._next_fresh = 0

    def release_slots(self, slots: Iterable[int]) -> None:
        """The copies that made these slots busy at a reset have ended: each slot
        becomes free once released as many times as it was held. Slots not held
        are ignored."""
        held, free = self._held, self._free
        for slot in slots:
            count = held.get(slot, 0)
            if count > 1:
                held[slot] = count - 1
            elif count == 1:
                del held[slot]
                free.append(slot)

    def get_stats(self) -> dict[str, TierStats]:
        counts = self._policy.counts
        return {
            self.name: replace(
                self._stats,
                occupancy=len(self._slots),
                hinted_chunks=self._policy.num_hinted(),
                hint_room=self._policy.hint_room,
                hints_honoured=counts.honoured,
                hints_expired_unused=counts.expired_unused,
                hints_dropped=counts.dropped,
            )
        }

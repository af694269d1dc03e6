"""The tiering manager: the primary (host) tier with secondary tiers behind it.

Chunks reach secondary tiers only through the primary tier: a chunk whose primary
write completes is cascaded to the secondary tiers that accept it, and a chunk
found only in a secondary tier is promoted into a primary slot before the engine
can load it, and from there cascaded to the tiers ahead of the one it came from.
Everything here runs on the scheduler thread and never waits on I/O.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import replace

from kvoffload.keys import OffloadKey
from kvoffload.tiering.cascades import Cascades, Sent
from kvoffload.tiering.config import TieringConfig
from kvoffload.tiering.demotion import DEMOTION_CONTEXT, Demotions
from kvoffload.tiering.promotions import PromotionTracker, promotion_batches
from kvoffload.tiering.requests import RequestState, RequestTracker
from kvoffload.tiers.base import (
    LookupResult,
    OffloadingEvent,
    OffloadingManager,
    OffloadPolicy,
    PrefixLookup,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    TierStats,
)
from kvoffload.tiers.primary import CPUOffloadingManager
from kvoffload.tiers.secondary.base import Clock, SecondaryTier, TierJob, TierJobResult

logger = logging.getLogger(__name__)

_MISS, _HIT, _PENDING, _RETRY = (
    LookupResult.MISS,
    LookupResult.HIT,
    LookupResult.HIT_PENDING,
    LookupResult.RETRY,
)


class TieringManager(OffloadingManager):
    """An `OffloadingManager` over a `CPUOffloadingManager` and ordered secondary tiers.

    - Cascade: every chunk whose primary write completes is stored, from its
      pinned slot, into each secondary tier the writing request's
      `kv_store_tiers` allows. For tiers that want a request's whole context
      (`REQUEST_LEVEL`), `prepare_store` also cascades the request's chunks
      already readable in the primary tier; chunks still being written there are
      parked and cascaded when their write completes. Within one completion a
      chunk is offered to each tier once, however many requests want it there.
    - Backpressure: each tier has at most `max_inflight_chunks` cascaded chunks
      in flight; beyond that, cascades are shed and counted as `drops`. A failed
      cascade leaves the chunk in the primary tier and is not retried.
    - Promotion: a lookup that misses the primary tier asks the secondary tiers
      the request's `kv_load_tiers` allows, in order; on a hit it allocates a
      primary slot and loads the chunk into it, answering `HIT_PENDING` until it
      lands. A failed promotion frees the slot (a failure of the tier it came
      from, not of the primary tier) and its key misses for
      `promotion_failure_ttl_s`. A landed one is cascaded, as for the request
      whose lookup promoted it, to the tiers ahead of its source: the lookup
      found it missing there. Tiers behind the source were offered it when it
      was first stored; offering it again on every promotion would retry that
      cascade and, for a remote tier behind a local one, send each local hit
      over the network.
    - Completions are taken from the tiers once per step (at the first lookup
      or prepare call, and in `on_schedule_end`), never waited for.
    - Retention hints travel with the chunks: a cascade carries each chunk's
      hint as the primary tier holds it (`TierJob.hints`), and a promoted chunk
      takes the hint its tier reports (`TierJobResult.hints`).
    - Hit tokens: a chunk promoted for a request counts for the tier it came
      from at that request's first load of it; every other load counts for the
      primary tier.
    - Write-back tiers (`SecondaryTier.write_back`) take no part in the above
      cascades nor in touches: they are written the chunks host memory is about
      to evict (`tiering/demotion.py`), once per step at most.
    - `on_request_finished` reaches the secondary tiers once no cascade for the
      request can follow.
    """

    def __init__(
        self,
        primary: CPUOffloadingManager,
        tiers: Sequence[SecondaryTier],
        config: TieringConfig | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        names = [primary.name, *(t.name for t in tiers)]
        if len(set(names)) != len(names):
            raise ValueError(f"tier names must be unique, got {names}")
        self.config = config or TieringConfig()
        self.primary = primary
        self.tiers = tuple(tiers)
        self._requests = RequestTracker()
        self._promotions = PromotionTracker(
            clock,
            self.config.promotion_failure_ttl_s,
            self.config.max_remembered_failures,
        )
        self._jobs = Cascades(primary, self.tiers)
        self._hit_tokens = [0] * len(self.tiers)
        self._demotions = Demotions(primary, self.tiers)
        self._polled = False

    # -- completions -------------------------------------------------------------

    def _poll_once(self) -> None:
        if not self._polled:
            self._polled = True
            self._poll()

    def _poll(self) -> None:
        for index, tier in enumerate(self.tiers):
            for result in tier.get_finished_jobs():
                record = self._jobs.finished(index, result.job_id)
                if record.promotion:
                    self._finish_promotion(index, record.job, result)

    def _finish_promotion(
        self, source: int, job: TierJob, result: TierJobResult
    ) -> None:
        failed = set(result.failed_keys)
        loaded = [k for k in job.keys if k not in failed]
        lost = [k for k in job.keys if k in failed]
        if loaded:
            self.primary.complete_store(loaded, job.ctx, True)
            if result.hints:
                # A promoted chunk keeps the hint it was under in its tier.
                for key in loaded:
                    hint = result.hints.get(key)
                    if hint is not None:
                        self.primary.retain((key,), hint)
        if lost:
            # The source tier counts the failure; host memory only lent a slot.
            self.primary.abort_store(lost)
        tracked = self._promotions.finished(job.keys, lost)
        state = self._requests.get(job.ctx.req_id)
        if state is not None:
            for key in lost:
                state.promoted.pop(key, None)
        sent: Sent = set()
        self._promotion_landed(source, job.ctx, tracked, failed, sent)
        self._primary_written(loaded, True, sent)
        self._primary_written(lost, False, sent)

    def _promotion_landed(
        self,
        source: int,
        ctx: ReqContext,
        tracked: list[OffloadKey],
        failed: set[OffloadKey],
        sent: Sent,
    ) -> None:
        """Cascade the promoted chunks that landed to the tiers ahead of `source`,
        for the request that promoted them. A reset forgot its promotions
        (`tracked` is empty then): nothing is cascaded or counted."""
        state = self._requests.get(ctx.req_id)
        if state is None or not tracked:
            return
        state.promoting -= len(tracked)
        landed = [k for k in tracked if k not in failed and self.primary.is_readable(k)]
        self._jobs.cascade(landed, state.ctx, range(source), sent)
        self._maybe_finalize(state)

    def _primary_written(
        self, keys: Iterable[OffloadKey], success: bool, sent: Sent
    ) -> None:
        """Cascade the chunks that requests parked until their primary write ended,
        except to the tiers the same completion already offered them to (`sent`)."""
        waiting: dict[str, list[OffloadKey]] = {}
        for key in keys:
            for req_id in self._requests.take_parked(key):
                waiting.setdefault(req_id, []).append(key)
        for req_id, parked in waiting.items():
            state = self._requests.get(req_id)
            assert state is not None
            if success:
                readable = [k for k in parked if self.primary.is_readable(k)]
                self._jobs.cascade(readable, state.ctx, state.request_level_tiers, sent)
            self._maybe_finalize(state)

    # -- lookups -----------------------------------------------------------------

    def lookup(self, key: OffloadKey, ctx: ReqContext) -> LookupResult:
        self._poll_once()
        result = self.primary.lookup(key, ctx)
        if result is _MISS and self.tiers:
            return self._lookup_secondary(key, ctx, (), ())
        return result

    def lookup_prefix(
        self, keys: Sequence[OffloadKey], ctx: ReqContext
    ) -> PrefixLookup:
        return self.lookup_prefixes((keys,), ctx)[0]

    def lookup_prefixes(
        self, prefixes: Sequence[Sequence[OffloadKey]], ctx: ReqContext
    ) -> list[PrefixLookup]:
        """Every group's primary prefix first, then the secondary tiers behind
        each: a promotion for one group must not evict a chunk another group
        counted, or the engine would load a chunk that is gone."""
        self._poll_once()
        found = [self.primary.lookup_prefix(keys, ctx) for keys in prefixes]
        pairs = list(zip(prefixes, found, strict=True))
        if not self.tiers or all(f.present == len(keys) for keys, f in pairs):
            return found
        counted = [keys[: f.present] for keys, f in pairs]
        for g, keys in enumerate(prefixes):
            if found[g].present < len(keys):
                others = [k for j, ks in enumerate(counted) if j != g for k in ks]
                found[g] = self._walk_secondary(keys, found[g], ctx, others)
                counted[g] = keys[: found[g].present]
        self._submit_promotions()
        return found

    def _walk_secondary(
        self,
        keys: Sequence[OffloadKey],
        head: PrefixLookup,
        ctx: ReqContext,
        protect: Sequence[OffloadKey],
    ) -> PrefixLookup:
        """Extend a primary prefix past its first miss from the secondary tiers;
        promotions evict none of `protect` nor of the prefix walked so far."""
        ready, present = head.ready, head.present
        readable = ready == present
        retry = False
        for i in range(head.present, len(keys)):
            key = keys[i]
            result = _MISS if i == head.present else self.primary.lookup(key, ctx)
            if result is _MISS:
                before = [*protect, *keys[:i]]
                result = self._lookup_secondary(key, ctx, before, keys[i + 1 :])
            if result is _MISS:
                break
            if result is _RETRY:
                retry = True
                break
            present += 1
            if result is _HIT and readable:
                ready += 1
            else:
                readable = False
        return PrefixLookup(ready, present, retry)

    def _lookup_secondary(
        self,
        key: OffloadKey,
        ctx: ReqContext,
        before: Sequence[OffloadKey],
        following: Sequence[OffloadKey],
    ) -> LookupResult:
        if self._promotions.recently_failed(key):
            return _MISS
        allowed = ctx.params.load_tiers
        retry = False
        for index, tier in enumerate(self.tiers):
            if not allowed.allows(tier.name, tier.medium, tier.locality):
                continue
            result = tier.lookup(key, ctx)
            if result is _HIT:
                if not self._start_promotion(index, key, ctx, before):
                    return _MISS
                state = self._requests.get(ctx.req_id)
                if state is not None:
                    state.promoted[key] = index
                return _PENDING
            if result is _RETRY:
                retry = True
                if following:
                    tier.prefetch(following, ctx)
        return _RETRY if retry else _MISS

    def _start_promotion(
        self,
        tier: int,
        key: OffloadKey,
        ctx: ReqContext,
        before: Sequence[OffloadKey],
    ) -> bool:
        # The chunks in `before` were counted present by this lookup: making room
        # for the promotion must not evict them.
        out = self.primary.prepare_store((key,), ctx, promotion=True, protect=before)
        if out is None or not out.keys_to_store:
            return False  # no room
        self._promotions.add(tier, ctx, key, out.slots[0])
        # Its landing cascades for this request: the request's tiers hear of its
        # finish only after that.
        self._state(ctx, "lookup").promoting += 1
        return True

    def _submit_promotions(self) -> None:
        """One request's promotion from one tier goes out head first, in jobs
        of growing size (`TieringConfig.promotion_first_batch`): a tier works
        through its queue in order, so the head of the prefix lands first."""
        for load in self._promotions.take_pending():
            for start, end in promotion_batches(
                len(load.keys),
                self.config.promotion_first_batch,
                self.config.promotion_max_batch,
            ):
                job = self._jobs.new_job(
                    load.tier,
                    True,
                    load.keys[start:end],
                    load.slots[start:end],
                    load.ctx,
                )
                self.tiers[load.tier].submit_load(job)

    # -- loads and stores --------------------------------------------------------

    def prepare_load(
        self, keys: Sequence[OffloadKey], ctx: ReqContext
    ) -> tuple[int, ...] | None:
        self._poll_once()
        return self.primary.prepare_load(keys, ctx)

    def complete_load(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        self.primary.complete_load(keys, ctx)

    def on_load_planned(
        self, tokens: Mapping[OffloadKey, int], ctx: ReqContext
    ) -> None:
        """Chunks promoted for this request count for the tier they came from
        (their first load only); the rest for the primary tier."""
        state = self._requests.get(ctx.req_id)
        promoted = state.promoted if state is not None else {}
        primary: dict[OffloadKey, int] = {}
        for key, n in tokens.items():
            tier = promoted.pop(key, None)
            if tier is None:
                primary[key] = n
            else:
                self._hit_tokens[tier] += n
        self.primary.on_load_planned(primary, ctx)

    def keep_chains(self, engine_chunks: int) -> bool:
        """Host memory's (the secondary tiers keep what it demotes)."""
        return self.primary.keep_chains(engine_chunks)

    def holds(self, key: OffloadKey) -> bool | None:
        """Held by host memory; otherwise `None` when there are secondary tiers
        (a lookup might promote it from one), `False` when there are none."""
        if self.primary.holds(key):
            return True
        return None if self.tiers else False

    def touch(
        self,
        keys: Sequence[OffloadKey],
        ctx: ReqContext,
        *,
        stored: Set[OffloadKey] | None = None,
    ) -> None:
        self.primary.touch(keys, ctx, stored=stored)
        for tier in self.tiers:
            if not tier.write_back:  # it holds what host memory does not
                tier.touch(keys, ctx)

    def prepare_store(
        self,
        keys: Sequence[OffloadKey],
        ctx: ReqContext,
        *,
        may_evict: bool = True,
        keep_loaded: bool = True,
    ) -> PrepareStoreOutput | None:
        self._poll_once()
        state = self._state(ctx, "prepare_store")
        out = self.primary.prepare_store(
            keys, ctx, may_evict=may_evict, keep_loaded=keep_loaded
        )
        if out is None:
            return None
        self._requests.writing_started(ctx.req_id, out.keys_to_store)
        if state.request_level_tiers:
            self._cascade_present(keys, set(out.keys_to_store), ctx, state)
        return out

    def _cascade_present(
        self,
        keys: Sequence[OffloadKey],
        storing: set[OffloadKey],
        ctx: ReqContext,
        state: RequestState,
    ) -> None:
        """Cascade to a request's request-level tiers the chunks the primary tier
        already has: readable ones now; ones another request is writing, or being
        promoted, when their write ends (parked). Chunks this request writes
        itself cascade on completion anyway; absent ones are skipped."""
        ready: list[OffloadKey] = []
        for key in dict.fromkeys(keys):
            if key in storing:
                continue
            if self.primary.is_readable(key):
                ready.append(key)
                continue
            writer = self._requests.writer(key)
            if writer is None:
                pending = self._promotions.is_in_flight(key)
            else:
                pending = writer != ctx.req_id
            if pending:
                self._requests.park(ctx.req_id, key)
        self._jobs.cascade(ready, ctx, state.request_level_tiers)

    def complete_store(
        self, keys: Sequence[OffloadKey], ctx: ReqContext, success: bool = True
    ) -> None:
        done = self._requests.writing_done(keys)
        self.primary.complete_store(keys, ctx, success)
        every_tier = range(len(self.tiers))
        sent: Sent = set()
        for req_id, written in done.items():
            state = self._requests.get(req_id)
            assert state is not None
            if success:
                readable = [k for k in written if self.primary.is_readable(k)]
                self._jobs.cascade(readable, state.ctx, every_tier, sent)
            self._primary_written(written, success, sent)
            self._maybe_finalize(state)

    # -- request lifecycle -------------------------------------------------------

    def on_new_request(self, ctx: ReqContext) -> RequestOffloadingContext:
        self.primary.on_new_request(ctx)
        allowed = ctx.params.store_tiers
        request_level = tuple(
            index
            for index, tier in enumerate(self.tiers)
            if tier.on_new_request(ctx).policy is OffloadPolicy.REQUEST_LEVEL
            and allowed.allows(tier.name, tier.medium, tier.locality)
        )
        self._requests.add(ctx, request_level)
        if request_level:
            return RequestOffloadingContext(OffloadPolicy.REQUEST_LEVEL)
        return RequestOffloadingContext(OffloadPolicy.CHUNK_LEVEL)

    def _state(self, ctx: ReqContext, call: str) -> RequestState:
        state = self._requests.get(ctx.req_id)
        if state is None:
            logger.debug("request %s: %s before on_new_request", ctx.req_id, call)
            self.on_new_request(ctx)
            state = self._requests.get(ctx.req_id)
            assert state is not None
        return state

    def on_request_finished(self, ctx: ReqContext) -> None:
        self.primary.on_request_finished(ctx)
        state = self._requests.get(ctx.req_id)
        if state is None:
            return
        state.finished = True
        self._maybe_finalize(state)

    def _maybe_finalize(self, state: RequestState) -> None:
        if not state.finalizable or self._requests.get(state.ctx.req_id) is not state:
            return
        self._requests.pop(state.ctx.req_id)
        for tier in self.tiers:
            tier.on_request_finished(state.ctx)

    # -- per step, events, stats, reset ------------------------------------------

    def _demote(self) -> None:
        """Write to each write-back tier the chunks of host memory's eviction
        window it lacks, and touch there those it has (`Demotions`)."""
        demotions = self._demotions
        if not demotions.due():
            return
        window = demotions.window()
        for index in demotions.indices:
            tier = self.tiers[index]
            held: list[OffloadKey] = []
            missing: list[OffloadKey] = []
            for key in window:
                (held if tier.holds(key) else missing).append(key)
            if held:
                tier.touch(held, DEMOTION_CONTEXT)
            room = self._jobs.room(index)
            if len(missing) > room:
                demotions.fell_behind()
            self._jobs.cascade(
                missing[:room], DEMOTION_CONTEXT, (index,), demoting=True
            )

    def on_schedule_end(self) -> None:
        self._poll()
        self._demote()
        self._submit_promotions()
        for tier in self.tiers:
            tier.on_schedule_end()
        self._polled = False

    def has_pending_work(self) -> bool:
        """Whether tier jobs or checks are in flight (keep calling `on_schedule_end`)."""
        return (
            bool(self._jobs)
            or self._promotions.has_pending()
            or any(tier.has_pending_work() for tier in self.tiers)
        )

    def take_events(self) -> list[OffloadingEvent]:
        events = self.primary.take_events()
        for tier in self.tiers:
            events.extend(tier.take_events())
        return events

    def reset_cache(self, busy_slots: Iterable[int] = ()) -> None:
        """Drop every chunk of every tier (SPEC §3.3): secondary tiers empty
        their whole namespace (`SecondaryTier.reset_cache`), because after an
        in-place weight update the model's fingerprint may be unchanged and
        anything they kept would be served as stale KV.

        First waits, on the scheduler thread, for every tier job in flight (none
        is aborted midway: a half-copied chunk would corrupt a slot or a tier),
        so no I/O thread touches a slot once the primary tier reuses it, and no
        job that read old chunks completes into the emptied tiers. That wait is
        bounded by each tier's `max_inflight_chunks` and call timeouts, and
        resets are rare (weight updates, with generation paused); deleting the
        tiers' contents, the long part, and their rescans run on their own
        threads and are not waited for (`SecondaryTier.drain`).

        The engine's own transfer jobs are not waited for: the primary tier holds
        their `busy_slots` until `release_slots`, so no promotion lands in a slot
        an old device copy still writes or reads.
        """
        self._requests.drop_in_flight()
        self._promotions.clear()
        for tier in self.tiers:
            tier.drain()
        self._poll()
        assert not self._jobs, "tier jobs still in flight after drain"
        for state in self._requests.finalizable():
            self._maybe_finalize(state)
        for tier in self.tiers:
            tier.reset_cache()
        self.primary.reset_cache(busy_slots)
        self._demotions.reset()
        self._polled = False

    def release_slots(self, slots: Iterable[int]) -> None:
        self.primary.release_slots(slots)

    def get_stats(self) -> dict[str, TierStats]:
        stats = self.primary.get_stats()
        for index, tier in enumerate(self.tiers):
            own = tier.get_stats()
            stats[tier.name] = replace(
                own,
                drops=own.drops + self._jobs.shed[index],
                hit_tokens=own.hit_tokens + self._hit_tokens[index],
            )
        return stats

    def shutdown(self) -> None:
        """Shut every tier down (each is attempted even if one fails), then the primary."""
        with contextlib.ExitStack() as stack:
            stack.callback(self.primary.shutdown)
            for tier in self.tiers:
                stack.callback(tier.shutdown)

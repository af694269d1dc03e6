"""The Redis/Valkey tier: chunks as checked raw-bytes values in a shared server.

Keys are `<prefix>:<fingerprint>:<key hex>`; values are the chunk header followed by
the payload (never pickle). Capacity is the server's (`maxmemory` with an LRU
policy, and `ttl_s` if set). Stores and loads are pipelined batches on a thread
pool.

Retention hints: the header holds a chunk's hint (format 2, in Unix time), so
whichever engine loads it hands it to its primary tier; a store that finds the
value present under an earlier deadline rewrites the header's in place
(`redis_renewal`). The server evicts by
itself, so the tier can only shape expiry: with `ttl_s`, a held chunk's value
expires no sooner than its hint ends (capped at about 139 years), and no
engine's store or renewal shortens it (`SET ... NX`, `PEXPIRE ... GT`); without
`ttl_s` values never expire, hinted or not (an expiry would make them the first
to go under the `volatile-*` policies). A chunk hinted 0 is not sent at all
(counted in `store_skipped`): the server's LRU cannot be told to take it first.
Of the hint counters only `hints_honoured` (loads of a value under a live hint)
is known here; what the server holds, and which hints ran out unused, only it
knows, so `hinted_chunks`, `hints_expired_unused` and `hints_dropped` stay 0.

Lookups are asynchronous: an unknown key answers `RETRY` and joins a batch of
`PTTL` calls (whether the value is there, and for how long) sent on a lookup
thread at the end of the step (with the rest of the prefix, through
`prefetch`), so a whole prefix costs one round trip and the scheduler thread
never waits on the network. Answers are cached briefly: a present one for
`hit_cache_s` at most, and never past the time the value has left on the server
(`PTTL`, or `ttl_s` after a store). A synchronous call would block the
scheduler for a round trip per chunk, and for the whole timeout when the server
is slow.

A store never rests on a cached answer, which goes stale when the server evicts
or expires the value: the chunks believed present are asked about again on the
I/O thread (a round trip, without their values), and only those the server
still holds are skipped, their expiry (or LRU clock) renewed as a `SET` would.

A load that finds a value absent (the server evicted it) or corrupt (then
deleted) reports the chunk removed, as the file tier does for a bad file, so
that KV-event consumers stop counting on it; a load that cannot reach the
server reports nothing removed.

Once a call has found the server down (a timeout, a lost connection), the jobs
and checks queued behind it fail at once, without a call, until the backoff is
over and a probe succeeds (see `RedisLink.attempt`): a paused server costs one
timeout, not one per queued job. Stores failed so are counted as drops, loads
as failures, checks as misses.

A server that answers a command with an error reply is up: only that command's
chunk fails. A store refused for want of memory (OOM: `maxmemory` reached with
`noeviction`, or a volatile policy and no TTL) is skipped and counted as a full
tier's is; a refused check is a miss. Only a server that cannot be reached (or
a cluster that says it is down) turns every lookup into a miss.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial

from kvoffload.keys import OffloadKey, offload_key_group
from kvoffload.tiers.base import LookupResult, ReqContext, TierStats
from kvoffload.tiers.secondary.base import Clock, SecondaryTier, TierJob, TierJobResult
from kvoffload.tiers.secondary.codec import validate_fingerprint
from kvoffload.tiers.secondary.executor import (
    BatchOutcome,
    ExecutorResult,
    JobExecutor,
    Task,
)
from kvoffload.tiers.secondary.redis_config import RedisTierConfig
from kvoffload.tiers.secondary.redis_link import REDIS_ERRORS, RedisLink
from kvoffload.tiers.secondary.redis_namespace import delete_namespace
from kvoffload.tiers.secondary.redis_presence import PresenceCache
from kvoffload.tiers.secondary.redis_values import RedisValues
from kvoffload.worker import ChunkBuffer

logger = logging.getLogger(__name__)

_MAX_LOOKUP_BATCH = 1024


@dataclass(frozen=True)
class _JobRecord:
    job: TierJob
    is_store: bool
    started: tuple[int, ...]
    refused: tuple[OffloadKey, ...]
    submitted: float


class RedisTier(SecondaryTier):
    """Chunks in a Redis or Valkey server reached through a `redis://` URL."""

    def __init__(
        self,
        config: RedisTierConfig,
        buffer: ChunkBuffer,
        fingerprint: str,
        clock: Clock = time.monotonic,
    ) -> None:
        super().__init__(
            config.name,
            "cpu",
            config.locality,
            config.offload_policy,
            config.max_inflight_chunks,
        )
        self.config = config
        self._buffer = buffer
        self._fingerprint = validate_fingerprint(fingerprint)
        self._prefix = f"{config.key_prefix}:{fingerprint}:"
        self._clock = clock
        self._link = RedisLink(config, clock)
        self._values = RedisValues(
            config.name,
            self._link,
            self._prefix,
            self._fingerprint,
            buffer,
            config.ttl_s,
        )
        self._executor = JobExecutor(config.name, config.num_threads)
        self._lookups = JobExecutor(f"{config.name}-lookup", 1)
        # A reset's deletion runs apart: `drain` waits for jobs and checks, each
        # bounded by a call timeout, never for a whole namespace's deletion.
        self._clears = JobExecutor(f"{config.name}-reset", 1)
        self._jobs: dict[int, _JobRecord] = {}
        self._presence = PresenceCache(config.hit_cache_s, config.miss_cache_s)
        self._answers_lock = threading.Lock()
        # Per key checked: the seconds its value has left (0: absent).
        self._answers: list[tuple[list[OffloadKey], list[float] | None]] = []
        self._stats = TierStats()
        # A reset empties the namespace on its own thread; until that has
        # succeeded, nothing is served or stored (see `reset_cache`).
        self._clearing = False
        self._clear_running = False
        self._clear_again = False  # a reset came while a deletion ran
        self._cleared: list[tuple[list[OffloadKey], bool | None]] = []
        # Per store job: indices its I/O threads dropped, the server being down.
        self._dropped: dict[int, set[int]] = {}
        self._stop = threading.Event()

    def redis_key(self, key: OffloadKey) -> str:
        """The server-side name of a chunk."""
        return self._values.name_of(key)

    @property
    def connected(self) -> bool:
        """False from a failed call until the next successful one."""
        return not self._link.is_down()

    # -- lookups -----------------------------------------------------------------

    def lookup(self, key: OffloadKey, ctx: ReqContext) -> LookupResult:
        self._absorb_answers()
        if self._clearing or not self._link.available():
            self._stats.lookups += 1
            return LookupResult.MISS
        present = self._presence.answer(key, self._clock())
        if present is None:
            self._ask(key)
            return LookupResult.RETRY  # counted once answered
        self._stats.lookups += 1
        if present:
            self._stats.hits += 1
            return LookupResult.HIT
        return LookupResult.MISS

    def prefetch(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        if self._clearing or not self._link.available():
            return
        now = self._clock()
        for key in keys:
            if self._presence.answer(key, now) is None:
                self._ask(key)

    def _ask(self, key: OffloadKey) -> None:
        if self._presence.ask(key) >= _MAX_LOOKUP_BATCH:
            self._send_lookups()

    def _send_lookups(self) -> None:
        if not self._presence.queued:
            return
        keys = self._presence.take_questions()
        self._lookups.submit_call("PTTL batch", partial(self._check, keys))

    def _absorb_answers(self) -> None:
        if not self._answers and not self._cleared:
            return
        with self._answers_lock:
            answers, self._answers = self._answers, []
            cleared, self._cleared = self._cleared, []
        for removed, done in cleared:
            self._record_event(removed, True)
            if done is not None:
                self._clear_running = False
                if self._clear_again:
                    self._clear_again = False
                    self._start_clear()
                else:
                    self._clearing = not done
        now = self._clock()
        for keys, lifetimes in answers:
            self._presence.answered(keys)
            if lifetimes is not None:
                for key, lifetime in zip(keys, lifetimes, strict=True):
                    self._presence.remember(key, lifetime, now)

    def on_schedule_end(self) -> None:
        self._absorb_answers()
        if self._clearing:
            self._start_clear()  # again, if the last attempt failed
        elif self._link.available():
            self._send_lookups()
        else:
            self._presence.drop_questions()

    # -- jobs --------------------------------------------------------------------

    def submit_store(self, job: TierJob) -> None:
        if self._clearing or not self._link.available():
            self._stats.drops += len(job.keys)
            self._refuse(job, True)
            return
        now = self._clock()
        believed = self._presence.believed_present
        held = frozenset(i for i, key in enumerate(job.keys) if believed(key, now))
        # A chunk hinted 0 is not sent: no request will share it, and a remote
        # store is where keeping it costs most (the network, a shared server's
        # memory); the server's LRU cannot be told to take it first.
        done = [i for i in range(len(job.keys)) if job.hint(i) == 0]
        if done:
            self._stats.store_skipped += len(done)
        every = [i for i in range(len(job.keys)) if job.hint(i) != 0]
        refused = tuple(job.keys[i] for i in done)
        self._start(job, True, every, partial(self._store_batch, held), refused)

    def submit_load(self, job: TierJob) -> None:
        if self._clearing or not self._link.available():
            self._stats.failures += len(job.keys)
            self._refuse(job, False)
            return
        self._start(job, False, list(range(len(job.keys))), self._load_batch)

    def _refuse(self, job: TierJob, is_store: bool) -> None:
        record = _JobRecord(job, is_store, (), job.keys, self._clock())
        self._jobs[job.job_id] = record
        self._executor.submit(job.job_id, [])

    def _start(
        self,
        job: TierJob,
        is_store: bool,
        started: list[int],
        run: Callable[[TierJob, tuple[int, ...]], BatchOutcome],
        refused: tuple[OffloadKey, ...] = (),
    ) -> None:
        record = _JobRecord(job, is_store, tuple(started), refused, self._clock())
        self._jobs[job.job_id] = record
        tasks, batch, batch_bytes = [], [], 0
        for i in started:
            batch.append(i)
            batch_bytes += self._buffer.chunk_nbytes(offload_key_group(job.keys[i]))
            if batch_bytes >= self.config.batch_bytes:
                tasks.append(Task(tuple(batch), partial(run, job, tuple(batch))))
                batch, batch_bytes = [], 0
        if batch:
            tasks.append(Task(tuple(batch), partial(run, job, tuple(batch))))
        self._executor.submit(job.job_id, tasks)

    def get_finished_jobs(self) -> list[TierJobResult]:
        out = []
        now = self._clock()
        for result in self._executor.take_finished():
            record = self._jobs.pop(result.job_id)
            out.append(self._finish(record, result, now))
        return out

    def _finish(
        self, record: _JobRecord, result: ExecutorResult, now: float
    ) -> TierJobResult:
        keys = record.job.keys
        unset = result.failed | result.held  # failed, or found already there
        done = [keys[i] for i in record.started if i not in unset]
        failed = [keys[i] for i in record.started if i in result.failed]
        with self._answers_lock:
            dropped = self._dropped.pop(record.job.job_id, set())
        stats = self._stats
        stats.store_skipped += len(result.full)  # a full server: not failures
        stats.drops += len(dropped)  # never sent: the server was down
        stats.failures += len(failed) - len(result.full) - len(dropped)
        stats.transfer_seconds += result.seconds
        if record.is_store:
            stats.chunks_stored += len(done)
            stats.bytes_stored += result.num_bytes
            # Set (or renewed) after the job was submitted: it lives that long.
            lifetime = math.inf if self.config.ttl_s is None else self.config.ttl_s
            for key in (*done, *(keys[i] for i in result.held)):
                self._presence.remember(key, lifetime, record.submitted)
            self._record_event(done, False)
        else:
            stats.chunks_loaded += len(done)
            stats.bytes_loaded += result.num_bytes
            for key in failed:
                self._presence.remember(key, 0.0, now)
            self._record_event([keys[i] for i in sorted(result.lost)], True)
        hints = None
        if result.hints:
            hints = {keys[i]: hint for i, hint in result.hints.items()}
            stats.hints_honoured += sum(1 for hint in hints.values() if hint > 0)
        return TierJobResult(
            record.job.job_id,
            (*record.refused, *failed),
            result.num_bytes,
            result.seconds,
            hints,
        )

    # -- on I/O threads ----------------------------------------------------------

    def _check(self, keys: list[OffloadKey]) -> None:
        lifetimes: list[float] | None = None
        with self._link.attempt() as allowed:
            try:
                if allowed:
                    lifetimes = self._values.lifetimes(keys)
            except REDIS_ERRORS as exc:
                self._link.call_failed(exc)
            except Exception as exc:  # thread root: the answer must still arrive
                self._client_broke("PTTL batch", exc)
        with self._answers_lock:
            self._answers.append((keys, lifetimes))

    def _store_batch(
        self, held: frozenset[int], job: TierJob, indices: tuple[int, ...]
    ) -> BatchOutcome:
        """Set the values of the chunks at `indices`, but for those believed
        present (`held`) that the server still holds."""
        with self._link.attempt() as allowed:
            if not allowed:
                with self._answers_lock:
                    self._dropped.setdefault(job.job_id, set()).update(indices)
                return BatchOutcome(indices, 0)
            try:
                values = self._values
                kept = values.still_held(job, [i for i in indices if i in held])
                todo = [i for i in indices if i not in kept]
                outcome = values.set_values(job, todo) if todo else BatchOutcome((), 0)
            except REDIS_ERRORS as exc:
                self._link.call_failed(exc)
                return BatchOutcome(indices, 0)
            except Exception as exc:  # logged here, redacted, not by the pool
                self._client_broke("store", exc)
                return BatchOutcome(indices, 0)
            return outcome._replace(held=[*kept, *outcome.held])

    def _load_batch(self, job: TierJob, indices: tuple[int, ...]) -> BatchOutcome:
        names = [self._values.name_of(job.keys[i]) for i in indices]
        with self._link.attempt() as allowed:
            if not allowed:
                return BatchOutcome(indices, 0)
            try:
                values = self._values.get_values(names)
            except REDIS_ERRORS as exc:
                self._link.call_failed(exc)
                return BatchOutcome(indices, 0)
            except Exception as exc:  # logged here, redacted, not by the pool
                self._client_broke("load", exc)
                return BatchOutcome(indices, 0)
            self._link.succeeded()
        return self._values.decode(job, indices, values)

    # -- reset -------------------------------------------------------------------

    def reset_cache(self) -> None:
        """Delete every key of this tier's namespace, `<prefix>:<fingerprint>:`:
        other engines' chunks of the same model too (they would be served as
        this engine's), never other namespaces (no FLUSHDB on a shared server).

        The scheduler thread only forgets what it knew; the deleting
        (`delete_namespace`, a round trip per thousand keys) runs on a thread
        of its own, which neither `drain` nor a later reset waits for. Until it
        has succeeded, lookups miss and stores drop (counted); a failed attempt
        is retried once the server is reachable again. A reset while a deletion
        runs has it run again once done: other engines may have stored keys its
        scan had passed.
        """
        assert not self._jobs and not self._presence.checking, (
            "reset_cache with I/O in flight"
        )
        self._presence.clear()
        self._clearing = True
        self._clear_again = self._clear_running
        self._start_clear()

    def _start_clear(self) -> None:
        if self._clear_running or not self._link.available():
            return
        self._clear_running = True
        self._clears.submit_call("reset", self._clear_namespace)

    def _clear_namespace(self) -> None:
        """On the reset thread: delete, then report the outcome."""
        done = False
        with self._link.attempt() as allowed:
            try:
                if allowed:
                    done = delete_namespace(
                        self._link.client,
                        self._prefix,
                        self._stop,
                        self._report_removed,
                    )
                    self._link.succeeded()
            except REDIS_ERRORS as exc:
                # Even an error reply (a server that forbids UNLINK, say) backs
                # off: until the namespace is cleared nothing is served or
                # stored anyway, and the backoff paces the attempts.
                self._link.failed(exc)
            except Exception as exc:  # thread root: the outcome must still arrive
                self._client_broke("reset", exc)
        with self._answers_lock:
            self._cleared.append(([], done))

    def _client_broke(self, what: str, exc: Exception) -> None:
        """A call failed with something other than a Redis error (an option
        redis-py takes but cannot use, say): logged with its traceback, and
        the server treated as down, so that lookups miss and nothing waits
        on an answer that would never come."""
        # The traceback as text, redacted: redis-py's messages may quote the
        # URL or an option, and a handler would print `exc_info` as it is.
        trace = "".join(traceback.format_exception(exc))
        logger.error(
            "%s: %s failed unexpectedly: %s", self.name, what, self._link.redact(trace)
        )
        self._link.failed(exc)

    def _report_removed(self, keys: list[OffloadKey]) -> None:
        with self._answers_lock:
            self._cleared.append((keys, None))

    # -- lifecycle ---------------------------------------------------------------

    def has_pending_work(self) -> bool:
        presence = self._presence
        return bool(
            self._jobs or presence.checking or presence.queued or self._clear_running
        )

    def drain(self) -> None:
        """Waits for jobs and existence checks; a reset's deletion goes on."""
        self._executor.drain()
        self._lookups.drain()
        self._absorb_answers()

    def shutdown(self) -> None:
        self._stop.set()  # a reset still deleting stops between batches
        self._executor.shutdown()
        self._lookups.shutdown()
        self._clears.shutdown()
        self._link.close()

    def get_stats(self) -> TierStats:
        return replace(self._stats)

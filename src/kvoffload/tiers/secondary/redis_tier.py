"""The Redis/Valkey tier: chunks as checked raw-bytes values in a shared server.

Keys are `<prefix>:<fingerprint>:<key hex>`; values are the chunk header followed by
the payload (never pickle). Capacity is the server's (`maxmemory` with an LRU
policy, and `ttl_s` if set). Stores and loads are pipelined batches on a thread
pool.

Retention hints: the header holds a chunk's hint (format 2, in Unix time), so
whichever engine loads it hands it to its primary tier. The server evicts by
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
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import cast

import redis
from redis.cluster import RedisCluster

from kvoffload.keys import OffloadKey, offload_key_group
from kvoffload.tiers.base import (
    LookupResult,
    ReqContext,
    TierStats,
)
from kvoffload.tiers.secondary.base import Clock, SecondaryTier, TierJob, TierJobResult
from kvoffload.tiers.secondary.buffer import scatter
from kvoffload.tiers.secondary.codec import (
    CorruptChunkError,
    check_header,
    check_payload,
    decode_header,
    encode_header,
    payload_checksum,
    validate_fingerprint,
)
from kvoffload.tiers.secondary.executor import (
    BatchOutcome,
    ExecutorResult,
    JobExecutor,
    Task,
)
from kvoffload.tiers.secondary.redis_config import RedisTierConfig
from kvoffload.tiers.secondary.redis_link import REDIS_ERRORS, RedisLink
from kvoffload.tiers.secondary.redis_namespace import delete_namespace
from kvoffload.worker import ChunkBuffer

logger = logging.getLogger(__name__)

_LONGEST_EXPIRY_MS = 2**42
"""About 139 years: the longest expiry a hint gives a value."""

_MAX_KNOWN_KEYS = 200_000
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
        self._ttl_ms = (
            None if config.ttl_s is None else max(1, int(config.ttl_s * 1000))
        )
        self._link = RedisLink(config, clock)
        self._executor = JobExecutor(config.name, config.num_threads)
        self._lookups = JobExecutor(f"{config.name}-lookup", 1)
        # A reset's deletion runs apart: `drain` waits for jobs and checks, each
        # bounded by a call timeout, never for a whole namespace's deletion.
        self._clears = JobExecutor(f"{config.name}-reset", 1)
        self._jobs: dict[int, _JobRecord] = {}
        # Per key: present or not, and until when that answer is trusted.
        self._known: OrderedDict[OffloadKey, tuple[bool, float]] = OrderedDict()
        self._to_ask: dict[OffloadKey, None] = {}
        self._asking: set[OffloadKey] = set()
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
        return self._prefix + key.hex()

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
        known = self._known.get(key)
        if known is None or known[1] <= self._clock():
            self._ask(key)
            return LookupResult.RETRY  # counted once answered
        self._stats.lookups += 1
        if known[0]:
            self._stats.hits += 1
            return LookupResult.HIT
        return LookupResult.MISS

    def prefetch(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        if self._clearing or not self._link.available():
            return
        now = self._clock()
        for key in keys:
            known = self._known.get(key)
            if known is None or known[1] <= now:
                self._ask(key)

    def _ask(self, key: OffloadKey) -> None:
        if key in self._asking or key in self._to_ask:
            return
        self._to_ask[key] = None
        if len(self._to_ask) >= _MAX_LOOKUP_BATCH:
            self._send_lookups()

    def _send_lookups(self) -> None:
        if not self._to_ask:
            return
        keys = list(self._to_ask)
        self._to_ask.clear()
        self._asking.update(keys)
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
            self._asking.difference_update(keys)
            if lifetimes is not None:
                for key, lifetime in zip(keys, lifetimes, strict=True):
                    self._remember(key, lifetime, now)

    def _remember(self, key: OffloadKey, lifetime: float, now: float) -> None:
        """As of `now`, the server holds `key`'s value for `lifetime` more
        seconds (`math.inf`: no expiry; 0: absent)."""
        present = lifetime > 0
        if present:
            trusted = min(self.config.hit_cache_s, lifetime)
        else:
            trusted = self.config.miss_cache_s
        known = self._known
        known[key] = (present, now + trusted)
        known.move_to_end(key)
        while len(known) > _MAX_KNOWN_KEYS:
            known.popitem(last=False)

    def on_schedule_end(self) -> None:
        self._absorb_answers()
        if self._clearing:
            self._start_clear()  # again, if the last attempt failed
        elif self._link.available():
            self._send_lookups()
        else:
            self._to_ask.clear()

    # -- jobs --------------------------------------------------------------------

    def submit_store(self, job: TierJob) -> None:
        if self._clearing or not self._link.available():
            self._stats.drops += len(job.keys)
            self._refuse(job, True)
            return
        now = self._clock()
        held = frozenset(
            i for i, key in enumerate(job.keys) if self._believed_present(key, now)
        )
        # A chunk hinted 0 is not sent: no request will share it, and a remote
        # store is where keeping it costs most (the network, a shared server's
        # memory); the server's LRU cannot be told to take it first.
        done = [i for i in range(len(job.keys)) if job.hint(i) == 0]
        if done:
            self._stats.store_skipped += len(done)
        every = [i for i in range(len(job.keys)) if job.hint(i) != 0]
        refused = tuple(job.keys[i] for i in done)
        self._start(job, True, every, partial(self._store_batch, held), refused)

    def _believed_present(self, key: OffloadKey, now: float) -> bool:
        known = self._known.get(key)
        return known is not None and known[0] and known[1] > now

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
                self._remember(key, lifetime, record.submitted)
            self._record_event(done, False)
        else:
            stats.chunks_loaded += len(done)
            stats.bytes_loaded += result.num_bytes
            for key in failed:
                self._remember(key, 0.0, now)
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
                    lifetimes = self._lifetimes(keys)
            except REDIS_ERRORS as exc:
                self._link.call_failed(exc)
            except Exception as exc:  # thread root: the answer must still arrive
                self._client_broke("PTTL batch", exc)
        with self._answers_lock:
            self._answers.append((keys, lifetimes))

    def _lifetimes(self, keys: list[OffloadKey]) -> list[float]:
        pipe = self._link.client.pipeline(transaction=False)
        for key in keys:
            pipe.pttl(self.redis_key(key))
        return [_lifetime(reply) for reply in self._link.execute(pipe)]

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
                kept = self._still_held(job, [i for i in indices if i in held])
                todo = [i for i in indices if i not in kept]
                outcome = self._set_values(job, todo) if todo else BatchOutcome((), 0)
            except REDIS_ERRORS as exc:
                self._link.call_failed(exc)
                return BatchOutcome(indices, 0)
            except Exception as exc:  # logged here, redacted, not by the pool
                self._client_broke("store", exc)
                return BatchOutcome(indices, 0)
            return outcome._replace(held=[*kept, *outcome.held])

    def _still_held(self, job: TierJob, checked: list[int]) -> list[int]:
        """Of `checked`, those whose value the server holds; their expiry is
        renewed (`ttl_s`, or the hint's end), never shortened: a value held
        under a longer hint keeps it (`PEXPIRE ... GT`, Redis 7 and Valkey;
        an older server refuses the option and the expiry stays as it is).
        Without `ttl_s` their LRU clock is renewed, as a `SET` would. A check
        the server refused counts as absent."""
        if not checked:
            return []
        expiries = [self._px(job.hint(i)) for i in checked]
        pipe = self._link.client.pipeline(transaction=False)
        for i, px in zip(checked, expiries, strict=True):
            name = self.redis_key(job.keys[i])
            if px is None:
                # Not TOUCH: a cluster pipeline drops its reply (redis-py 8.1);
                # not EXISTS: it leaves the LRU clock as it is.
                pipe.strlen(name)
            else:
                # GT answers 0 both for a value absent and for one whose expiry
                # is later already: PTTL tells which (-2: absent).
                pipe.pexpire(name, px, gt=True)
                pipe.pttl(name)
        replies = iter(self._link.execute(pipe))
        held = []
        for i, px in zip(checked, expiries, strict=True):
            reply = next(replies)
            if px is not None:
                reply = next(replies)  # the PTTL's: the value's presence
                present = not isinstance(reply, Exception) and reply != -2
            else:
                present = not isinstance(reply, Exception) and bool(reply)
            if present:
                held.append(i)
        return held

    def _set_values(self, job: TierJob, indices: list[int]) -> BatchOutcome:
        """`SET` each chunk's header and payload unless the server has the key
        already (`NX`: a key names its bytes, and a corrupt value is deleted
        when read), whose expiry is then only extended (`PEXPIRE ... GT`): a
        value held under another engine's longer hint keeps it. A key of
        another type (no value of ours) is replaced. Raises what a failed
        pipeline raises."""
        sizes = []
        values: dict[int, tuple[str, bytes, int | None]] = {}
        pipe = self._link.client.pipeline(transaction=False)
        for i in indices:
            key = job.keys[i]
            parts = self._buffer.chunk_views(job.slots[i], offload_key_group(key))
            n = sum(len(part) for part in parts)
            hint = job.hint(i)
            crc = payload_checksum(parts)
            header = encode_header(key, self._fingerprint, n, crc, hint, time.time())
            value = b"".join((header, *parts))  # one allocation, one copy each
            name, px = self.redis_key(key), self._px(hint)
            values[i] = (name, value, px)
            pipe.set(name, value, px=px, nx=True)
            if px is not None:
                pipe.pexpire(name, px, gt=True)
            sizes.append(n)
        replies = iter(self._link.execute(pipe))
        failed, full, held, num_bytes = [], [], [], 0
        for i, n in zip(indices, sizes, strict=True):
            reply = next(replies)
            _, _, px = values[i]
            if px is not None:
                next(replies)  # PEXPIRE GT's: an older server refuses GT
            if isinstance(reply, redis.OutOfMemoryError):
                full.append(i)
            if isinstance(reply, Exception):
                failed.append(i)
            elif reply is None:
                held.append(i)  # there already (NX)
            else:
                num_bytes += n
        if held:
            replaced = self._replace_foreign([values[i] for i in held])
            num_bytes += sum(
                n
                for i, n in zip(indices, sizes, strict=True)
                if values[i][0] in replaced
            )
            held = [i for i in held if values[i][0] not in replaced]
        return BatchOutcome(failed, num_bytes, full=full, held=held)

    def _replace_foreign(self, found: list[tuple[str, bytes, int | None]]) -> set[str]:
        """Of the keys `SET NX` found there, replace those that hold no string
        (another application's list, say: no value of ours, which `MGET` would
        read as absent for good); their names."""
        client = self._link.client
        pipe = client.pipeline(transaction=False)
        for name, _, _ in found:
            pipe.type(name)
        kinds = self._link.execute(pipe)
        foreign = [f for f, kind in zip(found, kinds, strict=True) if kind != b"string"]
        if not foreign:
            return set()
        pipe = client.pipeline(transaction=False)
        for name, value, px in foreign:
            pipe.set(name, value, px=px)
        replies = self._link.execute(pipe)
        return {
            name
            for (name, _, _), reply in zip(foreign, replies, strict=True)
            if not isinstance(reply, Exception)
        }

    def _load_batch(self, job: TierJob, indices: tuple[int, ...]) -> BatchOutcome:
        names = [self.redis_key(job.keys[i]) for i in indices]
        with self._link.attempt() as allowed:
            if not allowed:
                return BatchOutcome(indices, 0)
            try:
                values = self._get_values(names)
            except REDIS_ERRORS as exc:
                self._link.call_failed(exc)
                return BatchOutcome(indices, 0)
            except Exception as exc:  # logged here, redacted, not by the pool
                self._client_broke("load", exc)
                return BatchOutcome(indices, 0)
            self._link.succeeded()
        failed: list[int] = []
        corrupt: list[str] = []
        hints: dict[int, float] = {}
        num_bytes = 0
        now = time.time()
        for i, name, value in zip(indices, names, values, strict=True):
            if value is None:
                failed.append(i)  # evicted, expired or never there: gone
                continue
            key = job.keys[i]
            n = self._buffer.chunk_nbytes(offload_key_group(key))
            try:
                header = decode_header(value)
                check_header(header, key, self._fingerprint, n)
                payload = memoryview(value)[header.size :]
                check_payload(header, (payload,))
            except CorruptChunkError as exc:
                logger.warning("%s: dropping chunk %s: %s", self.name, name, exc)
                corrupt.append(name)
                failed.append(i)
                continue
            scatter(
                payload, self._buffer.chunk_views(job.slots[i], offload_key_group(key))
            )
            num_bytes += n
            hint = header.hint_left(now)
            if hint is not None:
                hints[i] = hint
        if corrupt:
            try:
                self._link.client.delete(*corrupt)
            except REDIS_ERRORS as exc:
                logger.warning(
                    "%s: cannot delete corrupt chunks: %s",
                    self.name,
                    self._link.redact(exc),
                )
                # A server that stopped answering since the MGET is down for
                # the jobs queued behind this one too.
                self._link.call_failed(exc)
        return BatchOutcome(failed, num_bytes, failed, hints=hints)

    def _px(self, hint: float | None) -> int | None:
        """A value's expiry in ms: `ttl_s`, extended to the hint's end. Without
        `ttl_s` none: a TTL would make the value volatile, the first to go
        under the `volatile-*` eviction policies."""
        if self._ttl_ms is None or hint is None:
            return self._ttl_ms
        # A hint is any finite number of seconds; the server refuses an expiry
        # past its clock's range (a whole batch's SET, not just this value).
        return max(self._ttl_ms, math.ceil(min(hint * 1000, _LONGEST_EXPIRY_MS)))

    def _get_values(self, names: list[str]) -> list[bytes | None]:
        client = self._link.client
        # A cluster's MGET must stay within one slot; the non-atomic form asks
        # each node for its keys.
        if isinstance(client, RedisCluster):
            return cast(list[bytes | None], client.mget_nonatomic(names))
        return cast(list[bytes | None], client.mget(names))

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
        assert not self._jobs and not self._asking, "reset_cache with I/O in flight"
        self._known.clear()
        self._to_ask.clear()
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
        return bool(self._jobs or self._asking or self._to_ask or self._clear_running)

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


def _lifetime(pttl: object) -> float:
    """Seconds a value has left, from its `PTTL` reply: `math.inf` for no
    expiry (-1); 0 for an absent value (-2), one about to expire (0), and a
    check the server refused (an error reply is a miss)."""
    if isinstance(pttl, Exception):
        return 0.0
    ms = cast(int, pttl)
    return math.inf if ms == -1 else max(0, ms) / 1000

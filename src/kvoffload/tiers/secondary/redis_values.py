"""The Redis tier's commands, run on its I/O threads.

Each method is one pipelined batch of calls for a batch of chunks: the `PTTL`
checks behind lookups, the `SET NX` (and `PEXPIRE ... GT`) of stores, the
renewal of values a store finds held (their expiry, and under a later hint
their header: `redis_renewal`), and the checks of what `MGET` read. A
failed pipeline raises what redis-py raises; `RedisTier` turns that into the
server being down for a while (`RedisLink`), and an error reply for one command
fails only that command's chunk.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from typing import Any, cast

import redis
from redis.cluster import RedisCluster

from kvoffload.keys import OffloadKey, offload_key_group
from kvoffload.tiers.secondary.base import TierJob
from kvoffload.tiers.secondary.buffer import scatter
from kvoffload.tiers.secondary.codec import (
    CorruptChunkError,
    check_header,
    check_payload,
    decode_header,
    encode_header,
    header_size,
    payload_checksum,
)
from kvoffload.tiers.secondary.executor import BatchOutcome
from kvoffload.tiers.secondary.redis_link import REDIS_ERRORS, RedisLink
from kvoffload.tiers.secondary.redis_renewal import HeaderRead, renew_headers
from kvoffload.worker import ChunkBuffer

logger = logging.getLogger(__name__)

_LONGEST_EXPIRY_MS = 2**42
"""About 139 years: the longest expiry a hint gives a value."""


class RedisValues:
    """Chunk values under `prefix` on the server behind `link`."""

    def __init__(
        self,
        tier: str,
        link: RedisLink,
        prefix: str,
        fingerprint: str,
        buffer: ChunkBuffer,
        ttl_s: float | None,
    ) -> None:
        self._tier = tier
        self._link = link
        self._prefix = prefix
        self._fingerprint = fingerprint
        self._buffer = buffer
        self._ttl_ms = None if ttl_s is None else max(1, int(ttl_s * 1000))

    def name_of(self, key: OffloadKey) -> str:
        """The server-side name of a chunk: `<prefix>:<fingerprint>:<key hex>`."""
        return self._prefix + key.hex()

    def lifetimes(self, keys: list[OffloadKey]) -> list[float]:
        """Per key, the seconds its value has left (0: absent)."""
        pipe = self._link.client.pipeline(transaction=False)
        for key in keys:
            pipe.pttl(self.name_of(key))
        return [_lifetime(reply) for reply in self._link.execute(pipe)]

    def still_held(self, job: TierJob, checked: list[int]) -> list[int]:
        """Of `checked`, those whose value the server holds; their expiry is
        renewed (`ttl_s`, or the hint's end), never shortened: a value held
        under a longer hint keeps it (`PEXPIRE ... GT`, Redis 7 and Valkey;
        an older server refuses the option and the expiry stays as it is).
        Without `ttl_s` their LRU clock is renewed, as a `SET` would. A check
        the server refused counts as absent. A positive hint renews the
        value's header too (`redis_renewal`)."""
        if not checked:
            return []
        expiries = [self._px(job.hint(i)) for i in checked]
        pipe = self._link.client.pipeline(transaction=False)
        for i, px in zip(checked, expiries, strict=True):
            name = self.name_of(job.keys[i])
            self._read_header(pipe, job, i)
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
        held, reads = [], []
        now = time.time()
        for i, px in zip(checked, expiries, strict=True):
            read = self._header_read(job, i, replies, now)
            reply = next(replies)
            if px is not None:
                reply = next(replies)  # the PTTL's: the value's presence
                present = not isinstance(reply, Exception) and reply != -2
            else:
                present = not isinstance(reply, Exception) and bool(reply)
            if present:
                held.append(i)
                if read is not None:
                    reads.append(read)
        renew_headers(self._link, self._fingerprint, reads, now)
        return held

    def _read_header(self, pipe: Any, job: TierJob, i: int) -> None:
        """Queue the `GETRANGE` of the header of a value under a positive hint."""
        hint = job.hint(i)
        if hint is not None and hint > 0:
            key = job.keys[i]
            size = header_size(len(key), self._fingerprint)
            pipe.getrange(self.name_of(key), 0, size - 1)

    def _header_read(
        self, job: TierJob, i: int, replies: Iterator[Any], now: float
    ) -> HeaderRead | None:
        """The reply of `_read_header`'s `GETRANGE`, if one was queued."""
        hint = job.hint(i)
        if hint is None or not hint > 0:
            return None
        key = job.keys[i]
        return HeaderRead(key, self.name_of(key), now + hint, next(replies))

    def set_values(self, job: TierJob, indices: list[int]) -> BatchOutcome:
        """`SET` each chunk's header and payload unless the server has the key
        already (`NX`: a key names its bytes, and a corrupt value is deleted
        when read), whose expiry is then only extended (`PEXPIRE ... GT`): a
        value held under another engine's longer hint keeps it. A key of
        another type (no value of ours) is replaced. Raises what a failed
        pipeline raises."""
        sizes = []
        values: dict[int, tuple[str, bytes, int | None]] = {}
        pipe = self._link.client.pipeline(transaction=False)
        now = time.time()
        for i in indices:
            key = job.keys[i]
            parts = self._buffer.chunk_views(job.slots[i], offload_key_group(key))
            n = sum(len(part) for part in parts)
            hint = job.hint(i)
            crc = payload_checksum(parts)
            header = encode_header(key, self._fingerprint, n, crc, hint, now)
            value = b"".join((header, *parts))  # one allocation, one copy each
            name, px = self.name_of(key), self._px(hint)
            values[i] = (name, value, px)
            pipe.set(name, value, px=px, nx=True)
            if px is not None:
                pipe.pexpire(name, px, gt=True)
            self._read_header(pipe, job, i)  # of the value found there, if any
            sizes.append(n)
        replies = iter(self._link.execute(pipe))
        failed, full, held, num_bytes = [], [], [], 0
        reads: dict[int, HeaderRead] = {}
        for i, n in zip(indices, sizes, strict=True):
            reply = next(replies)
            _, _, px = values[i]
            if px is not None:
                next(replies)  # PEXPIRE GT's: an older server refuses GT
            read = self._header_read(job, i, replies, now)
            if read is not None and reply is None:
                reads[i] = read
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
            found = [reads[i] for i in held if i in reads]
            renew_headers(self._link, self._fingerprint, found, now)
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

    def _px(self, hint: float | None) -> int | None:
        """A value's expiry in ms: `ttl_s`, extended to the hint's end. Without
        `ttl_s` none: a TTL would make the value volatile, the first to go
        under the `volatile-*` eviction policies."""
        if self._ttl_ms is None or hint is None:
            return self._ttl_ms
        # A hint is any finite number of seconds; the server refuses an expiry
        # past its clock's range (a whole batch's SET, not just this value).
        return max(self._ttl_ms, math.ceil(min(hint * 1000, _LONGEST_EXPIRY_MS)))

    def get_values(self, names: list[str]) -> list[bytes | None]:
        client = self._link.client
        # A cluster's MGET must stay within one slot; the non-atomic form asks
        # each node for its keys.
        if isinstance(client, RedisCluster):
            return cast(list[bytes | None], client.mget_nonatomic(names))
        return cast(list[bytes | None], client.mget(names))

    def decode(
        self, job: TierJob, indices: tuple[int, ...], values: list[bytes | None]
    ) -> BatchOutcome:
        """The values `MGET` read for the chunks at `indices` into their slots.
        A value absent (evicted, expired, never there) or corrupt fails its
        chunk, which is reported removed; a corrupt one is deleted."""
        names = [self.name_of(job.keys[i]) for i in indices]
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
                logger.warning("%s: dropping chunk %s: %s", self._tier, name, exc)
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
                    self._tier,
                    self._link.redact(exc),
                )
                # A server that stopped answering since the MGET is down for
                # the jobs queued behind this one too.
                self._link.call_failed(exc)
        return BatchOutcome(failed, num_bytes, failed, hints=hints)


def _lifetime(pttl: object) -> float:
    """Seconds a value has left, from its `PTTL` reply: `math.inf` for no
    expiry (-1); 0 for an absent value (-2), one about to expire (0), and a
    check the server refused (an error reply is a miss)."""
    if isinstance(pttl, Exception):
        return 0.0
    ms = cast(int, pttl)
    return math.inf if ms == -1 else max(0, ms) / 1000

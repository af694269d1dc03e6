"""The file tier: chunks as checked files under a directory, with a byte capacity.

Stores and loads run on a thread pool that writes from, and reads into, the host
slots directly; their jobs are `file_jobs`'s, from submission to result. The index lives on the scheduler thread and is rebuilt from the
directory at start, so a restarted process finds the chunks of the previous run;
with `rescan_interval_s`, engines sharing the directory also find each other's.
Chunks keep their retention hints: the index orders evictions by them, and
each file's header holds its hint in Unix time, so a load (by this engine, after
a restart, or by another engine sharing the directory) hands it back to the
primary tier. A hint renewed later (a returning request's touch, or a cascade
of a chunk on disk already) is written into the header in place, on the I/O
threads, once it moves the deadline far enough (`file_renewals`). Files the
tier indexes without writing them (at a restart, or found by a rescan) start
unhinted; their headers are read on the rescan thread and the hints still live
apply from the next poll (`file_hints`). A chunk
failing any check on load is a miss and its file is deleted; something other
than a regular file at its path (a FIFO, say) is a miss and is left in place; a file that cannot be read for another reason (no free descriptors, say)
fails that load only. A disk that runs out of space lowers the tier's capacity
(`file_space`): later stores evict to make room.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace

from kvoffload.keys import OffloadKey, offload_key_group
from kvoffload.policies import create_policy
from kvoffload.policies.retention import DEFAULT_MAX_HINTED_SHARE
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
from kvoffload.tiers.secondary.codec import validate_fingerprint
from kvoffload.tiers.secondary.config import FileTierConfig
from kvoffload.tiers.secondary.executor import JobExecutor
from kvoffload.tiers.secondary.file_batches import FileBatches
from kvoffload.tiers.secondary.file_hints import HintReader
from kvoffload.tiers.secondary.file_index import FileIndex
from kvoffload.tiers.secondary.file_io import ChunkFiles, chunk_file_size
from kvoffload.tiers.secondary.file_jobs import FileJobs
from kvoffload.tiers.secondary.file_renewals import HeaderRenewals
from kvoffload.tiers.secondary.file_rescan import Rescanner
from kvoffload.tiers.secondary.file_scan import ScannedFile
from kvoffload.tiers.secondary.file_space import TierSpace
from kvoffload.worker import ChunkBuffer

logger = logging.getLogger(__name__)

_KEY_LEN = 36
"""Bytes of an `OffloadKey` of a SHA-256 block hash and a 4-byte group index."""


def _chunk_files(config: FileTierConfig, fingerprint: str) -> ChunkFiles:
    """The tier's directory, made (privately) and found writable."""
    try:
        files = ChunkFiles(
            config.path,
            fingerprint,
            config.fsync,
            file_mode=config.file_mode,
            capacity=config.capacity_bytes,
        )
        files.check_writable()
    except OSError as exc:
        # Every store would fail: a setting to fix before serving.
        raise ValueError(
            f"file tier {config.name!r}: path: {config.path!r} is not usable "
            f"({exc}); expected a directory this process can create and "
            "write files in"
        ) from exc
    return files


class FileTier(SecondaryTier):
    """A directory of chunk files (see `ChunkFiles`) with a capacity in bytes."""

    def __init__(
        self,
        config: FileTierConfig,
        buffer: ChunkBuffer,
        fingerprint: str,
        clock: Clock = time.monotonic,
        max_hinted_share: float = DEFAULT_MAX_HINTED_SHARE,
    ) -> None:
        super().__init__(
            config.name,
            "storage",
            config.locality,
            config.offload_policy,
            config.max_inflight_chunks,
            write_back=config.write == "back",
        )
        self.config = config
        self._buffer = buffer
        fingerprint = validate_fingerprint(fingerprint)
        # The largest chunk file (a whole slot); a tier that cannot hold one
        # could never serve a prefix, so it is a start-up error, not a silent miss.
        largest = self._largest = chunk_file_size(
            _KEY_LEN, fingerprint, buffer.slot_nbytes
        )
        if config.capacity_bytes < largest:
            raise ValueError(
                f"file tier {config.name!r}: capacity: {config.capacity_bytes!r} "
                "bytes cannot hold one chunk file of this model and layout; "
                f"expected at least {largest} bytes"
            )
        self._files = _chunk_files(config, fingerprint)
        self._files.remove_leftovers()
        self._capacity_chunks = config.capacity_bytes // largest
        self._index = FileIndex(
            config.capacity_bytes,
            create_policy(config.eviction_policy, self._capacity_chunks),
            clock,
            max_hinted_share,
        )
        self._executor = JobExecutor(config.name, config.num_threads)
        # Rescans get a thread of their own: a walk of a large shared directory
        # never holds up a job, nor `drain` (a reset voids it instead).
        self._rescans = JobExecutor(f"{config.name}-rescan", 1)
        self._stats = TierStats(capacity=self._capacity_chunks)
        kept = self._rebuild_index()
        self._record_event(kept, False)  # readable from the start
        self._hint_reader = HintReader(self._files, self._rescans)
        self._renewals = HeaderRenewals(self._files, self._index, self._executor)
        self._hint_reader.read_later(kept)
        self._rescan = (
            Rescanner(self._files, self._rescans, config.rescan_interval_s, kept, clock)
            if config.rescan_interval_s
            else None
        )
        self._space = TierSpace(
            config.name, self._files.directory, config.capacity_bytes, largest, clock
        )
        self._space.start(self.used_bytes)
        self._index.capacity_bytes = self.capacity_bytes
        io = FileBatches(config.name, self._files, buffer, self._space, self._file_size)
        self._jobs = FileJobs(
            self._index,
            io,
            self._executor,
            self._stats,
            self._renewals,
            self._space,
            self._file_size,
            self._record_event,
            self._capacity_in_force,
        )

    @property
    def used_bytes(self) -> int:
        """Bytes of chunk files present or being written."""
        return self._index.used_bytes

    @property
    def capacity_bytes(self) -> int:
        """The capacity in force: the configured one, less where the file
        system holds less (see `file_space`), less the bytes other engines'
        files take in the directory (see `_capacity_in_force`)."""
        return self._capacity_in_force()

    def _capacity_in_force(self, adopting: int = 0) -> int:
        """What this tier may index: the directory's ledger counts every
        engine's files, so the capacity less what it counts beyond this
        tier's own (indexed, or evicted and not yet removed) is the room this
        tier has, never less than one chunk file (a tier holding none would
        never write, and so never see the ledger again). `adopting`: bytes of
        a file about to be indexed that the ledger counts already. Between
        two readings of the ledger this is an estimate; the ledger itself
        refuses what would not fit."""
        capacity = self._space.capacity_bytes
        total = self._files.directory_bytes
        if total is not None:
            index = self._index
            others = total - index.used_bytes - index.deleting_bytes - adopting
            capacity = min(capacity, self.config.capacity_bytes - max(0, others))
        return max(capacity, min(self._largest, self._space.capacity_bytes))

    def chunk_path(self, key: OffloadKey) -> str:
        """Where the file of `key` lives (whether or not it exists)."""
        return self._files.path(key)

    def _payload_len(self, key: OffloadKey) -> int | None:
        """The payload size of `key`'s group, or `None` for a group the buffer
        lacks (a file found on disk may name any): buffers say so with
        `ValueError`, `IndexError` or `KeyError` (the host pool's geometry)."""
        try:
            return self._buffer.chunk_nbytes(offload_key_group(key))
        except (ValueError, LookupError):
            return None

    def _has_expected_size(self, scanned: ScannedFile) -> bool:
        payload = self._payload_len(scanned.key)
        return payload is not None and scanned.size == self._files.file_size(
            scanned.key, payload
        )

    def _rebuild_index(self) -> list[OffloadKey]:
        """Index the files in place at start (oldest first), evicting (and
        counting) the oldest beyond capacity; returns the keys still indexed."""
        found = sorted(self._files.scan(remove_abandoned=True), key=lambda f: f.mtime)
        kept: list[OffloadKey] = []
        dropped = 0
        for scanned in found:
            if not self._has_expected_size(scanned):
                self._files.delete(scanned.key)  # truncated, or another layout
                dropped += 1
                continue
            reservation = self._index.add_existing(scanned.key, scanned.size)
            for victim in reservation.victims:
                self._files.delete(victim)
            self._index.deleted(reservation.victims)
            self._stats.evictions += len(reservation.victims)
            if reservation.ok:
                kept.append(scanned.key)
            else:
                self._files.delete(scanned.key)
        # A key kept early may be a later file's victim: announcing it would
        # tell routers of a chunk that is gone, with no removed event to follow.
        kept = [key for key in kept if self._index.is_readable(key)]
        if found:
            logger.info(
                "%s: found %d chunk files in %s (%d bytes, %d dropped)",
                self.name,
                self._index.num_readable,
                self._files.directory,
                self._index.used_bytes,
                dropped,
            )
        return kept

    def _adopt_shared(self, rescan: Rescanner) -> None:
        """Index the files other engines wrote since the last rescan; evict for
        them as for a store (an unreadable one is a miss on load, as ever); drop
        the readable chunks whose files other engines deleted. Announces as
        stored only the found chunks still indexed at the end of the pass."""
        found, deleted, vanished = rescan.poll()
        if deleted:
            self._index.deleted(deleted)
        if vanished:
            # A chunk written again since the scan looked is dropped too; its
            # file is then new to the next scan, which indexes it again.
            gone = [key for key in vanished if self._index.forget(key)]
            self._record_event(gone, True)
        adopted: list[OffloadKey] = []
        victims: list[OffloadKey] = []
        for scanned in found:
            key = scanned.key
            if self._index.is_known(key) or not self._has_expected_size(scanned):
                continue  # ours, or not what this tier's layout writes: left alone
            # Its bytes are in the ledger already: indexing it takes no room.
            self._index.capacity_bytes = self._capacity_in_force(scanned.size)
            reservation = self._index.add_existing(key, scanned.size)
            victims += reservation.victims
            if reservation.ok:
                adopted.append(key)
                self._renewals.found(key)
        self._index.capacity_bytes = self.capacity_bytes
        if victims:
            self._stats.evictions += len(victims)
            # A file adopted early in this pass may be a later one's victim:
            # routers never heard of it, so no removed event, nor a stored one.
            unannounced = set(adopted)
            self._record_event([k for k in victims if k not in unannounced], True)
            rescan.delete(victims)
            adopted = [key for key in adopted if self._index.is_readable(key)]
        if adopted:
            self._record_event(adopted, False)
            self._hint_reader.read_later(adopted)
            logger.debug(
                "%s: found %d chunk files of other engines", self.name, len(adopted)
            )

    # -- scheduler-thread API ----------------------------------------------------

    def holds(self, key: OffloadKey) -> bool:
        return self._index.holds(key)

    def lookup(self, key: OffloadKey, ctx: ReqContext) -> LookupResult:
        self._stats.lookups += 1
        if self._index.is_readable(key):
            self._stats.hits += 1
            return LookupResult.HIT
        return LookupResult.MISS

    def submit_store(self, job: TierJob) -> None:
        self._jobs.submit_store(job)

    def submit_load(self, job: TierJob) -> None:
        self._jobs.submit_load(job)

    def _file_size(self, key: OffloadKey) -> int:
        payload = self._payload_len(key)
        assert payload is not None, "a stored key without a chunk size"
        return self._files.file_size(key, payload)

    def _take_read_hints(self) -> None:
        """Apply the hints read from the headers of files this tier did not
        write, to chunks still indexed that no request has hinted since."""
        found = self._hint_reader.take()
        if not found:
            return
        now, index = time.time(), self._index
        for key, until in found:
            if not index.is_readable(key):
                continue
            self._renewals.read(key, until)
            if index.hints.hint_of(key) is not None:
                continue
            left = 0.0 if until == 0.0 else until - now
            if until == 0.0 or left > 0:  # an expired hint is no hint
                index.retain((key,), left)

    def get_finished_jobs(self) -> list[TierJobResult]:
        self._renewals.finish()
        if self._rescan is not None:
            self._adopt_shared(self._rescan)
        self._take_read_hints()
        self._space.poll(self._index.used_bytes, self._rescans.submit_call)
        self._index.capacity_bytes = self.capacity_bytes
        return self._jobs.take_finished()

    def touch(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        """Recency, and the request's positive retention hint from now, as in
        the primary tier: a conversation that comes back renews its prefix's
        hint in every tier, not only in host memory. A 0 arrives with the
        cascade instead (`TierJob.hints`), as host memory cut it: past the last
        point where requests branch, so not on a prefix others share."""
        self._index.touch(keys)
        hint = ctx.params.retention_s
        if hint is not None and hint > 0:
            self._index.retain(keys, hint)
            self._renewals.request(keys, hint)

    def on_schedule_end(self) -> None:
        """Renewed hints reach the headers of their files (`file_renewals`)."""
        self._renewals.flush()

    def has_pending_work(self) -> bool:
        # Files evicted for a rescan's finds, not yet reported deleted: their
        # keys cannot be stored again until a step hears of it.
        deleting = self._rescan is not None and self._rescan.deleting()
        return self._jobs.pending() or deleting or self._renewals.busy()

    def drain(self) -> None:
        """Waits for jobs only: a rescan in progress is voided by `reset_cache`,
        and files it deletes stay known (never written) until reported."""
        self._executor.drain()

    def reset_cache(self) -> None:
        """Forget every chunk and remove the fingerprint's directory at once
        (`ChunkFiles.remove_all`): files other engines put there go too, and a
        restarted engine or a rescan finds none of them."""
        assert not self._jobs.pending(), "reset_cache with jobs in flight"
        self._executor.drain()  # header renewals: a few writes at most
        self._renewals.finish()
        self._renewals.clear()
        self._record_event(self._index.clear(), True)
        self._hint_reader.reset()
        self._files.remove_all()
        if self._rescan is not None:
            # After the old directory is renamed aside: a rescan that begins
            # before that belongs to the generation this voids.
            self._rescan.reset()

    def shutdown(self) -> None:
        self._executor.shutdown()
        self._rescans.shutdown()
        self._files.close()

    def get_stats(self) -> TierStats:
        hints = self._index.hints
        return replace(
            self._stats,
            occupancy=self._index.num_readable,
            capacity=self.capacity_bytes // self._largest,
            hinted_chunks=hints.num_hinted(),
            hint_room=hints.hint_room,
            hints_honoured=hints.counts.honoured,
            hints_expired_unused=hints.counts.expired_unused,
            hints_dropped=hints.counts.dropped,
        )

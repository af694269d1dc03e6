"""Renewed retention hints written into chunk files' headers (when: see
`header_renewal`), so that a restarted engine, or another engine sharing the
directory, reads the renewed deadline, not the first store's.

On the scheduler thread, `HeaderRenewals` knows per indexed chunk the deadline
its header holds (as this tier wrote it, or as `file_hints` read it; not known
for a file found on disk until then), collects the renewals a step asks for
(`request`: touches, and cascades of chunks already on disk) and at the step's
end (`flush`) hands those due, in batches, to the tier's I/O threads. Each
chunk is pinned until its write is done (`finish`): not evicted under it, so
its file is neither deleted nor reused for another chunk meanwhile. A chunk
being loaded waits for a later step, so that its read does not meet a header
half written; a load that does (submitted under the write, or another
engine's) reads a header failing its checksum once more before it gives up
on the file (`ChunkFiles.read_hinted`).

On an I/O thread, `renew_file_deadline` opens the file without creating it (a
file deleted meanwhile stays deleted), takes an advisory lock on it (two
engines renewing one file do not interleave; a locked file is skipped), reads
and checks its header (this chunk's, format 2, its deadline not as late
already) and writes the renewed header in place: one write of the header's
bytes, about a hundred, within the file's first block; the payload is not
touched. Anything else (the file gone, not a regular file, not writable, a
header failing its checks, format 1, a failed write) leaves the file as it was
and is no error: the header keeps the earlier deadline. The renewed header keeps
the payload checksum it replaces, so whatever happens to the file meanwhile it
cannot make bytes it does not describe load: at worst a miss (SPEC §4).
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial

from kvoffload.keys import OffloadKey
from kvoffload.tiers.secondary.codec import (
    CorruptChunkError,
    check_header,
    header_size,
    renew_header,
)
from kvoffload.tiers.secondary.executor import JobExecutor
from kvoffload.tiers.secondary.file_access import check_regular, open_file
from kvoffload.tiers.secondary.file_index import FileIndex
from kvoffload.tiers.secondary.file_io import ChunkFiles
from kvoffload.tiers.secondary.header_renewal import renewal_due, renewal_floor

BATCH = 256
"""Headers rewritten per call on an I/O thread: jobs queued behind wait little."""
_PRUNE_MIN = 4096
"""Deadlines known before the first pruning of chunks no longer indexed."""


def renew_file_deadline(
    files: ChunkFiles, key: OffloadKey, until: float, now: float
) -> bool:
    """Rewrite the header of `key`'s file to hold the deadline `until` (Unix
    seconds) if `renewal_due` says so at Unix time `now`; whether it did."""
    path = files.path(key)
    try:
        fd = open_file(path, os.O_RDWR)  # never O_CREAT: nothing is resurrected
    except OSError:
        return False
    try:
        check_regular(fd, path)
        # Released by the close; BlockingIOError (an OSError) when held.
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        head = os.pread(fd, header_size(len(key), files.fingerprint), 0)
        renewed = renew_header(head, until)
        if renewed is None:
            return False
        header, new = renewed
        check_header(header, key, files.fingerprint, header.payload_len)
        if not renewal_due(header.hint_until or 0.0, until, now):
            return False
        # A short write leaves a header failing its checksum: a miss.
        return os.pwrite(fd, new, 0) == len(new)
    except (OSError, CorruptChunkError):
        return False
    finally:
        os.close(fd)


class HeaderRenewals:
    """The renewals of one file tier's headers (see the module docstring)."""

    def __init__(
        self,
        files: ChunkFiles,
        index: FileIndex,
        executor: JobExecutor,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._files = files
        self._index = index
        self._executor = executor
        self._wall_clock = wall_clock
        self._stored: dict[OffloadKey, float] = {}
        """Per chunk, the deadline its header holds (0.0: none); absent: not known."""
        self._due: dict[OffloadKey, float] = {}
        self._lock = threading.Lock()
        self._done: list[OffloadKey] = []
        self._pinned = 0
        self._prune_at = _PRUNE_MIN

    def wrote(self, key: OffloadKey, hint: float | None) -> None:
        """A store of `key` under `hint` (seconds from now, 0, `None`) began."""
        now = self._wall_clock()
        self._stored[key] = now + hint if hint is not None and hint > 0 else 0.0

    def found(self, key: OffloadKey) -> None:
        """`key`'s file was found on disk: what its header holds is not known."""
        self._stored.pop(key, None)

    def read(self, key: OffloadKey, until: float) -> None:
        """`key`'s header was read to hold `until`, unless written since."""
        self._stored.setdefault(key, until)

    def request(self, keys: Sequence[OffloadKey], hint: float) -> None:
        """The readable of `keys` are now under `hint` (> 0 seconds): each
        header whose deadline that moves far enough is rewritten at `flush`."""
        now = self._wall_clock()
        until = now + hint
        if not renewal_due(None, until, now):
            return  # a hint too long to be a time
        # `renewal_due` inlined: one comparison per key on the scheduler thread
        floor = renewal_floor(until, now)
        stored, due, readable = self._stored, self._due, self._index.is_readable
        for key in keys:
            held = stored.get(key)
            if (held is None or held < floor) and readable(key):
                due[key] = max(until, due.get(key, 0.0))

    def flush(self) -> None:
        """Hand the renewals due to the I/O threads (at a step's end)."""
        if not self._due:
            return
        index = self._index
        ready: list[tuple[OffloadKey, float]] = []
        waiting: dict[OffloadKey, float] = {}
        for key, until in self._due.items():
            if not index.is_readable(key):
                continue  # evicted, or written again: its store wrote a hint
            if index.is_pinned(key):
                waiting[key] = until  # being read: not under a read
                continue
            index.pin(key)
            self._stored[key] = until
            ready.append((key, until))
        self._due = waiting
        self._pinned += len(ready)
        for start in range(0, len(ready), BATCH):
            run = partial(self._write, tuple(ready[start : start + BATCH]))
            self._executor.submit_call("retention hint renewals", run)
        self._prune()

    def finish(self) -> None:
        """Unpin the chunks whose header writes are done."""
        with self._lock:
            done, self._done = self._done, []
        for key in done:
            self._index.unpin(key)
        self._pinned -= len(done)

    def busy(self) -> bool:
        """Whether header writes are in flight or not yet finished."""
        return self._pinned > 0

    def clear(self) -> None:
        """Forget every deadline (a reset); writes in flight must be finished."""
        assert not self._pinned, "clear with header writes in flight"
        self._stored.clear()
        self._due.clear()

    def _prune(self) -> None:
        """Forget, now and then, the deadlines of chunks no longer indexed."""
        if len(self._stored) < self._prune_at:
            return
        holds = self._index.holds
        self._stored = {k: v for k, v in self._stored.items() if holds(k)}
        self._prune_at = max(_PRUNE_MIN, 2 * len(self._stored))

    # -- on an I/O thread ----------------------------------------------------------

    def _write(self, batch: tuple[tuple[OffloadKey, float], ...]) -> None:
        try:
            now = self._wall_clock()
            for key, until in batch:
                renew_file_deadline(self._files, key, until, now)
        finally:
            with self._lock:
                self._done.extend(key for key, _ in batch)

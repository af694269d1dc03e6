"""Retention hints read back from chunk files' headers, for the files a file tier
indexes without having written them: those a previous run left (a restart) and
those other engines sharing the directory wrote (a rescan).

A scan reads entries' status only, so it cannot know a file's hint; reading
every header on the scheduler thread would cost a read per file at start. The
headers are read instead on the tier's rescan thread, in batches, and the
scheduler thread takes what was found at its next poll (`HintReader.take`),
keeping a hint only for a chunk still indexed and not hinted since. A header
that cannot be read or fails its checks gives no hint: the chunk's load finds
out whether it is usable, as ever.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from functools import partial

from kvoffload.keys import OffloadKey
from kvoffload.tiers.secondary.codec import (
    CorruptChunkError,
    check_header,
    decode_header,
    header_size,
)
from kvoffload.tiers.secondary.executor import JobExecutor
from kvoffload.tiers.secondary.file_access import check_regular, open_file
from kvoffload.tiers.secondary.file_io import ChunkFiles

BATCH = 1024
"""Headers read per call on the rescan thread, so that its other calls (rescans,
disk-space checks) are not held up by a large directory's."""


def read_hint_until(files: ChunkFiles, key: OffloadKey) -> float | None:
    """The hint in the header of `key`'s file: its deadline in Unix seconds,
    0.0 for "hinted 0", or `None` (no hint, format 1, or a file that cannot be
    read or is not this chunk's)."""
    path = files.path(key)
    try:
        fd = open_file(path, os.O_RDONLY)  # never blocks on a FIFO
        try:
            check_regular(fd, path)
            head = os.pread(fd, header_size(len(key), files.fingerprint), 0)
        finally:
            os.close(fd)
        header = decode_header(head)
        check_header(header, key, files.fingerprint, header.payload_len)
    except (OSError, CorruptChunkError):
        return None
    return header.hint_until


class HintReader:
    """Reads the hints of files on `executor` (`read_later`); the scheduler
    thread takes them (`take`). `reset` voids reads in flight (a reset of the
    tier: their keys may be written again, under other hints)."""

    def __init__(self, files: ChunkFiles, executor: JobExecutor) -> None:
        self._files = files
        self._executor = executor
        self._lock = threading.Lock()
        self._found: list[tuple[OffloadKey, float]] = []
        self._generation = 0

    def read_later(self, keys: Sequence[OffloadKey]) -> None:
        for start in range(0, len(keys), BATCH):
            batch = tuple(keys[start : start + BATCH])
            run = partial(self._read, batch, self._generation)
            self._executor.submit_call("retention hints", run)

    def _read(self, keys: tuple[OffloadKey, ...], generation: int) -> None:
        found = []
        for key in keys:
            until = read_hint_until(self._files, key)
            if until is not None:
                found.append((key, until))
        with self._lock:
            if generation == self._generation:
                self._found.extend(found)

    def take(self) -> list[tuple[OffloadKey, float]]:
        """(key, deadline) pairs read since the last call (0.0: hinted 0)."""
        with self._lock:
            found, self._found = self._found, []
        return found

    def reset(self) -> None:
        with self._lock:
            self._generation += 1
            self._found = []

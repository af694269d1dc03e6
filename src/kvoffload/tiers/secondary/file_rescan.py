"""Finding the chunk files other engines write into a file-tier directory they share.

A rescan walks the directory on a thread of its own, never on the scheduler
thread nor among the tier's jobs, and keeps the set of keys it saw; what it
hands over is only the files that appeared since the previous scan and the keys
whose files disappeared (another engine evicted them), so the scheduler thread's
share of the work grows with what other engines did, not with the directory's
size.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from functools import partial
from typing import NamedTuple

from kvoffload.keys import OffloadKey
from kvoffload.tiers.secondary.base import Clock
from kvoffload.tiers.secondary.executor import JobExecutor
from kvoffload.tiers.secondary.file_io import ChunkFiles
from kvoffload.tiers.secondary.file_scan import ScannedFile

logger = logging.getLogger(__name__)


class ScanNews(NamedTuple):
    """What changed in the directory since the last poll."""

    found: list[ScannedFile]  # new files, oldest first
    deleted: list[OffloadKey]  # files `Rescanner.delete` removed
    vanished: list[OffloadKey]  # files gone that this rescanner did not delete


class Rescanner:
    """Rescans a chunk directory every `interval_s` (one scan at a time) on
    `executor` and deletes there the files of chunks evicted to make room for
    what it found."""

    def __init__(
        self,
        files: ChunkFiles,
        executor: JobExecutor,
        interval_s: float,
        known: Iterable[OffloadKey],
        clock: Clock = time.monotonic,
    ) -> None:
        self._files = files
        self._clock = clock
        self._executor = executor
        self._interval_s = interval_s
        self._seen = set(known)  # keys of the previous scan
        self._lock = threading.Lock()
        self._found: list[ScannedFile] = []
        self._deleted: list[OffloadKey] = []
        self._vanished: list[OffloadKey] = []
        self._scanning = False
        self._due = clock() + interval_s
        self._generation = 0  # bumped by `reset`: older scans are void
        self._unreported = 0  # keys `delete` took that `poll` has not reported

    def poll(self) -> ScanNews:
        """On the scheduler thread: what changed since the last poll; starts a
        scan when one is due."""
        now = self._clock()
        with self._lock:
            found, self._found = self._found, []
            deleted, self._deleted = self._deleted, []
            vanished, self._vanished = self._vanished, []
            start = not self._scanning and now >= self._due
            if start:
                self._scanning = True
                self._due = now + self._interval_s
        if start:
            self._executor.submit_call("rescan", self._scan)
        self._unreported -= len(deleted)
        return ScanNews(found, deleted, vanished)

    def reset(self) -> None:
        """The directory was emptied: forget what earlier scans saw and found. A
        scan still running reports nothing (it may have listed the old files)."""
        with self._lock:
            self._generation += 1
            self._seen = set()
            self._found.clear()
            self._vanished.clear()

    def deleting(self) -> bool:
        """Whether some files `delete` took are not yet reported by `poll`."""
        return self._unreported > 0

    def delete(self, keys: Sequence[OffloadKey]) -> None:
        """Remove the files of `keys` on the executor; `poll` reports them when
        gone."""
        self._unreported += len(keys)
        self._executor.submit_call("delete", partial(self._delete, tuple(keys)))

    # -- on the executor ---------------------------------------------------------

    def _scan(self) -> None:
        with self._lock:
            generation, seen = self._generation, self._seen
        new: list[ScannedFile] = []
        gone: list[OffloadKey] = []
        keys: set[OffloadKey] | None = None
        try:
            found = list(self._files.scan())  # other engines' writes stay
            new = sorted((f for f in found if f.key not in seen), key=lambda f: f.mtime)
            keys = {f.key for f in found}
            # Files this rescanner deleted are reported by `_delete` already;
            # reporting them again is harmless (the index no longer has them).
            gone = [k for k in seen if k not in keys]
        except OSError as exc:
            logger.warning("rescan of %s failed: %s", self._files.directory, exc)
        finally:
            with self._lock:
                if generation == self._generation:
                    self._found.extend(new)
                    self._vanished.extend(gone)
                    if keys is not None:
                        self._seen = keys
                self._scanning = False

    def _delete(self, keys: tuple[OffloadKey, ...]) -> None:
        try:
            for key in keys:
                self._files.delete(key)
        finally:
            with self._lock:
                self._deleted.extend(keys)

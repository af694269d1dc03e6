"""The bytes of a file-tier directory, counted in one file that every engine
writing there changes under an exclusive lock, so that the directory's capacity
holds however many engines share it.

The ledger, `<fingerprint directory>/.space`, counts per subdirectory (the 4,096
`abc` directories, and the top level) the bytes of the chunk files and
temporary files in it. A file tier changes those entries only inside a *hold*
(`SpaceLedger.hold`: the lock taken, the counts read): it creates a temporary
file only where the total stays within its capacity (`DirectoryFullError`
otherwise), and counts what it renames into place, reuses, replaces and
deletes. Within a hold the counts grow before a file is made and shrink after
one is gone, so a process killed in a hold leaves the ledger counting more than
the directory holds, never less: the bound still holds. Scans (at start-up and
rescans) recount each subdirectory they list inside a hold, which corrects
such excess and files deleted by hand.

The lock is `flock` on the ledger, which excludes other processes on this host
and, on network file systems that support it (NFSv4, CephFS, Lustre with
`flock`), on other hosts; threads and tiers of one process take a lock of the
process first (`flock` over NFS is a per-process lock).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import struct
import threading
from collections.abc import Callable, Iterator
from functools import partial

import numpy as np
import numpy.typing as npt

from kvoffload.tiers.secondary.file_access import (
    check_regular,
    make_directories,
    open_file,
    set_file_mode,
)

logger = logging.getLogger(__name__)

LEDGER_NAME = ".space"
TOP_SLOT = 4096
"""The slot of the directory's own files (the start-up probe); `abc` is slot
`int("abc", 16)`."""
_SLOTS = TOP_SLOT + 1
_MAGIC = b"KVSPACE1"
_COUNT = np.dtype("<u8")
_COUNT_FORMAT = struct.Struct("<Q")
_LEDGER_SIZE = len(_MAGIC) + _COUNT_FORMAT.size * _SLOTS
"""A mark, then a little-endian 64-bit count per slot: 32,784 bytes, of which
a file system stores only the pages of slots in use (a sparse file)."""
_REOPENS = 8
"""Ledgers replaced while this process waited for the lock (resets of the
directory) before a hold gives up."""


class DirectoryFullError(OSError):
    """A new file would take the directory past its capacity: the other
    engines' files and this one's fill it."""

    def __init__(self, total: int, size: int, capacity: int) -> None:
        super().__init__(
            errno.ENOSPC,
            f"the directory holds {total:,} bytes: {size:,} more would pass "
            f"its capacity of {capacity:,}",
        )
        self.total = total


def slot_of(directory: str, path: str) -> int:
    """The ledger slot that counts `path`, an entry of `directory` or of one
    of its `abc` subdirectories."""
    parent = os.path.dirname(path)
    if parent == directory:
        return TOP_SLOT
    return int(os.path.basename(parent), 16)


def subdirectory_slot(name: str) -> int | None:
    """The slot of the subdirectory `name`, or `None` for a name no chunk
    path has."""
    if len(name) != 3 or name.strip("0123456789abcdef"):
        return None
    return int(name, 16)


class LedgerBook:
    """The counts of a ledger inside a hold. Counts that grow are written at
    once, before the caller makes the file they are for; counts that shrink
    are written when the hold ends, after the caller removed what they were
    for: a process killed between the two leaves more counted, never less."""

    def __init__(
        self,
        counts: npt.NDArray[np.uint64],
        capacity: int,
        write: Callable[[int, int], None],
    ) -> None:
        self._counts = counts
        self._capacity = capacity
        self._write = write
        self.total = int(counts.sum())
        self._dirty: set[int] = set()

    @property
    def changed(self) -> bool:
        return bool(self._dirty)

    def reserve(self, slot: int, size: int) -> None:
        """Count `size` bytes more in `slot`, for a file about to be made;
        `DirectoryFullError` where the total would pass the capacity."""
        if self.total + size > self._capacity:
            raise DirectoryFullError(self.total, size, self._capacity)
        self.add(slot, size)

    def add(self, slot: int, delta: int) -> None:
        """Count `delta` bytes more (or fewer) in `slot`, never below zero."""
        if delta:
            self.recount(slot, max(0, int(self._counts[slot]) + delta))
            if delta > 0:
                self.flush()

    def recount(self, slot: int, nbytes: int) -> None:
        """`slot` holds `nbytes` (just counted under this hold)."""
        before = int(self._counts[slot])
        if before != nbytes:
            self._counts[slot] = nbytes
            self.total += nbytes - before
            self._dirty.add(slot)

    def keep_only(self, slots: set[int]) -> None:
        """The subdirectories of the other slots are gone: they hold nothing
        (the directory's own slot is left to `recount`)."""
        for slot in np.flatnonzero(self._counts[:TOP_SLOT]):
            if int(slot) not in slots:
                self.recount(int(slot), 0)

    def flush(self) -> None:
        """Write the changed counts now; raises the `OSError` of a failed
        write (those not written stay to write)."""
        for slot in sorted(self._dirty):
            self._write(slot, int(self._counts[slot]))
            self._dirty.discard(slot)


_process_locks: dict[str, threading.Lock] = {}
_process_locks_lock = threading.Lock()


def _process_lock(path: str) -> threading.Lock:
    """One lock per ledger path in this process, whichever tier holds it."""
    with _process_locks_lock:
        return _process_locks.setdefault(os.path.realpath(path), threading.Lock())


class SpaceLedger:
    """The ledger of `directory` for a tier of `capacity` bytes. `count_all`
    counts the directory's files from scratch (per slot), for a ledger that is
    new, unreadable or not one (deleted or damaged by hand)."""

    def __init__(
        self,
        directory: str,
        capacity: int,
        file_mode: int,
        directory_mode: int,
        count_all: Callable[[], list[int]],
    ) -> None:
        self.directory = directory
        self.path = os.path.join(directory, LEDGER_NAME)
        self.capacity = capacity
        self._file_mode = file_mode
        self._directory_mode = directory_mode
        self._count_all = count_all
        self._lock = _process_lock(self.path)
        self._fd: int | None = None
        self._mark = bytearray(len(_MAGIC))
        self._counts = np.zeros(_SLOTS, _COUNT)
        self.total: int | None = None
        """The total of the latest hold: the directory's bytes as last seen."""

    @contextlib.contextmanager
    def hold(self) -> Iterator[LedgerBook]:
        """The ledger locked and read. Raises `OSError` where it cannot be
        locked or read, or a count that grows cannot be written: the caller
        then makes no file."""
        with self._lock:
            fd, size = self._locked()
            try:
                counts = self._read(fd, size)
                book = LedgerBook(counts, self.capacity, partial(_write, fd))
                try:
                    yield book
                finally:
                    self._end(book)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def _end(self, book: LedgerBook) -> None:
        self.total = book.total
        if not book.changed:
            return
        try:
            book.flush()
        except OSError as exc:
            # Only shrinking counts are left to write: the ledger counts more
            # than there is until a scan recounts.
            logger.warning("cannot write %s: %s", self.path, exc)

    def forget(self) -> None:
        """The directory was replaced (a reset): the total seen is unknown
        until the next hold."""
        self.total = None

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def _locked(self) -> tuple[int, int]:
        """The ledger's descriptor, locked, and its size: the file now at `path`. One that
        was renamed aside (with its directory, by a reset) or removed while
        this process waited is closed and the one in its place opened."""
        for _ in range(_REOPENS):
            if self._fd is None:
                self._fd = self._open()
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                now = os.stat(self.path, follow_symlinks=False)
            except FileNotFoundError:
                now = None
            mine = os.fstat(self._fd)
            if now is not None and (now.st_dev, now.st_ino) == (
                mine.st_dev,
                mine.st_ino,
            ):
                return self._fd, mine.st_size
            os.close(self._fd)  # releases the lock
            self._fd = None
        raise OSError(errno.EAGAIN, "the ledger kept being replaced", self.path)

    def _open(self) -> int:
        flags = os.O_RDWR | os.O_CREAT
        try:
            fd = open_file(self.path, flags, self._file_mode)
        except FileNotFoundError:  # the directory was removed: made again
            make_directories(self.directory, self._directory_mode)
            fd = open_file(self.path, flags, self._file_mode)
        try:
            set_file_mode(fd, check_regular(fd, self.path), self._file_mode)
        except OSError:
            os.close(fd)
            raise
        return fd

    def _read(self, fd: int, size: int) -> npt.NDArray[np.uint64]:
        """The counts (in a buffer reused by every hold); a file that is not a
        ledger (new and empty, cut short, damaged by hand) is counted afresh
        and made one, its counts written before its mark, so that one left
        half written is counted again."""
        counts = self._counts
        if size == _LEDGER_SIZE:
            got = os.preadv(fd, [self._mark, counts.data.cast("B")], 0)
            if got == _LEDGER_SIZE and self._mark == _MAGIC:
                return counts
        counts[:] = self._count_all()
        os.ftruncate(fd, 0)
        os.ftruncate(fd, _LEDGER_SIZE)  # zeros, which take no room until written
        for slot in np.flatnonzero(counts):
            _write(fd, int(slot), int(counts[slot]))
        _pwrite(fd, _MAGIC, 0)
        return counts


def _write(fd: int, slot: int, count: int) -> None:
    _pwrite(fd, _COUNT_FORMAT.pack(count), len(_MAGIC) + _COUNT_FORMAT.size * slot)


def _pwrite(fd: int, data: bytes, offset: int) -> None:
    if os.pwrite(fd, data, offset) != len(data):
        raise OSError(errno.EIO, "short write of the ledger")


class NoLedger:
    """Stands in for a ledger where there is none: holds count nothing and
    refuse nothing."""

    total: int | None = None

    @contextlib.contextmanager
    def hold(self) -> Iterator[LedgerBook]:
        yield LedgerBook(np.zeros(_SLOTS, _COUNT), 2**63, lambda slot, count: None)

    def forget(self) -> None:
        pass

    def close(self) -> None:
        pass


NO_LEDGER = NoLedger()
Ledger = SpaceLedger | NoLedger

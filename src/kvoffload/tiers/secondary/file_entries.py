"""How the file tier makes, renames and removes the entries of its directory,
each change counted in the directory's ledger (`file_ledger`), so that the bytes
of all engines writing there stay within the capacity.

A new temporary file is counted before it is made (and refused where the
directory has no room); a file renamed into place stops counting the chunk file
it replaces; an evicted file renamed to be reused moves its count; a removed
file stops counting once it is gone. Where the ledger cannot be held, removals
go ahead uncounted (the ledger then counts more than there is, until a scan
recounts) and new files are not made.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from collections.abc import Callable
from functools import partial

from kvoffload.tiers.secondary.file_access import check_regular, make_directories
from kvoffload.tiers.secondary.file_ledger import (
    NO_LEDGER,
    Ledger,
    LedgerBook,
    SpaceLedger,
    slot_of,
)
from kvoffload.tiers.secondary.file_scan import count_directory, count_subdirectory

logger = logging.getLogger(__name__)


def _regular_size(path: str) -> int:
    """The size of the regular file at `path`; 0 for anything else or nothing
    (what the ledger counts of it)."""
    try:
        status = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return 0
    return status.st_size if stat.S_ISREG(status.st_mode) else 0


def _same_file(path: str, status: os.stat_result) -> bool:
    """Whether `path` is still the file whose status is `status`."""
    try:
        now = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (status.st_dev, status.st_ino)


def open_ledger(
    directory: str, capacity: int | None, file_mode: int, directory_mode: int
) -> Ledger:
    """The ledger of `directory` for a tier of `capacity` bytes, found usable;
    `NO_LEDGER` without a capacity, or (with one warning) where the file
    system cannot lock it."""
    if capacity is None:
        return NO_LEDGER
    ledger = SpaceLedger(
        directory,
        capacity,
        file_mode,
        directory_mode,
        partial(count_directory, directory),
    )
    try:
        with ledger.hold():
            pass
    except OSError as exc:
        ledger.close()
        logger.warning(
            "%s: cannot lock %s (%s): the capacity is not shared with other "
            "engines writing in this directory, each keeps its own",
            directory,
            ledger.path,
            exc,
        )
        return NO_LEDGER
    return ledger


class CountedEntries:
    """Changes to the entries of `directory`, counted in `ledger`."""

    def __init__(self, directory: str, directory_mode: int, ledger: Ledger) -> None:
        self.directory = directory
        self.ledger = ledger
        self._directory_mode = directory_mode

    def create(self, tmp: str, size: int, opener: Callable[[], int]) -> int:
        """A new temporary file `tmp` of `size` bytes, opened by `opener`,
        counted first (`DirectoryFullError` where the directory has no room)."""
        slot = slot_of(self.directory, tmp)
        with self.ledger.hold() as book:
            book.reserve(slot, size)
            try:
                fd = opener()
            except OSError:
                book.add(slot, -size)
                raise
            try:
                check_regular(fd, tmp)
                os.ftruncate(fd, size)  # the size counted, for any recount
            except OSError:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                book.add(slot, -size)
                raise
        return fd

    def _recount(self, book: LedgerBook, slot: int, path: str) -> None:
        counted = count_subdirectory(os.path.dirname(path))
        if counted is not None:
            book.recount(slot, counted)

    def rename_into_place(self, tmp: str, path: str) -> None:
        """Rename `tmp` to `path`; a chunk file it replaces (the same chunk,
        written by another engine) is counted no more."""
        with self.ledger.hold() as book:
            replaced = _regular_size(path)
            os.rename(tmp, path)
            book.add(slot_of(self.directory, path), -replaced)

    def move(self, source: str, tmp: str, status: os.stat_result, size: int) -> None:
        """Rename the file at `source`, whose status is `status`, to `tmp`, to
        be reused for a chunk of `size` bytes; raises `OSError` where it is
        another size or no longer at `source` (replaced or removed since it
        was opened), and then moves nothing."""
        with self.ledger.hold() as book:
            if status.st_size != size or not _same_file(source, status):
                raise FileExistsError(errno.EEXIST, "not the file opened", source)
            book.add(slot_of(self.directory, tmp), size)
            try:
                try:
                    os.rename(source, tmp)
                except FileNotFoundError:
                    make_directories(os.path.dirname(tmp), self._directory_mode)
                    os.rename(source, tmp)
            except OSError:
                book.add(slot_of(self.directory, tmp), -size)
                raise
            book.add(slot_of(self.directory, source), -size)

    def remove(self, path: str) -> bool:
        """Unlink `path` (whatever is there) and count it no more; whether
        something was removed. Raises the `OSError` of a failed unlink.

        Where no regular file is there, something other than a tier removed
        or replaced a file the tier wrote (a chunk another engine evicted
        went through a hold of its own), uncounted: the subdirectory is
        recounted, so that its room is not lost until the next scan."""
        slot = slot_of(self.directory, path)
        try:
            with self.ledger.hold() as book:
                size = _regular_size(path)
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    return False
                finally:
                    if not size:
                        self._recount(book, slot, path)
                book.add(slot, -size)
                return True
        except OSError as exc:
            if exc.filename == path:
                raise  # the unlink's own error
            # The ledger could not be held: removed all the same, counted
            # until a scan recounts.
            logger.debug("removing %s without the ledger: %s", path, exc)
            try:
                os.unlink(path)
            except FileNotFoundError:
                return False
            return True

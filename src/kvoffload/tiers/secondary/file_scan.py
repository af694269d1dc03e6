"""The scan of a file-tier directory: the chunk files in place, at start and in
rescans, and the temporary files killed writers left.

Only regular files count, and only the layout's two levels are walked
(`<fingerprint>/<abc>/<key hex>.kvc`): entries of any other type (FIFOs,
sockets, devices, symbolic links, directories where files belong) are passed
over without being opened, followed or deleted. A scan lists directories and
reads entries' status, nothing more, so no entry can block it. Each directory
is listed inside a hold of the directory's ledger, whose count of it the scan
corrects (see `file_ledger`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple

from kvoffload.keys import OffloadKey
from kvoffload.processes import TMP_SUFFIX
from kvoffload.tiers.secondary.file_ledger import (
    NO_LEDGER,
    TOP_SLOT,
    Ledger,
    subdirectory_slot,
)
from kvoffload.tiers.secondary.file_temporary import is_abandoned

logger = logging.getLogger(__name__)

CHUNK_SUFFIX = ".kvc"


class ScannedFile(NamedTuple):
    key: OffloadKey
    size: int
    mtime: float


def scan_chunk_files(
    directory: str,
    path_of: Callable[[OffloadKey], str],
    remove_abandoned: bool = False,
    ledger: Ledger = NO_LEDGER,
) -> Iterator[ScannedFile]:
    """Every chunk file in place under `directory`, whose path for a key is
    `path_of(key)`; with `remove_abandoned`, the temporary files no live
    process is writing (`is_abandoned`) are removed.

    An abandoned temporary file is what a process killed mid-write left
    behind. Others may be writes in progress, of this process or of engines
    sharing the directory (or starting their own tier), and are left alone.
    Each subdirectory is listed inside a hold of `ledger`, which takes the
    bytes found there as its count (see `file_ledger`).
    """
    listing = _Listing(path_of, time.time(), remove_abandoned)
    tops = _counted(ledger, TOP_SLOT, directory, listing, top=True)
    yield from listing.take()
    for top in tops or ():
        slot = subdirectory_slot(top.name)
        if slot is not None and top.is_dir(follow_symlinks=False):
            _counted(ledger, slot, top.path, listing)
            yield from listing.take()


def count_directory(directory: str) -> list[int]:
    """The bytes of chunk and temporary files per ledger slot, counted now."""
    listing = _Listing(lambda key: "", time.time(), False)
    counts = [0] * (TOP_SLOT + 1)
    for top in _entries(directory) or ():
        slot = subdirectory_slot(top.name)
        if not top.is_dir(follow_symlinks=False):
            counts[TOP_SLOT] += listing.add(top)
        elif slot is not None:
            counts[slot] = sum(map(listing.add, _entries(top.path) or ()))
    return counts


def count_subdirectory(path: str) -> int | None:
    """The bytes of chunk and temporary files directly in `path`, counted
    now; `None` where it cannot be listed."""
    entries = _entries(path)
    if entries is None:
        return None
    listing = _Listing(lambda key: "", time.time(), False)
    return sum(map(listing.add, entries))


def _counted(
    ledger: Ledger, slot: int, path: str, listing: _Listing, top: bool = False
) -> list[os.DirEntry[str]] | None:
    """The entries of `path`, those of its files that are chunk files added to
    `listing`, and their bytes counted in `slot` of `ledger` (unless the
    ledger cannot be held: then listed all the same). For the `top`
    directory, the slots of subdirectories not there are emptied too."""
    try:
        with ledger.hold() as book:
            entries = _entries(path)
            if entries is not None:
                book.recount(slot, sum(map(listing.add, entries)))
                if top:
                    names = (subdirectory_slot(e.name) for e in entries)
                    book.keep_only({s for s in names if s is not None})
            return entries
    except OSError as exc:
        logger.debug("listing %s without its ledger: %s", path, exc)
        listing.take()
        entries = _entries(path)
        for entry in entries or ():
            listing.add(entry)
        return entries


class _Listing:
    """The chunk files of the entries added, and the bytes of those and of
    the temporary files kept; removes abandoned temporary files."""

    def __init__(
        self, path_of: Callable[[OffloadKey], str], now: float, remove: bool
    ) -> None:
        self._path_of = path_of
        self._now = now
        self._remove = remove
        self._files: list[ScannedFile] = []

    def take(self) -> list[ScannedFile]:
        files, self._files = self._files, []
        return files

    def add(self, entry: os.DirEntry[str]) -> int:
        """Take in `entry`; returns the bytes it counts for (0 but for a
        regular chunk or temporary file)."""
        name = entry.name
        is_chunk = name.endswith(CHUNK_SUFFIX)
        if not (is_chunk or name.endswith(TMP_SUFFIX)):
            return 0
        if not entry.is_file(follow_symlinks=False):
            return 0
        try:
            status = entry.stat(follow_symlinks=False)
        except OSError:
            return 0
        if not is_chunk:
            if self._remove and _remove_if_abandoned(entry, status, self._now):
                return 0
            return status.st_size
        key = _key_of(name)
        if key is not None and self._path_of(key) == entry.path:
            self._files.append(ScannedFile(key, status.st_size, status.st_mtime))
        return status.st_size


def _key_of(name: str) -> OffloadKey | None:
    try:
        key = OffloadKey(bytes.fromhex(name[: -len(CHUNK_SUFFIX)]))
    except ValueError:
        return None
    return key or None


def _entries(directory: str) -> list[os.DirEntry[str]] | None:
    """The entries of `directory`: none where it is gone (or not a directory),
    as `os.walk` has it; `None` where it cannot be listed for another reason
    (what is in it is then unknown)."""
    try:
        with os.scandir(directory) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError:
        return None


def _remove_if_abandoned(
    entry: os.DirEntry[str], status: os.stat_result, now: float
) -> bool:
    """Whether `entry`, a temporary file, was abandoned and is now removed."""
    if not is_abandoned(entry.name, status.st_mtime, now):
        return False
    try:
        os.unlink(entry.path)
    except FileNotFoundError:
        return True  # renamed into place, say: counted as that file by the op
    except OSError:
        return False
    return True

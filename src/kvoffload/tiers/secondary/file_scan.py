"""The scan of a file-tier directory: the chunk files in place, at start and in
rescans, and the temporary files killed writers left.

Only regular files count, and only the layout's two levels are walked
(`<fingerprint>/<abc>/<key hex>.kvc`): entries of any other type (FIFOs,
sockets, devices, symbolic links, directories where files belong) are passed
over without being opened, followed or deleted. A scan lists directories and
reads entries' status, nothing more, so no entry can block it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple

from kvoffload.keys import OffloadKey
from kvoffload.processes import TMP_SUFFIX
from kvoffload.tiers.secondary.file_temporary import is_abandoned

CHUNK_SUFFIX = ".kvc"


class ScannedFile(NamedTuple):
    key: OffloadKey
    size: int
    mtime: float


def scan_chunk_files(
    directory: str,
    path_of: Callable[[OffloadKey], str],
    remove_abandoned: bool = False,
) -> Iterator[ScannedFile]:
    """Every chunk file in place under `directory`, whose path for a key is
    `path_of(key)`; with `remove_abandoned`, the temporary files no live
    process is writing (`is_abandoned`) are removed.

    An abandoned temporary file is what a process killed mid-write left
    behind. Others may be writes in progress, of this process or of engines
    sharing the directory (or starting their own tier), and are left alone.
    """
    now = time.time()
    for top in _entries(directory):
        if top.is_dir(follow_symlinks=False):
            for entry in _entries(top.path):
                yield from _scanned(entry, path_of, now, remove_abandoned)
        else:  # the start-up probe's temporary file
            yield from _scanned(top, path_of, now, remove_abandoned)


def _scanned(
    entry: os.DirEntry[str],
    path_of: Callable[[OffloadKey], str],
    now: float,
    remove_abandoned: bool,
) -> Iterator[ScannedFile]:
    """The chunk file `entry` is, if it is one; removes it if it is an
    abandoned temporary file (and `remove_abandoned`)."""
    name = entry.name
    if not entry.is_file(follow_symlinks=False):
        return
    if name.endswith(TMP_SUFFIX):
        if remove_abandoned:
            _remove_if_abandoned(entry, now)
        return
    if not name.endswith(CHUNK_SUFFIX):
        return
    try:
        key = OffloadKey(bytes.fromhex(name[: -len(CHUNK_SUFFIX)]))
    except ValueError:
        return
    if not key or path_of(key) != entry.path:
        return
    try:
        status = entry.stat(follow_symlinks=False)
    except OSError:
        return
    yield ScannedFile(key, status.st_size, status.st_mtime)


def _entries(directory: str) -> list[os.DirEntry[str]]:
    """The entries of `directory`; none where it cannot be listed (gone, or
    not a directory), as `os.walk` has it."""
    try:
        with os.scandir(directory) as it:
            return list(it)
    except OSError:
        return []


def _remove_if_abandoned(entry: os.DirEntry[str], now: float) -> None:
    with contextlib.suppress(OSError):  # gone already: renamed into place, say
        if is_abandoned(entry.name, entry.stat(follow_symlinks=False).st_mtime, now):
            os.unlink(entry.path)

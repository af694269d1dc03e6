"""How the file tier creates and opens its files: private whatever the umask, and
never an open that blocks or follows a link.

Chunk files hold KV caches, from which prompts can be recovered, so directories
are made 0700 and files 0600 (0770 and 0660 with `file_mode: "0660"`, for
engines of different users sharing a directory through a group). The modes are
set explicitly after creation: `open` and `mkdir` only ask for a mode, which the
umask can then strip bits from, but never add to (so where a file system refuses
`chmod`, what the tier made is still no more open than asked: one warning, and
it goes on). Chunk files are opened with `O_NONBLOCK | O_NOFOLLOW` and checked
to be regular files: a FIFO, socket, device, directory or symbolic link where a
chunk file should be raises `NotAChunkFileError`; opening a FIFO without it
would block the I/O thread, and `drain` and `shutdown` with it, until some other
process opened its other end.
"""

from __future__ import annotations

import errno
import logging
import os
import stat

logger = logging.getLogger(__name__)

PRIVATE_FILE_MODE = 0o600
GROUP_FILE_MODE = 0o660
FILE_MODES = {"0600": PRIVATE_FILE_MODE, "0660": GROUP_FILE_MODE}
"""The modes `file_mode` allows, as users write them."""

_SAFE_FLAGS = (
    os.O_NONBLOCK
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
# What an open with `_SAFE_FLAGS` answers for a name that is no regular file:
# a symbolic link (ELOOP), a FIFO opened for writing with no reader or a socket
# (ENXIO), a directory opened for writing (EISDIR), a non-directory in the
# path (ENOTDIR), a device without a driver (ENODEV).
_NOT_A_FILE_ERRNOS = frozenset(
    {errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.ENOTDIR, errno.ENODEV}
)


class NotAChunkFileError(OSError):
    """Something other than a regular file (a FIFO, socket, device, directory or
    symbolic link) where a chunk file or temporary file should be. Never one
    the tier wrote: it writes only regular files and renames them into place."""


def directory_mode(file_mode: int) -> int:
    """The mode of the directories holding files of `file_mode`: the same
    users may list, enter and change them (0600 gives 0700, 0660 gives 0770)."""
    return file_mode | (file_mode & 0o444) >> 2


def open_file(path: str, flags: int, mode: int = PRIVATE_FILE_MODE) -> int:
    """`os.open` that never blocks on a FIFO nor follows a symbolic link.

    Raises `NotAChunkFileError` where the name is something other than a
    regular file, as far as the open alone can tell (see `check_regular`).
    """
    try:
        return os.open(path, flags | _SAFE_FLAGS, mode)
    except OSError as exc:
        if exc.errno in _NOT_A_FILE_ERRNOS:
            raise NotAChunkFileError(
                exc.errno, f"not a regular file ({exc.strerror})", path
            ) from exc
        raise


def check_regular(fd: int, path: str) -> os.stat_result:
    """The status of the open `fd`; `NotAChunkFileError` unless a regular file
    (a FIFO or a device opens without error: only its status tells). A regular
    file's descriptor is made blocking again: only its open needed otherwise,
    and a file system may honour the flag in reads and writes (FUSE can)."""
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode):
        kind = stat.filemode(status.st_mode)[0]
        raise NotAChunkFileError(
            errno.ENOTSUP, f"not a regular file (type {kind!r})", path
        )
    os.set_blocking(fd, True)
    return status


def set_file_mode(fd: int, status: os.stat_result, mode: int) -> None:
    """Give the open file exactly `mode` where it has another (the umask took
    bits, or the file was made by an older version or another program)."""
    if stat.S_IMODE(status.st_mode) != mode:
        try:
            os.fchmod(fd, mode)
        except OSError as exc:
            _not_set(f"file descriptor {fd}", mode, exc)


def make_directories(path: str, mode: int) -> None:
    """Create `path` and its missing parents with exactly `mode` (and the
    set-group-ID bit a parent may hand down, so that files keep a shared
    group); those already there are left as they are."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        if not os.path.isdir(path):
            raise
        return  # made by another thread or process, which sets its mode
    except FileNotFoundError:
        parent = os.path.dirname(path)
        if not parent or parent == path:
            raise
        make_directories(parent, mode)
        try:
            os.mkdir(path, mode)
        except FileExistsError:
            if not os.path.isdir(path):
                raise
            return
    _chmod_directory(path, mode)


def restrict_directory(path: str, mode: int) -> None:
    """Give an existing directory of this process's user exactly `mode`: one
    an older version made 0755, say. A directory of another user (engines of
    several users sharing it) is left alone, as it must be."""
    status = os.stat(path)
    if status.st_uid == os.geteuid() and (status.st_mode & 0o777) != mode:
        _chmod_directory(path, mode)


def _chmod_directory(path: str, mode: int) -> None:
    try:
        inherited = os.stat(path).st_mode & stat.S_ISGID
        os.chmod(path, mode | inherited)
    except OSError as exc:
        _not_set(path, mode, exc)


_warned = False


def _not_set(what: str, mode: int, exc: OSError) -> None:
    """A mode the file system would not set (vfat, some network file systems):
    logged once per process, as it says the same of every file after."""
    global _warned
    if not _warned:
        _warned = True
        logger.warning(
            "cannot set mode %o on %s (%s): new files and directories are no "
            "more open than that, but ones made earlier keep their modes; "
            "check the file system's permissions (this warning is not repeated)",
            mode,
            what,
            exc,
        )

"""How the file tier creates its files: private whatever the umask.

Chunk files hold KV caches, from which prompts can be recovered, so directories
are made 0700 and files 0600 (0770 and 0660 with `file_mode: "0660"`, for
engines of different users sharing a directory through a group). The modes are
set explicitly after creation: `open` and `mkdir` only ask for a mode, which
the umask can then strip bits from, but never add to.
"""

from __future__ import annotations

import os
import stat

PRIVATE_FILE_MODE = 0o600
GROUP_FILE_MODE = 0o660
FILE_MODES = {"0600": PRIVATE_FILE_MODE, "0660": GROUP_FILE_MODE}
"""The modes `file_mode` allows, as users write them."""


def directory_mode(file_mode: int) -> int:
    """The mode of the directories holding files of `file_mode`: the same
    users may list, enter and change them (0600 gives 0700, 0660 gives 0770)."""
    return file_mode | (file_mode & 0o444) >> 2


def set_file_mode(fd: int, status: os.stat_result, mode: int) -> None:
    """Give the open file exactly `mode` where it has another (the umask took
    bits, or the file was made by an older version or another program)."""
    if stat.S_IMODE(status.st_mode) != mode:
        os.fchmod(fd, mode)


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
    inherited = os.stat(path).st_mode & stat.S_ISGID
    os.chmod(path, mode | inherited)

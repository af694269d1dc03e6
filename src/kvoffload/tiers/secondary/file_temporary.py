"""Temporary chunk files: named by their writers, so that an engine starting up
can tell the ones a killed process left (it removes them) from writes in progress,
its own or those of other engines sharing the directory (it leaves them).

A name ends `.<host>-<pid namespace>.<pid>.<thread>.tmp`.
"""

from __future__ import annotations

import os
import re
import socket
import threading

TMP_SUFFIX = ".tmp"
STALE_TEMPORARY_S = 600.0
"""Seconds since its last change after which a temporary file counts as abandoned,
whoever wrote it: a chunk write takes milliseconds, and ten minutes leave room for
a writer stalled on a slow shared file system, or hosts whose clocks disagree by
minutes. A writer slower than that loses its write (its rename fails: a failed
store). A recycled file keeps its old time from its rename to its first write, a
few microseconds in which another engine's start-up may take it for abandoned;
that store fails the same way."""


def _writer_name() -> str:
    """This host and pid namespace, as temporary file names carry them: the pid
    in a name says whether its writer is alive only where that pid was given."""
    host = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        namespace = 0
    return f"{host}-{namespace}"


_WRITER = _writer_name()
_TEMPORARY = re.compile(
    rf"\.(?P<writer>[^.]+)\.(?P<pid>[1-9][0-9]*)\.[0-9]+{re.escape(TMP_SUFFIX)}\Z"
)


def temporary_suffix() -> str:
    """What this thread appends to a name to make its temporary file's."""
    return f".{_WRITER}.{os.getpid()}.{threading.get_ident()}{TMP_SUFFIX}"


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # EPERM: another user's process
    return True


def is_abandoned(name: str, mtime: float, now: float) -> bool:
    """Whether no live process can be writing the temporary file `name` last
    changed at `mtime`: it is older than `STALE_TEMPORARY_S`, or its writer was
    a process of this host and pid namespace that has exited. Any other may be
    a write in progress, of this process or of another engine."""
    if now - mtime > STALE_TEMPORARY_S:
        return True
    match = _TEMPORARY.search(name)
    if match is None or match["writer"] != _WRITER:
        return False
    return not _process_exists(int(match["pid"]))

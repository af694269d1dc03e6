"""Which process made a file, and whether it has exited: what an engine starting
up needs to tell the files a killed process left (temporary files, host pools)
from those of processes still running, its own or other engines'.

A process is named by its host and pid namespace (`HOST_NAMESPACE`) and its pid;
a temporary file's name ends `.<host>-<pid namespace>.<pid>.<thread>.tmp`.
"""

from __future__ import annotations

import os
import re
import socket
import threading

TMP_SUFFIX = ".tmp"


def _host_namespace() -> str:
    """This host and pid namespace: a pid says whether its process is alive
    only where that pid was given."""
    host = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        namespace = 0
    return f"{host}-{namespace}"


HOST_NAMESPACE = _host_namespace()
"""`<host>-<pid namespace inode>`, with no `.` in it (file names carry it)."""

_TEMPORARY = re.compile(
    rf"\.(?P<writer>[^.]+)\.(?P<pid>[1-9][0-9]*)\.[0-9]+{re.escape(TMP_SUFFIX)}\Z"
)


def has_exited(host_namespace: str, pid: int) -> bool:
    """Whether process `pid` of `host_namespace` is known to have exited: only a
    process of this host and pid namespace can know; of any other it may be
    alive, so False. A pid the kernel gave again since counts as alive."""
    if host_namespace != HOST_NAMESPACE or pid < 1:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # EPERM: another user's process
    return False


def temporary_suffix() -> str:
    """What this thread appends to a name to make its temporary file's."""
    return f".{HOST_NAMESPACE}.{os.getpid()}.{threading.get_ident()}{TMP_SUFFIX}"


def writer_has_exited(name: str) -> bool:
    """Whether the temporary file `name` (named by `temporary_suffix`) was
    written by a process known to have exited (`has_exited`)."""
    match = _TEMPORARY.search(name)
    return match is not None and has_exited(match["writer"], int(match["pid"]))

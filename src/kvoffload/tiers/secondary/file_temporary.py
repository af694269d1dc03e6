"""Temporary chunk files: named by their writers (`kvoffload.processes`), so that
an engine starting up can tell the ones a killed process left (it removes them)
from writes in progress, its own or those of other engines sharing the directory
(it leaves them).
"""

from __future__ import annotations

from kvoffload.processes import writer_has_exited

STALE_TEMPORARY_S = 600.0
"""Seconds since its last change after which a temporary file counts as abandoned,
whoever wrote it: a chunk write takes milliseconds, and ten minutes leave room for
a writer stalled on a slow shared file system, or hosts whose clocks disagree by
minutes. A writer slower than that loses its write (its rename fails: a failed
store). A recycled file keeps its old time from its rename to its first write, a
few microseconds in which another engine's start-up may take it for abandoned;
that store fails the same way."""


def is_abandoned(name: str, mtime: float, now: float) -> bool:
    """Whether no live process can be writing the temporary file `name` last
    changed at `mtime`: it is older than `STALE_TEMPORARY_S`, or its writer was
    a process of this host and pid namespace that has exited. Any other may be
    a write in progress, of this process or of another engine."""
    return now - mtime > STALE_TEMPORARY_S or writer_has_exited(name)

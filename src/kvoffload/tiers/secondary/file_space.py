"""The file tier's effective capacity: the configured one, or less where the file
system holds less.

A disk smaller than `capacity`, shared with other data or under a quota runs out
of space before the tier is full, and its writes fail with ENOSPC or EDQUOT.
Rather than failing every store from then on, the tier lowers its capacity to
the bytes it holds less those it could not write: its next stores evict, by its
policy, to make room, as on a full tier. The free space is measured at start
(a disk already smaller than the capacity lowers it before any write fails)
and, while the capacity is lowered, every `RECHECK_S` again, off the scheduler
thread, so that space freed by others is used again (up to the configured
capacity). A quota is invisible to that measure: past it, the next write that
fails lowers the capacity again. The first lowering logs a warning; the tier's
`capacity` gauge shows the capacity in force.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable

from kvoffload.tiers.secondary.base import Clock

logger = logging.getLogger(__name__)

NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
"""The file system, or the user's quota on it, is full: eviction makes room."""
TOO_BIG_ERRNOS = frozenset({errno.EFBIG})
"""The file may not be that large (a file-size limit, `ulimit -f`): no eviction
helps; the store is skipped, as one larger than the tier is."""
RECHECK_S = 60.0
"""Seconds between measures of the free space while the capacity is lowered."""


def free_bytes(directory: str) -> int | None:
    """Bytes this user may still write on the file system of `directory` (as
    `statvfs` sees it: not a quota), or `None` where that cannot be told."""
    try:
        status = os.statvfs(directory)
    except OSError:
        return None
    return status.f_bavail * status.f_frsize


class TierSpace:
    """The capacity in force of a tier configured with `configured_bytes`,
    never below `floor_bytes` (one chunk file: a tier holding none could never
    learn that space came back from a write).

    I/O threads report writes that found no room (`note_no_space`) and free
    space they measured; the scheduler thread takes them in (`job_done`,
    `poll`) with the bytes the tier holds, and reads `capacity_bytes`.
    """

    def __init__(
        self,
        name: str,
        directory: str,
        configured_bytes: int,
        floor_bytes: int,
        clock: Clock,
    ) -> None:
        self._name = name
        self._directory = directory
        self.configured_bytes = configured_bytes
        self.capacity_bytes = configured_bytes
        self._floor = min(floor_bytes, configured_bytes)
        self._clock = clock
        self._next_check = clock()
        self._warned = False
        self._lock = threading.Lock()
        self._no_space: dict[int, int] = {}  # bytes not written, by job
        self._measures: list[int | None] = []

    # -- on I/O threads -----------------------------------------------------------

    def note_no_space(self, job_id: int, nbytes: int) -> None:
        """A write of `nbytes` for job `job_id` found no room."""
        with self._lock:
            self._no_space[job_id] = self._no_space.get(job_id, 0) + nbytes

    def measure(self) -> None:
        """Measure the free space, for the next `poll`."""
        free = free_bytes(self._directory)
        with self._lock:
            self._measures.append(free)

    # -- on the scheduler thread ------------------------------------------------

    def start(self, held_bytes: int) -> None:
        """At start, with the files found there: a disk already smaller than
        the capacity lowers it before any write fails."""
        self.measured(held_bytes, free_bytes(self._directory))
        self._next_check = self._clock() + RECHECK_S

    @property
    def lowered(self) -> bool:
        return self.capacity_bytes < self.configured_bytes

    def job_done(self, job_id: int, held_bytes: int) -> None:
        """Job `job_id` ended with the tier holding `held_bytes` (its failed
        writes released): if some writes found no room, lower the capacity."""
        with self._lock:
            wanted = self._no_space.pop(job_id, 0)
        if wanted:
            self.out_of_space(held_bytes, wanted)

    def poll(
        self, held_bytes: int, submit: Callable[[str, Callable[[], None]], None]
    ) -> None:
        """Each step: while lowered, every `RECHECK_S` have `submit` run a
        `measure` off this thread (`statvfs` of a network file system waits on
        its server); take in the measures done since the last poll."""
        if self._check_due():
            submit("free space", self.measure)
        with self._lock:
            measures, self._measures = self._measures, []
        for free in measures:
            self.measured(held_bytes, free)

    def measured(self, held_bytes: int, free: int | None) -> None:
        """The file system had `free` bytes free while the tier held
        `held_bytes`: together, what the tier can hold (at most the configured
        capacity)."""
        if free is None:
            return
        allowed = min(self.configured_bytes, held_bytes + free)
        self._set(allowed, f"{free:,} bytes free beside the tier's {held_bytes:,}")

    def out_of_space(self, held_bytes: int, wanted_bytes: int) -> None:
        """Writes of `wanted_bytes` failed for want of space while the tier held
        `held_bytes` (those writes not included)."""
        allowed = min(self.capacity_bytes, held_bytes - wanted_bytes)
        self._set(allowed, f"writes of {wanted_bytes:,} bytes ran out of space")
        self._next_check = self._clock() + RECHECK_S

    def _check_due(self) -> bool:
        """Whether to measure the free space now (while lowered, every
        `RECHECK_S`); if so, the next one is due `RECHECK_S` later."""
        now = self._clock()
        if not self.lowered or now < self._next_check:
            return False
        self._next_check = now + RECHECK_S
        return True

    def _set(self, allowed: int, why: str) -> None:
        capacity = max(self._floor, allowed)
        if capacity == self.capacity_bytes:
            return
        before, self.capacity_bytes = self.capacity_bytes, capacity
        if capacity > before:
            logger.info(
                "%s: capacity raised to %s bytes (%s)", self._name, f"{capacity:,}", why
            )
        elif not self._warned:
            self._warned = True
            logger.warning(
                "%s: the file system of %s holds less than the configured capacity "
                "of %s bytes (%s): capacity lowered to %s bytes, stores evict to "
                "make room; the capacity gauge shows the capacity in force, "
                "raised again as space frees (this warning is not repeated)",
                self._name,
                self._directory,
                f"{self.configured_bytes:,}",
                why,
                f"{capacity:,}",
            )
        else:
            logger.info(
                "%s: capacity lowered to %s bytes (%s)",
                self._name,
                f"{capacity:,}",
                why,
            )

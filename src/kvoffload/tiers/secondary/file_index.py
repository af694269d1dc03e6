"""The file tier's index: which chunk files exist, their sizes, pins and writes.

Scheduler-thread bookkeeping only (the I/O threads never touch it). Capacity is in
bytes; the eviction policy orders chunks. A chunk is *reserved* from the moment a
store is accepted, *readable* once its file is in place, and *deleting* after
eviction until its file is gone, so a key is never written while its old file may
still be removed. Retention hints order evictions over the policy's own
(`RetentionPolicy`), as in the primary tier.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from kvoffload.keys import OffloadKey
from kvoffload.policies import EvictionPolicy
from kvoffload.policies.retention import DEFAULT_MAX_HINTED_SHARE, RetentionPolicy


class Reservation(NamedTuple):
    ok: bool
    victims: list[OffloadKey]


class FileIndex:
    """Sizes of reserved and readable chunk files under a byte capacity.

    `capacity_bytes` may change (the tier lowers it where the disk holds less,
    see `file_space`): nothing is evicted then, the next `reserve` evicts down
    to it."""

    def __init__(
        self,
        capacity_bytes: int,
        policy: EvictionPolicy,
        clock: Callable[[], float] = time.monotonic,
        max_hinted_share: float = DEFAULT_MAX_HINTED_SHARE,
    ) -> None:
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self._policy = RetentionPolicy(policy, clock, max_hinted_share)
        self._sizes: dict[OffloadKey, int] = {}
        self._writing: set[OffloadKey] = set()
        self._pins: dict[OffloadKey, int] = {}
        self._deleting: dict[OffloadKey, int] = {}  # sizes of evicted files
        self._evictable_bytes = 0
        """Bytes of readable, unpinned chunks: what eviction could free now."""

    @property
    def deleting_bytes(self) -> int:
        """Bytes of evicted chunks whose files may not be removed yet."""
        return sum(self._deleting.values())

    @property
    def num_readable(self) -> int:
        return len(self._sizes) - len(self._writing)

    def is_readable(self, key: OffloadKey) -> bool:
        return key in self._sizes and key not in self._writing

    def is_deleting(self, key: OffloadKey) -> bool:
        """Evicted, its file perhaps not yet removed: a write now could be lost."""
        return key in self._deleting

    def is_known(self, key: OffloadKey) -> bool:
        """Readable, being written, or being deleted: not to be written now."""
        return key in self._sizes or key in self._deleting

    def holds(self, key: OffloadKey) -> bool:
        """Readable or being written (`SecondaryTier.holds`): not being deleted."""
        return key in self._sizes and key not in self._deleting

    def is_pinned(self, key: OffloadKey) -> bool:
        """Being read (or its header rewritten): not evictable until unpinned."""
        return key in self._pins

    def _evictable(self, key: OffloadKey) -> bool:
        return key not in self._writing and key not in self._pins

    def reserve(self, key: OffloadKey, size: int) -> Reservation:
        """Reserve `size` bytes for a new chunk file, evicting if needed.

        All or nothing: if evicting every readable, unpinned chunk would not make
        room, nothing is evicted and the reservation fails. Otherwise victims
        are taken one at a time in the policy's order until the chunk fits, so
        with mixed chunk sizes no more are evicted than needed. Evicted keys
        become *deleting*: the caller removes their files, then calls `deleted`.
        """
        assert not self.is_known(key), "reserve of a known key"
        deficit = self.used_bytes + size - self.capacity_bytes
        if size > self.capacity_bytes or deficit > self._evictable_bytes:
            return Reservation(False, [])
        victims: list[OffloadKey] = []
        while deficit > 0:
            # One victim at a time: the policy knows no sizes, and the first
            # may free enough (the deficit is at most `size` unless the
            # capacity was lowered below the bytes used: see `file_space`).
            got = self._policy.evict(1, (key,), self._evictable)
            assert got, "evictable bytes counted but no chunk evictable"
            victim = got[0]
            victim_size = self._sizes.pop(victim)
            self.used_bytes -= victim_size
            self._evictable_bytes -= victim_size
            self._deleting[victim] = victim_size
            victims.append(victim)
            deficit -= victim_size
        self._sizes[key] = size
        self._writing.add(key)
        self.used_bytes += size
        self._policy.insert(key)
        return Reservation(True, victims)

    def commit(self, key: OffloadKey, success: bool) -> None:
        """End a reservation: the file is in place, or the write failed."""
        if key not in self._writing:
            return
        self._writing.discard(key)
        if not success:
            self.used_bytes -= self._sizes.pop(key)
            self._policy.remove(key)
        elif key not in self._pins:
            self._evictable_bytes += self._sizes[key]

    def add_existing(self, key: OffloadKey, size: int) -> Reservation:
        """Index a file found at start-up (oldest first); evicts beyond capacity."""
        reservation = self.reserve(key, size)
        if reservation.ok:
            self.commit(key, True)
        return reservation

    def forget(self, key: OffloadKey) -> bool:
        """Drop a readable chunk whose file turned out bad (the caller deleted it)."""
        if not self.is_readable(key):
            return False
        size = self._sizes.pop(key)
        self.used_bytes -= size
        if key not in self._pins:
            self._evictable_bytes -= size
        self._policy.remove(key)
        return True

    def clear(self) -> list[OffloadKey]:
        """Forget every chunk (the caller removes the files); returns the keys
        that were readable. No write or pin may be in flight. Keys still being
        deleted stay so until `deleted`: a late delete must not hit a new file."""
        assert not self._writing and not self._pins, "clear with I/O in flight"
        readable = list(self._sizes)
        self._sizes.clear()
        self._policy.clear()
        self.used_bytes = self._evictable_bytes = 0
        return readable

    def deleted(self, keys: Sequence[OffloadKey]) -> None:
        """The files of evicted `keys` are gone; the keys may be written again."""
        for key in keys:
            self._deleting.pop(key, None)

    def pin(self, key: OffloadKey) -> None:
        count = self._pins.get(key, 0)
        if count == 0 and self.is_readable(key):
            self._evictable_bytes -= self._sizes[key]
        self._pins[key] = count + 1

    def unpin(self, key: OffloadKey) -> None:
        count = self._pins.get(key, 0)
        if count > 1:
            self._pins[key] = count - 1
            return
        if self._pins.pop(key, None) is not None and self.is_readable(key):
            self._evictable_bytes += self._sizes[key]

    def touch(self, keys: Sequence[OffloadKey]) -> None:
        self._policy.touch(keys)

    @property
    def hints(self) -> RetentionPolicy:
        """The retention hints of the indexed chunks (`retain`, `note_hit`,
        counts)."""
        return self._policy

    def retain(self, keys: Sequence[OffloadKey], hint: float | None) -> None:
        """Put the reserved or readable `keys` (prefix order) under a request's
        retention hint (seconds from now, 0, or `None`: nothing changes)."""
        if hint is not None:
            sizes = self._sizes
            self._policy.retain([k for k in keys if k in sizes], hint)

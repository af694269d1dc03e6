"""Faults under the file tier: what is not a regular file at a chunk path, a disk
smaller than the capacity, and permissions. Each ends in a miss, a counted
store (skipped or failed) or a lowered capacity, never a hang, wrong bytes or
an exception, and the tier goes on serving its other chunks.

A tier that blocked on a FIFO would hang the test; the `fifos_released` fixture
opens the other end of every FIFO at teardown, so that it fails instead.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvoffload import LookupResult, OffloadKey
from kvoffload.tiers.secondary import ArrayChunkBuffer, FileTier
from kvoffload.tiers.secondary.file_ledger import LEDGER_NAME
from kvoffload.tiers.secondary.file_space import RECHECK_S
from tests.tiering.test_file_faults import tiny_tmpfs
from tests.tiers.secondary.secondary_support import (
    CTX,
    FINGERPRINT,
    GROUPS,
    Jobs,
    key,
    payload,
    resolve,
)
from tests.tiers.secondary.test_file_tier import FILE_SIZE, open_failing, tier_at

KINDS = ["fifo", "socket", "directory", "symlink-to-fifo", "device"]
IS_ROOT = os.geteuid() == 0


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def fifos_released(tmp_path: Path) -> Iterator[None]:
    yield
    # A few rounds: a thread woken from one open may retry it (without O_DIRECT).
    for _ in range(5):
        for path in fifos_under(tmp_path):
            for flags in (os.O_RDONLY, os.O_WRONLY):
                # A writer fails without a reader: then nobody is blocked on it.
                with contextlib.suppress(OSError):
                    os.close(os.open(path, flags | os.O_NONBLOCK))
        threading.Event().wait(0.02)


def fifos_under(root: Path) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            if stat.S_ISFIFO(os.lstat(path).st_mode):
                found.append(path)
    return found


def make_entry(path: Path, kind: str, elsewhere: Path) -> None:
    """Put something of `kind`, not a regular file, at `path`."""
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path, 0o600)
    elif kind == "socket":
        os.mknod(path, 0o600 | stat.S_IFSOCK)
    elif kind == "directory":
        path.mkdir()
    elif kind == "symlink-to-fifo":
        target = elsewhere / "a.fifo"
        os.mkfifo(target, 0o600)
        path.symlink_to(target)
    else:
        make_device(path)


def make_device(path: Path) -> None:
    """A character device with /dev/null's numbers, where this may be made and
    opened (root, a file system without `nodev`, no device cgroup in the way)."""
    try:
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
    except OSError as exc:
        path.unlink(missing_ok=True)
        pytest.skip(f"cannot make and open a device node here: {exc}")


def kind_of(path: Path) -> str:
    return stat.filemode(os.lstat(path).st_mode)[0]


def store(tier: FileTier, buffer: ArrayChunkBuffer, ids: list[int]) -> list[bool]:
    """Store chunks one job each; whether each was stored."""
    jobs = Jobs(tier)
    done = []
    for i in ids:
        buffer.slot_view(0)[: GROUPS[0]] = payload(key(i), GROUPS[0])
        done.append(jobs.store([key(i)], [0], timeout_s=5.0).success)
    return done


def loads_intact(tier: FileTier, buffer: ArrayChunkBuffer, k: OffloadKey) -> bool:
    if not Jobs(tier).load([k], [7], timeout_s=5.0).success:
        return False
    return bytes(buffer.slot_view(7)[: GROUPS[0]]) == payload(k, GROUPS[0])


# -- not a regular file ----------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_non_regular_file_at_a_chunk_path_is_a_miss_and_is_left_in_place(
    tmp_path: Path, buffer: ArrayChunkBuffer, kind: str, fifos_released: None
) -> None:
    """Scenario: the file of a stored chunk is replaced by a FIFO, a socket, a
    directory, a symbolic link to a FIFO or a device. Its load is a miss (the
    other chunk of the job loads) and never blocks, nor do `drain` and
    `shutdown`; the entry is not the tier's to delete and stays; the chunk,
    stored again, replaces it (a directory excepted: that store fails, counted)."""
    tier = tier_at(tmp_path / "tier", buffer)
    store(tier, buffer, [1, 2])
    path = Path(tier.chunk_path(key(1)))
    make_entry(path, kind, tmp_path)
    before = kind_of(path)
    result = Jobs(tier).load([key(1), key(2)], [3, 4], timeout_s=5.0)
    assert result.failed_keys == (key(1),)
    assert bytes(buffer.slot_view(4)[: GROUPS[0]]) == payload(key(2), GROUPS[0])
    assert resolve(tier, key(1)) is LookupResult.MISS
    assert kind_of(path) == before
    assert store(tier, buffer, [1]) == [kind != "directory"]
    if kind != "directory":
        assert loads_intact(tier, buffer, key(1))
    assert tier.get_stats().failures == 1 + (kind == "directory")
    assert loads_intact(tier, buffer, key(2))
    tier.drain()
    tier.shutdown()


@pytest.mark.parametrize("kind", KINDS)
def test_an_evicted_chunks_path_holding_a_non_regular_file_never_blocks_a_store(
    tmp_path: Path, buffer: ArrayChunkBuffer, kind: str, fifos_released: None
) -> None:
    """Scenario: on a full tier, the file of the chunk to evict (whose file a
    store reuses) was replaced by something else: the store writes a new file
    instead and succeeds, and the evicted chunk's name is cleared (a directory
    cannot be, and stays)."""
    tier = tier_at(tmp_path / "tier", buffer, capacity=2 * FILE_SIZE)
    store(tier, buffer, [1, 2])
    path = Path(tier.chunk_path(key(1)))
    make_entry(path, kind, tmp_path)
    assert store(tier, buffer, [3]) == [True]
    assert tier.get_stats().evictions == 1
    assert resolve(tier, key(1)) is LookupResult.MISS
    assert loads_intact(tier, buffer, key(3))
    assert loads_intact(tier, buffer, key(2))
    assert os.path.lexists(path) == (kind == "directory")
    tier.shutdown()


def test_restart_and_rescans_pass_over_non_regular_files_and_leave_them(
    tmp_path: Path, buffer: ArrayChunkBuffer, fifos_released: None
) -> None:
    """Scenario: a directory shared by engines holds, at chunk paths, a FIFO, a
    socket, a directory, and a symbolic link to a good chunk file elsewhere.
    An engine starting on it, and its rescans, index none of them and delete
    none of them, and find the regular chunk files beside them."""
    root = tmp_path / "tier"
    writer = tier_at(root, buffer)
    store(writer, buffer, [1, 2, 3, 4, 5])
    copy = tmp_path / "copy.kvc"
    shutil.copy(writer.chunk_path(key(4)), copy)
    entries = {i: Path(writer.chunk_path(key(i))) for i in (1, 2, 3, 4)}
    for i, kind in zip((1, 2, 3), ("fifo", "socket", "directory"), strict=True):
        make_entry(entries[i], kind, tmp_path)
    entries[4].unlink()
    entries[4].symlink_to(copy)
    kinds = {i: kind_of(p) for i, p in entries.items()}

    clock = ManualClock()
    reader = tier_at(root, buffer, rescan_interval_s=1.0, clock=clock)
    assert [reader.lookup(key(i), CTX) for i in (1, 2, 3, 4, 5)] == [
        LookupResult.MISS
    ] * 4 + [LookupResult.HIT]
    store(writer, buffer, [6])

    def found() -> bool:
        clock.now += 1.0  # a rescan is due at each step
        return reader.lookup(key(6), CTX) is LookupResult.HIT

    step_until(found, reader)
    assert [reader.lookup(key(i), CTX) for i in (1, 2, 3, 4)] == [LookupResult.MISS] * 4
    assert {i: kind_of(p) for i, p in entries.items()} == kinds
    for tier in (reader, writer):
        tier.shutdown()


# -- permissions -----------------------------------------------------------------


def deny_writes_in(monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
    """Take away this user's write permission on `directory`. Root is not
    stopped by permissions: for root, creating a file there fails as it would."""
    os.chmod(directory, 0o500)
    if not IS_ROOT:
        return
    real_open = os.open

    def open_(path: str, flags: int, *args: int, **kw: int) -> int:
        if os.path.dirname(path) == str(directory) and flags & os.O_CREAT:
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path, flags, *args, **kw)

    monkeypatch.setattr(os, "open", open_)


def id_in_the_directory_of(i: int) -> int:
    """Another chunk id whose file goes in the same directory as chunk `i`'s."""
    prefix = key(i).hex()[:3]
    return next(j for j in range(i + 1, 1 << 20) if key(j).hex()[:3] == prefix)


def test_an_unreadable_chunk_file_fails_its_load_counted_and_serving_continues(
    tmp_path: Path, buffer: ArrayChunkBuffer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario: a chunk file this user may not read (mode 000): its load fails
    and is counted, the file is kept (nothing says it is wrong), and the other
    chunks load and store as before."""
    tier = tier_at(tmp_path, buffer)
    store(tier, buffer, [1, 2])
    path = tier.chunk_path(key(1))
    os.chmod(path, 0)
    if IS_ROOT:
        open_failing(monkeypatch, path, errno.EACCES)
    assert Jobs(tier).load([key(1), key(2)], [3, 4]).failed_keys == (key(1),)
    assert tier.get_stats().failures == 1
    assert os.path.exists(path)
    assert loads_intact(tier, buffer, key(2))
    assert store(tier, buffer, [3]) == [True]
    assert loads_intact(tier, buffer, key(3))
    tier.shutdown()


def test_an_unwritable_directory_fails_its_stores_counted_and_serving_continues(
    tmp_path: Path, buffer: ArrayChunkBuffer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario: one of the tier's directories loses its write permission: a
    chunk whose file goes there is not stored (counted in `failures`) and is a
    miss; the chunks already there load, and chunks of other directories store."""
    tier = tier_at(tmp_path, buffer)
    store(tier, buffer, [1])
    directory = Path(tier.chunk_path(key(1))).parent
    deny_writes_in(monkeypatch, directory)
    try:
        same = id_in_the_directory_of(1)
        assert store(tier, buffer, [same]) == [False]
        assert tier.get_stats().failures == 1
        assert resolve(tier, key(same)) is LookupResult.MISS
        assert loads_intact(tier, buffer, key(1))
        other = next(j for j in range(2, 100) if key(j).hex()[:3] != key(1).hex()[:3])
        assert store(tier, buffer, [other]) == [True]
        assert loads_intact(tier, buffer, key(other))
    finally:
        os.chmod(directory, 0o700)
    tier.shutdown()


# -- a disk smaller than the capacity --------------------------------------------


class SmallDisk:
    """A file system under `root` with room for `files` chunk files: a write
    to a file not yet given space fails with `error` once that many are on
    it. A file's space is its own until it is deleted, so rewriting a file
    (the tier reusing an evicted chunk's) always fits."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, root: Path, files: int, error: int
    ) -> None:
        self.root, self.files, self.error = root, files, error
        self.allocated: set[int] = set()
        self._lock = threading.Lock()
        self._pwritev = os.pwritev
        monkeypatch.setattr(os, "pwritev", self.pwritev)

    def _inodes_on_disk(self) -> set[int]:
        inodes = set()
        for dirpath, _, filenames in os.walk(self.root):
            for name in filenames:
                with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
                    inodes.add(os.lstat(os.path.join(dirpath, name)).st_ino)
        return inodes

    def pwritev(self, fd: int, buffers: list[memoryview], offset: int) -> int:
        inode = os.fstat(fd).st_ino
        with self._lock:
            if inode not in self.allocated:
                holding = self.allocated & self._inodes_on_disk()
                if len(holding) >= self.files:
                    raise OSError(self.error, os.strerror(self.error))
                self.allocated.add(inode)
        return self._pwritev(fd, buffers, offset)


def space_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "capacity lowered" in r.getMessage()
    ]


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EDQUOT], ids=errno.errorcode.get)
def test_a_disk_smaller_than_the_capacity_lowers_it_and_stores_go_on(
    tmp_path: Path,
    buffer: ArrayChunkBuffer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    error: int,
) -> None:
    """Scenario: a tier configured for 16 chunk files on a disk (or quota) with
    room for 4. The fifth store finds no room: it is skipped (not a failure),
    the capacity drops to what the disk held less that store (3 files), one
    warning says so, and the gauge shows it. Every later store evicts by the
    tier's policy to make room and succeeds; the newest chunks load intact.
    Once a measure of the free space says there is room again (`RECHECK_S`
    later), the capacity goes back up; past the real limit, the next store
    that finds no room lowers it again, with no second warning."""
    clock = ManualClock()
    tier = tier_at(tmp_path, buffer, capacity=16 * FILE_SIZE, clock=clock)
    assert tier.get_stats().capacity == 16
    SmallDisk(monkeypatch, tmp_path, 4, error)
    assert store(tier, buffer, list(range(1, 11))) == [True] * 4 + [False] + [True] * 5
    stats = tier.get_stats()
    assert (stats.store_skipped, stats.failures, stats.capacity) == (1, 0, 3)
    assert tier.capacity_bytes == 3 * FILE_SIZE >= tier.used_bytes
    assert [resolve(tier, key(i)) for i in (8, 9, 10)] == [LookupResult.HIT] * 3
    assert all(loads_intact(tier, buffer, key(i)) for i in (8, 9, 10))
    assert len(space_warnings(caplog)) == 1

    clock.now += RECHECK_S  # the real file system has room: back to 16
    step_until(lambda: tier.get_stats().capacity == 16, tier)
    assert store(tier, buffer, [11, 12]) == [True, False]
    assert tier.get_stats().capacity < 16
    assert store(tier, buffer, [13]) == [True]
    assert len(space_warnings(caplog)) == 1
    tier.shutdown()


def test_a_disk_with_no_room_at_all_skips_stores_until_room_comes_back(
    tmp_path: Path, buffer: ArrayChunkBuffer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario: other data fills the disk before the tier stores anything:
    every store is skipped and counted, the capacity stays at one chunk file
    (never none, or the tier could not learn that space came back), and once
    the disk has room a store succeeds."""
    tier = tier_at(tmp_path, buffer, capacity=16 * FILE_SIZE)
    disk = SmallDisk(monkeypatch, tmp_path, 0, errno.ENOSPC)
    assert store(tier, buffer, [1, 2]) == [False, False]
    stats = tier.get_stats()
    assert (stats.store_skipped, stats.failures, stats.capacity) == (2, 0, 1)
    disk.files = 1
    assert store(tier, buffer, [3]) == [True]
    assert loads_intact(tier, buffer, key(3))
    tier.shutdown()


def test_a_file_too_large_for_the_file_system_is_skipped_and_keeps_the_capacity(
    tmp_path: Path, buffer: ArrayChunkBuffer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario: a write fails with EFBIG (a file-size limit): eviction cannot
    help, so the store is skipped and counted, the capacity stays."""
    tier = tier_at(tmp_path, buffer, capacity=16 * FILE_SIZE)
    store(tier, buffer, [1])
    SmallDisk(monkeypatch, tmp_path, 0, errno.EFBIG)
    assert store(tier, buffer, [2]) == [False]
    stats = tier.get_stats()
    assert (stats.store_skipped, stats.failures, stats.capacity) == (1, 0, 16)
    assert loads_intact(tier, buffer, key(1))
    tier.shutdown()


def test_a_real_small_file_system_fills_up_and_stores_go_on(
    tmp_path: Path, buffer: ArrayChunkBuffer, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario: a tier configured for 1 MiB on a real 64 KiB file system (a
    tmpfs; skipped where one cannot be mounted). At start the capacity is what
    the file system holds (8 files); another program then takes half of it.
    Stores go on: the first that finds no room is skipped and lowers the
    capacity, later ones evict, nothing fails and the newest chunks load
    intact. When the other program's file goes, a measure of the free space
    raises the capacity again."""
    with tiny_tmpfs(tmp_path / "small", "64k") as small:
        clock = ManualClock()
        tier = tier_at(small, buffer, capacity=1 << 20, clock=clock)
        assert tier.get_stats().capacity == room_beside_the_ledger(small) // FILE_SIZE
        ballast = small / "other-program.data"
        ballast.write_bytes(b"x" * 32768)
        ids = list(range(1, 13))
        stored = store(tier, buffer, ids)
        stats = tier.get_stats()
        assert stats.failures == 0 and stats.store_skipped == stored.count(False) >= 1
        assert stats.capacity * FILE_SIZE + 32768 <= 65536
        newest = [i for i, ok in zip(ids, stored, strict=True) if ok][
            -stats.occupancy :
        ]
        assert newest[-1] == 12
        assert all(loads_intact(tier, buffer, key(i)) for i in newest)
        assert len(space_warnings(caplog)) == 1

        ballast.unlink()
        clock.now += RECHECK_S
        lowered = stats.capacity
        step_until(lambda: tier.get_stats().capacity > lowered, tier)
        assert tier.get_stats().capacity == room_beside_the_ledger(small) // FILE_SIZE
        tier.shutdown()


def room_beside_the_ledger(small: Path) -> int:
    """What the 64 KiB file system holds beside the pages of the directory's
    ledger (see `file_ledger`) in use."""
    ledger = small / FINGERPRINT / LEDGER_NAME
    return 65536 - ledger.stat().st_blocks * 512


def step_until(done: Callable[[], bool], tier: FileTier) -> None:
    """Step the tier as the scheduler does until `done()`, giving its rescan
    thread (rescans, measures of the free space) time to run."""
    for _ in range(2000):
        if done():
            return
        tier.get_finished_jobs()
        threading.Event().wait(0.005)
    raise AssertionError("the tier's rescan thread never got there")

"""Engines sharing one file-tier directory: with `rescan_interval_s`, each finds
the chunk files the others write, on its I/O pool, and indexes them. Rescans
follow a manual clock that each step of a rescanning tier advances by the
interval, so each step starts a rescan if none is running."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvoffload import LookupResult
from kvoffload.tiers.secondary import ArrayChunkBuffer, FileTier
from kvoffload.tiers.secondary.file_io import ChunkFiles
from kvoffload.tiers.secondary.file_scan import ScannedFile
from kvoffload.worker import ChunkBuffer, GroupGeometry, HostPool, PoolGeometry
from tests.tiers.secondary.secondary_support import CTX, GROUPS, Jobs, key, payload
from tests.tiers.secondary.test_file_tier import FILE_SIZE, store, tier_at

RESCAN_S = 1.0


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


CLOCK = ManualClock()


def rescanning(path: Path, buffer: ChunkBuffer, **kw: object) -> FileTier:
    """A tier that rescans `path` every `RESCAN_S` of `CLOCK`."""
    return tier_at(path, buffer, rescan_interval_s=RESCAN_S, clock=CLOCK, **kw)  # type: ignore[arg-type]


def step(tier: FileTier) -> None:
    """One scheduler step, a rescan interval after the previous one."""
    CLOCK.now += RESCAN_S
    tier.get_finished_jobs()
    time.sleep(0.005)  # for the rescan thread, which runs on its own


def wait_for_hit(tier: FileTier, ids: list[int], timeout_s: float = 10.0) -> None:
    """Step the tier (as the scheduler does each step) until `ids` are hits."""
    deadline = time.monotonic() + timeout_s
    while not all(tier.lookup(key(i), CTX) is LookupResult.HIT for i in ids):
        assert time.monotonic() < deadline, f"chunks {ids} never found by rescan"
        step(tier)


def step_until(
    tier: FileTier, done: Callable[[], bool], timeout_s: float = 10.0
) -> None:
    """Step the tier (as the scheduler does each step) until `done()`."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "the tier's rescans never got there"
        step(tier)


def test_a_chunk_another_engine_stores_becomes_a_hit_with_its_bytes(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    reader = rescanning(tmp_path, buffer)
    alone = tier_at(tmp_path, buffer)  # the default: no rescans
    writer_buffer = ArrayChunkBuffer(16, 4096, GROUPS)
    writer = tier_at(tmp_path, writer_buffer)
    store(writer, writer_buffer, [1, 2])
    assert reader.lookup(key(1), CTX) is LookupResult.MISS

    wait_for_hit(reader, [1, 2])
    assert reader.used_bytes == 2 * FILE_SIZE
    stored = [e.keys for e in reader.take_events() if not e.removed]
    assert sorted(k for keys in stored for k in keys) == sorted([key(1), key(2)])
    assert Jobs(reader).load([key(2)], [5]).success
    assert bytes(buffer.slot_view(5)[: GROUPS[0]]) == payload(key(2), GROUPS[0])

    alone.get_finished_jobs()
    assert alone.lookup(key(1), CTX) is LookupResult.MISS
    for tier in (reader, alone, writer):
        tier.shutdown()


def test_found_chunks_evict_by_policy_and_rescans_leave_temporary_files(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    reader = rescanning(tmp_path, buffer, capacity=FILE_SIZE)
    store(reader, buffer, [3])
    writer_buffer = ArrayChunkBuffer(16, 4096, GROUPS)
    writer = tier_at(tmp_path, writer_buffer, capacity=4 * FILE_SIZE)
    in_progress = Path(writer.chunk_path(key(9)) + ".77.88.tmp")
    in_progress.parent.mkdir(parents=True, exist_ok=True)
    in_progress.write_bytes(b"another engine's write in progress")
    store(writer, writer_buffer, [1])

    wait_for_hit(reader, [1])
    assert reader.lookup(key(3), CTX) is LookupResult.MISS  # evicted for it
    deadline = time.monotonic() + 10.0
    while Path(reader.chunk_path(key(3))).exists():
        assert time.monotonic() < deadline, "evicted chunk file never deleted"
        step(reader)
    assert reader.get_stats().evictions == 1
    assert in_progress.exists()
    # Once its deletion is reported the evicted key can be stored again.
    step_until(reader, lambda: not reader.has_pending_work())
    store(reader, buffer, [3])
    assert reader.lookup(key(3), CTX) is LookupResult.HIT
    for tier in (reader, writer):
        tier.shutdown()


def test_a_chunk_another_engine_deletes_becomes_a_miss_and_frees_its_room(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    reader = rescanning(tmp_path, buffer, capacity=2 * FILE_SIZE)
    writer_buffer = ArrayChunkBuffer(16, 4096, GROUPS)
    writer = tier_at(tmp_path, writer_buffer)
    store(writer, writer_buffer, [1, 2])
    wait_for_hit(reader, [1, 2])
    reader.take_events()

    Path(writer.chunk_path(key(1))).unlink()  # the writer evicted it
    deadline = time.monotonic() + 10.0
    while reader.lookup(key(1), CTX) is LookupResult.HIT:
        assert time.monotonic() < deadline, "a deleted chunk stayed a hit"
        step(reader)
    assert reader.used_bytes == FILE_SIZE
    removed = [e.keys for e in reader.take_events() if e.removed]
    assert removed == [(key(1),)]
    # The room it held takes a new chunk without evicting the other one.
    store(reader, buffer, [3])
    assert reader.lookup(key(2), CTX) is LookupResult.HIT
    assert reader.lookup(key(3), CTX) is LookupResult.HIT
    assert reader.get_stats().evictions == 0
    for tier in (reader, writer):
        tier.shutdown()


def test_an_engine_starting_up_leaves_a_peers_write_in_progress(
    tmp_path: Path, buffer: ArrayChunkBuffer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario: engine A, on a directory it shares, is writing a chunk (its
    temporary file is on disk, not yet renamed) when engine B starts on the
    same directory. B's start-up leaves A's temporary file alone: A's store
    succeeds and B's first rescan finds the chunk."""
    writer_buffer = ArrayChunkBuffer(16, 4096, GROUPS)
    writer = rescanning(tmp_path, writer_buffer)
    starting: list[FileTier] = []
    real_pwritev = os.pwritev

    def peer_starts_mid_write(fd: int, buffers: list[memoryview], offset: int) -> int:
        written: int = real_pwritev(fd, buffers, offset)
        if not starting:
            starting.append(rescanning(tmp_path, buffer))
        return written

    monkeypatch.setattr(os, "pwritev", peer_starts_mid_write)
    store(writer, writer_buffer, [1])
    assert writer.get_stats().failures == 0
    wait_for_hit(starting[0], [1])
    for tier in (writer, *starting):
        tier.shutdown()


def test_a_chunk_evicted_at_start_up_and_stored_again_by_another_engine_is_found(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: an engine restarts with room for one of two chunk files and
    evicts the older while rebuilding its index; another engine sharing the
    directory then stores that chunk again. The first rescan finds it, as any
    file new since start-up."""
    first = tier_at(tmp_path, buffer)
    store(first, buffer, [1, 2])
    first.shutdown()
    base = time.time() - 100
    for age, i in enumerate((1, 2)):  # chunk 1 is the older
        os.utime(first.chunk_path(key(i)), (base + age, base + age))
    reader = rescanning(tmp_path, buffer, capacity=FILE_SIZE)
    assert reader.lookup(key(1), CTX) is LookupResult.MISS
    writer_buffer = ArrayChunkBuffer(16, 4096, GROUPS)
    writer = tier_at(tmp_path, writer_buffer)
    store(writer, writer_buffer, [1])

    wait_for_hit(reader, [1])
    for tier in (reader, writer):
        tier.shutdown()


def test_a_rescan_passes_over_a_file_naming_a_group_the_host_pool_lacks(
    tmp_path: Path,
) -> None:
    """Scenario: beside a good chunk another engine wrote, the shared directory
    gets a file whose name decodes to group 7, which this engine's host pool
    does not have. Rescans on the scheduler thread pass over it (it is not this
    layout's) and still find the good chunk."""
    pool = HostPool.create(PoolGeometry((GroupGeometry(0, 2, 1024, 2),)), 4)
    reader = rescanning(tmp_path, pool)
    writer_buffer = ArrayChunkBuffer(16, 4096)
    writer = tier_at(tmp_path, writer_buffer)
    stray = Path(writer.chunk_path(key(1, group=7)))
    stray.parent.mkdir(parents=True, exist_ok=True)
    stray.write_bytes(b"\0" * FILE_SIZE)
    store(writer, writer_buffer, [2])

    wait_for_hit(reader, [2])
    assert reader.lookup(key(1, group=7), CTX) is LookupResult.MISS
    for tier in (reader, writer):
        tier.shutdown()
    pool.close()


def test_a_rescan_announces_only_the_chunks_it_keeps_and_counts_its_evictions(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: another engine stores four chunks in a directory shared with
    an engine that has room for two; one rescan finds all four (oldest first),
    so the two older are adopted and then evicted by the newer in the same
    pass. Routers hear of the two kept only, with no removed event for chunks
    they never heard of, and both evictions are counted."""
    reader = rescanning(tmp_path, buffer, capacity=2 * FILE_SIZE)
    writer_buffer = ArrayChunkBuffer(16, 4096, GROUPS)
    writer = tier_at(tmp_path, writer_buffer)
    store(writer, writer_buffer, [1, 2, 3, 4])
    base = time.time() - 100
    for age, i in enumerate((1, 2, 3, 4)):  # chunk 1 is the oldest
        os.utime(writer.chunk_path(key(i)), (base + age, base + age))
    # The reader is not stepped before this, so its first rescan sees all four.
    wait_for_hit(reader, [3, 4])

    events = reader.take_events()
    assert [(set(e.keys), e.removed) for e in events] == [({key(3), key(4)}, False)]
    assert reader.lookup(key(1), CTX) is LookupResult.MISS
    assert reader.lookup(key(2), CTX) is LookupResult.MISS
    stats = reader.get_stats()
    assert (stats.evictions, stats.occupancy) == (2, 2)
    for tier in (reader, writer):
        tier.shutdown()


def test_a_reset_does_not_wait_for_a_rescan_and_serves_nothing_it_listed(
    tmp_path: Path, buffer: ArrayChunkBuffer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario: a rescan has listed the shared directory, with chunk 1 another
    engine stored, and is still walking it (held here) when the engine resets.
    The reset returns without waiting for the walk; once it ends, its findings
    are void: chunk 1, stored before the reset, is never served after it."""
    walking, release = threading.Event(), threading.Event()
    released: list[bool] = []  # per rescan: released by the test, not timed out
    real_scan = ChunkFiles.scan

    def held_scan(
        files: ChunkFiles, remove_abandoned: bool = False
    ) -> Iterator[ScannedFile]:
        listed = list(real_scan(files, remove_abandoned))
        if not remove_abandoned:  # a rescan, not a start-up's rebuild
            walking.set()
            released.append(release.wait(10.0))
        yield from listed

    monkeypatch.setattr(ChunkFiles, "scan", held_scan)
    reader = rescanning(tmp_path, buffer)
    writer_buffer = ArrayChunkBuffer(16, 4096, GROUPS)
    writer = tier_at(tmp_path, writer_buffer)
    store(writer, writer_buffer, [1])
    step_until(reader, walking.is_set)

    reader.drain()  # as TieringManager.reset_cache does
    reader.reset_cache()
    release.set()
    # Two rescans later, the held one's findings would have been indexed.
    step_until(reader, lambda: len(released) >= 3)
    assert released[0], "the reset waited for the rescan"
    assert reader.lookup(key(1), CTX) is LookupResult.MISS
    assert not [e for e in reader.take_events() if not e.removed]
    for tier in (reader, writer):
        tier.shutdown()

"""FileTier specifics: layout, index rebuild, byte capacity and eviction."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kvoffload import LookupResult
from kvoffload.tiers.secondary import (
    ArrayChunkBuffer,
    Clock,
    FileTier,
    FileTierConfig,
    TierJob,
)
from kvoffload.tiers.secondary.file_io import chunk_file_size
from kvoffload.tiers.secondary.file_ledger import LEDGER_NAME
from kvoffload.tiers.secondary.file_temporary import STALE_TEMPORARY_S
from kvoffload.worker import ChunkBuffer, GroupGeometry, HostPool, PoolGeometry
from tests.tiers.secondary.secondary_support import (
    CTX,
    FINGERPRINT,
    GROUPS,
    Jobs,
    key,
    payload,
    resolve,
)

FILE_SIZE = chunk_file_size(36, FINGERPRINT, GROUPS[0])


def tier_files(root: Path) -> list[Path]:
    """The files a tier at `root` wrote: its chunk files and any temporary
    ones, not the directory's ledger (see `file_ledger`)."""
    directory = root / FINGERPRINT
    return [p for p in directory.rglob("*") if p.is_file() and p.name != LEDGER_NAME]


def tier_at(
    path: Path,
    buffer: ChunkBuffer,
    capacity: int = 1 << 20,
    clock: Clock = time.monotonic,
    **kw: object,
) -> FileTier:
    config = FileTierConfig(str(path), capacity, **kw)  # type: ignore[arg-type]
    return FileTier(config, buffer, FINGERPRINT, clock)


def store(tier: FileTier, buffer: ArrayChunkBuffer, ids: list[int]) -> None:
    jobs = Jobs(tier)
    for i in ids:
        buffer.slot_view(0)[: GROUPS[0]] = payload(key(i), GROUPS[0])
        assert jobs.store([key(i)], [0]).success


def test_files_are_spread_over_directories_under_the_fingerprint(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    tier = tier_at(tmp_path, buffer)
    store(tier, buffer, [1])
    hexkey = key(1).hex()
    expected = tmp_path / FINGERPRINT / hexkey[:3] / f"{hexkey}.kvc"
    assert tier.chunk_path(key(1)) == str(expected)
    assert expected.stat().st_size == FILE_SIZE
    tier.shutdown()


def test_rebuild_removes_abandoned_temporary_files_and_keeps_chunks(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: a restart finds two chunk files and two temporary files: one
    last written longer ago than any write takes (abandoned), and one of an
    engine on another host sharing the directory, written just now (a write in
    progress). The abandoned one is removed, the other left to its writer, and
    neither is indexed."""
    tier = tier_at(tmp_path, buffer)
    store(tier, buffer, [1, 2])
    tier.shutdown()
    abandoned = Path(tier.chunk_path(key(3)) + ".otherhost-1.123.456.tmp")
    in_progress = Path(tier.chunk_path(key(4)) + ".otherhost-1.123.789.tmp")
    for leftover in (abandoned, in_progress):
        leftover.parent.mkdir(parents=True, exist_ok=True)
        leftover.write_bytes(b"half a chunk")
    old = time.time() - STALE_TEMPORARY_S - 60
    os.utime(abandoned, (old, old))
    again = tier_at(tmp_path, buffer)
    assert not abandoned.exists()
    assert in_progress.exists()
    # What it found is announced as stored, for KV-event consumers.
    assert [(set(e.keys), e.removed) for e in again.take_events()] == [
        ({key(1), key(2)}, False)
    ]
    assert [resolve(again, key(i)) for i in (1, 2, 3, 4)] == [
        LookupResult.HIT,
        LookupResult.HIT,
        LookupResult.MISS,
        LookupResult.MISS,
    ]
    assert again.used_bytes == 2 * FILE_SIZE
    again.shutdown()


def _restart_with_room_for_two_of_three(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> tuple[FileTier, FileTier]:
    """Chunks 1, 2 and 3 stored and their files aged 3 (oldest), 1, 2; then a
    tier restarted on the directory with room for two files: (first, restarted)."""
    tier = tier_at(tmp_path, buffer)
    store(tier, buffer, [1, 2, 3])
    tier.shutdown()
    base = time.time() - 100
    for age, i in enumerate((3, 1, 2)):
        os.utime(tier.chunk_path(key(i)), (base + age, base + age))
    return tier, tier_at(tmp_path, buffer, capacity=2 * FILE_SIZE)


def test_rebuild_with_a_smaller_capacity_keeps_the_newest_files(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    tier, small = _restart_with_room_for_two_of_three(tmp_path, buffer)
    assert [resolve(small, key(i)) for i in (1, 2, 3)] == [
        LookupResult.HIT,
        LookupResult.HIT,
        LookupResult.MISS,
    ]
    assert not os.path.exists(tier.chunk_path(key(3)))
    small.shutdown()


def test_rebuild_announces_only_the_chunks_it_keeps_and_counts_its_evictions(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: a restart with room for two of the three chunk files on disk
    evicts the oldest while rebuilding its index: routers hear of the two kept
    only (never of a chunk no removed event would follow), and the eviction
    is counted."""
    _, small = _restart_with_room_for_two_of_three(tmp_path, buffer)
    events = small.take_events()
    assert [(set(e.keys), e.removed) for e in events] == [({key(1), key(2)}, False)]
    stats = small.get_stats()
    assert (stats.evictions, stats.occupancy) == (1, 2)
    small.shutdown()


def test_full_tier_evicts_least_recently_used_and_touch_refreshes(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    tier = tier_at(tmp_path, buffer, capacity=2 * FILE_SIZE)
    store(tier, buffer, [1, 2])
    tier.touch([key(1)], CTX)
    store(tier, buffer, [3])
    assert [resolve(tier, key(i)) for i in (1, 2, 3)] == [
        LookupResult.HIT,
        LookupResult.MISS,
        LookupResult.HIT,
    ]
    tier.drain()
    tier.get_finished_jobs()
    assert not os.path.exists(tier.chunk_path(key(2)))
    removed = [e.keys for e in tier.take_events() if e.removed]
    assert removed == [(key(2),)]
    assert tier.get_stats().evictions == 1
    tier.shutdown()


def test_capacity_below_one_chunk_file_is_a_start_up_error(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: a capacity one byte short of the largest chunk file could never
    hold a chunk of every group: the tier refuses to start, naming the size it
    needs, and creates nothing on disk; exactly one chunk file is accepted."""
    with pytest.raises(
        ValueError, match=rf"capacity: {FILE_SIZE - 1} bytes .* at least {FILE_SIZE}"
    ):
        tier_at(tmp_path / "small", buffer, capacity=FILE_SIZE - 1)
    assert not (tmp_path / "small").exists()
    tier = tier_at(tmp_path / "one", buffer, capacity=FILE_SIZE)
    store(tier, buffer, [1])
    assert resolve(tier, key(1)) is LookupResult.HIT
    assert tier.get_stats().capacity == 1
    tier.shutdown()


def test_eviction_policy_comes_from_the_registry(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    tier = tier_at(tmp_path, buffer, capacity=2 * FILE_SIZE, eviction_policy="arc")
    store(tier, buffer, [1, 2, 3])
    hits = [i for i in (1, 2, 3) if resolve(tier, key(i)) is LookupResult.HIT]
    assert len(hits) == 2 and 3 in hits
    tier.shutdown()


def test_many_chunks_in_one_job_use_several_threads(tmp_path: Path) -> None:
    buffer = ArrayChunkBuffer(32, 4096)
    tier = tier_at(tmp_path, buffer, num_threads=4)
    ks = [key(i) for i in range(32)]
    for slot, k in enumerate(ks):
        buffer.slot_view(slot)[:] = payload(k, 4096)
    jobs = Jobs(tier)
    assert jobs.store(ks, list(range(32))).success
    for slot in range(32):
        buffer.slot_view(slot)[:] = bytes(4096)
    assert jobs.load(ks, list(range(32))).num_bytes == 32 * 4096
    assert all(bytes(buffer.slot_view(s)) == payload(k, 4096) for s, k in enumerate(ks))
    tier.shutdown()


def test_evicted_file_of_another_size_is_deleted_not_reused(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: a full tier holds a group-0 and a group-1 chunk (different sizes);
    a new group-1 chunk evicts the group-0 one: its file goes, both group-1
    chunks load intact, and the bytes on disk stay within capacity."""
    small = chunk_file_size(36, FINGERPRINT, GROUPS[1])
    tier = tier_at(tmp_path, buffer, capacity=FILE_SIZE + small)
    jobs = Jobs(tier)
    big_key, old, new = key(1), key(2, group=1), key(3, group=1)
    for k, group in ((big_key, 0), (old, 1), (new, 1)):
        buffer.slot_view(0)[: GROUPS[group]] = payload(k, GROUPS[group])
        assert jobs.store([k], [0]).success
    assert [resolve(tier, k) for k in (big_key, old, new)] == [
        LookupResult.MISS,
        LookupResult.HIT,
        LookupResult.HIT,
    ]
    assert not os.path.exists(tier.chunk_path(big_key))
    assert jobs.load([old, new], [4, 5]).success
    assert bytes(buffer.slot_view(4)[: GROUPS[1]]) == payload(old, GROUPS[1])
    assert bytes(buffer.slot_view(5)[: GROUPS[1]]) == payload(new, GROUPS[1])
    files = tier_files(tmp_path)
    assert sum(p.stat().st_size for p in files) <= FILE_SIZE + small
    tier.shutdown()


def test_full_tier_reuses_evicted_files_and_leaves_no_temporary_files(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    tier = tier_at(tmp_path, buffer, capacity=2 * FILE_SIZE)
    store(tier, buffer, list(range(10)))
    files = sorted(p.name for p in tier_files(tmp_path))
    assert files == sorted(f"{key(i).hex()}.kvc" for i in (8, 9))
    jobs = Jobs(tier)
    assert jobs.load([key(8), key(9)], [2, 3]).success
    assert bytes(buffer.slot_view(3)[: GROUPS[0]]) == payload(key(9), GROUPS[0])
    tier.shutdown()


def test_store_that_cannot_make_room_evicts_nothing_with_mixed_sizes(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: a full tier holds a small (group-1) chunk and a large one still
    being written; a second large chunk would need both gone. It is skipped and
    the small chunk stays: its file, its hit and its bytes (evicting it alone
    would free too little and lose it for nothing)."""
    small = chunk_file_size(36, FINGERPRINT, GROUPS[1])
    tier = tier_at(tmp_path, buffer, capacity=FILE_SIZE + small)
    jobs = Jobs(tier)
    kept, big, refused = key(1, group=1), key(2), key(3)
    buffer.slot_view(0)[: GROUPS[1]] = payload(kept, GROUPS[1])
    assert jobs.store([kept], [0]).success
    tier.take_events()
    for slot, k in ((1, big), (2, refused)):
        buffer.slot_view(slot)[: GROUPS[0]] = payload(k, GROUPS[0])
    # One job: the first large chunk is being written while the second asks.
    assert jobs.store([big, refused], [1, 2]).failed_keys == (refused,)
    assert [resolve(tier, k) for k in (kept, big, refused)] == [
        LookupResult.HIT,
        LookupResult.HIT,
        LookupResult.MISS,
    ]
    assert os.path.exists(tier.chunk_path(kept))
    assert tier.get_stats().evictions == 0
    assert [e for e in tier.take_events() if e.removed] == []
    assert jobs.load([kept], [5]).success
    assert bytes(buffer.slot_view(5)[: GROUPS[1]]) == payload(kept, GROUPS[1])


def test_a_store_of_a_chunk_whose_evicted_file_is_being_deleted_is_refused(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: a tier with room for one chunk holds chunk 1; in one step a
    store of chunk 2 evicts it and another request stores chunk 1 again, while
    chunk 1's file is still being deleted. That store reports chunk 1 failed
    and counts it skipped (it is not in the tier), never a silent success."""
    tier = tier_at(tmp_path, buffer, capacity=FILE_SIZE)
    store(tier, buffer, [1])
    for slot, i in ((1, 1), (2, 2)):
        buffer.slot_view(slot)[: GROUPS[0]] = payload(key(i), GROUPS[0])
    tier.submit_store(TierJob(10, (key(2),), (2,), CTX))
    tier.submit_store(TierJob(11, (key(1),), (1,), CTX))
    tier.drain()
    results = {r.job_id: r for r in tier.get_finished_jobs()}

    assert results[10].success
    assert results[11].failed_keys == (key(1),)
    assert tier.lookup(key(1), CTX) is LookupResult.MISS
    stats = tier.get_stats()
    assert (stats.chunks_stored, stats.store_skipped) == (2, 1)
    # Once its old file is gone, chunk 1 can be stored again.
    store(tier, buffer, [1])
    assert tier.lookup(key(1), CTX) is LookupResult.HIT
    tier.shutdown()


def open_failing(
    monkeypatch: pytest.MonkeyPatch, path: str, error: int
) -> Callable[[], None]:
    """Make `os.open` of `path` fail with `error`; returns what lifts it."""
    real_open = os.open

    def failing_open(name: str, flags: int, *args: int) -> int:
        if name == path:
            raise OSError(error, os.strerror(error), name)
        return real_open(name, flags, *args)

    monkeypatch.setattr(os, "open", failing_open)
    return lambda: monkeypatch.setattr(os, "open", real_open)


@pytest.mark.parametrize(
    "error", [errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EACCES, errno.EIO]
)
def test_a_read_error_that_says_nothing_of_the_file_keeps_the_chunk(
    tmp_path: Path,
    buffer: ArrayChunkBuffer,
    monkeypatch: pytest.MonkeyPatch,
    error: int,
) -> None:
    """Scenario: opening a stored chunk's file fails for a reason of the process
    or the system (no free descriptors, no memory, no permission, an I/O error),
    not because the file is wrong: that load fails, but the file stays, no
    removed event is sent, and once the error passes the chunk loads intact."""
    tier = tier_at(tmp_path, buffer)
    store(tier, buffer, [1])
    tier.take_events()
    jobs = Jobs(tier)
    lift = open_failing(monkeypatch, tier.chunk_path(key(1)), error)
    assert jobs.load([key(1)], [3]).failed_keys == (key(1),)
    lift()
    assert os.path.exists(tier.chunk_path(key(1)))
    assert [e for e in tier.take_events() if e.removed] == []
    assert resolve(tier, key(1)) is LookupResult.HIT
    assert tier.get_stats().failures == 1
    assert jobs.load([key(1)], [3]).success
    assert bytes(buffer.slot_view(3)[: GROUPS[0]]) == payload(key(1), GROUPS[0])
    tier.shutdown()


def test_a_chunk_whose_file_vanished_is_a_miss_from_its_failed_load_on(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: a stored chunk's file is deleted behind the tier's back (by
    hand, or by an engine sharing the directory without rescans): its load
    fails, the chunk is a miss from then on and is announced removed."""
    tier = tier_at(tmp_path, buffer)
    store(tier, buffer, [1])
    tier.take_events()
    os.unlink(tier.chunk_path(key(1)))
    assert Jobs(tier).load([key(1)], [3]).failed_keys == (key(1),)
    assert resolve(tier, key(1)) is LookupResult.MISS
    assert [e.keys for e in tier.take_events() if e.removed] == [(key(1),)]
    tier.shutdown()


def wait_until_gone(path: Path, timeout_s: float = 10.0) -> None:
    """Wait for a background delete to remove `path`."""
    deadline = time.monotonic() + timeout_s
    while path.exists():
        assert time.monotonic() < deadline, f"{path} was not deleted"
        time.sleep(0.005)


def test_reset_removes_every_file_of_the_fingerprint_only(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: this engine stored chunk 1, another engine sharing the directory
    chunk 2 (unknown here), and another model chunk 1 in its own directory. A
    reset empties the fingerprint's directory at once: the other engine's load
    fails (a miss, never stale bytes), a restarted engine finds nothing, and
    the old tree is deleted in the background. The other model keeps its chunk;
    a chunk stored after the reset is a hit."""
    tier = tier_at(tmp_path, buffer)
    peer_buffer = ArrayChunkBuffer(16, 4096, GROUPS)
    peer = tier_at(tmp_path, peer_buffer)
    other = FileTier(FileTierConfig(str(tmp_path), 1 << 20), buffer, "fp-b")
    store(tier, buffer, [1])
    store(peer, peer_buffer, [2])
    store(other, buffer, [1])
    tier.take_events()
    tier.reset_cache()
    assert [e.keys for e in tier.take_events() if e.removed] == [(key(1),)]
    assert not tier_files(tmp_path)
    assert resolve(tier, key(1)) is LookupResult.MISS
    assert Jobs(peer).load([key(2)], [3]).failed_keys == (key(2),)
    for aside in tmp_path.glob(f".{FINGERPRINT}.*.deleting"):
        wait_until_gone(aside)
    restarted = tier_at(tmp_path, buffer)
    assert [resolve(restarted, key(i)) for i in (1, 2)] == [LookupResult.MISS] * 2
    assert resolve(other, key(1)) is LookupResult.HIT
    assert Jobs(other).load([key(1)], [4]).success
    store(tier, buffer, [3])
    assert resolve(tier, key(3)) is LookupResult.HIT
    for t in (tier, peer, other, restarted):
        t.shutdown()


def test_start_up_deletes_what_an_interrupted_reset_left(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: a process died while deleting a reset's old tree: the next start
    deletes it in the background; another fingerprint's is left to its owner."""
    mine = tmp_path / f".{FINGERPRINT}.{'a' * 32}.deleting"
    theirs = tmp_path / f".{FINGERPRINT}.x.{'a' * 32}.deleting"
    for tree in (mine, theirs):
        (tree / "abc").mkdir(parents=True)
        (tree / "abc" / "chunk.kvc").write_bytes(b"old")
    tier = tier_at(tmp_path, buffer)
    wait_until_gone(mine)
    assert theirs.exists()
    tier.shutdown()


def test_a_file_naming_a_group_the_host_pool_lacks_is_dropped_at_start(
    tmp_path: Path,
) -> None:
    """Scenario: the directory holds a chunk file whose name decodes to group 7,
    which the engine's host pool does not have (a stray or hand-copied file).
    The tier starts, deletes the file as not its own, and serves around it."""
    geometry = PoolGeometry((GroupGeometry(0, 2, 1024, 2),))
    pool = HostPool.create(geometry, 4)
    stray = key(1, group=7)
    first = tier_at(tmp_path, ArrayChunkBuffer(4, 4096))
    path = Path(first.chunk_path(stray))
    first.shutdown()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * FILE_SIZE)

    tier = tier_at(tmp_path, pool)
    assert not path.exists()
    assert resolve(tier, stray) is LookupResult.MISS
    pool.slot_view(0)[:] = payload(key(2), pool.slot_nbytes)
    assert Jobs(tier).store([key(2)], [0]).success
    assert resolve(tier, key(2)) is LookupResult.HIT
    tier.shutdown()
    pool.close()


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_a_path_that_cannot_be_a_directory_is_a_start_up_error(
    tmp_path: Path, buffer: ArrayChunkBuffer, where: str
) -> None:
    """Scenario: `path` names a regular file (or a place inside one): the tier
    refuses to start with an error naming the setting and its value, instead
    of an OSError from deep inside, or failing every store later."""
    regular = tmp_path / "not-a-dir"
    regular.write_bytes(b"x")
    path = regular if where == "a file" else regular / "kv"
    with pytest.raises(ValueError, match=rf"path: '{path}' is not usable .* directory"):
        tier_at(path, buffer)

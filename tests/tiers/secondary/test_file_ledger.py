"""The directory's ledger (`file_ledger`): however many engines (processes,
threads, tiers) write into one file-tier directory, the bytes of its chunk and
temporary files stay within the capacity, and the ledger counts them exactly
but after a crash or a change by hand, where it counts more until a scan."""

from __future__ import annotations

import errno
import fcntl
import multiprocessing
import os
import random
import signal
from functools import partial
from pathlib import Path

import pytest

from kvoffload import LookupResult
from kvoffload.tiers.secondary import ArrayChunkBuffer, FileTier
from kvoffload.tiers.secondary.file_io import ChunkFiles
from kvoffload.tiers.secondary.file_ledger import (
    LEDGER_NAME,
    DirectoryFullError,
    SpaceLedger,
)
from kvoffload.tiers.secondary.file_scan import count_directory
from tests.tiers.secondary.secondary_support import (
    CTX,
    FINGERPRINT,
    GROUPS,
    Jobs,
    key,
    payload,
)
from tests.tiers.secondary.test_file_tier import FILE_SIZE, store, tier_at
from tests.tiers.secondary.test_file_tier_shared import (
    rescanning,
    step_until,
    wait_for_hit,
)


def measure(directory: Path) -> tuple[int, int]:
    """Under the ledger's lock (no tier changes an entry meanwhile): the bytes
    of the chunk and temporary files in `directory`, and the ledger's total."""
    path = str(directory)
    ledger = SpaceLedger(path, 0, 0o600, 0o700, partial(count_directory, path))
    try:
        with ledger.hold() as book:
            return sum(count_directory(path)), book.total
    finally:
        ledger.close()


def store_all(tier: FileTier, buffer: ArrayChunkBuffer, ids: list[int]) -> list[bool]:
    """Store chunks one job each; whether each was stored."""
    jobs = Jobs(tier)
    done = []
    for i in ids:
        buffer.slot_view(0)[: GROUPS[0]] = payload(key(i), GROUPS[0])
        done.append(jobs.store([key(i)], [0]).success)
    return done


def test_engines_that_do_not_rescan_keep_the_directory_within_one_capacity(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: two engines without rescans share a directory, each with a
    capacity of four chunk files, and store eight chunks each, in turns. The
    directory never holds more than four files' bytes (without the ledger each
    engine kept its own four): each engine's capacity in force leaves the
    other's files, so each evicts its own; a store that finds the room taken
    since its engine last looked is skipped, and nothing fails."""
    capacity = 4 * FILE_SIZE
    first = tier_at(tmp_path, buffer, capacity=capacity)
    other_buffer = ArrayChunkBuffer(16, 4096, GROUPS)
    second = tier_at(tmp_path, other_buffer, capacity=capacity)
    directory = tmp_path / FINGERPRINT
    for i in range(8):
        store_all(first, buffer, [i])
        store_all(second, other_buffer, [100 + i])
        on_disk, counted = measure(directory)
        assert on_disk == counted <= capacity
    one, two = first.get_stats(), second.get_stats()
    assert one.failures == two.failures == 0
    assert one.chunks_stored + two.chunks_stored >= 12
    assert one.occupancy + two.occupancy == 4
    assert one.capacity + two.capacity == 4
    for tier in (first, second):
        tier.shutdown()


def test_rescanning_engines_evict_each_others_files_to_make_room(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: engine A fills the shared directory (four chunk files, the
    capacity of both); engine B's rescan finds them and indexes them without
    evicting anything (they are in the directory already); B then stores two
    chunks of its own: it evicts the two oldest it knows, A's, first, so none
    of its stores is skipped, and the directory stays within the capacity."""
    capacity = 4 * FILE_SIZE
    a_buffer = ArrayChunkBuffer(16, 4096, GROUPS)
    a = rescanning(tmp_path, a_buffer, capacity=capacity)
    b = rescanning(tmp_path, buffer, capacity=capacity)
    store(a, a_buffer, [1, 2, 3, 4])
    wait_for_hit(b, [1, 2, 3, 4])
    assert b.get_stats().evictions == 0

    assert store_all(b, buffer, [5, 6]) == [True, True]
    stats = b.get_stats()
    assert (stats.store_skipped, stats.evictions, stats.occupancy) == (0, 2, 4)
    on_disk, counted = measure(tmp_path / FINGERPRINT)
    assert on_disk == counted <= capacity
    wait_for_hit(a, [5, 6])
    step_until(a, lambda: a.lookup(key(1), CTX) is LookupResult.MISS)
    for tier in (a, b):
        tier.shutdown()


def _writer(root: str, capacity: int, seed: int, rounds: int) -> None:
    """A process of its own writing and deleting chunk files at random, from
    two threads, into a directory other processes write into too."""
    import threading

    def run(thread: int) -> None:
        files = ChunkFiles(root, FINGERPRINT, direct=False, capacity=capacity)
        rng = random.Random(seed * 10 + thread)
        mine: list[int] = []
        for _ in range(rounds):
            if mine and rng.random() < 0.4:
                files.delete(key(mine.pop(rng.randrange(len(mine)))))
                continue
            i = seed * 1_000_000 + thread * 100_000 + rng.randrange(50_000)
            data = payload(key(i), GROUPS[0])
            try:
                files.write(key(i), [memoryview(data)])
                mine.append(i)
            except DirectoryFullError:
                if mine:
                    files.delete(key(mine.pop(0)))
        files.close()

    threads = [threading.Thread(target=run, args=(t,)) for t in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_processes_and_threads_writing_at_once_never_pass_the_capacity(
    tmp_path: Path,
) -> None:
    """Scenario: three processes, two threads each, write and delete chunk
    files at random in one directory with room for six. Measured under the
    ledger's lock while they run, and at the end, the directory holds at most
    six files' bytes, and exactly what the ledger counts."""
    capacity = 6 * FILE_SIZE
    directory = tmp_path / FINGERPRINT
    context = multiprocessing.get_context("fork")
    writers = [
        context.Process(target=_writer, args=(str(tmp_path), capacity, seed, 150))
        for seed in range(1, 4)
    ]
    for w in writers:
        w.start()
    samples = 0
    while any(w.is_alive() for w in writers):
        on_disk, counted = measure(directory)
        assert on_disk == counted <= capacity
        samples += 1
    for w in writers:
        w.join()
        assert w.exitcode == 0
    on_disk, counted = measure(directory)
    assert on_disk == counted <= capacity
    assert samples > 0


def _killed_in_a_hold(root: str, capacity: int, when: str) -> None:
    """Write one chunk and be killed (SIGKILL) `when`: right after the ledger
    counted its file, before the file is made ("counted"), or halfway through
    writing it ("writing")."""
    files = ChunkFiles(root, FINGERPRINT, direct=False, capacity=capacity)
    real_open, real_pwritev = os.open, os.pwritev

    def die_at_open(path: str, *args: object, **kw: object) -> int:
        if path.endswith(".tmp"):
            os.kill(os.getpid(), signal.SIGKILL)
        return real_open(path, *args, **kw)  # type: ignore[arg-type]

    def die_mid_write(fd: int, buffers: list[memoryview], offset: int) -> int:
        real_pwritev(fd, buffers[:1], offset)
        os.kill(os.getpid(), signal.SIGKILL)
        return 0

    if when == "counted":
        os.open = die_at_open  # type: ignore[assignment]
    else:
        os.pwritev = die_mid_write  # type: ignore[assignment]
    data = payload(key(9), GROUPS[0])
    files.write(key(9), [memoryview(data)])


@pytest.mark.parametrize("when", ["counted", "writing"])
def test_a_writer_killed_leaves_more_counted_never_less_until_a_scan(
    tmp_path: Path, buffer: ArrayChunkBuffer, when: str
) -> None:
    """Scenario: an engine is killed while storing a chunk, once just after
    the ledger counted the file (not made yet), once halfway through writing
    it. The ledger then counts more than the directory holds (the bound still
    holds); an engine starting up (its scan) counts the directory afresh,
    removes the dead writer's temporary file, and stores fill the whole
    capacity again."""
    capacity = 3 * FILE_SIZE
    tier = tier_at(tmp_path, buffer, capacity=capacity)
    store(tier, buffer, [1, 2])
    tier.shutdown()
    directory = tmp_path / FINGERPRINT
    killed = multiprocessing.get_context("fork").Process(
        target=_killed_in_a_hold, args=(str(tmp_path), capacity, when)
    )
    killed.start()
    killed.join()
    assert killed.exitcode == -signal.SIGKILL
    on_disk, counted = measure(directory)
    assert counted == 3 * FILE_SIZE
    assert on_disk == (3 if when == "writing" else 2) * FILE_SIZE

    restarted = tier_at(tmp_path, buffer, capacity=capacity)
    assert measure(directory) == (2 * FILE_SIZE, 2 * FILE_SIZE)
    assert store_all(restarted, buffer, [3]) == [True]
    assert restarted.get_stats().evictions == 0
    restarted.shutdown()


def test_files_deleted_by_hand_are_counted_again_by_a_rescan(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: someone deletes two of a full shared directory's chunk files
    by hand. The ledger still counts them, so another engine's store is
    skipped; the next rescan recounts and its stores go in without evicting."""
    capacity = 2 * FILE_SIZE
    other_buffer = ArrayChunkBuffer(16, 4096, GROUPS)
    other = rescanning(tmp_path, other_buffer, capacity=capacity)
    writer = tier_at(tmp_path, buffer, capacity=capacity)
    store(writer, buffer, [1, 2])
    for i in (1, 2):
        Path(writer.chunk_path(key(i))).unlink()
    assert store_all(other, other_buffer, [3]) == [False]
    step_until(other, lambda: measure(tmp_path / FINGERPRINT)[1] == 0)
    assert store_all(other, other_buffer, [3, 4]) == [True, True]
    assert other.get_stats().evictions == 0
    for tier in (writer, other):
        tier.shutdown()


def test_a_damaged_or_deleted_ledger_is_counted_afresh(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: the ledger is cut short, overwritten, or deleted while an
    engine runs: its next store counts the directory afresh, and is refused
    where the directory is full, never let past the capacity."""
    capacity = 2 * FILE_SIZE
    tier = tier_at(tmp_path, buffer, capacity=capacity)
    store(tier, buffer, [1, 2])
    ledger = tmp_path / FINGERPRINT / LEDGER_NAME
    other = ChunkFiles(str(tmp_path), FINGERPRINT, direct=False, capacity=capacity)
    for damage in ("truncate", "garbage", "delete"):
        if damage == "truncate":
            os.truncate(ledger, 100)
        elif damage == "garbage":
            ledger.write_bytes(os.urandom(ledger.stat().st_size))
        else:
            ledger.unlink()
        with pytest.raises(DirectoryFullError):
            other.write(key(50), [memoryview(payload(key(50), GROUPS[0]))])
        assert measure(tmp_path / FINGERPRINT) == (capacity, capacity)
    other.close()
    tier.shutdown()


def test_a_reset_starts_a_new_ledger_that_other_engines_count_in(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: engine B resets the shared directory (renamed aside with its
    ledger) while engine A holds the old ledger open. A's next stores are
    counted in the new directory's ledger, so it counts exactly what is
    there."""
    a_buffer = ArrayChunkBuffer(16, 4096, GROUPS)
    a = tier_at(tmp_path, a_buffer, capacity=4 * FILE_SIZE)
    b = tier_at(tmp_path, buffer, capacity=4 * FILE_SIZE)
    store(a, a_buffer, [1, 2, 3])
    b.reset_cache()
    store(a, a_buffer, [4])
    assert measure(tmp_path / FINGERPRINT) == (FILE_SIZE, FILE_SIZE)
    for tier in (a, b):
        tier.shutdown()


def test_a_file_system_without_locks_warns_once_and_each_engine_keeps_its_own(
    tmp_path: Path,
    buffer: ArrayChunkBuffer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Scenario: `flock` is refused (ENOLCK: an NFS mount without a lock
    service). The tier starts, says once that the capacity is not shared,
    and stores and evicts within its own capacity."""

    def refused(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", refused)
    tier = tier_at(tmp_path, buffer, capacity=2 * FILE_SIZE)
    assert store_all(tier, buffer, [1, 2, 3]) == [True, True, True]
    stats = tier.get_stats()
    assert (stats.evictions, stats.occupancy, stats.failures) == (1, 2, 0)
    warnings = [r for r in caplog.records if "not shared" in r.getMessage()]
    assert len(warnings) == 1 and "No locks available" in warnings[0].getMessage()
    tier.shutdown()


def test_a_chunk_file_of_another_size_is_never_reused_for_a_chunk(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: the evicted chunk's file was replaced (by hand) with one of
    another size. The store does not reuse it (the ledger would count the
    wrong size): it removes it and writes a new file; the ledger counts
    exactly what is there."""
    tier = tier_at(tmp_path, buffer, capacity=2 * FILE_SIZE)
    store(tier, buffer, [1, 2])
    Path(tier.chunk_path(key(1))).write_bytes(b"x" * (3 * FILE_SIZE))
    assert store_all(tier, buffer, [3]) == [True]
    on_disk, counted = measure(tmp_path / FINGERPRINT)
    assert on_disk == counted == 2 * FILE_SIZE
    tier.shutdown()

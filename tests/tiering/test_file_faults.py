"""File tier behind the tiering manager: restart, disk full, corrupt files, kill.

Each scenario ends by checking the engine-side view: lookups answer what is really
there, loads return the engine's exact bytes, and primary slots are not leaked.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvoffload import LookupResult, PrefixLookup, ReqContext
from kvoffload.tiers.secondary.file_io import chunk_file_size
from tests.tiering.tiering_support import (
    FINGERPRINT,
    SLOT,
    chunk_files,
    file_engine,
    key,
    keys,
    wait_until,
)

W = ReqContext("writer")
R = ReqContext("reader")


def stored_through_tier(path: Path, ids: list[int], **kwargs: object) -> list[str]:
    """Run one engine that stores chunks `ids` into a file tier at `path`."""
    m, engine, _ = file_engine(path, **kwargs)  # type: ignore[arg-type]
    m.on_new_request(W)
    engine.store(keys(*ids), W)
    engine.settle()
    m.on_request_finished(W)
    m.shutdown()
    return chunk_files(path)


def assert_promoted_miss(path: Path, k: bytes) -> None:
    """A fresh engine sees `k` as a miss, loads nothing, leaks no slot."""
    m, engine, tier = file_engine(path)
    m.on_new_request(R)
    assert engine.lookup_until_known(k, R) is LookupResult.MISS  # type: ignore[arg-type]
    assert m.lookup(k, R) is LookupResult.MISS  # type: ignore[arg-type]
    assert m.primary.num_free_slots() == m.primary.num_chunks
    assert not os.path.exists(tier.chunk_path(k))  # type: ignore[arg-type]
    m.shutdown()


def test_restart_finds_the_previous_runs_chunks(tmp_path: Path) -> None:
    """Scenario: one engine stores four chunks through the file tier and exits; a
    new engine on the same directory hits all four and loads identical bytes."""
    stored_through_tier(tmp_path, [1, 2, 3, 4])
    m, engine, _ = file_engine(tmp_path)
    m.on_new_request(R)
    assert m.lookup_prefix(keys(1, 2, 3, 4), R) == PrefixLookup(0, 4)
    engine.settle()
    assert m.lookup_prefix(keys(1, 2, 3, 4), R) == PrefixLookup(4, 4)
    engine.load(keys(1, 2, 3, 4), R)
    m.shutdown()


def test_restart_on_a_file_system_refusing_direct_io_at_open_loads_its_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario: a restarted engine's file system answers EINVAL to O_DIRECT at
    open (FUSE without direct_io, say), and its first file I/O is a promotion:
    every chunk the previous run stored (aligned, so meant for direct I/O)
    hits and loads its exact bytes, and no chunk file is deleted."""
    stored_through_tier(tmp_path, [1, 2], slot=4096)
    before = chunk_files(tmp_path)
    real_open = os.open

    def open_refusing_direct(path: str, flags: int, *args: int) -> int:
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, "Invalid argument", path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", open_refusing_direct)
    m, engine, _ = file_engine(tmp_path, slot=4096)
    m.on_new_request(R)
    assert [engine.lookup_until_known(k, R) for k in keys(1, 2)] == [
        LookupResult.HIT
    ] * 2
    engine.load(keys(1, 2), R)
    assert m.get_stats()["file"].failures == 0
    m.shutdown()
    assert chunk_files(tmp_path) == before


def test_capacity_of_a_few_chunks_keeps_the_most_recent(tmp_path: Path) -> None:
    """Scenario: capacity for three chunk files, six chunks stored: the disk never
    holds more than three, the newest three hit after a restart, the rest miss."""
    size = chunk_file_size(36, FINGERPRINT, SLOT)
    for i in range(1, 7):
        stored_through_tier(tmp_path, [i], capacity=3 * size)
    files = [f for f in chunk_files(tmp_path) if f.endswith(".kvc")]
    assert len(files) == 3
    assert sum(os.path.getsize(tmp_path / f) for f in files) <= 3 * size
    m, engine, _ = file_engine(tmp_path, capacity=3 * size)
    m.on_new_request(R)
    hits = [
        i
        for i in range(1, 7)
        if engine.lookup_until_known(key(i), R) is LookupResult.HIT
    ]
    assert hits == [4, 5, 6]
    engine.load(keys(4, 5, 6), R)
    m.shutdown()


def check_no_partial_files_after_enospc(path: Path, ids: list[int]) -> None:
    """After writes that ran out of space: only whole, loadable chunks remain."""
    assert not [f for f in chunk_files(path) if f.endswith(".tmp")]
    m, engine, _ = file_engine(path)
    m.on_new_request(R)
    results = {i: engine.lookup_until_known(key(i), R) for i in ids}
    readable = [i for i, r in results.items() if r is LookupResult.HIT]
    engine.load(keys(*readable), R)
    assert m.primary.num_free_slots() == m.primary.num_chunks - len(readable)
    m.shutdown()


def test_disk_full_write_errors_skip_the_store_and_serving_continues(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario: every write from the tier's threads hits ENOSPC partway: the
    stores are skipped and counted (as on a full tier, not as failures), the
    chunks stay readable in the primary tier, no partial file is left, and once
    space returns stores succeed."""
    real_pwritev = os.pwritev
    disk_full = threading.Event()
    disk_full.set()

    def pwritev(fd: int, buffers: list[memoryview], offset: int) -> int:
        on_tier_thread = threading.current_thread().name.startswith("kvoffload-")
        if disk_full.is_set() and on_tier_thread:
            real_pwritev(fd, buffers[:1], offset)  # the header goes in, then no space
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwritev(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", pwritev)
    m, engine, _ = file_engine(tmp_path)
    m.on_new_request(W)
    engine.store(keys(1, 2), W)
    engine.settle()
    stats = m.get_stats()["file"]
    assert (stats.store_skipped, stats.failures) == (2, 0)
    engine.load(keys(1, 2), W)  # the primary tier still serves them
    disk_full.clear()
    engine.store(keys(3), W)
    engine.settle()
    assert m.get_stats()["file"].chunks_stored == 1
    m.shutdown()
    check_no_partial_files_after_enospc(tmp_path, [1, 2, 3])


@contextlib.contextmanager
def tiny_tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_real_enospc_on_a_tiny_tmpfs(tmp_path: Path) -> None:
    """Scenario: a 64 KiB file system under a tier configured for 1 MiB: the
    tier holds what the file system does (its capacity gauge says so), stores
    beyond it are skipped and counted, none fails, and what was stored loads
    back intact, before and after a restart."""
    ids = list(range(1, 11))
    file_size = chunk_file_size(36, FINGERPRINT, 8192)
    with tiny_tmpfs(tmp_path / "small", "64k") as small:
        m, engine, _ = file_engine(small, capacity="1MiB", num_chunks=16, slot=8192)
        assert m.get_stats()["file"].capacity == 65536 // file_size
        m.on_new_request(W)
        engine.store(keys(*ids), W)
        engine.settle()
        stats = m.get_stats()["file"]
        assert stats.failures == 0 and stats.store_skipped > 0
        assert stats.chunks_stored + stats.store_skipped == len(ids)
        engine.load(keys(*ids), W)
        m.shutdown()
        assert not [f for f in chunk_files(small) if f.endswith(".tmp")]
        m, engine, _ = file_engine(small, num_chunks=16, slot=8192)
        m.on_new_request(R)
        hits = [
            i for i in ids if engine.lookup_until_known(key(i), R) is LookupResult.HIT
        ]
        assert len(hits) == stats.chunks_stored
        engine.load(keys(*hits), R)
        m.shutdown()


@pytest.mark.parametrize("where", ["payload", "header"])
def test_one_flipped_byte_is_a_miss_and_the_file_is_deleted(
    tmp_path: Path, where: str
) -> None:
    """Scenario: one byte of a stored chunk file flips on disk; the next engine's
    promotion fails its check: the key misses, nothing is loaded, the file goes."""
    stored_through_tier(tmp_path, [1, 2])
    m, _, tier = file_engine(tmp_path)
    path = tier.chunk_path(key(1))
    m.shutdown()
    offset = 40 if where == "header" else os.path.getsize(path) - 100
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))
    assert_promoted_miss(tmp_path, key(1))
    m, engine, _ = file_engine(tmp_path)
    m.on_new_request(R)
    assert engine.lookup_until_known(key(2), R) is LookupResult.HIT
    engine.load(keys(2), R)
    m.shutdown()


def test_truncated_file_found_at_start_is_dropped(tmp_path: Path) -> None:
    stored_through_tier(tmp_path, [1])
    m, _, tier = file_engine(tmp_path)
    path = tier.chunk_path(key(1))
    m.shutdown()
    os.truncate(path, os.path.getsize(path) - 1)
    assert_promoted_miss(tmp_path, key(1))


def test_file_truncated_while_running_fails_its_promotion(tmp_path: Path) -> None:
    """Scenario: the tier indexed a good file that is then truncated: the
    promotion fails, the key misses from then on and the file is deleted."""
    stored_through_tier(tmp_path, [1])
    m, engine, tier = file_engine(tmp_path)
    os.truncate(tier.chunk_path(key(1)), 100)
    m.on_new_request(R)
    assert m.lookup(key(1), R) is LookupResult.HIT_PENDING
    assert engine.lookup_until_known(key(1), R) is LookupResult.MISS
    assert m.primary.num_free_slots() == m.primary.num_chunks
    assert not os.path.exists(tier.chunk_path(key(1)))
    m.shutdown()


def test_file_written_for_another_fingerprint_is_never_loaded(tmp_path: Path) -> None:
    """Scenario: a chunk file of another model/layout (same key, same size) is
    placed where this model looks: it is a miss and is deleted."""
    stored_through_tier(tmp_path / "other", [1], fingerprint="another-model-xyz")
    m, _, other = file_engine(tmp_path / "other", fingerprint="another-model-xyz")
    foreign = other.chunk_path(key(1))
    m.shutdown()
    m, _, mine = file_engine(tmp_path)
    target = mine.chunk_path(key(1))
    m.shutdown()
    os.makedirs(os.path.dirname(target), exist_ok=True)
    # Fingerprints of equal length: the file size alone cannot tell them apart.
    assert len("another-model-xyz") == len(FINGERPRINT)
    with open(foreign, "rb") as src, open(target, "wb") as dst:
        dst.write(src.read())
    assert_promoted_miss(tmp_path, key(1))


_KILLED_WRITER = """
import os, sys, time
sys.path.insert(0, {repo!r})
from tests.tiering.tiering_support import FINGERPRINT, key, payload
from kvoffload import ReqContext
from kvoffload.tiers.secondary import ArrayChunkBuffer, FileTier, FileTierConfig, TierJob

root, marker = sys.argv[1], sys.argv[2]
buf = ArrayChunkBuffer(2, 65536)
tier = FileTier(FileTierConfig(root, "16MiB"), buf, FINGERPRINT)
ctx = ReqContext("w")
buf.slot_view(0)[:] = payload(key(0), 65536)
tier.submit_store(TierJob(0, (key(0),), (0,), ctx))
tier.drain()
assert tier.get_finished_jobs()[0].success

real_pwritev = os.pwritev
def stalled_pwritev(fd, buffers, offset):
    header, body = buffers[0], buffers[-1]
    real_pwritev(fd, [header, body[: len(body) // 2]], offset)
    open(marker, "w").close()
    time.sleep(600)
os.pwritev = stalled_pwritev
buf.slot_view(1)[:] = payload(key(1), 65536)
tier.submit_store(TierJob(1, (key(1),), (1,), ctx))
time.sleep(600)
"""


def test_process_killed_mid_write_leaves_no_partial_chunk(tmp_path: Path) -> None:
    """Scenario: a process is SIGKILLed halfway through writing a chunk file. After
    a restart the half-written chunk is a miss (its temporary file is removed)
    and the chunk written before it loads back intact."""
    root, marker = tmp_path / "tier", tmp_path / "halfway"
    script = tmp_path / "writer.py"
    script.write_text(_KILLED_WRITER.format(repo=str(Path(__file__).parents[2])))
    proc = subprocess.Popen([sys.executable, str(script), str(root), str(marker)])
    try:
        wait_until(lambda: marker.exists() or proc.poll() is not None, timeout_s=60)
        assert proc.poll() is None, "writer exited before the kill"
        assert [f for f in chunk_files(root) if f.endswith(".tmp")]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    m, engine, tier = file_engine(root, slot=65536, num_chunks=4)
    assert not [f for f in chunk_files(root) if f.endswith(".tmp")]
    m.on_new_request(R)
    assert engine.lookup_until_known(key(0), R) is LookupResult.HIT
    engine.load(keys(0), R)
    assert engine.lookup_until_known(key(1), R) is LookupResult.MISS
    assert not os.path.exists(tier.chunk_path(key(1)))
    m.shutdown()

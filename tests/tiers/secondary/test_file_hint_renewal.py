"""A renewed retention hint reaches the chunk file's header, so a restarted
engine, or another engine sharing the directory, reads the renewed deadline; a
deadline moving earlier (or barely later) is never written; a header write
racing a delete, a replacement or a lock changes nothing."""

from __future__ import annotations

import fcntl
import math
import os
import shutil
import struct
import time
import zlib
from pathlib import Path

import pytest

from kvoffload import ReqContext
from kvoffload.tiers.secondary import (
    ArrayChunkBuffer,
    FileTier,
    FileTierConfig,
    TierJob,
    TierJobResult,
    codec,
    file_io,
)
from kvoffload.tiers.secondary.file_io import ChunkFiles
from kvoffload.tiers.secondary.file_renewals import renew_file_deadline
from kvoffload.tiers.secondary.header_renewal import renewal_due
from tests.tiers.secondary.secondary_support import (
    FINGERPRINT,
    GROUPS,
    key,
    payload,
    settle,
)

N = GROUPS[0]


def tier_at(path: Path, buffer: ArrayChunkBuffer) -> FileTier:
    return FileTier(FileTierConfig(str(path), 1 << 20), buffer, FINGERPRINT)


def run(tier: FileTier, job: TierJob) -> TierJobResult:
    (tier.submit_store if job.slots[0] == 0 else tier.submit_load)(job)
    deadline = time.monotonic() + 10
    while True:
        for result in tier.get_finished_jobs():
            assert result.job_id == job.job_id
            return result
        assert time.monotonic() < deadline, "job did not finish in time"
        time.sleep(0.001)


def store(tier: FileTier, buffer: ArrayChunkBuffer, i: int, hint: float | None) -> None:
    buffer.slot_view(0)[:N] = payload(key(i), N)
    ctx = ReqContext("w")
    assert run(tier, TierJob(1, (key(i),), (0,), ctx, hints=(hint,))).success


def hint_loaded(tier: FileTier, i: int) -> float:
    """The hint a load of chunk `i` hands back (seconds left)."""
    result = run(tier, TierJob(2, (key(i),), (1,), ReqContext("r")))
    assert result.success and result.hints is not None
    return result.hints[key(i)]


def touch(tier: FileTier, i: int, seconds: float) -> None:
    """A returning request under a hint of `seconds` touches chunk `i`, and
    the step ends."""
    tier.touch([key(i)], ReqContext.create("t", {"kv_retention_s": seconds}))
    tier.on_schedule_end()
    settle(tier)


def test_a_touch_renewal_reaches_the_header_a_restart_reads(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    tier = tier_at(tmp_path, buffer)
    store(tier, buffer, 1, 60)
    touch(tier, 1, 6000)
    assert 5990 < hint_loaded(tier, 1) <= 6000  # a load reads the header
    tier.shutdown()
    restarted = tier_at(tmp_path, buffer)
    assert 5990 < hint_loaded(restarted, 1) <= 6000
    restarted.shutdown()


def test_a_cascade_of_a_chunk_on_disk_under_a_later_hint_renews_its_header(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    tier = tier_at(tmp_path, buffer)
    store(tier, buffer, 1, 60)
    other = tier_at(tmp_path, buffer)  # another engine sharing the directory
    store(tier, buffer, 1, 6000)  # held already: not written again
    assert tier.get_stats().chunks_stored == 1
    tier.on_schedule_end()
    settle(tier)
    assert 5990 < hint_loaded(other, 1) <= 6000
    tier.shutdown()
    other.shutdown()


def file_bytes(tier: FileTier, i: int) -> bytes:
    with open(tier.chunk_path(key(i)), "rb") as f:
        return f.read()


@pytest.mark.parametrize("seconds", [60, 6000, 6001, 7400])
def test_a_deadline_moving_earlier_or_barely_later_is_never_written(
    tmp_path: Path, buffer: ArrayChunkBuffer, seconds: float
) -> None:
    """Scenario: a chunk stored under 6,000 s is touched under `seconds`: no
    move later by more than a quarter of the hint leaves the file as it was."""
    tier = tier_at(tmp_path, buffer)
    store(tier, buffer, 1, 6000)
    before = file_bytes(tier, 1)
    touch(tier, 1, seconds)
    assert file_bytes(tier, 1) == before
    tier.shutdown()


def test_the_renewal_rule() -> None:
    now = 1000.0
    assert renewal_due(None, now + 10, now)  # not known: read and see
    assert renewal_due(0.0, now + 10, now)  # no deadline held
    assert not renewal_due(now + 600, now + 60, now)  # earlier
    assert not renewal_due(now + 75, now + 100, now)  # a quarter of 100 s
    assert renewal_due(now + 74, now + 100, now)
    assert not renewal_due(now + 1.5, now + 2, now)  # a second at least
    assert not renewal_due(None, now, now)  # no time left
    assert not renewal_due(None, math.nan, now)


def chunk_files(tmp_path: Path) -> ChunkFiles:
    return ChunkFiles(str(tmp_path), FINGERPRINT)


def test_a_renewal_racing_a_delete_resurrects_nothing(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    tier = tier_at(tmp_path, buffer)
    store(tier, buffer, 1, 60)
    path = tier.chunk_path(key(1))
    os.unlink(path)
    now = time.time()
    assert not renew_file_deadline(chunk_files(tmp_path), key(1), now + 6000, now)
    assert not os.path.exists(path)
    tier.shutdown()


def v1_header(i: int) -> bytes:
    """A format-1 header (before hints: no room for a deadline)."""
    k, fp, data = key(i), FINGERPRINT.encode(), payload(key(i), N)
    crc = codec.payload_checksum([data])
    head = struct.pack("<4sHHHHQI", b"KVOC", 1, 0, len(k), len(fp), N, crc) + k + fp
    return head + struct.pack("<I", zlib.crc32(head))


@pytest.mark.parametrize("damage", ["other chunk", "short", "bad header", "format 1"])
def test_a_renewal_of_a_file_that_is_not_this_chunks_changes_nothing(
    tmp_path: Path, buffer: ArrayChunkBuffer, damage: str
) -> None:
    """What a renewal finds at the chunk's path may have changed since the
    step asked for it: another chunk's file (reused by another engine), a
    file cut short, a header failing its checks, one of format 1."""
    tier = tier_at(tmp_path, buffer)
    store(tier, buffer, 1, 60)
    store(tier, buffer, 2, 60)
    path = tier.chunk_path(key(1))
    if damage == "other chunk":
        shutil.copyfile(tier.chunk_path(key(2)), path)
    elif damage == "short":
        os.truncate(path, 40)
    else:
        with open(path, "r+b") as f:
            f.write(v1_header(1) if damage == "format 1" else b"\x00" * 8)
    before = Path(path).read_bytes()
    now = time.time()
    assert not renew_file_deadline(chunk_files(tmp_path), key(1), now + 6000, now)
    assert Path(path).read_bytes() == before
    tier.shutdown()


def test_a_file_another_renewal_holds_is_left_alone(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    tier = tier_at(tmp_path, buffer)
    store(tier, buffer, 1, 60)
    path = tier.chunk_path(key(1))
    before = Path(path).read_bytes()
    files, now = chunk_files(tmp_path), time.time()
    with open(path, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert not renew_file_deadline(files, key(1), now + 6000, now)
    assert Path(path).read_bytes() == before
    assert renew_file_deadline(files, key(1), now + 6000, now)
    assert 5990 < hint_loaded(tier, 1) <= 6000  # the payload still checks out
    tier.shutdown()


def test_a_chunk_being_loaded_is_renewed_after_its_load(
    tmp_path: Path, buffer: ArrayChunkBuffer
) -> None:
    """Scenario: a chunk is touched while its load is in flight: its header is
    not rewritten under the read (which hands back the hint it read), but at
    the first step's end after it."""
    tier = tier_at(tmp_path, buffer)
    store(tier, buffer, 1, 60)
    load = TierJob(2, (key(1),), (1,), ReqContext("r"))
    tier.submit_load(load)  # its chunk stays pinned until its result is taken
    tier.touch([key(1)], ReqContext.create("t", {"kv_retention_s": 6000}))
    tier.on_schedule_end()
    tier.drain()
    (result,) = tier.get_finished_jobs()
    assert result.hints is not None and 50 < result.hints[key(1)] <= 60
    tier.on_schedule_end()
    settle(tier)
    tier.shutdown()
    restarted = tier_at(tmp_path, buffer)
    assert 5990 < hint_loaded(restarted, 1) <= 6000
    restarted.shutdown()


def test_a_header_read_half_renewed_is_read_again_not_dropped(
    tmp_path: Path, buffer: ArrayChunkBuffer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario: a load reads a header while another engine (or this one, for
    a load submitted after the renewal) rewrites it: what it read fails the
    header checksum. The header is read once more: the chunk loads, and its
    file is kept."""
    tier = tier_at(tmp_path, buffer)
    store(tier, buffer, 1, 60)
    reads = 0

    def torn(fd: int, buffers: list[memoryview]) -> int:
        nonlocal reads
        got = read_all(fd, buffers)
        reads += 1
        if reads == 1:
            buffers[0][24:32] = b"\xff" * 8  # the deadline, half written
        return got

    read_all = file_io._read_all
    monkeypatch.setattr(file_io, "_read_all", torn)
    assert 50 < hint_loaded(tier, 1) <= 60
    assert reads == 1 and os.path.exists(tier.chunk_path(key(1)))
    assert bytes(buffer.slot_view(1)[:N]) == payload(key(1), N)
    tier.shutdown()

"""Chunk files: the padded layout, direct I/O and its fallbacks to the page cache."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvoffload.tiers.secondary import (
    ArrayChunkBuffer,
    FileTier,
    FileTierConfig,
    codec,
    file_direct,
    file_io,
)
from kvoffload.tiers.secondary.file_io import (
    ALIGN,
    ChunkFiles,
    chunk_file_size,
    payload_offset,
)
from tests.tiers.secondary.secondary_support import FINGERPRINT, key, payload

pytestmark = pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no O_DIRECT")

ALIGNED = 2 * ALIGN  # a payload direct I/O can move
UNALIGNED = 1536


@pytest.fixture
def slots() -> ArrayChunkBuffer:
    """Page-aligned slots (an anonymous map), as the host pool's are."""
    return ArrayChunkBuffer(4, ALIGNED)


def filled(slots: ArrayChunkBuffer, slot: int, n: int, k: bytes) -> memoryview:
    view = slots.slot_view(slot)[:n]
    view[:] = payload(k, n)  # type: ignore[arg-type]
    return view


@pytest.fixture
def open_flags(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The flags of every `os.open` of a chunk or temporary file."""
    seen: list[int] = []
    real_open = os.open

    def recording_open(path: str, flags: int, *args: int) -> int:
        if path.endswith((".kvc", ".tmp")):
            seen.append(flags)
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", recording_open)
    yield seen


def test_payload_starts_at_4k_after_a_zero_padded_header(
    tmp_path: Path, slots: ArrayChunkBuffer
) -> None:
    files = ChunkFiles(str(tmp_path), FINGERPRINT)
    files.write(key(1), [filled(slots, 0, ALIGNED, key(1))])
    data = Path(files.path(key(1))).read_bytes()
    start = payload_offset(36, FINGERPRINT)
    head_len = codec.header_size(36, FINGERPRINT)
    assert start == ALIGN and len(data) == chunk_file_size(36, FINGERPRINT, ALIGNED)
    assert data[start:] == payload(key(1), ALIGNED)
    assert data[head_len:start] == bytes(start - head_len)
    header = codec.decode_header(data)
    codec.check_header(header, key(1), FINGERPRINT, ALIGNED)


def test_aligned_payloads_bypass_the_page_cache_and_others_use_it(
    tmp_path: Path, slots: ArrayChunkBuffer, open_flags: list[int]
) -> None:
    files = ChunkFiles(str(tmp_path), FINGERPRINT)
    files.write(key(1), [filled(slots, 0, ALIGNED, key(1))])
    assert files.read(key(1), [slots.slot_view(1)]) == ALIGNED
    if not files.direct:
        pytest.skip("this file system refuses O_DIRECT")
    assert all(flags & os.O_DIRECT for flags in open_flags)
    assert bytes(slots.slot_view(1)) == payload(key(1), ALIGNED)
    files.write(key(3), [filled(slots, 0, ALIGN, key(3))])
    open_flags.clear()
    files.write(key(2), [filled(slots, 0, UNALIGNED, key(2))])  # unaligned length
    files.read(key(2), [slots.slot_view(2)[:UNALIGNED]])
    unaligned_address = slots.slot_view(3)[1 : 1 + ALIGN]
    files.read(key(3), [unaligned_address])
    assert bytes(unaligned_address) == payload(key(3), ALIGN)
    assert len(open_flags) >= 3  # (a write may retry its open after a mkdir)
    assert not any(flags & os.O_DIRECT for flags in open_flags)


def test_direct_and_page_cache_files_are_identical_and_interchangeable(
    tmp_path: Path, slots: ArrayChunkBuffer
) -> None:
    direct = ChunkFiles(str(tmp_path / "a"), FINGERPRINT)
    cached = ChunkFiles(str(tmp_path / "b"), FINGERPRINT, direct=False)
    view = filled(slots, 0, ALIGNED, key(1))
    direct.write(key(1), [view])
    cached.write(key(1), [view])
    assert (
        Path(direct.path(key(1))).read_bytes() == Path(cached.path(key(1))).read_bytes()
    )
    os.replace(direct.path(key(1)), cached.path(key(1)) + ".x")
    os.replace(cached.path(key(1)), direct.path(key(1)))
    os.replace(cached.path(key(1)) + ".x", cached.path(key(1)))
    for files, slot in ((direct, 1), (cached, 2)):
        files.read(key(1), [slots.slot_view(slot)])
        assert bytes(slots.slot_view(slot)) == payload(key(1), ALIGNED)


def _refusing(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> Callable[[int], bool]:  # fmt: skip
    """Make `os.<name>` fail with EINVAL on file descriptors opened O_DIRECT,
    as some file systems do; returns a check of whether an fd is direct."""
    real = getattr(os, name)

    def is_direct(fd: int) -> bool:
        return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)

    def refusing(fd: int, *args: object) -> int:
        if is_direct(fd):
            raise OSError(errno.EINVAL, "Invalid argument")
        result: int = real(fd, *args)
        return result

    monkeypatch.setattr(os, name, refusing)
    return is_direct


def _refuse_direct_at_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `os.open` answer EINVAL to O_DIRECT, as some file systems do."""
    real_open = os.open

    def open_refusing_direct(path: str, flags: int, *args: int) -> int:
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", open_refusing_direct)


@pytest.mark.parametrize("refuses", ["open", "pwritev", "preadv"])
def test_file_system_refusing_direct_io_falls_back_to_the_page_cache(
    tmp_path: Path,
    slots: ArrayChunkBuffer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    refuses: str,
) -> None:
    """Scenario: the file system answers EINVAL to O_DIRECT (at open, or at the
    first read or write): that chunk and every later one go through the page
    cache, the bytes are right, and one warning says so."""
    files = ChunkFiles(str(tmp_path), FINGERPRINT)
    if not files.direct:
        pytest.skip("no direct I/O on this file system to begin with")
    if refuses == "open":
        _refuse_direct_at_open(monkeypatch)
    else:
        _refusing(monkeypatch, refuses)
    with caplog.at_level(logging.WARNING):
        for i in (1, 2):
            files.write(key(i), [filled(slots, 0, ALIGNED, key(i))])
            files.read(key(i), [slots.slot_view(i)])
            assert bytes(slots.slot_view(i)) == payload(key(i), ALIGNED)
    assert not files.direct
    assert len([r for r in caplog.records if "direct I/O" in r.message]) == 1


def test_a_read_before_any_write_falls_back_when_open_refuses_direct_io(
    tmp_path: Path,
    slots: ArrayChunkBuffer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Scenario: an engine restarts on a file system that answers EINVAL to
    O_DIRECT at open, and its first I/O is a read of a chunk the previous run
    stored: the read goes through the page cache with the right bytes, direct
    I/O is off from then on, and the file stays."""
    ChunkFiles(str(tmp_path), FINGERPRINT, direct=False).write(
        key(1), [filled(slots, 0, ALIGNED, key(1))]
    )
    files = ChunkFiles(str(tmp_path), FINGERPRINT)
    if not files.direct:
        pytest.skip("no direct I/O on this file system to begin with")
    _refuse_direct_at_open(monkeypatch)
    assert files.read(key(1), [slots.slot_view(1)]) == ALIGNED
    assert bytes(slots.slot_view(1)) == payload(key(1), ALIGNED)
    assert not files.direct
    assert os.path.exists(files.path(key(1)))


def test_recycled_file_of_another_size_is_resized(
    tmp_path: Path, slots: ArrayChunkBuffer
) -> None:
    """Scenario: an evicted chunk's file grew on disk (by hand, say); reusing it
    for a new chunk still leaves a file of exactly the new chunk's size."""
    files = ChunkFiles(str(tmp_path), FINGERPRINT)
    files.write(key(1), [filled(slots, 0, ALIGNED, key(1))])
    with open(files.path(key(1)), "ab") as f:
        f.write(b"tail")
    files.write(key(2), [filled(slots, 0, ALIGNED, key(2))], recycle=key(1))
    assert not os.path.exists(files.path(key(1)))
    assert os.path.getsize(files.path(key(2))) == chunk_file_size(
        36, FINGERPRINT, ALIGNED
    )
    files.read(key(2), [slots.slot_view(1)])
    assert bytes(slots.slot_view(1)) == payload(key(2), ALIGNED)


def test_files_of_the_unpadded_layout_are_dropped_at_start(
    tmp_path: Path, slots: ArrayChunkBuffer
) -> None:
    """Scenario: a directory holds a chunk file of the earlier layout (payload
    right after the header); the tier started on it drops and deletes it."""
    files = ChunkFiles(str(tmp_path), FINGERPRINT)
    data = payload(key(1), ALIGNED)
    path = Path(files.path(key(1)))
    path.parent.mkdir(parents=True)
    path.write_bytes(
        codec.encode_header(
            key(1), FINGERPRINT, ALIGNED, codec.payload_checksum([data])
        )
        + data
    )
    tier = FileTier(FileTierConfig(str(tmp_path), 1 << 20), slots, FINGERPRINT)
    assert tier.used_bytes == 0
    assert not path.exists()
    tier.shutdown()


def test_file_system_type_is_that_of_the_longest_mount_holding_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "/dev/vda / ext4 rw 0 0\n"
        "tmpfs /dev/shm tmpfs rw 0 0\n"
        "tmpfs /mnt/my\\040cache tmpfs rw 0 0\n"
        "nfs:/x /mnt/my\\040cache/nfs nfs4 rw 0 0\n"
    )
    monkeypatch.setattr(file_direct, "_MOUNTS", str(mounts))
    assert file_io.file_system_type("/dev/shm/kv") == "tmpfs"
    assert file_io.file_system_type("/dev/shmem") == "ext4"
    assert file_io.file_system_type("/mnt/my cache/a") == "tmpfs"
    assert file_io.file_system_type("/mnt/my cache/nfs/a/b") == "nfs4"
    monkeypatch.setattr(file_direct, "_MOUNTS", str(tmp_path / "absent"))
    assert file_io.file_system_type("/dev/shm") is None


def test_no_direct_io_on_a_memory_file_system(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario: the tier's directory is on tmpfs: there is no disk to bypass
    the page cache for, so every chunk goes through it."""
    real = file_io.file_system_type
    monkeypatch.setattr(
        file_io,
        "file_system_type",
        lambda path: "tmpfs" if path.startswith(str(tmp_path)) else real(path),
    )
    assert not ChunkFiles(str(tmp_path), FINGERPRINT).direct

"""Chunk files on disk: where they live, atomic writes, checked reads, the scan.

Layout: `<root>/<fingerprint>/<abc>/<key hex>.kvc`, where `abc` are the first three
hex digits of the key: keys are hashes, so 4,096 evenly filled directories (2,500
files each at ten million chunks), few enough that creating them costs little. A
file is written under a temporary name and renamed into place, so a chunk file is
either absent or complete. These functions run on I/O threads and
raise `OSError` or `CorruptChunkError`; the tier turns them into failed chunks.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from typing import NamedTuple

from kvoffload.keys import OffloadKey
from kvoffload.tiers.secondary.codec import (
    CorruptChunkError,
    check_header,
    check_payload,
    decode_header,
    encode_header,
    header_size,
    payload_checksum,
)

logger = logging.getLogger(__name__)

CHUNK_SUFFIX = ".kvc"
TMP_SUFFIX = ".tmp"
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class ScannedFile(NamedTuple):
    key: OffloadKey
    size: int
    mtime: float


def _advance(views: list[memoryview], n: int) -> list[memoryview]:
    """`views` without their first `n` bytes."""
    while n and views:
        if n >= len(views[0]):
            n -= len(views[0])
            views = views[1:]
        else:
            views = [views[0][n:], *views[1:]]
            n = 0
    return views


def _write_all(fd: int, buffers: list[memoryview]) -> None:
    """Write every buffer in order, with as few system calls as the kernel allows."""
    views = [b for b in buffers if len(b)]
    while views:
        views = _advance(views, os.writev(fd, views))


def _read_all(fd: int, buffers: list[memoryview]) -> int:
    """Fill the buffers in order until they are full or the file ends."""
    views = [b for b in buffers if len(b)]
    total = 0
    while views:
        got = os.readv(fd, views)
        if got == 0:
            break
        total += got
        views = _advance(views, got)
    return total


class ChunkFiles:
    """Reads and writes the chunk files of one fingerprint under `root`."""

    def __init__(self, root: str, fingerprint: str, fsync: bool = False) -> None:
        self.fingerprint = fingerprint
        self.directory = os.path.join(root, fingerprint)
        self._fsync = fsync
        os.makedirs(self.directory, exist_ok=True)

    def path(self, key: OffloadKey) -> str:
        name = key.hex()
        return os.path.join(self.directory, name[:3], name + CHUNK_SUFFIX)

    def file_size(self, key: OffloadKey, payload_len: int) -> int:
        return header_size(len(key), self.fingerprint) + payload_len

    def write(
        self, key: OffloadKey, payload: memoryview, recycle: OffloadKey | None = None
    ) -> int:
        """Write a chunk file atomically; returns the payload bytes written.

        With `recycle`, the file of that evicted chunk (of the same size) is
        renamed to the temporary name and overwritten in place: no inode or block
        allocation, which on a full tier (the steady state of a cache) is most of
        the cost of a new file. The evicted chunk vanishes at that rename.
        """
        path = self.path(key)
        header = encode_header(
            key, self.fingerprint, len(payload), payload_checksum(payload)
        )
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}{TMP_SUFFIX}"
        fd = self._reuse(recycle, tmp) if recycle is not None else None
        if fd is None:
            fd = self._create(tmp)
        try:
            try:
                _write_all(fd, [memoryview(header), payload.cast("B")])
                if recycle is not None:
                    os.ftruncate(fd, len(header) + len(payload))
                if self._fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return len(payload)

    def _create(self, tmp: str) -> int:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC
        try:
            return os.open(tmp, flags, 0o644)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(tmp), exist_ok=True)
            return os.open(tmp, flags, 0o644)

    def _reuse(self, victim: OffloadKey, tmp: str) -> int | None:
        """The evicted chunk's file, renamed to `tmp` and open for writing."""
        source = self.path(victim)
        try:
            try:
                os.rename(source, tmp)
            except FileNotFoundError:
                if not os.path.exists(source):
                    return None  # already gone (deleted by hand, say)
                os.makedirs(os.path.dirname(tmp), exist_ok=True)
                os.rename(source, tmp)
        except OSError:
            self.delete(victim)
            return None
        try:
            return os.open(tmp, os.O_WRONLY | _O_CLOEXEC)
        except OSError:
            return None  # `_create` truncates it

    def read(self, key: OffloadKey, dest: memoryview) -> int:
        """Fill `dest` with the chunk's payload after checking header and checksum.

        `len(dest)` is the expected payload length. Raises `CorruptChunkError` for
        a file that fails any check (the caller deletes it).
        """
        head_len = header_size(len(key), self.fingerprint)
        head, beyond = bytearray(head_len), bytearray(1)
        payload = dest.cast("B")
        fd = os.open(self.path(key), os.O_RDONLY | _O_CLOEXEC)
        try:
            # One readv for header and payload; a byte past them means a longer file.
            got = _read_all(fd, [memoryview(head), payload, memoryview(beyond)])
        finally:
            os.close(fd)
        expected = head_len + len(payload)
        if got != expected:
            size = f"more than {expected}" if got > expected else str(got)
            raise CorruptChunkError(f"file has {size} bytes, expected {expected}")
        header = decode_header(memoryview(head))
        check_header(header, key, self.fingerprint, len(payload))
        check_payload(header, payload)
        return len(payload)

    def delete(self, key: OffloadKey) -> None:
        """Remove a chunk file; a missing file is fine, other errors are logged."""
        try:
            os.unlink(self.path(key))
        except FileNotFoundError:
            pass
        except OSError as exc:
            logger.warning("cannot delete chunk file %s: %s", self.path(key), exc)

    def scan(self) -> Iterator[ScannedFile]:
        """Every chunk file in place; leftover temporary files are removed.

        Temporary files are what a process killed mid-write leaves behind; a
        directory (per fingerprint) has one writing process, so none is live.
        """
        for dirpath, _dirnames, filenames in os.walk(self.directory):
            for name in filenames:
                full = os.path.join(dirpath, name)
                if name.endswith(TMP_SUFFIX):
                    with contextlib.suppress(OSError):
                        os.unlink(full)
                    continue
                if not name.endswith(CHUNK_SUFFIX):
                    continue
                try:
                    key = OffloadKey(bytes.fromhex(name[: -len(CHUNK_SUFFIX)]))
                except ValueError:
                    continue
                if not key or self.path(key) != full:
                    continue
                try:
                    st = os.stat(full)
                except OSError:
                    continue
                yield ScannedFile(key, st.st_size, st.st_mtime)

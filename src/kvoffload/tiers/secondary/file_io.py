"""Chunk files on disk: where they live, atomic writes, checked reads, the scan.

Layout: `<root>/<fingerprint>/<k0>/<k1>/<key hex>.kvc`, where `k0` and `k1` are the
first two bytes of the key in hex (keys are hashes, so 65,536 evenly filled
directories). A file is written under a temporary name and renamed into place, so
a chunk file is either absent or complete. These functions run on I/O threads and
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


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _read_into(fd: int, dest: memoryview) -> None:
    view = dest.cast("B")
    while view:
        got = os.readv(fd, [view])
        if got == 0:
            raise CorruptChunkError("file ended before its payload")
        view = view[got:]


class ChunkFiles:
    """Reads and writes the chunk files of one fingerprint under `root`."""

    def __init__(self, root: str, fingerprint: str, fsync: bool = False) -> None:
        self.fingerprint = fingerprint
        self.directory = os.path.join(root, fingerprint)
        self._fsync = fsync
        os.makedirs(self.directory, exist_ok=True)

    def path(self, key: OffloadKey) -> str:
        name = key.hex()
        return os.path.join(self.directory, name[0:2], name[2:4], name + CHUNK_SUFFIX)

    def file_size(self, key: OffloadKey, payload_len: int) -> int:
        return header_size(len(key), self.fingerprint) + payload_len

    def write(self, key: OffloadKey, payload: memoryview) -> int:
        """Write a chunk file atomically; returns the payload bytes written."""
        path = self.path(key)
        header = encode_header(
            key, self.fingerprint, len(payload), payload_checksum(payload)
        )
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}{TMP_SUFFIX}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC
        try:
            fd = os.open(tmp, flags, 0o644)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(tmp, flags, 0o644)
        try:
            try:
                _write_all(fd, header)
                _write_all(fd, payload)
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

    def read(self, key: OffloadKey, dest: memoryview) -> int:
        """Fill `dest` with the chunk's payload after checking header and checksum.

        `len(dest)` is the expected payload length. Raises `CorruptChunkError` for
        a file that fails any check (the caller deletes it).
        """
        fd = os.open(self.path(key), os.O_RDONLY | _O_CLOEXEC)
        try:
            head_len = header_size(len(key), self.fingerprint)
            size = os.fstat(fd).st_size
            if size != head_len + len(dest):
                raise CorruptChunkError(
                    f"file is {size} bytes, expected {head_len + len(dest)}"
                )
            head = bytearray(head_len)
            _read_into(fd, memoryview(head))
            header = decode_header(memoryview(head))
            check_header(header, key, self.fingerprint, len(dest))
            _read_into(fd, dest)
            check_payload(header, dest)
        finally:
            os.close(fd)
        return len(dest)

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

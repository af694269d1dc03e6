"""Direct I/O of chunk files: the 4 KiB alignment it needs, `O_DIRECT` on and
off, page-aligned header buffers, and whole-file vectored reads and writes.

A chunk file's payload starts at the header rounded up to 4 KiB (`payload_offset`),
so that an aligned payload moves with `O_DIRECT` straight between the host slot
and the disk; `ChunkFiles` (`file_io`) decides when it does (never on a file
system in memory, `file_system_type`).
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import threading

import numpy as np

from kvoffload.tiers.secondary.codec import header_size

ALIGN = 4096
"""Payload offset, and the alignment direct I/O needs of lengths and addresses."""
O_DIRECT: int = getattr(os, "O_DIRECT", 0)
"""The open flag, or 0 where the platform has none (direct I/O is then off)."""


MEMORY_FILE_SYSTEMS = frozenset({"tmpfs", "ramfs"})
"""File systems in memory: no disk for direct I/O to bypass the page cache for."""
_MOUNTS = "/proc/self/mounts"


def file_system_type(path: str) -> str | None:
    """The type of the file system holding `path` (from `/proc/self/mounts`),
    or `None` where that cannot be told."""
    target = os.path.realpath(path)
    best, fstype = "", None
    try:
        with open(_MOUNTS, encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                mount = fields[1].replace("\\040", " ")
                inside = target == mount or target.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, fstype = mount, fields[2]
    except OSError:
        return None
    return fstype


def payload_offset(key_len: int, fingerprint: str) -> int:
    """Where the payload starts in a chunk file: the header rounded up to 4 KiB."""
    return -(-header_size(key_len, fingerprint) // ALIGN) * ALIGN


def chunk_file_size(key_len: int, fingerprint: str, payload_len: int) -> int:
    """Bytes of the file of a chunk with `payload_len` bytes of payload."""
    return payload_offset(key_len, fingerprint) + payload_len


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


def write_all(fd: int, buffers: list[memoryview]) -> None:
    """Write every buffer in order from offset 0, in as few calls as the kernel allows."""
    views = [b for b in buffers if len(b)]
    offset = 0
    while views:
        n = os.pwritev(fd, views, offset)
        if n <= 0:
            raise OSError(errno.EIO, "write made no progress")
        offset += n
        views = _advance(views, n)


def read_all(fd: int, buffers: list[memoryview]) -> int:
    """Fill the buffers in order from offset 0 until they are full or the file ends."""
    views = [b for b in buffers if len(b)]
    total = 0
    while views:
        got = os.preadv(fd, views, total)
        if got == 0:
            break
        total += got
        views = _advance(views, got)
    return total


def is_aligned(view: memoryview) -> bool:
    """Whether direct I/O can move `view`: its address and length 4 KiB-aligned."""
    address = int(np.frombuffer(view, np.uint8).ctypes.data)
    return address % ALIGN == 0 and len(view) % ALIGN == 0


def set_direct(fd: int, on: bool) -> None:
    """Turn `O_DIRECT` on or off for the open file `fd`."""
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    flags = (flags | O_DIRECT) if on else (flags & ~O_DIRECT)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags)


class HeaderPages(threading.local):
    """Per I/O thread: a page-aligned buffer for the padded header (an anonymous
    map is page-aligned), as direct I/O needs; one per size, reused."""

    def __init__(self) -> None:
        self.pages: dict[int, memoryview] = {}

    def get(self, size: int) -> memoryview:
        page = self.pages.get(size)
        if page is None:
            page = self.pages[size] = memoryview(mmap.mmap(-1, size))
        return page

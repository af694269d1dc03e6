"""The host pool: one contiguous buffer of chunk slots, shareable between processes.

The pool needs no torch: it is an `mmap` exposed as a `numpy` array and as
per-slot `memoryview`s, so secondary tiers read and write chunks in place. Given a
name it lives in a shared-memory file (`/dev/shm/NAME`) that another process (the
scheduler, beside the worker that created it) attaches to by name. Its header
names its creator, so that a pool a killed worker left is removed at the next
start (`HostPool.create`), and so is one that names this very process but that no
open pool of it owns (left by an earlier process that had this pid).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import stat
import struct
import threading
import weakref
from pathlib import Path

import numpy as np
import numpy.typing as npt

from kvoffload import processes
from kvoffload.worker.base import OneViewPerChunk
from kvoffload.worker.geometry import GroupGeometry, PoolGeometry

logger = logging.getLogger(__name__)

DEFAULT_SHM_DIR = "/dev/shm"
_HEADER_NBYTES = 4096  # one page, so that the slots start page-aligned
_MAGIC = b"KVOPOOL\x00"
_VERSION = 3
# magic, version, groups, slots, slot bytes, KV layout (`KVLayout.fingerprint`),
# the creator's host and pid namespace (`processes.HOST_NAMESPACE`) and pid
_LAYOUT_NBYTES = 32
_CREATOR_NBYTES = 96
_HEAD = struct.Struct(f"<8sIIQQ{_LAYOUT_NBYTES}s{_CREATOR_NBYTES}sQ")
_GROUP = struct.Struct("<QQQQ")  # group, layers, layer block bytes, blocks per chunk
_MAX_GROUPS = (_HEADER_NBYTES - _HEAD.size) // _GROUP.size
_FILE_MODE = 0o600
"""The pool holds KV caches (prompts can be recovered from them): this user only,
whatever the umask. The attaching process runs as the same user."""

# Named pools this process created and has not closed, by (device, inode): a
# pool file whose header names this process but is not among them was left by
# an earlier process that had the same pid, which has exited.
_OWNED_HERE: set[tuple[int, int]] = set()
_OWNED_LOCK = threading.Lock()


class HostPool(OneViewPerChunk):
    """`num_slots` slots of `slot_nbytes` bytes in one buffer; a `ChunkBuffer`.

    Slot `s` is bytes `[s * slot_nbytes, (s + 1) * slot_nbytes)` of `array`; a
    chunk of group `g` fills its first `chunk_nbytes(g)` bytes. The pool does no
    bookkeeping of which slot holds what: that is the primary tier manager's.
    `close` releases the mapping; the process that created a named pool also
    removes its file then (or at exit, if it never calls `close`). A creator
    killed before either leaves the file; the next `create` of a named pool in
    that directory on its host removes it.
    """

    def __init__(
        self,
        geometry: PoolGeometry,
        num_slots: int,
        mapping: mmap.mmap,
        path: Path | None,
        owner: bool,
        layout: str = "",
        file_id: tuple[int, int] = (0, 0),
    ) -> None:
        """`file_id`: the (device, inode) of the file of a named pool it owns."""
        self._geometry = geometry
        self._layout = layout
        self._num_slots = num_slots
        self._slot_nbytes = geometry.slot_nbytes
        self._mmap = mapping
        self._path = path
        offset = _HEADER_NBYTES if path is not None else 0
        nbytes = num_slots * self._slot_nbytes
        self._view: memoryview | None = memoryview(mapping)[offset : offset + nbytes]
        self._array: npt.NDArray[np.uint8] | None = np.frombuffer(
            self._view, dtype=np.uint8
        )
        self._unlink = (
            weakref.finalize(self, _release_owned, path, file_id)
            if owner and path is not None
            else None
        )

    @classmethod
    def create(
        cls,
        geometry: PoolGeometry,
        num_slots: int,
        *,
        name: str | None = None,
        shm_dir: str = DEFAULT_SHM_DIR,
        exist_ok: bool = False,
        layout: str = "",
    ) -> HostPool:
        """A new pool, anonymous or (with `name`) in the file `shm_dir/name`.

        A named pool first removes from `shm_dir` the pools, and the temporary
        files of pools being created, whose creator was a process of this host
        and pid namespace that has exited: a killed one's (a process that exits
        normally removes its own). Those of live processes, this one's included,
        and of other hosts or pid namespaces (whose pids mean nothing here) are
        left alone.

        The file is made 0600 whatever the umask, and its space is reserved
        up front, so a full `/dev/shm` is an `OSError` here rather than a crash
        at the first write. With `exist_ok`, a file of that name still there
        (a live process's) is replaced.
        `layout` (at most 32 ASCII characters) names how the engine's KV bytes
        are arranged, for the process that attaches: it names the chunks, the
        worker sees the tensors.
        """
        if type(num_slots) is not int or num_slots < 1:
            raise ValueError(f"num_slots: {num_slots!r} is not an integer >= 1")
        if not (layout.isascii() and len(layout) <= _LAYOUT_NBYTES):
            raise ValueError(
                f"layout: {layout!r} is not at most {_LAYOUT_NBYTES} ASCII characters"
            )
        nbytes = num_slots * geometry.slot_nbytes
        if name is None:
            return cls(geometry, num_slots, mmap.mmap(-1, nbytes), None, True, layout)
        if len(geometry.groups) > _MAX_GROUPS:
            raise ValueError(f"a named pool holds at most {_MAX_GROUPS} groups")
        path = _shm_path(name, shm_dir)
        _remove_left_by_exited_creators(path.parent)
        if path.exists() and not exist_ok:
            raise FileExistsError(f"host pool {str(path)!r} exists; pass exist_ok=True")
        # Named by its creator, so that one killed while it reserves the memory
        # (all of it, in a file no attacher can name) is found and removed.
        tmp = path.with_name(f".{path.name}{processes.temporary_suffix()}")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, _FILE_MODE)
        st = os.fstat(fd)
        file_id = (st.st_dev, st.st_ino)
        with _OWNED_LOCK:  # before the rename: another thread's scan may follow
            _OWNED_HERE.add(file_id)
        try:
            # Exactly: the umask may have taken the owner's bits too (0o277
            # leaves 0400, which the attaching scheduler cannot map).
            os.fchmod(fd, _FILE_MODE)
            os.posix_fallocate(fd, 0, _HEADER_NBYTES + nbytes)
            os.pwrite(fd, _encode_header(geometry, num_slots, layout), 0)
            mapping = mmap.mmap(fd, _HEADER_NBYTES + nbytes)
            os.rename(tmp, path)  # attachers see a complete file or none
        except BaseException:
            _release_owned(tmp, file_id)
            raise
        finally:
            os.close(fd)
        return cls(geometry, num_slots, mapping, path, True, layout, file_id)

    @classmethod
    def attach(
        cls,
        name: str,
        geometry: PoolGeometry | None = None,
        num_slots: int | None = None,
        *,
        shm_dir: str = DEFAULT_SHM_DIR,
    ) -> HostPool:
        """The named pool another process created; `ValueError` if it differs
        from the expected `geometry` or `num_slots`, or its file is truncated."""
        path = _shm_path(name, shm_dir)
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            found, found_slots, layout, _ = _decode_header(
                os.pread(fd, _HEADER_NBYTES, 0), path
            )
            expected_size = _HEADER_NBYTES + found_slots * found.slot_nbytes
            if size != expected_size:
                raise ValueError(
                    f"host pool {str(path)!r}: file has {size} bytes, its header "
                    f"says {expected_size}"
                )
            if geometry is not None and geometry != found:
                raise ValueError(
                    f"host pool {str(path)!r}: geometry {found} differs from the "
                    f"expected {geometry}"
                )
            if num_slots is not None and num_slots != found_slots:
                raise ValueError(
                    f"host pool {str(path)!r}: {found_slots} slots, expected {num_slots}"
                )
            mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return cls(found, found_slots, mapping, path, False, layout)

    @property
    def geometry(self) -> PoolGeometry:
        return self._geometry

    @property
    def layout(self) -> str:
        """How the engine's KV bytes in a chunk are arranged, as its creator said."""
        return self._layout

    @property
    def num_slots(self) -> int:
        return self._num_slots

    @property
    def slot_nbytes(self) -> int:
        return self._slot_nbytes

    @property
    def nbytes(self) -> int:
        return self._num_slots * self._slot_nbytes

    @property
    def path(self) -> Path | None:
        """The shared-memory file, or `None` for an anonymous pool."""
        return self._path

    @property
    def array(self) -> npt.NDArray[np.uint8]:
        """All slots as one writable `uint8` array (no copy)."""
        if self._array is None:
            raise ValueError("host pool is closed")
        return self._array

    def chunk_nbytes(self, group: int) -> int:
        return self._geometry.chunk_nbytes(group)

    def slot_view(self, slot: int) -> memoryview:
        """A writable view of the slot's `slot_nbytes` bytes."""
        if self._view is None:
            raise ValueError("host pool is closed")
        if not 0 <= slot < self._num_slots:
            raise IndexError(
                f"slot {slot} is outside the pool (0..{self._num_slots - 1})"
            )
        start = slot * self._slot_nbytes
        return self._view[start : start + self._slot_nbytes]

    def close(self) -> None:
        """Release the mapping (once no view of it is alive) and, if this
        process created a named pool, remove its file."""
        if self._unlink is not None:
            self._unlink()
        view, self._view, self._array = self._view, None, None
        try:
            if view is not None:
                view.release()
            self._mmap.close()
        except BufferError:
            # Views handed out (slot_view, torch tensors) are still alive; the
            # mapping goes when the last of them does.
            logger.debug("host pool %s: views still alive at close", self._path)

    def __enter__(self) -> HostPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _shm_path(name: str, shm_dir: str) -> Path:
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"host pool name {name!r}: expected a plain file name")
    return Path(shm_dir) / name


def _release_owned(path: Path, file_id: tuple[int, int]) -> None:
    """The owner of the pool file `path` is done with it: remove it, unless the
    name is another pool's by now (one created with `exist_ok` in its place)."""
    if _same_file(str(path), file_id[1]):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    with _OWNED_LOCK:
        _OWNED_HERE.discard(file_id)


def _remove_left_by_exited_creators(directory: Path) -> None:
    """Remove the pools and pool temporaries in `directory` that a process known
    to have exited created (`processes.has_exited`), and the pools whose header
    names this process but that no open pool of it owns: an earlier process
    that had this pid created them (pids are reused).

    A pool is told by its header, whatever its name; a pool's temporary file by
    its name (`processes.temporary_suffix`), as its header is written only once
    its memory is reserved. A pool whose creator is alive stays, whoever
    attaches to it: a worker creates its pool and lives as long as its engine,
    whose scheduler attaches to it by name. A live process still mapping a
    removed pool keeps its memory until it unmaps it; only the name goes.
    """
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return  # the directory's own error, if any, comes with the pool's file
    for entry in entries:
        if entry.name.startswith("."):
            if entry.is_file(follow_symlinks=False) and processes.writer_has_exited(
                entry.name
            ):
                _remove_left(Path(entry.path), "temporary file of a host pool")
        else:
            inode = _left_pool(entry)
            if inode is not None and _same_file(entry.path, inode):
                _remove_left(Path(entry.path), "host pool")


def _left_pool(entry: os.DirEntry[str]) -> int | None:
    """The inode of `entry` if it is a host pool whose creator has exited, or
    one that names this process as its creator but that it does not own."""
    if not entry.is_file(follow_symlinks=False):
        return None
    try:
        # Other programs' files share /dev/shm: never block on, nor follow, one.
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(entry.path, flags)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size < _HEADER_NBYTES:
            return None
        _, _, _, (namespace, pid) = _decode_header(
            os.pread(fd, _HEADER_NBYTES, 0), Path(entry.path)
        )
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    if processes.has_exited(namespace, pid):
        return st.st_ino
    ours = namespace == processes.HOST_NAMESPACE and pid == os.getpid()
    with _OWNED_LOCK:
        owned = (st.st_dev, st.st_ino) in _OWNED_HERE
    return st.st_ino if ours and not owned else None


def _same_file(path: str, inode: int) -> bool:
    """Whether `path` is still the file read: a live process may have renamed a
    new pool of the same name into place since."""
    try:
        return os.stat(path, follow_symlinks=False).st_ino == inode
    except OSError:
        return False


def _remove_left(path: Path, what: str) -> None:
    with contextlib.suppress(OSError):  # gone already: another start removed it
        path.unlink()
        logger.warning("removed %s %s: its creator has exited", what, path)


def _encode_header(geometry: PoolGeometry, num_slots: int, layout: str) -> bytes:
    head = _HEAD.pack(
        _MAGIC,
        _VERSION,
        len(geometry.groups),
        num_slots,
        geometry.slot_nbytes,
        layout.encode("ascii"),
        processes.HOST_NAMESPACE.encode("ascii"),
        os.getpid(),
    )
    groups = b"".join(
        _GROUP.pack(g.group, g.num_layers, g.layer_block_nbytes, g.blocks_per_chunk)
        for g in geometry.groups
    )
    return head + groups


def _decode_header(
    data: bytes, path: Path
) -> tuple[PoolGeometry, int, str, tuple[str, int]]:
    """The header's geometry, slots, layout and creator (host and pid namespace,
    pid); `ValueError` if it is not a pool's of this version, or is corrupt."""
    if len(data) < _HEAD.size:
        raise ValueError(f"host pool {str(path)!r}: file is shorter than its header")
    magic, version, num_groups, num_slots, slot_nbytes, layout, namespace, pid = (
        _HEAD.unpack_from(data)
    )
    if magic != _MAGIC or version != _VERSION:
        raise ValueError(
            f"host pool {str(path)!r}: not a kvoffload host pool of version {_VERSION}"
        )
    if not 1 <= num_groups <= _MAX_GROUPS:
        raise ValueError(
            f"host pool {str(path)!r}: corrupt header ({num_groups} groups)"
        )
    groups = [
        GroupGeometry(*_GROUP.unpack_from(data, _HEAD.size + i * _GROUP.size))
        for i in range(num_groups)
    ]
    geometry = PoolGeometry(tuple(groups))
    if geometry.slot_nbytes != slot_nbytes:
        raise ValueError(f"host pool {str(path)!r}: corrupt header (slot size)")
    try:
        creator = (namespace.rstrip(b"\0").decode("ascii"), pid)
        return geometry, num_slots, layout.rstrip(b"\0").decode("ascii"), creator
    except UnicodeDecodeError:
        raise ValueError(f"host pool {str(path)!r}: corrupt header (text)") from None

"""Chunk files on disk: where they live, atomic writes, checked reads, the scan.

Layout: `<root>/<fingerprint>/<abc>/<key hex>.kvc`, where `abc` are the first three
hex digits of the key: keys are hashes, so 4,096 evenly filled directories (2,500
files each at ten million chunks), few enough that creating them costs little. A
file is the header, zero padding to the next 4 KiB, then the payload, written
under a temporary name and renamed into place, so a chunk file is either absent or
complete. Payloads move with direct I/O when their length and host address are
4 KiB-aligned (see `ChunkFiles`; the means are `file_direct`'s). These functions
run on I/O threads and raise `OSError` or `CorruptChunkError`; the tier turns them
into failed chunks. `remove_all` (a reset) renames `<root>/<fingerprint>` aside
and deletes it in the background (`file_reset`). Temporary files are named by
their writers (see `file_temporary`). Modes, and what is not a regular file at a
chunk path, are `file_access`'s concern; the scan of the directory is
`file_scan`'s. `ALIGN`, `payload_offset`, `chunk_file_size` and `DELETING_SUFFIX`
are importable from here too.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial

from kvoffload.keys import OffloadKey
from kvoffload.processes import temporary_suffix
from kvoffload.tiers.secondary.codec import (
    CorruptChunkError,
    check_header,
    check_payload,
    decode_header,
    encode_header,
    header_size,
    payload_checksum,
)
from kvoffload.tiers.secondary.file_access import (
    PRIVATE_FILE_MODE,
    check_regular,
    directory_mode,
    make_directories,
    open_file,
    restrict_directory,
    set_file_mode,
)
from kvoffload.tiers.secondary.file_direct import ALIGN as ALIGN
from kvoffload.tiers.secondary.file_direct import (
    MEMORY_FILE_SYSTEMS,
    O_DIRECT,
    HeaderPages,
    file_system_type,
    is_aligned,
    set_direct,
)
from kvoffload.tiers.secondary.file_direct import chunk_file_size as chunk_file_size
from kvoffload.tiers.secondary.file_direct import payload_offset as payload_offset

# Bound here under these names: tests replace them to tear reads and writes.
from kvoffload.tiers.secondary.file_direct import read_all as _read_all
from kvoffload.tiers.secondary.file_direct import write_all as _write_all
from kvoffload.tiers.secondary.file_entries import CountedEntries, open_ledger
from kvoffload.tiers.secondary.file_reset import DELETING_SUFFIX as DELETING_SUFFIX
from kvoffload.tiers.secondary.file_reset import (
    aside_path,
    delete_trees,
    remove_leftover_trees,
)
from kvoffload.tiers.secondary.file_scan import (
    CHUNK_SUFFIX,
    ScannedFile,
    scan_chunk_files,
)

logger = logging.getLogger(__name__)


class ChunkFiles:
    """Reads and writes the chunk files of one fingerprint under `root`.

    With `direct` (the default), a payload whose length and host address are
    4 KiB-aligned is written and read with `O_DIRECT`: one request per chunk
    straight between the host slot and the disk, no page-cache copy, no dirty
    pages to flush later and no second copy of cached chunks in RAM (the host
    pool is the memory tier). Other payloads, memory file systems (tmpfs,
    where there is no disk to go to and direct I/O only adds work), and file
    systems that refuse it (`EINVAL`, after which it stays off) use the page
    cache.

    Files are made with `file_mode` and directories with the matching
    `directory_mode`, whatever the umask; the fingerprint's directory, if this
    user's, is given that mode at start too (see `file_access`).

    With `capacity`, every file made, renamed, reused or deleted is counted in
    the directory's ledger (see `file_ledger`), and a new file that would take
    the directory past `capacity` is refused (`DirectoryFullError`); where the
    file system offers no lock, one warning, and nothing is counted.
    """

    def __init__(
        self,
        root: str,
        fingerprint: str,
        fsync: bool = False,
        direct: bool = True,
        file_mode: int = PRIVATE_FILE_MODE,
        capacity: int | None = None,
    ) -> None:
        self.fingerprint = fingerprint
        self.directory = os.path.join(root, fingerprint)
        self._fsync = fsync
        self._file_mode = file_mode
        self._directory_mode = directory_mode(file_mode)
        make_directories(self.directory, self._directory_mode)
        restrict_directory(self.directory, self._directory_mode)
        self._direct = (
            direct
            and bool(O_DIRECT)
            and file_system_type(self.directory) not in MEMORY_FILE_SYSTEMS
        )
        self._pages = HeaderPages()
        ledger = open_ledger(self.directory, capacity, file_mode, self._directory_mode)
        self._entries = CountedEntries(self.directory, self._directory_mode, ledger)

    @property
    def directory_bytes(self) -> int | None:
        """The bytes of chunk and temporary files in the directory as its
        ledger last counted them (every file of every engine writing there);
        `None` without a ledger."""
        return self._entries.ledger.total

    def close(self) -> None:
        self._entries.ledger.close()

    def check_writable(self) -> None:
        """Create and remove a file in the directory; raises the `OSError` of a
        directory this process cannot write (read-only, no permission). Named
        as a temporary file, so a process killed here leaves nothing a later
        start does not remove."""
        probe = os.path.join(self.directory, f".probe{temporary_suffix()}")
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        os.close(open_file(probe, flags, self._file_mode))
        os.unlink(probe)

    @property
    def direct(self) -> bool:
        """Whether aligned payloads still use direct I/O."""
        return self._direct

    def path(self, key: OffloadKey) -> str:
        name = key.hex()
        return os.path.join(self.directory, name[:3], name + CHUNK_SUFFIX)

    def file_size(self, key: OffloadKey, payload_len: int) -> int:
        return chunk_file_size(len(key), self.fingerprint, payload_len)

    def _header_page(self, key: OffloadKey, header: bytes) -> memoryview:
        page = self._pages.get(payload_offset(len(key), self.fingerprint))
        page[: len(header)] = header
        page[len(header) :] = bytes(len(page) - len(header))
        return page

    def _use_direct(self, parts: Sequence[memoryview]) -> bool:
        return self._direct and all(map(is_aligned, parts))

    def _direct_refused(self, fd: int, exc: OSError) -> bool:
        """Whether `exc` is the file system refusing direct I/O on `fd`; if so,
        direct I/O is off from now on and `fd` is back on the page cache."""
        if exc.errno != errno.EINVAL:
            return False
        self._no_direct(exc)
        set_direct(fd, False)
        return True

    def _no_direct(self, exc: OSError) -> None:
        if self._direct:
            self._direct = False
            logger.warning(
                "%s: direct I/O refused (%s); using the page cache from now on",
                self.directory,
                exc,
            )

    def write(
        self,
        key: OffloadKey,
        payload: Sequence[memoryview],
        recycle: OffloadKey | None = None,
        hint: float | None = None,
    ) -> int:
        """Write a chunk file atomically; returns the payload bytes written. The
        payload is the parts' bytes in order (one part per tensor-parallel rank);
        `hint` is its retention hint (seconds from now, 0, or `None`), kept in
        the header in Unix time.

        With `recycle`, the file of that evicted chunk (of the same size) is
        renamed to the temporary name and overwritten in place: no inode or block
        allocation, which on a full tier (the steady state of a cache) is most of
        the cost of a new file. The evicted chunk vanishes at that rename.
        """
        path = self.path(key)
        data = [part.cast("B") for part in payload]
        nbytes = sum(len(part) for part in data)
        header = encode_header(
            key, self.fingerprint, nbytes, payload_checksum(data), hint, time.time()
        )
        buffers = [self._header_page(key, header), *data]
        size = sum(len(b) for b in buffers)
        direct = self._use_direct(data)
        tmp = path + temporary_suffix()
        fd = self._reuse(recycle, tmp, direct, size) if recycle is not None else None
        if fd is None:
            fd = self._create(tmp, direct, size)
        try:
            try:
                status = check_regular(fd, tmp)
                set_file_mode(fd, status, self._file_mode)
                if status.st_size != size:
                    os.ftruncate(fd, size)
                try:
                    _write_all(fd, buffers)
                except OSError as exc:
                    if not (direct and self._direct_refused(fd, exc)):
                        raise
                    _write_all(fd, buffers)
                if self._fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            self._entries.rename_into_place(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                self._entries.remove(tmp)
            raise
        return nbytes

    def _create(self, tmp: str, direct: bool, size: int) -> int:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        opener = partial(self._open, partial(self._open_creating_dirs, tmp), flags)
        return self._entries.create(tmp, size, partial(opener, direct))

    def _open(self, opener: Callable[[int], int], flags: int, direct: bool) -> int:
        """`opener(flags)`, with O_DIRECT when `direct`. A file system that refuses
        O_DIRECT at open (EINVAL) turns direct I/O off, and the open is retried
        without it: the first I/O after a restart may be a read or a write."""
        if direct:
            try:
                return opener(flags | O_DIRECT)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self._no_direct(exc)
        return opener(flags)

    def _open_creating_dirs(self, tmp: str, flags: int) -> int:
        try:
            return open_file(tmp, flags, self._file_mode)
        except FileNotFoundError:
            make_directories(os.path.dirname(tmp), self._directory_mode)
            return open_file(tmp, flags, self._file_mode)

    def _reuse(
        self, victim: OffloadKey, tmp: str, direct: bool, size: int
    ) -> int | None:
        """The evicted chunk's file, of `size` bytes, open for writing and
        renamed to `tmp`; or `None` where it cannot be reused, its name then
        removed (the chunk is evicted). Opened before the rename, so that only
        a regular file is ever moved to the temporary name: a directory put
        there would make every later write of this thread to that name fail."""
        source = self.path(victim)
        try:
            fd = open_file(source, os.O_WRONLY | (O_DIRECT if direct else 0))
        except OSError:
            # Gone (deleted by hand, say: its count is corrected) or not to
            # be opened so (O_DIRECT refused, say): `_create` makes a file.
            self.delete(victim)
            return None
        try:
            self._entries.move(source, tmp, check_regular(fd, source), size)
        except OSError:
            os.close(fd)
            self.delete(victim)
            return None
        return fd

    def read(self, key: OffloadKey, dest: Sequence[memoryview]) -> int:
        """`read_hinted`'s payload bytes."""
        return self.read_hinted(key, dest)[0]

    def read_hinted(
        self, key: OffloadKey, dest: Sequence[memoryview]
    ) -> tuple[int, float | None]:
        """Fill `dest`, in order, with the chunk's payload and check header and
        checksum; returns the payload bytes and the retention hint the header
        holds now (seconds left, 0, or `None`; a file of format 1 has none).

        The lengths of `dest` sum to the expected payload length. Raises
        `CorruptChunkError` for a file that fails any check (the caller deletes
        it), `NotAChunkFileError` for something other than a regular file (a
        FIFO, say: never blocks), and `OSError` where the file could not be
        read, which says nothing of its contents (`FileNotFoundError`: it is
        gone). A header failing its checksum is read once more first: it may
        have been renewed in place as it was read (`file_renewals`).
        """
        payload = [part.cast("B") for part in dest]
        nbytes = sum(len(part) for part in payload)
        head = self._pages.get(payload_offset(len(key), self.fingerprint))
        expected = len(head) + nbytes
        direct = self._use_direct(payload)
        path = self.path(key)
        fd = self._open_for_reading(path, direct)
        try:
            size = check_regular(fd, path).st_size
            if size != expected:
                raise CorruptChunkError(f"file has {size} bytes, expected {expected}")
            try:
                got = _read_all(fd, [head, *payload])
            except OSError as exc:
                if not (direct and self._direct_refused(fd, exc)):
                    raise
                got = _read_all(fd, [head, *payload])
        finally:
            os.close(fd)
        if got != expected:
            raise CorruptChunkError(f"file has {got} bytes, expected {expected}")
        try:
            header = decode_header(head)
        except CorruptChunkError:
            # A header renewed in place (`file_renewals`, by this engine or
            # another) as it was read may read half written: read once more
            # before the file counts as bad.
            header = decode_header(self._read_header(path, len(key)))
        check_header(header, key, self.fingerprint, nbytes)
        check_payload(header, payload)
        return nbytes, header.hint_left(time.time())

    def _read_header(self, path: str, key_len: int) -> bytes:
        fd = open_file(path, os.O_RDONLY)
        try:
            check_regular(fd, path)
            return os.pread(fd, header_size(key_len, self.fingerprint), 0)
        finally:
            os.close(fd)

    def _open_for_reading(self, path: str, direct: bool) -> int:
        return self._open(partial(open_file, path), os.O_RDONLY, direct)

    def delete(self, key: OffloadKey) -> None:
        """Remove a chunk file (an evicted chunk's name, whatever is there); a
        missing file is fine, other errors are logged."""
        try:
            self._entries.remove(self.path(key))
        except OSError as exc:
            logger.warning("cannot delete chunk file %s: %s", self.path(key), exc)

    def remove_all(self) -> None:
        """Remove every chunk file of the fingerprint, as any process sees it.

        The directory is renamed aside, in one atomic step, and a new empty one
        takes its place: no file of it can be found, loaded or finished (a
        write in flight elsewhere fails its rename) afterwards. The old tree is
        deleted on a background thread, so the caller does not wait for
        millions of unlinks. Where renaming fails, files are deleted here.
        """
        aside = aside_path(self.directory, self.fingerprint)
        try:
            # In a hold: no file is then being made or counted in the old
            # directory, whose ledger goes with it; the new one counts afresh.
            with self._entries.ledger.hold():
                os.rename(self.directory, aside)
            self._entries.ledger.forget()
        except FileNotFoundError:
            aside = ""  # removed by hand, say: nothing to delete
        except OSError as exc:
            logger.warning("cannot rename %s aside: %s", self.directory, exc)
            for scanned in self.scan(remove_abandoned=True):
                self.delete(scanned.key)
            return
        with contextlib.suppress(OSError):  # writes create it too
            make_directories(self.directory, self._directory_mode)
        if aside:
            delete_trees([aside])

    def remove_leftovers(self) -> None:
        """Delete, in the background, trees `remove_all` left when its process
        ended before it finished deleting them (this fingerprint's only)."""
        remove_leftover_trees(self.directory, self.fingerprint)

    def scan(self, remove_abandoned: bool = False) -> Iterator[ScannedFile]:
        """Every chunk file in place; with `remove_abandoned`, the abandoned
        temporary files are removed (see `scan_chunk_files`)."""
        return scan_chunk_files(
            self.directory, self.path, remove_abandoned, self._entries.ledger
        )

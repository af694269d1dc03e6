"""The file tier's work on its I/O threads: batches of chunk writes and reads
between host slots and chunk files, each chunk's outcome sorted for the
scheduler thread (stored, skipped for want of room, failed; loaded, lost,
failed), never raised.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kvoffload.keys import OffloadKey, offload_key_group
from kvoffload.tiers.secondary.base import TierJob
from kvoffload.tiers.secondary.codec import CorruptChunkError
from kvoffload.tiers.secondary.executor import BatchOutcome
from kvoffload.tiers.secondary.file_access import NotAChunkFileError
from kvoffload.tiers.secondary.file_io import ChunkFiles
from kvoffload.tiers.secondary.file_ledger import DirectoryFullError
from kvoffload.tiers.secondary.file_space import (
    NO_SPACE_ERRNOS,
    TOO_BIG_ERRNOS,
    TierSpace,
)
from kvoffload.worker import ChunkBuffer

logger = logging.getLogger(__name__)


class FileBatches:
    """Runs batches of the tier `name`'s jobs; `file_size(key)` is the size of
    the file of `key`'s chunk."""

    def __init__(
        self,
        name: str,
        files: ChunkFiles,
        buffer: ChunkBuffer,
        space: TierSpace,
        file_size: Callable[[OffloadKey], int],
    ) -> None:
        self._name = name
        self._files = files
        self._buffer = buffer
        self._space = space
        self._file_size = file_size

    def write(
        self, job: TierJob, indices: tuple[int, ...], recycle: dict[int, OffloadKey]
    ) -> BatchOutcome:
        """Write the chunks at `indices`. A write the disk has no room for is
        `full` (a skipped store) and its bytes are noted for `_finish_store`,
        which lowers the capacity; any other error fails the store."""
        failed: list[int] = []
        full: list[int] = []
        no_space = 0
        errors: list[OSError] = []
        num_bytes = 0
        for i in indices:
            key = job.keys[i]
            views = self._buffer.chunk_views(job.slots[i], offload_key_group(key))
            try:
                num_bytes += self._files.write(key, views, recycle.get(i), job.hint(i))
            except DirectoryFullError:
                # Other engines' files fill the directory: skipped; the
                # capacity in force now counts them (see `_capacity_in_force`).
                failed.append(i)
                full.append(i)
            except OSError as exc:
                failed.append(i)
                if exc.errno in NO_SPACE_ERRNOS:
                    no_space += self._file_size(key)
                    full.append(i)
                elif exc.errno in TOO_BIG_ERRNOS:
                    full.append(i)
                else:
                    errors.append(exc)
        if no_space:
            self._space.note_no_space(job.job_id, no_space)
        if full:
            logger.debug("%s: %d chunk writes found no room", self._name, len(full))
        if errors:
            logger.warning(
                "%s: %d of %d chunk writes failed (first: %s)",
                self._name,
                len(errors),
                len(indices),
                errors[0],
            )
        return BatchOutcome(failed, num_bytes, full=full)

    def read(self, job: TierJob, indices: tuple[int, ...]) -> BatchOutcome:
        """Read the chunks at `indices`, with the retention hints their headers
        hold. A file failing a check is deleted and, like a file that is gone,
        lost; any other error fails the load only."""
        failed: list[int] = []
        lost: list[int] = []
        errors: list[OSError] = []
        hints: dict[int, float] = {}
        num_bytes = 0
        for i in indices:
            key = job.keys[i]
            views = self._buffer.chunk_views(job.slots[i], offload_key_group(key))
            try:
                nbytes, hint = self._files.read_hinted(key, views)
                num_bytes += nbytes
                if hint is not None:
                    hints[i] = hint
            except CorruptChunkError as exc:
                # Wrong bytes: never loaded, and deleted so it is a miss.
                logger.warning("%s: dropping chunk %s: %s", self._name, key.hex(), exc)
                self._files.delete(key)
                lost.append(i)
            except FileNotFoundError:
                lost.append(i)  # evicted by an engine sharing the directory, say
            except NotAChunkFileError as exc:
                # Not a file this tier wrote (a FIFO, a directory, a link): a
                # miss from now on, left in place, as it is not the tier's.
                logger.warning(
                    "%s: passing over %s: %s", self._name, self._files.path(key), exc
                )
                lost.append(i)
            except OSError as exc:
                # No descriptors, memory or permission, an I/O error: nothing
                # known to be wrong with the file, which a later load may read.
                errors.append(exc)
                failed.append(i)
        if errors:
            logger.warning(
                "%s: %d of %d chunk reads failed, files kept (first: %s)",
                self._name,
                len(errors),
                len(indices),
                errors[0],
            )
        return BatchOutcome([*failed, *lost], num_bytes, lost, hints=hints)

    def delete_then_write(
        self,
        job: TierJob,
        indices: tuple[int, ...],
        recycle: dict[int, OffloadKey],
        victims: tuple[OffloadKey, ...],
    ) -> BatchOutcome:
        for key in victims:
            self._files.delete(key)
        return self.write(job, indices, recycle)

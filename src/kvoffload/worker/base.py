"""The data plane's vocabulary: transfer jobs, their results, the host buffer.

The scheduler-side connector describes each job as pairs of engine blocks and host
blocks per KV-cache group; the worker copies them asynchronously and reports each
job's success, bytes and time. A host block index is
`slot * blocks_per_chunk + index_within_chunk`, so a job can start or end in the
middle of a chunk.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass
from enum import Enum
from typing import Protocol


class TransferDirection(Enum):
    STORE = "store"
    """Engine (device) blocks to host slots."""
    LOAD = "load"
    """Host slots to engine (device) blocks."""


@dataclass(frozen=True)
class GroupTransfer:
    """The engine blocks of one KV-cache group that a job moves, and where to."""

    group: int
    engine_blocks: tuple[int, ...]
    host_blocks: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.engine_blocks) != len(self.host_blocks):
            raise ValueError(
                f"group {self.group}: {len(self.engine_blocks)} engine blocks but "
                f"{len(self.host_blocks)} host blocks"
            )


@dataclass(frozen=True)
class TransferJob:
    """One asynchronous copy between the engine's KV cache and the host pool."""

    job_id: int
    direction: TransferDirection
    groups: tuple[GroupTransfer, ...]
    fail: bool = False
    """Copy nothing and report the job failed: a load whose chunks left the host
    tier before it could be planned (its request recomputes them)."""

    @property
    def num_blocks(self) -> int:
        return sum(len(g.engine_blocks) for g in self.groups)


@dataclass(frozen=True)
class JobResult:
    """How a job ended. A failed job moved nothing usable."""

    job_id: int
    success: bool
    num_bytes: int = 0
    seconds: float = 0.0


class TransferWorker(ABC):
    """Runs transfer jobs next to the model, asynchronously.

    `submit` never blocks on the copy and never raises for a failed copy: the
    failure is reported by `get_finished` as `success=False`, as it is for a job
    marked `fail`. Jobs finish in any order. A load waits for the engine's own pending writes to its destination
    blocks before copying.
    """

    @abstractmethod
    def submit(self, job: TransferJob) -> None:
        """Start `job`; its result arrives later through `get_finished`."""

    @abstractmethod
    def get_finished(self) -> list[JobResult]:
        """Results of the jobs finished since the last call."""

    @abstractmethod
    def wait(self, job_ids: Collection[int]) -> None:
        """Block until the given jobs have finished (results stay queued)."""

    def shutdown(self) -> None:
        """Finish or abandon running jobs and release resources."""


class ChunkBuffer(Protocol):
    """Host memory holding one chunk per slot, shared with secondary tiers.

    Secondary tiers read a chunk's bytes from, and write them into, its slot
    without intermediate copies. A chunk of group `g` is `chunk_nbytes(g)` bytes:
    in one pool, the first bytes of its slot; with tensor parallelism, each
    rank's slice in that rank's pool (`RankedChunkBuffer`), in rank order.
    `slot_nbytes` bounds every chunk.
    """

    @property
    def num_slots(self) -> int: ...

    @property
    def slot_nbytes(self) -> int: ...

    def chunk_nbytes(self, group: int) -> int: ...

    def chunk_views(self, slot: int, group: int) -> list[memoryview]:
        """Writable views that together hold the slot's chunk of `group`, in
        order (their lengths sum to `chunk_nbytes(group)`)."""
        ...


class OneViewPerChunk(ABC):
    """`chunk_views` for a buffer whose chunk is the head of its slot."""

    @abstractmethod
    def chunk_nbytes(self, group: int) -> int: ...

    @abstractmethod
    def slot_view(self, slot: int) -> memoryview: ...

    def chunk_views(self, slot: int, group: int) -> list[memoryview]:
        return [self.slot_view(slot)[: self.chunk_nbytes(group)]]

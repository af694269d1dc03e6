"""`ChunkBuffer`s: a plain in-process one, and one over every rank's pool.

The engine's host pool (the worker's) implements the protocol over memory shared
with the device copies; `ArrayChunkBuffer` is an anonymous memory map, for
benchmarks, tests and simulation. With tensor parallelism each rank's worker
fills its own pool with its slice of every chunk, at the same slot;
`RankedChunkBuffer` shows secondary tiers those slices as one chunk.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence

from kvoffload.worker import ChunkBuffer
from kvoffload.worker.base import OneViewPerChunk


class ArrayChunkBuffer(OneViewPerChunk):
    """`num_slots` slots of `slot_nbytes` bytes; group `g` chunks use the first
    `group_nbytes[g]` bytes of a slot (any group the whole slot by default)."""

    def __init__(
        self,
        num_slots: int,
        slot_nbytes: int,
        group_nbytes: Sequence[int] | None = None,
    ) -> None:
        if type(num_slots) is not int or num_slots < 1:
            raise ValueError(f"num_slots: {num_slots!r} must be an int >= 1")
        if type(slot_nbytes) is not int or slot_nbytes < 1:
            raise ValueError(f"slot_nbytes: {slot_nbytes!r} must be an int >= 1")
        sizes = tuple(group_nbytes) if group_nbytes is not None else None
        if sizes is not None and (
            not sizes or any(not 0 < n <= slot_nbytes for n in sizes)
        ):
            raise ValueError(
                f"group_nbytes: {group_nbytes!r} must be sizes in [1, {slot_nbytes}]"
            )
        self._num_slots = num_slots
        self._slot_nbytes = slot_nbytes
        self._group_nbytes = sizes
        self._mem = mmap.mmap(-1, num_slots * slot_nbytes)
        self._view = memoryview(self._mem)

    @property
    def num_slots(self) -> int:
        return self._num_slots

    @property
    def slot_nbytes(self) -> int:
        return self._slot_nbytes

    def chunk_nbytes(self, group: int) -> int:
        if self._group_nbytes is None:
            return self._slot_nbytes
        if not 0 <= group < len(self._group_nbytes):
            raise ValueError(
                f"group {group} has no chunk size; groups 0..{len(self._group_nbytes) - 1}"
            )
        return self._group_nbytes[group]

    def slot_view(self, slot: int) -> memoryview:
        if not 0 <= slot < self._num_slots:
            raise IndexError(f"slot {slot} out of range [0, {self._num_slots})")
        start = slot * self._slot_nbytes
        return self._view[start : start + self._slot_nbytes]


class RankedChunkBuffer:
    """The pools of all tensor-parallel ranks as one `ChunkBuffer`: a chunk is
    every rank's slice at the same slot, in rank order."""

    def __init__(self, ranks: Sequence[ChunkBuffer]) -> None:
        if not ranks:
            raise ValueError("ranks: need at least one buffer")
        slots = {rank.num_slots for rank in ranks}
        if len(slots) != 1:
            raise ValueError(f"ranks: buffers differ in slot count {sorted(slots)}")
        self._ranks = tuple(ranks)
        self._num_slots = slots.pop()

    @property
    def num_slots(self) -> int:
        return self._num_slots

    @property
    def slot_nbytes(self) -> int:
        return sum(rank.slot_nbytes for rank in self._ranks)

    def chunk_nbytes(self, group: int) -> int:
        return sum(rank.chunk_nbytes(group) for rank in self._ranks)

    def chunk_views(self, slot: int, group: int) -> list[memoryview]:
        return [view for rank in self._ranks for view in rank.chunk_views(slot, group)]


def scatter(data: bytes | memoryview, views: Sequence[memoryview]) -> None:
    """Copy `data` into `views` in order (their lengths must sum to its length)."""
    source = memoryview(data).cast("B")
    if len(source) != sum(len(view) for view in views):
        raise ValueError(
            f"scatter: {len(source)} bytes into views of {sum(map(len, views))}"
        )
    start = 0
    for view in views:
        view[:] = source[start : start + len(view)]
        start += len(view)

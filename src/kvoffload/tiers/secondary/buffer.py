"""A plain in-process `ChunkBuffer`, for benchmarks, tests and simulation.

The engine's host pool (the worker's) implements the same protocol over pinned
memory shared with the device copies; this one is an anonymous memory map.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence


class ArrayChunkBuffer:
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

"""Sizes of chunks and host-pool slots, computed without tensors.

The worker derives a `PoolGeometry` from the engine's KV tensors; the scheduler
process, which has no tensors, builds the same one from a per-group description
so that both sides agree on the slot size and on how many slots a budget buys.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class GroupGeometry:
    """Bytes of one KV-cache group: `num_layers` layers of `layer_block_nbytes` each.

    `layer_block_nbytes` is what one engine block occupies in one layer (K and V
    together). A chunk holds `blocks_per_chunk` engine blocks of every layer.
    """

    group: int
    num_layers: int
    layer_block_nbytes: int
    blocks_per_chunk: int

    def __post_init__(self) -> None:
        for field in ("group", "num_layers", "layer_block_nbytes", "blocks_per_chunk"):
            value = getattr(self, field)
            minimum = 0 if field == "group" else 1
            if type(value) is not int or value < minimum:
                raise ValueError(
                    f"group geometry {field}: {value!r} is not an integer >= {minimum}"
                )

    @property
    def block_nbytes(self) -> int:
        """Bytes of one engine block over all layers of the group."""
        return self.num_layers * self.layer_block_nbytes

    @property
    def chunk_nbytes(self) -> int:
        """Bytes of one chunk of this group."""
        return self.block_nbytes * self.blocks_per_chunk


@dataclass(frozen=True)
class PoolGeometry:
    """The host pool's shape: one slot holds one chunk of any group.

    The slot size is the largest chunk over all groups; a chunk of a smaller
    group occupies the first `chunk_nbytes(group)` bytes of its slot.
    """

    groups: tuple[GroupGeometry, ...]

    def __post_init__(self) -> None:
        if not self.groups:
            raise ValueError("pool geometry: at least one group is required")
        ids = [g.group for g in self.groups]
        if len(set(ids)) != len(ids):
            raise ValueError(f"pool geometry: group ids {ids} are not unique")

    @classmethod
    def of(cls, groups: Iterable[GroupGeometry]) -> PoolGeometry:
        """The geometry of `groups`, ordered by group id."""
        return cls(tuple(sorted(groups, key=lambda g: g.group)))

    @property
    def slot_nbytes(self) -> int:
        return max(g.chunk_nbytes for g in self.groups)

    def group(self, group: int) -> GroupGeometry:
        for g in self.groups:
            if g.group == group:
                return g
        known = [g.group for g in self.groups]
        raise KeyError(f"group {group} is not in the pool geometry (groups {known})")

    def chunk_nbytes(self, group: int) -> int:
        return self.group(group).chunk_nbytes

    def num_slots_for(self, cpu_bytes_to_use: int, ranks: int = 1) -> int:
        """How many slots each of `ranks` pools of this geometry has when they
        share `cpu_bytes_to_use` bytes: the same number in every pool, so that a
        chunk has the same slot on every rank (at least one, else error).

        With tensor parallelism every rank's pool holds that rank's slice of each
        chunk, so one chunk costs `ranks` slots; as in vLLM's
        OffloadingConnector, the budget is the engine's total, not each rank's.
        """
        chunk_nbytes = self.slot_nbytes * ranks
        slots = cpu_bytes_to_use // chunk_nbytes
        if slots < 1:
            where = "" if ranks == 1 else f" on each of {ranks} ranks"
            raise ValueError(
                f"cpu_bytes_to_use: {cpu_bytes_to_use} bytes is smaller than one "
                f"chunk slot{where} ({chunk_nbytes} bytes); allowed: at least "
                f"{chunk_nbytes}"
            )
        return slots

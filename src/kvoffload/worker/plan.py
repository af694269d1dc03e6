"""A job's copies, checked and cut into runs of consecutive host blocks.

Host blocks of one chunk are consecutive in every region of its slot, so a run
(consecutive host blocks of one slot) is one contiguous byte range per region:
one gather or scatter each. Every index is checked here, before any byte moves,
so that a bad job fails whole instead of half-copying or tripping a device assert.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvoffload.worker.base import TransferJob
from kvoffload.worker.layout import GroupLayout, KVLayout


class InvalidJobError(ValueError):
    """A job names a group, engine block or host block that does not exist."""


@dataclass(frozen=True)
class CopyRun:
    """Engine blocks copied to or from host blocks `first..first+n-1` of `slot`."""

    slot: int
    first: int
    engine_blocks: tuple[int, ...]

    @property
    def engine_start(self) -> int | None:
        """The first engine block if the engine blocks are consecutive, else None."""
        first = self.engine_blocks[0]
        if self.engine_blocks == tuple(range(first, first + len(self.engine_blocks))):
            return first
        return None


@dataclass(frozen=True)
class GroupPlan:
    """The runs of one group and the group's layout."""

    layout: GroupLayout
    runs: tuple[CopyRun, ...]

    @property
    def num_bytes(self) -> int:
        return sum(len(r.engine_blocks) for r in self.runs) * self.layout.block_nbytes

    def host_offset(self, region: int, run: CopyRun, slot_nbytes: int) -> int:
        """Where `run`'s bytes of region `region` start in the host pool."""
        block_nbytes = self.layout.regions[region].block_nbytes
        return (
            run.slot * slot_nbytes
            + self.layout.chunk_offsets[region]
            + run.first * block_nbytes
        )


def plan_job(
    job: TransferJob, layout: KVLayout, num_slots: int
) -> tuple[GroupPlan, ...]:
    """The runs of `job`; `InvalidJobError` if any index is out of range."""
    plans = []
    for transfer in job.groups:
        try:
            group = layout.group(transfer.group)
        except KeyError as exc:
            raise InvalidJobError(f"job {job.job_id}: {exc.args[0]}") from None
        bpc = group.blocks_per_chunk
        runs: list[CopyRun] = []
        slot, first, prev = -1, 0, -2
        blocks: list[int] = []
        for engine_block, host_block in zip(
            transfer.engine_blocks, transfer.host_blocks, strict=True
        ):
            if not 0 <= engine_block < group.num_blocks:
                raise InvalidJobError(
                    f"job {job.job_id}: engine block {engine_block} of group "
                    f"{group.group} is outside 0..{group.num_blocks - 1}"
                )
            if not 0 <= host_block < num_slots * bpc:
                raise InvalidJobError(
                    f"job {job.job_id}: host block {host_block} (slot "
                    f"{host_block // bpc}) is outside the pool of {num_slots} slots"
                )
            block_slot, index = divmod(host_block, bpc)
            if block_slot != slot or index != prev + 1:
                if blocks:
                    runs.append(CopyRun(slot, first, tuple(blocks)))
                slot, first, blocks = block_slot, index, []
            blocks.append(engine_block)
            prev = index
        if blocks:
            runs.append(CopyRun(slot, first, tuple(blocks)))
        plans.append(GroupPlan(group, tuple(runs)))
    return tuple(plans)

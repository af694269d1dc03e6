"""Copies through a device staging buffer laid out as the host pool is (GPU path).

On a GPU the cost lies in the host link and in the number of operations issued,
not in device memory traffic. So a store first gathers a piece's whole chunks on
the device into a staging buffer in host order, where a whole chunk of every
layer is one contiguous range (`ChunkMover`: one kernel for all regions, or one
per region), then copies each run of adjacent slots to the host in one
asynchronous copy. A load runs the same steps backwards. Partial chunks (a job
starting or ending mid-chunk) take one copy per region and run.

The steps are split so that the CUDA worker can put the gather and the host
copies on different streams and overlap one piece's host copies with the next
piece's gather. The code is device-agnostic torch; tests run it on CPU tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from kvoffload.worker.layout import GroupLayout
from kvoffload.worker.plan import CopyRun, GroupPlan

CopyFn = Callable[[torch.Tensor, torch.Tensor], None]
"""`copy(dst, src)`: one host-link copy (asynchronous on a GPU)."""


class ChunkMover(Protocol):
    """Moves whole chunks of one group between engine blocks and a staging
    buffer in host order (`[chunks, chunk bytes]`, regions as in a slot)."""

    def gather(self, blocks: torch.Tensor, staging: torch.Tensor) -> None:
        """Engine blocks `blocks` (`chunks * blocks_per_chunk`, chunk by chunk)
        into the `uint8` buffer `staging` of `chunks * chunk_nbytes` bytes."""

    def scatter(self, blocks: torch.Tensor, staging: torch.Tensor) -> None:
        """The reverse of `gather`: `staging` into engine blocks `blocks`."""


class TorchChunkMover:
    """A `ChunkMover` of plain torch operations: two per region (a gather of
    the region's blocks, then a strided copy into place)."""

    def __init__(self, layout: GroupLayout, engine: Sequence[torch.Tensor]) -> None:
        self._layout = layout
        self._engine = list(engine)

    def gather(self, blocks: torch.Tensor, staging: torch.Tensor) -> None:
        for region, view in enumerate(self._engine):
            rows = view.index_select(0, blocks)
            place = _region_of(self._layout, staging, region)
            place.copy_(rows.view(place.shape))

    def scatter(self, blocks: torch.Tensor, staging: torch.Tensor) -> None:
        for region, view in enumerate(self._engine):
            place = _region_of(self._layout, staging, region)
            view.index_copy_(0, blocks, place.reshape(-1, view.shape[1]))


def _region_of(layout: GroupLayout, staging: torch.Tensor, region: int) -> torch.Tensor:
    """Region `region`'s bytes of every chunk in `staging`: `[chunks, bytes]`."""
    chunk_nbytes = layout.block_nbytes * layout.blocks_per_chunk
    nbytes = layout.regions[region].block_nbytes * layout.blocks_per_chunk
    chunks = staging.numel() // chunk_nbytes
    return staging.as_strided(
        (chunks, nbytes),
        (chunk_nbytes, 1),
        staging.storage_offset() + layout.chunk_offsets[region],
    )


@dataclass(frozen=True)
class StagedPiece:
    """A piece of a job as the staging path moves it.

    `blocks` are the engine blocks of its whole chunks, in staging order;
    `spans` are `(staging offset, host offset, bytes)` host copies of runs of
    adjacent slots; `partial` are the runs that are not whole chunks.
    """

    plan: GroupPlan
    blocks: tuple[int, ...]
    spans: tuple[tuple[int, int, int], ...]
    partial: tuple[CopyRun, ...]

    @property
    def staging_nbytes(self) -> int:
        layout = self.plan.layout
        return len(self.blocks) * layout.block_nbytes


def batches(plan: GroupPlan, max_nbytes: int) -> list[GroupPlan]:
    """`plan` cut between runs into pieces of at most `max_nbytes` (or one run),
    so that staging memory stays bounded whatever the job's size."""
    pieces: list[GroupPlan] = []
    runs: list[CopyRun] = []
    nbytes = 0
    for run in plan.runs:
        size = len(run.engine_blocks) * plan.layout.block_nbytes
        if runs and nbytes + size > max_nbytes:
            pieces.append(GroupPlan(plan.layout, tuple(runs)))
            runs, nbytes = [], 0
        runs.append(run)
        nbytes += size
    if runs:
        pieces.append(GroupPlan(plan.layout, tuple(runs)))
    return pieces


def stage(piece: GroupPlan, slot_nbytes: int) -> StagedPiece:
    """How `piece` moves: its whole chunks through staging, the rest apart."""
    layout = piece.layout
    bpc = layout.blocks_per_chunk
    chunk_nbytes = layout.block_nbytes * bpc
    full = [run for run in piece.runs if len(run.engine_blocks) == bpc]
    partial = tuple(run for run in piece.runs if len(run.engine_blocks) != bpc)
    spans: list[tuple[int, int, int]] = []
    for i, run in enumerate(full):
        start = run.slot * slot_nbytes
        if spans and chunk_nbytes == slot_nbytes:
            first, host, nbytes = spans[-1]
            if host + nbytes == start:
                spans[-1] = (first, host, nbytes + chunk_nbytes)
                continue
        spans.append((i * chunk_nbytes, start, chunk_nbytes))
    blocks = tuple(b for run in full for b in run.engine_blocks)
    return StagedPiece(piece, blocks, tuple(spans), partial)


def copy_spans(
    staged: StagedPiece,
    staging: torch.Tensor,
    host: torch.Tensor,
    store: bool,
) -> None:
    """The host copies of `staged`'s whole chunks, to (`store`) or from host,
    asynchronous where the device allows.

    All of them go to torch in one call: issuing a copy from Python costs
    several microseconds, about what the link needs for 256 KiB, so with small
    chunks a loop of `copy_` calls, not the link, set the pace (docs/benchmarks.md,
    "On an H100")."""
    if not staged.spans:
        return
    devices = [staging[o : o + n] for o, _, n in staged.spans]
    pooled = [host[h : h + n] for _, h, n in staged.spans]
    if store:
        torch._foreach_copy_(pooled, devices, non_blocking=True)
    else:
        torch._foreach_copy_(devices, pooled, non_blocking=True)


def store_partial(
    staged: StagedPiece,
    engine: Sequence[torch.Tensor],
    host: torch.Tensor,
    slot_nbytes: int,
    copy: CopyFn,
) -> None:
    """Copy the partial-chunk runs of `staged` to the host, region by region."""
    plan = staged.plan
    for run in staged.partial:
        index = upload(list(run.engine_blocks), engine[0].device)
        for region, view in enumerate(engine):
            rows = view.index_select(0, index)
            copy(_host_range(plan, region, run, host, slot_nbytes), rows.view(-1))


def load_partial(
    staged: StagedPiece,
    engine: Sequence[torch.Tensor],
    host: torch.Tensor,
    slot_nbytes: int,
    copy: CopyFn,
) -> None:
    """Copy the partial-chunk runs of `staged` from the host into the engine."""
    plan = staged.plan
    for run in staged.partial:
        index = upload(list(run.engine_blocks), engine[0].device)
        for region, view in enumerate(engine):
            rows = torch.empty(
                (len(run.engine_blocks), view.shape[1]),
                dtype=torch.uint8,
                device=view.device,
            )
            copy(rows.view(-1), _host_range(plan, region, run, host, slot_nbytes))
            view.index_copy_(0, index, rows)


def upload(values: Sequence[int], device: torch.device) -> torch.Tensor:
    """`values` as an index tensor on `device`, without stalling the caller: on a
    GPU through page-locked memory, so the copy is asynchronous."""
    tensor = torch.tensor(list(values), dtype=torch.long)
    if device.type == "cuda":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


def _host_range(
    plan: GroupPlan, region: int, run: CopyRun, host: torch.Tensor, slot_nbytes: int
) -> torch.Tensor:
    start = plan.host_offset(region, run, slot_nbytes)
    nbytes = len(run.engine_blocks) * plan.layout.regions[region].block_nbytes
    return host[start : start + nbytes]

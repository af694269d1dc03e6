"""Copies through a device staging tensor laid out as the host pool is (GPU path).

On a GPU the cost lies in the host link and in the number of copies issued, not
in device memory traffic. So a store first gathers the job's engine blocks on the
device (one kernel per region) and reorders them into host order, where a whole
chunk of every layer is one contiguous range: one host copy per run of adjacent
whole chunks instead of one per layer and chunk. Partial chunks (a job starting
or ending mid-chunk) take one copy per region. A load runs the same steps
backwards. The code is device-agnostic torch; tests run it on CPU tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from kvoffload.worker.plan import CopyRun, GroupPlan

CopyFn = Callable[[torch.Tensor, torch.Tensor], None]
"""`copy(dst, src)`: one host-link copy (asynchronous on a GPU)."""


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


def store_staged(
    plan: GroupPlan,
    engine: Sequence[torch.Tensor],
    index: torch.Tensor,
    host: torch.Tensor,
    slot_nbytes: int,
    copy: CopyFn,
) -> None:
    """Copy `plan`'s engine blocks (rows `index` of the `uint8` views `engine`)
    to the 1-D `uint8` host pool `host`."""
    staged = _staging(engine, index)
    full, partial = _split_runs(plan, staged)
    if full:
        stacked = torch.stack(staged)
        bpc = plan.layout.blocks_per_chunk
        rows = _rows(full, bpc, index.numel(), index.device)
        if rows is not None:
            stacked = stacked.index_select(1, rows)
        # [regions, chunks * bpc, bytes] -> [chunks, chunk bytes], as slots are.
        chunks = stacked.view(len(staged), len(full), -1).transpose(0, 1)
        chunks = chunks.reshape(len(full), -1)
        for first, count, start in _spans(full, plan, slot_nbytes):
            copy(
                host[start : start + count * chunks.shape[1]],
                chunks[first : first + count].view(-1),
            )
    for row, run in partial:
        for region, rows_of_region in enumerate(staged):
            dst = _host_range(plan, region, run, host, slot_nbytes)
            copy(dst, rows_of_region[row : row + len(run.engine_blocks)].view(-1))


def load_staged(
    plan: GroupPlan,
    engine: Sequence[torch.Tensor],
    index: torch.Tensor,
    host: torch.Tensor,
    slot_nbytes: int,
    copy: CopyFn,
) -> None:
    """Copy host blocks of `plan` from `host` into rows `index` of `engine`."""
    staged = _staging(engine, index, gather=False)
    full, partial = _split_runs(plan, staged)
    if full:
        bpc = plan.layout.blocks_per_chunk
        chunks = torch.empty(
            (len(full), len(staged) * bpc * staged[0].shape[1]),
            dtype=torch.uint8,
            device=index.device,
        )
        for first, count, start in _spans(full, plan, slot_nbytes):
            copy(
                chunks[first : first + count].view(-1),
                host[start : start + count * chunks.shape[1]],
            )
        # [chunks, regions * bpc * bytes] -> [regions, chunks * bpc, bytes]
        by_region = chunks.view(len(full), len(staged), -1).transpose(0, 1)
        by_region = by_region.reshape(len(staged), len(full) * bpc, -1)
        rows = _rows(full, bpc, index.numel(), index.device)
        for region, target in enumerate(staged):
            if rows is None:
                target.copy_(by_region[region])
            else:
                target.index_copy_(0, rows, by_region[region])
    for row, run in partial:
        for region, target in enumerate(staged):
            src = _host_range(plan, region, run, host, slot_nbytes)
            copy(target[row : row + len(run.engine_blocks)].view(-1), src)
    for view, rows_of_region in zip(engine, staged, strict=True):
        view.index_copy_(0, index, rows_of_region)


def _staging(
    engine: Sequence[torch.Tensor], index: torch.Tensor, gather: bool = True
) -> list[torch.Tensor]:
    """Per region, a [blocks, bytes] tensor: the gathered blocks, or empty."""
    if not gather:
        return [
            torch.empty(
                (index.numel(), v.shape[1]), dtype=torch.uint8, device=index.device
            )
            for v in engine
        ]
    return [view.index_select(0, index) for view in engine]


def _split_runs(
    plan: GroupPlan, staged: Sequence[torch.Tensor]
) -> tuple[list[tuple[int, CopyRun]], list[tuple[int, CopyRun]]]:
    """Runs that are whole chunks and the others, each with its first row.

    Whole chunks go to the host as one range only when every region has the
    same bytes per block (else the reordering does not apply); otherwise all
    runs are copied region by region.
    """
    full: list[tuple[int, CopyRun]] = []
    partial: list[tuple[int, CopyRun]] = []
    uniform = len({t.shape[1] for t in staged}) == 1
    row = 0
    for run in plan.runs:
        whole = uniform and len(run.engine_blocks) == plan.layout.blocks_per_chunk
        (full if whole else partial).append((row, run))
        row += len(run.engine_blocks)
    return full, partial


def _rows(
    full: list[tuple[int, CopyRun]], bpc: int, num_rows: int, device: torch.device
) -> torch.Tensor | None:
    """Rows of the whole-chunk runs, or None when they are all `num_rows` rows
    of the piece in order (rows 0..n-1 followed by partial-chunk rows are not)."""
    rows = [row + j for row, _ in full for j in range(bpc)]
    if rows == list(range(num_rows)):
        return None
    return upload(rows, device)


def upload(values: list[int], device: torch.device) -> torch.Tensor:
    """`values` as an index tensor on `device`, without stalling the caller: on a
    GPU through page-locked memory, so the copy is asynchronous."""
    tensor = torch.tensor(values, dtype=torch.long)
    if device.type == "cuda":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


def _spans(
    full: list[tuple[int, CopyRun]], plan: GroupPlan, slot_nbytes: int
) -> list[tuple[int, int, int]]:
    """`(first chunk, chunks, host byte offset)` of whole chunks adjacent in the
    pool (neighbouring slots, when a chunk fills its slot): one copy each."""
    chunk_nbytes = plan.layout.block_nbytes * plan.layout.blocks_per_chunk
    spans: list[tuple[int, int, int]] = []
    for i, (_, run) in enumerate(full):
        start = run.slot * slot_nbytes
        if spans and chunk_nbytes == slot_nbytes:
            first, count, begin = spans[-1]
            if begin + count * slot_nbytes == start:
                spans[-1] = (first, count + 1, begin)
                continue
        spans.append((i, 1, start))
    return spans


def _host_range(
    plan: GroupPlan, region: int, run: CopyRun, host: torch.Tensor, slot_nbytes: int
) -> torch.Tensor:
    start = plan.host_offset(region, run, slot_nbytes)
    nbytes = len(run.engine_blocks) * plan.layout.regions[region].block_nbytes
    return host[start : start + nbytes]

"""One kernel that moves whole chunks of every region of a group (GPU path).

The torch path (`staging.TorchChunkMover`) issues two operations per region: a
model with 32 layers and K and V apart is 128 launches per piece, which costs
more CPU time than the host copy it prepares takes on the link. This mover issues
one Triton kernel per piece: a table of the regions (where each starts relative
to one base address, its block stride and size, where it sits in a chunk) lets
each program copy one engine block of one region. It is used only where Triton
imports and a check at start-up, on two engine blocks, gives the torch path's
bytes in both directions; anywhere else the torch path runs.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import torch

from kvoffload.worker.layout import GroupLayout
from kvoffload.worker.staging import ChunkMover, TorchChunkMover

logger = logging.getLogger(__name__)

_WORD_DTYPES = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}
_LANES = 1024  # words one program copies
_KERNEL: Any = None


def _kernel() -> Any:
    """The Triton kernel, compiled lazily (Triton is optional)."""
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton  # type: ignore[import-not-found, unused-ignore]
    import triton.language as tl  # type: ignore[import-not-found, unused-ignore]

    @triton.jit  # type: ignore[untyped-decorator, unused-ignore]
    def move_chunks(  # type: ignore[no-untyped-def]
        base,
        staging,
        table,
        blocks,
        regions,
        bpc,
        chunk_words,
        STORE: tl.constexpr,
        LANES: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        part = tl.program_id(1).to(tl.int64)
        j = row % bpc
        region = (row // bpc) % regions
        chunk = row // (bpc * regions)
        block = tl.load(blocks + chunk * bpc + j)
        entry = table + region * 4
        offset = tl.load(entry)
        stride = tl.load(entry + 1)
        words = tl.load(entry + 2)
        placed = tl.load(entry + 3)
        lanes = part * LANES + tl.arange(0, LANES)
        mask = lanes < words
        engine = base + offset + block * stride + lanes
        host = staging + chunk * chunk_words + placed + j * words + lanes
        if STORE:
            tl.store(host, tl.load(engine, mask=mask), mask=mask)
        else:
            tl.store(engine, tl.load(host, mask=mask), mask=mask)

    _KERNEL = move_chunks
    return _KERNEL


class TritonChunkMover:
    """A `ChunkMover` of one kernel launch per call (see the module docstring)."""

    def __init__(self, layout: GroupLayout, engine: Sequence[torch.Tensor]) -> None:
        self._layout = layout
        self._word = _word_nbytes(layout, engine)
        dtype = _WORD_DTYPES[self._word]
        storage = engine[0].untyped_storage()
        self._base = torch.empty(0, dtype=dtype, device=engine[0].device)
        self._base.set_(storage, 0, (storage.nbytes() // self._word,), (1,))
        base_ptr = storage.data_ptr()
        rows = []
        for region, view in zip(layout.regions, engine, strict=True):
            rows.append(
                [
                    (view.data_ptr() - base_ptr) // self._word,
                    region.block_stride // self._word,
                    region.block_nbytes // self._word,
                    0,
                ]
            )
        for row, offset in zip(rows, layout.chunk_offsets, strict=True):
            row[3] = offset // self._word
        self._table = torch.tensor(rows, dtype=torch.int64).to(engine[0].device)
        self._words = max(r.block_nbytes for r in layout.regions) // self._word
        self._chunk_words = layout.block_nbytes * layout.blocks_per_chunk // self._word

    def gather(self, blocks: torch.Tensor, staging: torch.Tensor) -> None:
        self._launch(blocks, staging, store=True)

    def scatter(self, blocks: torch.Tensor, staging: torch.Tensor) -> None:
        self._launch(blocks, staging, store=False)

    def _launch(self, blocks: torch.Tensor, staging: torch.Tensor, store: bool) -> None:
        if blocks.numel() == 0:
            return
        words = staging.view(_WORD_DTYPES[self._word])
        regions = len(self._layout.regions)
        grid = (blocks.numel() * regions, math.ceil(self._words / _LANES))
        _kernel()[grid](
            self._base,
            words,
            self._table,
            blocks,
            regions,
            self._layout.blocks_per_chunk,
            self._chunk_words,
            STORE=store,
            LANES=_LANES,
        )


def _word_nbytes(layout: GroupLayout, engine: Sequence[torch.Tensor]) -> int:
    """The widest word that divides every address, stride and size involved."""
    values = [v.data_ptr() for v in engine] + [
        n
        for region, offset in zip(layout.regions, layout.chunk_offsets, strict=True)
        for n in (region.block_stride, region.block_nbytes, offset)
    ]
    return next(w for w in (8, 4, 2, 1) if all(v % w == 0 for v in values))


def chunk_mover(
    layout: GroupLayout, engine: Sequence[torch.Tensor], kind: str = "auto"
) -> ChunkMover:
    """The mover for `layout`'s group: `"torch"`, `"triton"` or `"auto"` (Triton
    on a GPU where it imports and passes the start-up check, else torch)."""
    if kind not in ("auto", "torch", "triton"):
        raise ValueError(f"mover: {kind!r} is not one of auto, torch, triton")
    fallback = TorchChunkMover(layout, engine)
    if kind == "torch" or (kind == "auto" and engine[0].device.type != "cuda"):
        return fallback
    try:
        mover = TritonChunkMover(layout, engine)
        _check(mover, fallback, layout, engine[0].device)
    except Exception as exc:  # ImportError, a compile error, a failed check
        if kind == "triton":
            raise
        logger.warning(
            "group %s: the one-kernel chunk mover is unavailable (%s); using "
            "torch's per-region copies",
            layout.group,
            exc,
        )
        return fallback
    return mover


def _check(
    mover: ChunkMover, oracle: ChunkMover, layout: GroupLayout, device: torch.device
) -> None:
    """Both directions on the first and last engine blocks, against `oracle`.

    Runs at registration, before the engine has cached anything; the blocks'
    bytes are put back as they were."""
    bpc = layout.blocks_per_chunk
    if layout.num_blocks < bpc:
        raise RuntimeError("the group has fewer engine blocks than a chunk")
    ids = list(range(bpc))
    if layout.num_blocks >= 2 * bpc:
        ids += range(layout.num_blocks - bpc, layout.num_blocks)
    count = len(ids)
    blocks = torch.tensor(ids, dtype=torch.long, device=device)
    chunk_nbytes = layout.block_nbytes * bpc
    nbytes = chunk_nbytes * (count // bpc)
    saved = torch.empty(nbytes, dtype=torch.uint8, device=device)
    oracle.gather(blocks, saved)
    pattern = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device)
    oracle.scatter(blocks, pattern)
    got = torch.empty_like(saved)
    mover.gather(blocks, got)
    mover.scatter(blocks, saved)
    back = torch.empty_like(saved)
    oracle.gather(blocks, back)
    if not (torch.equal(got, pattern) and torch.equal(back, saved)):
        oracle.scatter(blocks, saved)
        raise RuntimeError("its bytes differ from torch's on a start-up check")

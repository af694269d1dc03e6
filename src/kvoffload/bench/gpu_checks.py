"""Correctness on a GPU for `python -m kvoffload.bench gpu`: round trips for every
KV layout the worker registers, with each chunk mover, and a failure injected
in the middle of a job's copies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kvoffload.worker.base import GroupTransfer, TransferDirection, TransferJob
from kvoffload.worker.cuda_worker import CudaTransferWorker
from kvoffload.worker.host_pool import HostPool
from kvoffload.worker.layout import GroupSpec, KVCaches, describe_kv_caches
from kvoffload.worker.staging import StagedPiece

CUDA = torch.device("cuda")
STORE, LOAD = TransferDirection.STORE, TransferDirection.LOAD
LAYERS, TOKENS, HEADS, DIM, BLOCKS, BPC = 4, 16, 8, 128, 64, 2

Make = Callable[[torch.dtype], "torch.Tensor | tuple[torch.Tensor, ...]"]


def _random(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Random bytes viewed as `dtype` (every bit pattern, NaNs included)."""
    item = torch.empty((), dtype=dtype).element_size()
    count = item
    for size in shape:
        count *= size
    raw = torch.randint(0, 256, (count,), dtype=torch.uint8, device=CUDA)
    return raw.view(dtype).view(shape)


def _hnd(dtype: torch.dtype) -> torch.Tensor:
    return _random((2, BLOCKS, HEADS, TOKENS, DIM), dtype).permute(0, 1, 3, 2, 4)


def _padded(dtype: torch.dtype) -> torch.Tensor:
    row = 2 * TOKENS * HEADS * DIM
    page = _random((BLOCKS, row + 3 * DIM), dtype)
    return page[:, :row].view(BLOCKS, 2, TOKENS, HEADS * DIM)


LAYOUTS: dict[str, Make] = {
    "flash [2,blocks,tokens,heads,dim]": lambda d: _random(
        (2, BLOCKS, TOKENS, HEADS, DIM), d
    ),
    "flashinfer [blocks,2,tokens,heads,dim]": lambda d: _random(
        (BLOCKS, 2, TOKENS, HEADS, DIM), d
    ),
    "HND [2,blocks,heads,tokens,dim]": _hnd,
    "K,V apart [blocks,tokens,heads,dim]": lambda d: (
        _random((BLOCKS, TOKENS, HEADS, DIM), d),
        _random((BLOCKS, TOKENS, HEADS, DIM), d),
    ),
    "MLA [blocks,tokens,576]": lambda d: _random((BLOCKS, TOKENS, 576), d),
    "cpu [blocks,heads,tokens,2*dim]": lambda d: _random(
        (BLOCKS, HEADS, TOKENS, 2 * DIM), d
    ),
    "padded pages [blocks,page]": _padded,
}
DTYPES = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn, "fp32": torch.float32}


def _caches(make: Make, dtype: torch.dtype) -> KVCaches:
    return {f"layer.{i}": make(dtype) for i in range(LAYERS)}


def _blocks(caches: KVCaches, spec: GroupSpec, blocks: list[int]) -> list[bytes]:
    """Each engine block's bytes, read with plain indexing (not the worker)."""
    out = []
    for block in blocks:
        parts = []
        for name in spec.layer_names:
            value = caches[name]
            tensors = (value,) if isinstance(value, torch.Tensor) else tuple(value)
            for t in tensors:
                view = t[:, block] if t.shape[0] == 2 and t.dim() == 5 else t[block]
                parts.append(view.contiguous().view(torch.uint8).reshape(-1).cpu())
        out.append(bytes(torch.cat(parts).numpy()))
    return out


def _job(
    job_id: int, direction: TransferDirection, engine: list[int], hosts: list[int]
) -> TransferJob:
    return TransferJob(
        job_id, direction, (GroupTransfer(0, tuple(engine), tuple(hosts)),)
    )


def _run(worker: CudaTransferWorker, job: TransferJob) -> bool:
    worker.submit(job)
    worker.wait([job.job_id])
    return all(r.success for r in worker.get_finished())


def round_trips() -> list[dict[str, Any]]:
    """Store whole and partial chunks, scribble the cache, load into other
    blocks; every layout, dtype and mover; bytes compared, and the two movers'
    host bytes compared with each other."""
    rows: list[dict[str, Any]] = []
    for name, make in LAYOUTS.items():
        for dtype_name, dtype in DTYPES.items():
            seed = len(rows)
            gen = torch.Generator().manual_seed(seed)
            order = torch.randperm(BLOCKS, generator=gen).tolist()
            sources, targets = order[:7], order[7:14]
            # Two whole chunks apart, one adjacent to the first, a partial one.
            hosts = [2, 3, 8, 9, 4, 5, 13]
            pools: dict[str, bytes] = {}
            for mover in ("torch", "triton"):
                row: dict[str, Any] = {
                    "layout": name,
                    "dtype": dtype_name,
                    "mover": mover,
                }
                torch.manual_seed(seed)  # the same cache for both movers
                caches = _caches(make, dtype)
                spec = GroupSpec(0, tuple(caches), BLOCKS, BPC)
                want = _blocks(caches, spec, sources)
                try:
                    row["exact"], pools[mover] = _round_trip(
                        caches, spec, mover, sources, targets, hosts, want
                    )
                except Exception as exc:
                    row.update(exact=False, error=f"{type(exc).__name__}: {exc}")
                rows.append(row)
            if len(pools) == 2:
                rows[-1]["same_host_bytes_as_torch"] = pools["torch"] == pools["triton"]
                rows[-1]["exact"] = (
                    rows[-1]["exact"] and pools["torch"] == pools["triton"]
                )
    return rows


def _round_trip(
    caches: KVCaches,
    spec: GroupSpec,
    mover: str,
    sources: list[int],
    targets: list[int],
    hosts: list[int],
    want: list[bytes],
) -> tuple[bool, bytes]:
    layout = describe_kv_caches(caches, [spec])
    with HostPool.create(layout.geometry, 8) as pool:
        worker = CudaTransferWorker(caches, layout, pool, mover=mover)
        try:
            stored = _run(worker, _job(1, STORE, sources, hosts))
            pooled = bytes(pool.array)
            for value in caches.values():
                for t in (value,) if isinstance(value, torch.Tensor) else value:
                    t.copy_(_random(tuple(t.shape), t.dtype))
            loaded = _run(worker, _job(2, LOAD, targets, hosts))
            torch.cuda.synchronize()
        finally:
            worker.shutdown()
    return stored and loaded and _blocks(caches, spec, targets) == want, pooled


class _FailOnSecondPiece(CudaTransferWorker):
    """Raises while issuing a job's second piece (its first piece's copies are
    already queued): the failure the worker must report only after them."""

    pieces = 0

    def _store(self, lane: Any, staged: StagedPiece) -> None:
        self._count()
        super()._store(lane, staged)

    def _load(self, lane: Any, staged: StagedPiece) -> None:
        self._count()
        super()._load(lane, staged)

    def _count(self) -> None:
        self.pieces += 1
        if self.pieces % 2 == 0:
            raise RuntimeError("injected failure mid-copy")


def failure_check() -> dict[str, Any]:
    """A store and a load fail after their first piece's copies were issued
    behind ~0.1 s of engine work. Once each is reported failed, the slot (or
    engine block) it was writing is rewritten; after the device drains, that
    rewrite must still be there: no copy of the failed job landed late."""
    caches = _caches(LAYOUTS["flash [2,blocks,tokens,heads,dim]"], torch.bfloat16)
    spec = GroupSpec(0, tuple(caches), BLOCKS, 1)
    layout = describe_kv_caches(caches, [spec])
    chunk = layout.groups[0].block_nbytes
    result: dict[str, Any] = {}
    with HostPool.create(layout.geometry, 8) as pool:
        worker = _FailOnSecondPiece(caches, layout, pool, staging_nbytes=chunk)
        try:
            _busy_engine()
            worker.submit(_job(1, STORE, [0, 1], [0, 2]))
            stored = _result(worker, 1)
            pool.array[:chunk] = 7
            torch.cuda.synchronize()
            result["reported_failed"] = not stored
            result["slot_kept"] = bool((pool.array[:chunk] == 7).all())
            target = caches["layer.0"]
            assert isinstance(target, torch.Tensor)
            _busy_engine()
            worker.submit(_job(2, LOAD, [5, 6], [4, 6]))
            loaded = _result(worker, 2)
            target[:, 5].fill_(3)  # the engine recomputes the block
            torch.cuda.synchronize()
            result["load_reported_failed"] = not loaded
            result["engine_block_kept"] = bool((target[:, 5] == 3).all())
        finally:
            worker.shutdown()
    return result


def _busy_engine() -> None:
    big = torch.randn(4096, 4096, device=CUDA)
    for _ in range(40):
        big = torch.tanh(big @ big)


def _result(worker: CudaTransferWorker, job_id: int) -> bool:
    while True:
        for result in worker.get_finished():
            if result.job_id == job_id:
                return result.success

"""Speed on a GPU for `python -m kvoffload.bench gpu`: bandwidth next to bare
copies, and the slowdown transfers cause to the engine's compute.

The cache is laid out as vLLM's FlashAttention backend lays it out, K and V of a
layer in one tensor `[2, blocks, 16 tokens, 8 heads, 128]` in bf16 (32 KiB per
engine block and region); a chunk size picks the layers and blocks per chunk.
Engine blocks and slots are scattered at random, as a long-running engine's are.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from kvoffload.worker.base import GroupTransfer, TransferDirection, TransferJob
from kvoffload.worker.cuda_worker import CudaTransferWorker
from kvoffload.worker.host_pool import HostPool
from kvoffload.worker.layout import GroupSpec, describe_kv_caches

CUDA = torch.device("cuda")
_LAYER_BLOCK = 64 << 10  # K and V of one layer for one engine block
_DIRECTIONS = (TransferDirection.STORE, TransferDirection.LOAD)


def _geometry(chunk_nbytes: int) -> tuple[int, int]:
    """(layers, blocks per chunk) of a chunk of `chunk_nbytes` bytes."""
    if chunk_nbytes % _LAYER_BLOCK:
        raise ValueError(f"chunk of {chunk_nbytes} bytes is not a multiple of 64 KiB")
    units = chunk_nbytes // _LAYER_BLOCK
    layers = min(units, 32)
    while units % layers:
        layers -= 1
    return layers, units // layers


@contextmanager
def _plane(
    chunk_nbytes: int, num_chunks: int, mover: str
) -> Iterator[tuple[CudaTransferWorker, HostPool, GroupSpec]]:
    layers, bpc = _geometry(chunk_nbytes)
    num_blocks = num_chunks * bpc
    caches = {
        f"layer.{i}": torch.randn(
            (2, num_blocks, 16, 8, 128), dtype=torch.bfloat16, device=CUDA
        )
        for i in range(layers)
    }
    spec = GroupSpec(0, tuple(caches), num_blocks, bpc)
    layout = describe_kv_caches(caches, [spec])
    with HostPool.create(layout.geometry, num_chunks) as pool:
        worker = CudaTransferWorker(caches, layout, pool, mover=mover)
        try:
            yield worker, pool, spec
        finally:
            worker.shutdown()
            del caches
            torch.cuda.empty_cache()


def _jobs(
    spec: GroupSpec, slots: list[int], chunks_per_job: int, seed: int
) -> list[tuple[GroupTransfer, ...]]:
    """Jobs of `chunks_per_job` chunks: scattered engine blocks, the given slots."""
    gen = torch.Generator().manual_seed(seed)
    bpc = spec.blocks_per_chunk
    chunks = torch.randperm(spec.num_blocks // bpc, generator=gen)[: len(slots)]
    jobs: list[tuple[GroupTransfer, ...]] = []
    for first in range(0, len(slots), chunks_per_job):
        engine = [
            c * bpc + j
            for c in chunks[first : first + chunks_per_job].tolist()
            for j in range(bpc)
        ]
        hosts = [
            s * bpc + j
            for s in slots[first : first + chunks_per_job]
            for j in range(bpc)
        ]
        jobs.append((GroupTransfer(0, tuple(engine), tuple(hosts)),))
    return jobs


class _Submitter:
    """Runs jobs through a worker and waits for them."""

    def __init__(self, worker: CudaTransferWorker) -> None:
        self._worker = worker
        self._ids = iter(range(1 << 62))

    def run(
        self, direction: TransferDirection, jobs: list[tuple[GroupTransfer, ...]]
    ) -> None:
        ids = []
        for groups in jobs:
            job_id = next(self._ids)
            ids.append(job_id)
            self._worker.submit(TransferJob(job_id, direction, groups))
        self._worker.wait(ids)
        failed = [r.job_id for r in self._worker.get_finished() if not r.success]
        if failed:
            raise RuntimeError(f"{direction.value} jobs {failed} failed")


def _seconds(fn: Callable[[], object]) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def bandwidth(
    chunk_nbytes: int, total_nbytes: int, job_nbytes: int, rounds: int
) -> list[dict[str, Any]]:
    """GB/s of stores and loads through the worker (each mover), of a bare
    non-blocking `copy_` per chunk between the same pinned slots and device
    memory, and of one contiguous copy of all the bytes; best of `rounds`,
    interleaved, after a warm-up round."""
    num_chunks = max(total_nbytes // chunk_nbytes, 1)
    chunks_per_job = max(job_nbytes // chunk_nbytes, 1)
    gen = torch.Generator().manual_seed(chunk_nbytes)
    slots = torch.randperm(num_chunks, generator=gen).tolist()
    rows = []
    for mover in ("auto", "torch"):
        with _plane(chunk_nbytes, num_chunks, mover) as (worker, pool, spec):
            jobs = _jobs(spec, slots, chunks_per_job, seed=chunk_nbytes)
            for direction in _DIRECTIONS:
                times = _time_cases(
                    worker, pool, jobs, slots, chunk_nbytes, direction, rounds
                )
                rows.append(
                    _row(
                        chunk_nbytes,
                        direction,
                        mover,
                        worker,
                        num_chunks * chunk_nbytes,
                        chunks_per_job,
                        times,
                    )
                )
    return rows


def _time_cases(
    worker: CudaTransferWorker,
    pool: HostPool,
    jobs: list[tuple[GroupTransfer, ...]],
    slots: list[int],
    chunk_nbytes: int,
    direction: TransferDirection,
    rounds: int,
) -> dict[str, list[float]]:
    """Seconds of each case per timed round (the first round warms up)."""
    store = direction is TransferDirection.STORE
    nbytes = len(slots) * chunk_nbytes
    host = torch.from_numpy(pool.array)
    device = torch.empty(nbytes, dtype=torch.uint8, device=CUDA)
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    submitter = _Submitter(worker)

    def bare() -> None:
        with torch.cuda.stream(side):
            for i, slot in enumerate(slots):
                pooled = host[slot * pool.slot_nbytes :][:chunk_nbytes]
                mine = device[i * chunk_nbytes : (i + 1) * chunk_nbytes]
                if store:
                    pooled.copy_(mine, non_blocking=True)
                else:
                    mine.copy_(pooled, non_blocking=True)

    def contiguous() -> None:
        with torch.cuda.stream(side):
            if store:
                host[:nbytes].copy_(device, non_blocking=True)
            else:
                device.copy_(host[:nbytes], non_blocking=True)

    cases: dict[str, Callable[[], object]] = {
        "worker": lambda: submitter.run(direction, jobs),
        "bare": bare,
        "contiguous": contiguous,
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for round_ in range(rounds + 1):
        for name, case in cases.items():
            seconds = _seconds(case)
            if round_:
                times[name].append(seconds)
    return times


def _row(
    chunk_nbytes: int,
    direction: TransferDirection,
    mover: str,
    worker: CudaTransferWorker,
    nbytes: int,
    chunks_per_job: int,
    times: dict[str, list[float]],
) -> dict[str, Any]:
    def gbps(name: str) -> float:
        return nbytes / min(times[name]) / 1e9

    by_round = [b / w for w, b in zip(times["worker"], times["bare"], strict=True)]
    return {
        "chunk_kib": chunk_nbytes >> 10,
        "direction": direction.value,
        "mover": mover,
        "mover_resolved": ",".join(worker.mover_names.values()),
        "mib": nbytes >> 20,
        "chunks_per_job": chunks_per_job,
        "gbps": round(gbps("worker"), 2),
        "bare_gbps": round(gbps("bare"), 2),
        "contiguous_gbps": round(gbps("contiguous"), 2),
        "vs_bare": round(gbps("worker") / gbps("bare"), 3),
        "vs_bare_rounds": [round(r, 3) for r in sorted(by_round)],
        "vs_contiguous": round(gbps("worker") / gbps("contiguous"), 3),
    }


def interference(size: int, iters: int, rounds: int) -> dict[str, Any]:
    """The matmul loop's wall time alone and while stores and loads of 16 MiB
    chunks run without pause on the worker's streams; alternating rounds."""
    a = torch.randn(size, size, dtype=torch.bfloat16, device=CUDA)
    b = torch.randn(size, size, dtype=torch.bfloat16, device=CUDA)
    c = torch.empty_like(a)

    def loop() -> None:
        for _ in range(iters):
            torch.matmul(a, b, out=c)

    chunk = 16 << 20
    num_chunks = 64
    with _plane(chunk, num_chunks, "auto") as (worker, _, spec):
        half = num_chunks // 2
        stores = _jobs(spec, list(range(half)), 4, seed=1)
        loads = _jobs(spec, list(range(half, num_chunks)), 4, seed=2)
        alone: list[float] = []
        busy: list[float] = []
        moved: list[float] = []
        for _ in range(2):  # warm-up
            _seconds(loop)
        for _ in range(rounds):
            alone.append(_seconds(loop))
            block_nbytes = chunk // spec.blocks_per_chunk
            with _traffic(worker, stores, loads, block_nbytes) as counter:
                started = time.perf_counter()
                busy.append(_seconds(loop))
                elapsed = time.perf_counter() - started
                moved.append(counter() / elapsed / 1e9)
    ratios = sorted(b_ / a_ for a_, b_ in zip(alone, busy, strict=True))
    return {
        "matmul": size,
        "iters": iters,
        "alone_ms": round(1e3 * statistics.median(alone), 2),
        "busy_ms": round(1e3 * statistics.median(busy), 2),
        "slowdown": round(statistics.median(busy) / statistics.median(alone), 4),
        "slowdown_rounds": [round(r, 4) for r in ratios],
        "tflops_alone": round(2 * size**3 * iters / statistics.median(alone) / 1e12, 1),
        "transfer_gbps": round(statistics.median(moved), 2),
    }


@contextmanager
def _traffic(
    worker: CudaTransferWorker,
    stores: list[tuple[GroupTransfer, ...]],
    loads: list[tuple[GroupTransfer, ...]],
    block_nbytes: int,
) -> Iterator[Callable[[], int]]:
    """Stores and loads, alternating, without pause on a thread (four jobs in
    flight), from a stream of its own so that they do not wait for the engine's
    queued work; yields a function giving the bytes moved so far."""
    stop = threading.Event()
    moved = [0]
    plan = [
        (direction, groups)
        for pair in zip(stores, loads, strict=True)
        for direction, groups in zip(_DIRECTIONS, pair, strict=True)
    ]

    def collect(in_flight: dict[int, int]) -> None:
        for result in worker.get_finished():
            nbytes = in_flight.pop(result.job_id, 0)
            moved[0] += nbytes if result.success else 0

    def feed() -> None:
        ids = iter(range(1 << 62))
        in_flight: dict[int, int] = {}
        with torch.cuda.stream(torch.cuda.Stream()):  # type: ignore[no-untyped-call]
            while not stop.is_set():
                for direction, groups in plan:
                    if stop.is_set():
                        break
                    if len(in_flight) >= 4:
                        worker.wait([next(iter(in_flight))])
                        collect(in_flight)
                    job_id = next(ids)
                    in_flight[job_id] = len(groups[0].host_blocks) * block_nbytes
                    worker.submit(TransferJob(job_id, direction, groups))
            worker.wait(list(in_flight))
            collect(in_flight)

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    try:
        yield lambda: moved[0]
    finally:
        stop.set()
        thread.join()

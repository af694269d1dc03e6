"""Benchmark of the data plane: store and load GB/s against one contiguous copy.

`python -m kvoffload.bench transfer [--json]` registers a many-layer KV cache,
then for each per-layer chunk size stores a batch of chunks from scattered engine
blocks into scattered slots and loads it back, timing submit-to-finish. Next to
each it measures one contiguous `copy_` of the same bytes in the same run (on
CUDA: the pinned device-to-host or host-to-device copy) and prints the ratio;
on CPU both with as many threads as the worker copies with and with all cores.
Rounds interleave the four measurements; each reports its best round, the
steadiest estimate on a machine shared with other work.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from kvoffload.worker.base import GroupTransfer, TransferDirection, TransferJob
from kvoffload.worker.factory import create_data_plane
from kvoffload.worker.layout import GroupSpec

_KIB = 1024


@dataclass(frozen=True)
class Row:
    """One measured size and direction."""

    direction: str
    chunk_kib: int
    layers: int
    chunks: int
    mib: float
    gbps: float
    copy_gbps: float
    """One contiguous `copy_` with as many threads as the worker copies with."""
    ratio: float
    copy_all_gbps: float
    """One contiguous `copy_` with torch's default threads (all cores)."""
    ratio_all: float


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvoffload.bench transfer")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--blocks-per-chunk", type=int, default=4)
    parser.add_argument(
        "--sizes", default="64,256,1024,4096", help="chunk KiB per layer"
    )
    parser.add_argument("--job-mib", type=int, default=64, help="MiB per job")
    parser.add_argument("--repeats", type=int, default=25, help="timed rounds")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--copy-threads", type=int, default=1, help="CPU only")
    args = parser.parse_args(argv)
    rows: list[Row] = []
    for size in (int(s) for s in args.sizes.split(",")):
        rows += _measure(size * _KIB, args)
        for row in rows[-2:]:
            if args.json:
                print(
                    json.dumps(
                        {
                            "bench": "transfer",
                            "device": args.device,
                            "copy_threads": args.copy_threads,
                            **asdict(row),
                        },
                        allow_nan=False,
                    )
                )
    if not args.json:
        _print_table(rows, args)
    return 0


def _measure(chunk_nbytes: int, args: argparse.Namespace) -> list[Row]:
    layers, bpc = int(args.layers), int(args.blocks_per_chunk)
    device = torch.device(args.device)
    # vLLM's CPU layout [blocks, heads, tokens, 2 * head_dim]: 8 heads of 128
    # bf16 make 4 KiB per token and layer.
    tokens = max(chunk_nbytes // bpc // (4 * _KIB), 1)
    chunks = max(int(args.job_mib) * 2**20 // (chunk_nbytes * layers), 1)
    num_blocks = 2 * chunks * bpc + 1
    shape = (num_blocks, 8, tokens, 256)
    kv = {
        f"layer.{i}": torch.ones(shape, dtype=torch.bfloat16, device=device)
        for i in range(layers)
    }
    spec = GroupSpec(0, tuple(kv), num_blocks, bpc)
    job_nbytes = chunks * layers * chunk_nbytes
    budget = 2 * job_nbytes + chunk_nbytes * layers
    _, pool, worker = create_data_plane(
        kv, [spec], budget, copy_threads=args.copy_threads
    )
    try:
        generator = torch.Generator().manual_seed(chunk_nbytes)
        blocks = torch.randperm(num_blocks, generator=generator)[: chunks * bpc]
        slots = torch.randperm(pool.num_slots, generator=generator)[:chunks]
        host = tuple(int(s) * bpc + j for s in slots.tolist() for j in range(bpc))
        transfer = (GroupTransfer(0, tuple(blocks.tolist()), host),)
        job_ids = iter(range(1 << 30))

        def run(direction: TransferDirection) -> None:
            job_id = next(job_ids)
            worker.submit(TransferJob(job_id, direction, transfer))
            worker.wait([job_id])
            (result,) = worker.get_finished()
            if not result.success:
                raise RuntimeError(f"benchmark {direction.value} job failed")

        copy_store, copy_load = _bounds(job_nbytes, device)
        own = args.copy_threads if device.type == "cpu" else None
        timed: dict[str, Callable[[], object]] = {
            "store": lambda: run(TransferDirection.STORE),
            "load": lambda: run(TransferDirection.LOAD),
        }
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.repeats + 1):  # the first round warms up
            for direction, copy in (("store", copy_store), ("load", copy_load)):
                for kind, threads in (("own", own), ("all", None)):
                    times.setdefault((direction, kind), []).append(
                        _time(copy, device, threads)
                    )
                times.setdefault((direction, "job"), []).append(
                    _time(timed[direction], device, None)
                )
    finally:
        worker.shutdown()
        pool.close()

    def gbps(direction: str, kind: str) -> float:
        return job_nbytes / min(times[(direction, kind)][1:]) / 1e9

    return [
        Row(
            direction,
            chunk_nbytes // _KIB,
            layers,
            chunks,
            round(job_nbytes / 2**20, 1),
            round(gbps(direction, "job"), 2),
            round(gbps(direction, "own"), 2),
            round(gbps(direction, "job") / gbps(direction, "own"), 3),
            round(gbps(direction, "all"), 2),
            round(gbps(direction, "job") / gbps(direction, "all"), 3),
        )
        for direction in ("store", "load")
    ]


def _bounds(
    nbytes: int, device: torch.device
) -> tuple[Callable[[], object], Callable[[], object]]:
    """One contiguous copy of `nbytes` each way (device to host, host to device)."""
    if device.type == "cpu":
        src = torch.ones(nbytes, dtype=torch.uint8)
        dst = torch.empty(nbytes, dtype=torch.uint8)
        return (lambda: dst.copy_(src)), (lambda: src.copy_(dst))
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    on_device = torch.ones(nbytes, dtype=torch.uint8, device=device)
    return (
        lambda: pinned.copy_(on_device, non_blocking=True),
        lambda: on_device.copy_(pinned, non_blocking=True),
    )


def _time(fn: Callable[[], object], device: torch.device, threads: int | None) -> float:
    """Seconds `fn` takes; with `threads`, torch's intra-op threads meanwhile."""
    default = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    torch.set_num_threads(default)
    return seconds


def _print_table(rows: list[Row], args: argparse.Namespace) -> None:
    print(
        f"transfer: {args.layers} layers, blocks_per_chunk={args.blocks_per_chunk}, "
        f"~{args.job_mib} MiB per job, best of {args.repeats} rounds, device "
        f"{args.device}, copy threads {args.copy_threads}; copy_ with the same "
        f"threads, and with all {torch.get_num_threads()}"
    )
    head = (
        "chunk/layer",
        "dir",
        "chunks",
        "GB/s",
        "copy_",
        "ratio",
        "copy_ all",
        "ratio",
    )
    print("{:>11} {:>5} {:>6} {:>7} {:>7} {:>6} {:>9} {:>6}".format(*head))
    for r in rows:
        print(
            f"{r.chunk_kib:>7} KiB {r.direction:>5} {r.chunks:>6} {r.gbps:>7.2f} "
            f"{r.copy_gbps:>7.2f} {r.ratio:>6.2f} {r.copy_all_gbps:>9.2f} "
            f"{r.ratio_all:>6.2f}"
        )

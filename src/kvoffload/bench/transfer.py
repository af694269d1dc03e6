"""Benchmark of the data plane: store and load GB/s against one contiguous copy.

`python -m kvoffload.bench transfer [--json]` registers a many-layer KV cache,
then for each per-layer chunk size stores a batch of chunks from scattered engine
blocks into scattered slots and loads it back, timing submit-to-finish. Next to
each it measures one contiguous `copy_` of the same bytes in the same run (on
CUDA: the pinned device-to-host or host-to-device copy) and prints the ratio.
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
    ratio: float


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
                        }
                    )
                )
    if not args.json:
        _print_table(rows, args)
    return 0


def _measure(chunk_nbytes: int, args: argparse.Namespace) -> list[Row]:
    layers, bpc, device = args.layers, args.blocks_per_chunk, torch.device(args.device)
    # vLLM's CPU layout [blocks, heads, tokens, 2 * head_dim]: 8 heads of 128
    # bf16 make 4 KiB per token and layer.
    tokens = max(chunk_nbytes // bpc // (4 * _KIB), 1)
    chunks = max(args.job_mib * 2**20 // (chunk_nbytes * layers), 1)
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
        times: dict[str, list[float]] = {k: [] for k in ("store", "load", "cs", "cl")}
        for _ in range(args.repeats + 1):  # the first round warms up
            times["cs"].append(_time(copy_store, device))
            times["store"].append(_time(lambda: run(TransferDirection.STORE), device))
            times["cl"].append(_time(copy_load, device))
            times["load"].append(_time(lambda: run(TransferDirection.LOAD), device))
    finally:
        worker.shutdown()
        pool.close()
    rows = []
    for direction, bound in (("store", "cs"), ("load", "cl")):
        gbps = job_nbytes / min(times[direction][1:]) / 1e9
        copy_gbps = job_nbytes / min(times[bound][1:]) / 1e9
        rows.append(
            Row(
                direction,
                chunk_nbytes // _KIB,
                layers,
                chunks,
                round(job_nbytes / 2**20, 1),
                round(gbps, 2),
                round(copy_gbps, 2),
                round(gbps / copy_gbps, 3),
            )
        )
    return rows


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


def _time(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def _print_table(rows: list[Row], args: argparse.Namespace) -> None:
    print(
        f"transfer: {args.layers} layers, blocks_per_chunk={args.blocks_per_chunk}, "
        f"~{args.job_mib} MiB per job, best of {args.repeats} rounds, device "
        f"{args.device}, copy threads {args.copy_threads}"
    )
    print(
        f"{'chunk/layer':>12} {'dir':>6} {'chunks':>7} {'GB/s':>8} {'copy_ GB/s':>11} {'ratio':>6}"
    )
    for r in rows:
        print(
            f"{r.chunk_kib:>9} KiB {r.direction:>6} {r.chunks:>7} {r.gbps:>8.2f} "
            f"{r.copy_gbps:>11.2f} {r.ratio:>6.2f}"
        )

"""Benchmark of the secondary tiers: file and Redis GB/s against plain I/O.

`python -m kvoffload.bench tiers [--json] [--dir PATH] [--empty]` stores chunks from
a host buffer into a file tier and loads them back (from the first submit to the
last result), and next to it writes and reads the same bytes as one plain
sequential file on the same file system, runs alternating. By default the tier is
full, as a cache is in steady state (every store evicts, reusing the evicted
file), and the plain file is written over in place; `--empty` measures new files
against a new plain file. Both read right after writing, from a warm page cache:
this measures the tier's costs (headers, checksums, a file per chunk, renames,
threads) over the file system's, not the disk. The Redis tier is measured the same
way against a throwaway `redis-server` on loopback, next to plain pipelined
SET/MGET of the same bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from kvoffload.keys import OffloadKey, make_offload_key
from kvoffload.tiers.base import ReqContext
from kvoffload.tiers.secondary import (
    ArrayChunkBuffer,
    FileTier,
    FileTierConfig,
    RedisTierConfig,
    SecondaryTier,
    TierJob,
    codec,
)

_MIB = 1 << 20
_CTX = ReqContext("bench")
_FINGERPRINT = "bench"


@dataclass(frozen=True)
class Row:
    tier: str
    direction: str
    chunk_kib: int
    chunks: int
    mib: float
    gbps: float
    plain_gbps: float
    ratio: float


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvoffload.bench tiers")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument(
        "--dir", default=None, help="where to write (default: a temp dir)"
    )
    parser.add_argument("--sizes", default="256,2048,8192", help="chunk sizes in KiB")
    parser.add_argument("--total-mib", type=int, default=256, help="bytes per run")
    parser.add_argument("--job-chunks", type=int, default=16, help="chunks per job")
    parser.add_argument("--threads", type=int, default=4, help="file tier I/O threads")
    parser.add_argument(
        "--empty", action="store_true", help="file tier never full (new files only)"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--redis-mib", type=int, default=128, help="0 skips Redis")
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="kvoffload-bench-", dir=args.dir)
    rows: list[Row] = []
    try:
        for kib in (int(s) for s in args.sizes.split(",")):
            rows += _file_rows(kib << 10, args.total_mib * _MIB, root, args)
        if args.redis_mib:
            rows += _redis_rows(args.redis_mib * _MIB, root, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        for row in rows:
            print(json.dumps({"bench": "tiers", **asdict(row)}))
    else:
        _print_table(rows, args, root)
    return 0


def _filled_buffer(chunk_nbytes: int, total: int) -> ArrayChunkBuffer:
    chunks = max(1, total // chunk_nbytes)
    buf = ArrayChunkBuffer(2 * chunks, chunk_nbytes)
    noise = np.random.default_rng(0).integers(0, 256, chunk_nbytes, dtype=np.uint8)
    for slot in range(chunks):
        buf.slot_view(slot)[:] = noise.tobytes()
        buf.slot_view(slot)[:8] = slot.to_bytes(8, "big")
    return buf


def _keys(n: int, run: int) -> list[OffloadKey]:
    """Hash-like keys, as real block hashes are (they spread over directories)."""
    return [
        make_offload_key(hashlib.sha256(f"{run}/{i}".encode()).digest(), 0)
        for i in range(n)
    ]


def _run_jobs(tier: SecondaryTier, store: bool, ks: Sequence[OffloadKey],
              slots: Sequence[int], job_chunks: int) -> float:  # fmt: skip
    """Seconds from the first submit to the last result; every job must succeed."""
    submit = tier.submit_store if store else tier.submit_load
    start = time.perf_counter()
    for job_id, i in enumerate(range(0, len(ks), job_chunks)):
        submit(
            TierJob(
                job_id,
                tuple(ks[i : i + job_chunks]),
                tuple(slots[i : i + job_chunks]),
                _CTX,
            )
        )
    tier.drain()
    elapsed = time.perf_counter() - start
    failed = [r for r in tier.get_finished_jobs() if not r.success]
    if failed:
        raise RuntimeError(f"{tier.name}: {len(failed)} benchmark jobs failed")
    return elapsed


def _plain_file(
    path: str, buf: ArrayChunkBuffer, n: int, overwrite: bool
) -> tuple[float, float]:
    """Seconds to write then read the same chunks as one sequential file.

    With `overwrite` the file is kept between runs and written over in place, as
    a full tier writes over the files of the chunks it evicts; else it is new.
    """
    flags = os.O_WRONLY | os.O_CREAT | (0 if overwrite else os.O_TRUNC)
    start = time.perf_counter()
    fd = os.open(path, flags, 0o644)
    for slot in range(n):
        view = buf.slot_view(slot)
        while view:
            view = view[os.write(fd, view) :]
    os.close(fd)
    write_s = time.perf_counter() - start
    start = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    for slot in range(n):
        os.readv(fd, [buf.slot_view(n + slot)])
    os.close(fd)
    read_s = time.perf_counter() - start
    if not overwrite:
        os.unlink(path)
    return write_s, read_s


def _file_rows(
    chunk_nbytes: int, total: int, root: str, args: argparse.Namespace
) -> list[Row]:
    buf = _filled_buffer(chunk_nbytes, total)
    n = buf.num_slots // 2
    times: dict[str, list[float]] = {k: [] for k in ("tw", "tr", "pw", "pr")}
    directory = os.path.join(root, f"file-{chunk_nbytes}")
    file_size = codec.header_size(36, _FINGERPRINT) + chunk_nbytes
    # Full (the steady state of a cache: every store evicts), or never full.
    capacity = ((args.repeats + 1) if args.empty else 1) * n * file_size
    tier = FileTier(
        FileTierConfig(directory, capacity, num_threads=args.threads), buf, _FINGERPRINT
    )

    def tier_run(run: int) -> None:
        ks = _keys(n, run + 1)
        write_s = _run_jobs(tier, True, ks, range(n), args.job_chunks)
        read_s = _run_jobs(tier, False, ks, range(n, 2 * n), args.job_chunks)
        if any(
            bytes(buf.slot_view(i)) != bytes(buf.slot_view(n + i)) for i in range(n)
        ):
            raise RuntimeError("file tier loaded different bytes")
        if run >= 0:
            times["tw"].append(write_s)
            times["tr"].append(read_s)

    def plain_run(run: int) -> None:
        plain = os.path.join(root, "plain")
        write_s, read_s = _plain_file(plain, buf, n, overwrite=not args.empty)
        if run >= 0:
            times["pw"].append(write_s)
            times["pr"].append(read_s)

    try:
        tier_run(-1)  # warm-up: creates directories; fills the tier unless --empty
        plain_run(-1)
        _interleave(tier_run, plain_run, args.repeats)
    finally:
        tier.shutdown()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(root, "plain"))
    return _rows("file", chunk_nbytes, n, times)


def _interleave(
    mine: Callable[[int], None], plain: Callable[[int], None], repeats: int
) -> None:
    """Alternate which runs first, so that drift in a shared machine hits both."""
    for run in range(repeats):
        first, second = (mine, plain) if run % 2 == 0 else (plain, mine)
        first(run)
        second(run)


def _rows(
    tier: str, chunk_nbytes: int, n: int, times: dict[str, list[float]]
) -> list[Row]:
    """GB/s are medians over the runs; the ratio is the median of per-run ratios
    (each run pairs a tier measurement with the plain one next to it)."""
    nbytes = n * chunk_nbytes
    out = []
    for direction, mine, plain in (("write", "tw", "pw"), ("read", "tr", "pr")):
        gbps = nbytes / statistics.median(times[mine]) / 1e9
        plain_gbps = nbytes / statistics.median(times[plain]) / 1e9
        ratio = statistics.median(
            p / m for m, p in zip(times[mine], times[plain], strict=True)
        )
        out.append(
            Row(tier, direction, chunk_nbytes >> 10, n, round(nbytes / _MIB, 1),
                round(gbps, 2), round(plain_gbps, 2), round(ratio, 3))
        )  # fmt: skip
    return out


def _redis_rows(total: int, root: str, args: argparse.Namespace) -> list[Row]:
    import redis

    from kvoffload.tiers.secondary.redis_server import RedisServer, find_redis_server
    from kvoffload.tiers.secondary.redis_tier import RedisTier

    if find_redis_server() is None:
        print("tiers: redis-server not found, skipping the Redis tier")
        return []
    chunk_nbytes = 2 << 20
    buf = _filled_buffer(chunk_nbytes, total)
    n = buf.num_slots // 2
    server = RedisServer(root)
    server.start()
    times: dict[str, list[float]] = {k: [] for k in ("tw", "tr", "pw", "pr")}

    def tier_run(run: int) -> None:
        config = RedisTierConfig(server.url, timeout_s=30.0)
        tier = RedisTier(config, buf, _FINGERPRINT)
        ks = _keys(n, run)
        try:
            times["tw"].append(_run_jobs(tier, True, ks, range(n), args.job_chunks))
            times["tr"].append(
                _run_jobs(tier, False, ks, range(n, 2 * n), args.job_chunks)
            )
        finally:
            tier.shutdown()
        redis.Redis.from_url(server.url).flushall()

    def plain_run(run: int) -> None:
        write_s, read_s = _plain_redis(server.url, buf, n, args.job_chunks)
        times["pw"].append(write_s)
        times["pr"].append(read_s)

    try:
        _interleave(tier_run, plain_run, args.repeats)
    finally:
        server.stop()
    return _rows("redis", chunk_nbytes, n, times)


def _plain_redis(
    url: str, buf: ArrayChunkBuffer, n: int, batch: int
) -> tuple[float, float]:
    """Pipelined SET then MGET of the raw chunks, one connection, then FLUSHALL."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=30.0)
    names = [f"plain:{i}" for i in range(n)]
    write_s = _timed(lambda: _plain_sets(client, names, buf, batch))
    read_s = _timed(
        lambda: [client.mget(names[i : i + batch]) for i in range(0, n, batch)]
    )
    client.flushall()
    client.close()
    return write_s, read_s


def _plain_sets(
    client: object, names: list[str], buf: ArrayChunkBuffer, batch: int
) -> None:
    import redis

    assert isinstance(client, redis.Redis)
    for i in range(0, len(names), batch):
        pipe = client.pipeline(transaction=False)
        for j in range(i, min(i + batch, len(names))):
            pipe.set(names[j], buf.slot_view(j))
        pipe.execute()


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _print_table(rows: list[Row], args: argparse.Namespace, root: str) -> None:
    print(
        f"tiers: file tier ({args.threads} threads) vs one plain sequential file in "
        f"{os.path.dirname(root)}; Redis tier vs plain pipelined SET/MGET on loopback; "
        f"{args.job_chunks} chunks per job, median of {args.repeats}, page cache warm"
    )
    print(
        f"{'tier':>6} {'dir':>6} {'chunk':>9} {'MiB':>7} {'GB/s':>7} {'plain GB/s':>11} {'ratio':>6}"
    )
    for r in rows:
        print(
            f"{r.tier:>6} {r.direction:>6} {r.chunk_kib:>5} KiB {r.mib:>7.0f} "
            f"{r.gbps:>7.2f} {r.plain_gbps:>11.2f} {r.ratio:>6.2f}"
        )

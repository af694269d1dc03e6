"""Benchmark of the secondary tiers: file and Redis GB/s against plain I/O.

`python -m kvoffload.bench tiers [--json] [--dir PATH] [--sizes KIB,...] [--empty]
[--page-cache] [--huge-pages]` stores chunks from a host buffer into a file tier
and loads them back (first submit to last result); in the same run, rotating which
goes first, the same bytes are written and read as one plain sequential file (the
headline baseline) and as one plain file per chunk. By default every write phase
ends when its bytes are on the disk (`syncfs`, timed) and every read phase starts
from a cold page cache (each file's pages dropped first, untimed); `--page-cache`
skips both and measures against memory. The tier is full by default (every store
evicts and reuses the evicted file; the plain files are written over in place);
`--empty` writes new files on every side. Host slots are shared anonymous memory
in 4 KiB pages, as the worker's host pool is; `--huge-pages` puts them in
transparent huge pages (fewer, larger segments per direct I/O request). The
Redis tier is measured against a throwaway `redis-server` on loopback, next to
plain pipelined SET/MGET of the same bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import hashlib
import json
import mmap
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
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
)
from kvoffload.tiers.secondary.file_io import chunk_file_size
from kvoffload.worker.base import OneViewPerChunk

_MIB = 1 << 20
_CTX = ReqContext("bench")
_FINGERPRINT = "bench"
_SIDES = ("tier", "plain", "per_file")


@dataclass(frozen=True)
class Row:
    """One direction at one chunk size. `ratio` is tier / plain sequential (the
    headline), `ratio_min`/`ratio_max` its spread over the runs; `per_file_*` is
    the plain one-file-per-chunk baseline (file tier only)."""

    tier: str
    direction: str
    chunk_kib: int
    chunks: int
    mib: float
    gbps: float
    plain_gbps: float
    ratio: float
    ratio_min: float
    ratio_max: float
    per_file_gbps: float | None = None
    per_file_ratio: float | None = None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvoffload.bench tiers")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument(
        "--dir", default=None, help="where to write (default: a temp dir)"
    )
    parser.add_argument(
        "--sizes",
        default="256,2048,8192,32768",
        help="chunk sizes in KiB (empty: no file tier)",
    )
    parser.add_argument("--total-mib", type=int, default=512, help="bytes per run")
    parser.add_argument("--job-chunks", type=int, default=16, help="chunks per job")
    parser.add_argument("--threads", type=int, default=4, help="file tier I/O threads")
    parser.add_argument(
        "--empty", action="store_true", help="file tier never full (new files only)"
    )
    parser.add_argument(
        "--page-cache",
        action="store_true",
        help="no flush after writes, warm reads: the tier's costs over memory",
    )
    parser.add_argument(
        "--huge-pages",
        action="store_true",
        help="host slots in transparent huge pages (default: 4 KiB shared pages)",
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--redis-mib", type=int, default=128, help="0 skips Redis")
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="kvoffload-bench-", dir=args.dir)
    rows: list[Row] = []
    try:
        for kib in (int(s) for s in args.sizes.split(",") if s):
            rows += _file_rows(kib << 10, args.total_mib * _MIB, root, args)
        if args.redis_mib:
            rows += _redis_rows(args.redis_mib * _MIB, root, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        for row in rows:
            print(json.dumps({"bench": "tiers", **asdict(row)}, allow_nan=False))
    else:
        _print_table(rows, args, root)
    return 0


class _Disk:
    """Puts every side in the same state before a timed phase.

    Disk mode (`cold`): a write phase starts with nothing dirty on the file system
    (untimed `syncfs`) and ends when its bytes are on the disk (timed `syncfs`,
    the same call for every side); a read phase starts with its files' pages
    dropped from the page cache (untimed). Otherwise phases are timed as they are.
    """

    def __init__(self, root: str, cold: bool) -> None:
        self._root = root
        self.cold = cold
        libc = ctypes.CDLL(None, use_errno=True)
        self._syncfs: Callable[[int], int] | None = getattr(libc, "syncfs", None)

    def sync(self) -> None:
        if self._syncfs is None:
            os.sync()
            return
        fd = os.open(self._root, os.O_RDONLY)
        try:
            if self._syncfs(fd) != 0:
                raise OSError(ctypes.get_errno(), "syncfs failed")
        finally:
            os.close(fd)

    def timed_write(self, write: Callable[[], object]) -> float:
        if self.cold:
            self.sync()
        start = time.perf_counter()
        write()
        if self.cold:
            self.sync()
        return time.perf_counter() - start

    def timed_read(self, read: Callable[[], object], paths: Iterable[str]) -> float:
        if self.cold:
            self.sync()  # pages must be clean to be dropped
            for path in paths:
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
        start = time.perf_counter()
        read()
        return time.perf_counter() - start


class _HugePageBuffer(OneViewPerChunk):
    """A `ChunkBuffer` in private anonymous memory advised to use huge pages."""

    def __init__(self, num_slots: int, slot_nbytes: int) -> None:
        self.num_slots = num_slots
        self.slot_nbytes = slot_nbytes
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
        self._mem = mmap.mmap(-1, num_slots * slot_nbytes, flags=flags)
        self._mem.madvise(mmap.MADV_HUGEPAGE)
        self._view = memoryview(self._mem)

    def chunk_nbytes(self, group: int) -> int:
        return self.slot_nbytes

    def slot_view(self, slot: int) -> memoryview:
        start = slot * self.slot_nbytes
        return self._view[start : start + self.slot_nbytes]


def _filled_buffer(
    chunk_nbytes: int, total: int, huge_pages: bool = False
) -> ArrayChunkBuffer | _HugePageBuffer:
    chunks = max(1, total // chunk_nbytes)
    buf: ArrayChunkBuffer | _HugePageBuffer = (
        _HugePageBuffer(2 * chunks, chunk_nbytes)
        if huge_pages
        else ArrayChunkBuffer(2 * chunks, chunk_nbytes)
    )
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
              slots: Sequence[int], job_chunks: int) -> None:  # fmt: skip
    """Submit every job at once and wait for all; every job must succeed."""
    submit = tier.submit_store if store else tier.submit_load
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
    failed = [r for r in tier.get_finished_jobs() if not r.success]
    if failed:
        raise RuntimeError(f"{tier.name}: {len(failed)} benchmark jobs failed")


def _write_file(path: str, views: Iterable[memoryview], truncate: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if truncate else 0))
    try:
        for view in views:
            while view:
                view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _read_file(path: str, views: Iterable[memoryview]) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        for view in views:
            if os.readv(fd, [view]) != len(view):
                raise RuntimeError(f"{path}: short read")
    finally:
        os.close(fd)


def _file_rows(
    chunk_nbytes: int, total: int, root: str, args: argparse.Namespace
) -> list[Row]:
    buf = _filled_buffer(chunk_nbytes, total, args.huge_pages)
    n = buf.num_slots // 2
    sources = [buf.slot_view(i) for i in range(n)]
    targets = [buf.slot_view(n + i) for i in range(n)]
    disk = _Disk(root, cold=not args.page_cache)
    times: dict[str, list[float]] = {f"{s}/{d}": [] for s in _SIDES for d in "wr"}
    directory = os.path.join(root, f"file-{chunk_nbytes}")
    file_size = chunk_file_size(36, _FINGERPRINT, chunk_nbytes)
    # Full (the steady state of a cache: every store evicts), or never full.
    capacity = ((args.repeats + 1) if args.empty else 1) * n * file_size
    tier = FileTier(
        FileTierConfig(directory, capacity, num_threads=args.threads), buf, _FINGERPRINT
    )
    plain = os.path.join(root, "plain")
    per_file = os.path.join(root, "per-file")
    os.makedirs(per_file, exist_ok=True)
    per_file_paths = [os.path.join(per_file, f"{i}.chunk") for i in range(n)]

    def record(side: str, run: int, write_s: float, read_s: float) -> None:
        for i in range(n):
            if targets[i] != sources[i]:
                raise RuntimeError(f"{side}: chunk {i} read back different bytes")
            targets[i][:8] = bytes(8)  # the next side must fill it again
        if run >= 0:
            times[f"{side}/w"].append(write_s)
            times[f"{side}/r"].append(read_s)

    def tier_run(run: int) -> None:
        ks = _keys(n, run + 1)
        write_s = disk.timed_write(
            lambda: _run_jobs(tier, True, ks, range(n), args.job_chunks)
        )
        read_s = disk.timed_read(
            lambda: _run_jobs(tier, False, ks, range(n, 2 * n), args.job_chunks),
            [tier.chunk_path(k) for k in ks],
        )  # fmt: skip
        record("tier", run, write_s, read_s)

    def plain_run(run: int) -> None:
        write_s = disk.timed_write(lambda: _write_file(plain, sources, args.empty))
        read_s = disk.timed_read(lambda: _read_file(plain, targets), [plain])
        record("plain", run, write_s, read_s)

    def per_file_run(run: int) -> None:
        def write() -> None:
            for path, source in zip(per_file_paths, sources, strict=True):
                _write_file(path, [source], args.empty)

        def read() -> None:
            for path, target in zip(per_file_paths, targets, strict=True):
                _read_file(path, [target])

        write_s = disk.timed_write(write)
        read_s = disk.timed_read(read, per_file_paths)
        record("per_file", run, write_s, read_s)

    def remove_new_files() -> None:
        if args.empty:  # the next run creates them again
            for path in (plain, *per_file_paths):
                os.unlink(path)

    try:
        for side in (tier_run, plain_run, per_file_run):  # warm-up: create files
            side(-1)
        remove_new_files()
        for run in range(args.repeats):
            # Rotate which side goes first, so drift on a shared machine hits all.
            sides = [tier_run, plain_run, per_file_run]
            for side in sides[run % 3 :] + sides[: run % 3]:
                side(run)
            remove_new_files()
    finally:
        tier.shutdown()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(plain)
        shutil.rmtree(per_file, ignore_errors=True)
    return _rows("file", chunk_nbytes, n, times)


def _interleave(
    mine: Callable[[int], None], plain: Callable[[int], None], repeats: int
) -> None:
    """Alternate which runs first, so that drift in a shared machine hits both."""
    for run in range(repeats):
        first, second = (mine, plain) if run % 2 == 0 else (plain, mine)
        first(run)
        second(run)


def _ratios(mine: list[float], other: list[float]) -> list[float]:
    """Per-run speed ratios (each run pairs a tier time with the baseline's)."""
    return [o / m for m, o in zip(mine, other, strict=True)]


def _rows(
    tier: str, chunk_nbytes: int, n: int, times: dict[str, list[float]]
) -> list[Row]:
    """GB/s are medians over the runs; ratios are medians of per-run ratios."""
    nbytes = n * chunk_nbytes
    out = []
    for direction, d in (("write", "w"), ("read", "r")):
        mine = times[f"tier/{d}"]
        ratios = _ratios(mine, times[f"plain/{d}"])
        per_file = times.get(f"per_file/{d}")
        out.append(
            Row(
                tier,
                direction,
                chunk_nbytes >> 10,
                n,
                round(nbytes / _MIB, 1),
                _gbps(nbytes, mine),
                _gbps(nbytes, times[f"plain/{d}"]),
                round(statistics.median(ratios), 3),
                round(min(ratios), 3),
                round(max(ratios), 3),
                None if not per_file else _gbps(nbytes, per_file),
                None
                if not per_file
                else round(statistics.median(_ratios(mine, per_file)), 3),
            )
        )
    return out


def _gbps(nbytes: int, seconds: list[float]) -> float:
    """GB/s of the median time, to three significant figures (a slow run on a
    busy machine still shows a rate, not 0.00)."""
    return float(f"{nbytes / statistics.median(seconds) / 1e9:.3g}")


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
    times: dict[str, list[float]] = {
        f"{s}/{d}": [] for s in ("tier", "plain") for d in "wr"
    }

    def tier_run(run: int) -> None:
        config = RedisTierConfig(server.url, timeout_s=30.0)
        tier = RedisTier(config, buf, _FINGERPRINT)
        ks = _keys(n, run)
        try:
            times["tier/w"].append(
                _timed(lambda: _run_jobs(tier, True, ks, range(n), args.job_chunks))
            )
            times["tier/r"].append(
                _timed(
                    lambda: _run_jobs(tier, False, ks, range(n, 2 * n), args.job_chunks)
                )
            )
        finally:
            tier.shutdown()
        redis.Redis.from_url(server.url).flushall()

    def plain_run(run: int) -> None:
        write_s, read_s = _plain_redis(server.url, buf, n, args.job_chunks)
        times["plain/w"].append(write_s)
        times["plain/r"].append(read_s)

    try:
        _interleave(tier_run, plain_run, args.repeats)
    finally:
        server.stop()
    return _rows("redis", chunk_nbytes, n, times)


def _plain_redis(
    url: str, buf: ArrayChunkBuffer | _HugePageBuffer, n: int, batch: int
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
    client: object,
    names: list[str],
    buf: ArrayChunkBuffer | _HugePageBuffer,
    batch: int,
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
    mode = (
        "page cache: no flush after writes, warm reads"
        if args.page_cache
        else "disk: writes end with syncfs, reads start cold"
    )
    fill = "never full (new files)" if args.empty else "full (evicted files reused)"
    print(
        f"tiers: file tier ({args.threads} threads, {fill}) vs one plain sequential "
        f"file and vs one plain file per chunk, in {os.path.dirname(root)}; {mode}; "
        f"Redis tier vs plain pipelined SET/MGET on loopback; {args.job_chunks} "
        f"chunks per job; medians of {args.repeats} runs, ratio min-max over runs"
    )
    print(
        f"{'tier':>6} {'dir':>6} {'chunk':>9} {'MiB':>6} {'GB/s':>6} {'plain':>6} "
        f"{'ratio':>6} {'(min-max)':>11} {'per-file':>8} {'ratio':>6}"
    )
    for r in rows:
        per_file = (
            f"{r.per_file_gbps:>8.2f} {r.per_file_ratio:>6.2f}"
            if r.per_file_gbps is not None and r.per_file_ratio is not None
            else f"{'-':>8} {'-':>6}"
        )
        print(
            f"{r.tier:>6} {r.direction:>6} {r.chunk_kib:>5} KiB {r.mib:>6.0f} "
            f"{r.gbps:>6.2f} {r.plain_gbps:>6.2f} {r.ratio:>6.2f} "
            f"{f'({r.ratio_min:.2f}-{r.ratio_max:.2f})':>11} {per_file}"
        )

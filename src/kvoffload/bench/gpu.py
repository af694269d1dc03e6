"""The CUDA data path proven on one GPU: `python -m kvoffload.bench gpu --json OUT`.

One prepared command for a session that is lent a GPU for a few minutes. It runs,
each part on its own so that one failing part does not hide the others:

1. the CUDA tests (`tests/worker/test_cuda_worker.py`, with pytest), one-line
   summary;
2. transfer bandwidth through the CUDA worker, device to host and host to
   device, for chunks of 256 KiB, 1, 4 and 16 MiB, next to a bare
   `copy_(non_blocking=True)` per chunk between the same page-locked pool and
   device memory, and one contiguous copy of the same bytes (`gpu_speed`);
3. interference: a fixed bf16 matmul loop on the default stream, alone and
   while stores and loads run on the worker's streams (`gpu_speed`);
4. byte-exact round trips for every KV layout the worker registers, and a
   failure injected mid-copy (`gpu_checks`).

Without CUDA it prints "no CUDA device" and exits 0 (writing the JSON record if
asked). It needs only torch, numpy and, for part 1, pytest.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

_TESTS = "tests/worker/test_cuda_worker.py"
_SIZES_KIB = (256, 1024, 4096, 16384)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    record: dict[str, Any] = {
        "bench": "gpu",
        "args": {
            k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
        },
    }
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        record["cuda"] = False
        _write(args.json, record)
        return 0
    record.update(cuda=True, **_device_facts())
    print(
        f"device: {record['device']} (torch {torch.__version__}, CUDA "
        f"{torch.version.cuda})",
        flush=True,
    )
    parts: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("checks", lambda: _checks(args)),
        ("bandwidth", lambda: _bandwidth(args)),
        ("interference", lambda: _interference(args)),
        ("tests", lambda: _run_tests(args.tests_timeout)),
    ]
    for name, part in parts:
        if name in args.skip:
            continue
        started = time.perf_counter()
        try:
            record[name] = part()
        except Exception as exc:  # a part that breaks must not hide the others
            traceback.print_exc()
            record[name] = {"error": f"{type(exc).__name__}: {exc}"}
        record[name]["seconds"] = round(time.perf_counter() - started, 1)
        _write(args.json, record)
    _verdict(record)
    _write(args.json, record)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m kvoffload.bench gpu",
        description="The CUDA data path on one GPU: tests, bandwidth, "
        "interference, round trips (see the module docstring).",
    )
    parser.add_argument(
        "--json", type=Path, metavar="OUT", help="write the record here"
    )
    parser.add_argument(
        "--sizes",
        type=_sizes,
        default=_SIZES_KIB,
        help="chunk sizes in KiB, comma-separated (default: 256,1024,4096,16384)",
    )
    parser.add_argument(
        "--total-mib", type=_positive, default=1024, help="MiB moved per measurement"
    )
    parser.add_argument(
        "--job-mib", type=_positive, default=64, help="MiB per job (default: 64)"
    )
    parser.add_argument("--rounds", type=_positive, default=5, help="timed rounds")
    parser.add_argument(
        "--matmul", type=_positive, default=8192, help="matmul size (default: 8192)"
    )
    parser.add_argument(
        "--matmul-iters", type=_positive, default=200, help="matmuls per loop"
    )
    parser.add_argument(
        "--tests-timeout", type=_positive, default=240, help="seconds for pytest"
    )
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=("tests", "checks", "bandwidth", "interference"),
        help="leave a part out (repeatable)",
    )
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def _sizes(text: str) -> tuple[int, ...]:
    return tuple(_positive(part) for part in text.split(","))


def _write(path: Path | None, record: dict[str, Any]) -> None:
    if path is not None:
        path.write_text(json.dumps(record, indent=1, allow_nan=False) + "\n")


def _device_facts() -> dict[str, Any]:
    props = torch.cuda.get_device_properties(0)
    return {
        "device": props.name,
        "torch": torch.__version__,
        "cuda_version": torch.version.cuda,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "multiprocessors": props.multi_processor_count,
    }


def _run_tests(timeout: int) -> dict[str, Any]:
    root = Path(__file__).resolve().parents[3]
    if not (root / _TESTS).is_file():
        print(f"tests: {_TESTS} not found under {root}; skipped", flush=True)
        return {"summary": "not found"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", _TESTS]
    done = subprocess.run(
        command, cwd=root, capture_output=True, text=True, timeout=timeout
    )
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    summary = lines[-1] if lines else done.stderr.strip()[-500:]
    counts = {
        k: int(v)
        for v, k in re.findall(r"(\d+) (passed|failed|skipped|error)", summary)
    }
    print(f"tests: {summary}", flush=True)
    failures = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    for line in failures[:20]:
        print(f"  {line}", flush=True)
    return {
        "summary": summary,
        "counts": counts,
        "returncode": done.returncode,
        "failures": failures[:50],
        "tail": done.stdout[-6000:],
    }


def _checks(args: argparse.Namespace) -> dict[str, Any]:
    from kvoffload.bench.gpu_checks import failure_check, round_trips

    trips = round_trips()
    for row in trips:
        print(
            f"round trip: {row['layout']:<36} {row['mover']:<7} "
            f"{'ok' if row['exact'] else 'WRONG BYTES'}",
            flush=True,
        )
    failure = failure_check()
    print(f"injected failure: {failure}", flush=True)
    return {"round_trips": trips, "failure": failure}


def _bandwidth(args: argparse.Namespace) -> dict[str, Any]:
    from kvoffload.bench.gpu_speed import bandwidth

    rows = []
    for size in args.sizes:
        for row in bandwidth(
            size << 10, args.total_mib << 20, args.job_mib << 20, args.rounds
        ):
            rows.append(row)
            print(
                f"bandwidth: {row['chunk_kib']:>6} KiB {row['direction']:<5} "
                f"{row['mover']:<7} {row['gbps']:7.2f} GB/s  bare per chunk "
                f"{row['bare_gbps']:7.2f} ({row['vs_bare']:.3f}x)  contiguous "
                f"{row['contiguous_gbps']:7.2f} ({row['vs_contiguous']:.3f}x)",
                flush=True,
            )
    return {"rows": rows}


def _interference(args: argparse.Namespace) -> dict[str, Any]:
    from kvoffload.bench.gpu_speed import interference

    result = interference(args.matmul, args.matmul_iters, args.rounds)
    print(
        f"interference: matmul loop {result['alone_ms']:.1f} ms alone, "
        f"{result['busy_ms']:.1f} ms with transfers ({result['slowdown']:.3f}x); "
        f"transfers meanwhile {result['transfer_gbps']:.1f} GB/s",
        flush=True,
    )
    return result


def _verdict(record: dict[str, Any]) -> None:
    """The issue's acceptance lines, each true or false, from the record."""
    verdict: dict[str, bool | None] = {}
    tests = record.get("tests", {})
    counts = tests.get("counts", {})
    verdict["tests_pass"] = (
        None
        if "counts" not in tests
        else counts.get("failed", 0) == 0
        and counts.get("error", 0) == 0
        and counts.get("passed", 0) > 0
    )
    rows = record.get("bandwidth", {}).get("rows", [])
    big = [r for r in rows if r["chunk_kib"] >= 1024 and r["mover"] == "auto"]
    verdict["bandwidth_0.9_of_bare"] = (
        all(r["vs_bare"] >= 0.9 for r in big) if big else None
    )
    slowdown = record.get("interference", {}).get("slowdown")
    verdict["matmul_slowdown_5pct"] = None if slowdown is None else slowdown <= 1.05
    checks = record.get("checks", {})
    trips = checks.get("round_trips")
    verdict["round_trips_exact"] = (
        None if trips is None else all(r["exact"] for r in trips)
    )
    failure = checks.get("failure")
    verdict["failure_safe"] = (
        None
        if failure is None
        else bool(failure.get("reported_failed") and failure.get("slot_kept"))
    )
    record["verdict"] = verdict
    print("verdict: " + ", ".join(f"{k}={v}" for k, v in verdict.items()), flush=True)

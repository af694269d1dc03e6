"""Benchmark: replay speed, requests per second of `kvoffload replay`.

Replays a trace (by default the bundled production trace) through the connector,
manager, policy and engine model, as `kvoffload replay` does, and next to it, in
the same process, the bare manager operation stream of the same trace (lookup,
load, store, touch, finish: no connector, no engine model), so the ratio shows what
the engine model and connector add.

    python -m kvoffload.bench replay [--trace PATH] [--policy lru] [--capacity 5859] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

from kvoffload.bench.manager import DEFAULT_TRACE, build_stream, run_ours
from kvoffload.engine_model import TimeModel
from kvoffload.replay.cli import DEFAULT_TARGET_LOAD, _auto_scale
from kvoffload.replay.mooncake import load_mooncake
from kvoffload.replay.runner import ReplaySettings, run_replay


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kvoffload.bench replay", description=__doc__
    )
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--policy", default="lru")
    parser.add_argument("--capacity", type=int, default=5859)
    parser.add_argument("--limit", type=int)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not args.trace.exists():
        parser.error(f"trace not found: {args.trace} (pass --trace)")
    started = time.perf_counter()
    probe = load_mooncake(args.trace, limit=args.limit)
    scale = _auto_scale(probe, TimeModel(), DEFAULT_TARGET_LOAD)
    workload = load_mooncake(args.trace, limit=args.limit, time_scale=scale)
    load_s = time.perf_counter() - started
    result = run_replay(
        workload, args.policy, args.capacity, ReplaySettings(chunk_tokens=512)
    )
    stream, _ = build_stream(args.trace, args.limit)
    _, bare_s = run_ours(stream, args.policy, args.capacity)
    record = {
        "trace": args.trace.name,
        "policy": args.policy,
        "capacity_chunks": args.capacity,
        "requests": result.requests,
        "hit_ratio": result.hit_ratio,
        "load_s": load_s,
        "replay_s": result.wall_s,
        "replay_requests_per_s": result.requests_per_s,
        "manager_only_s": bare_s,
        "manager_only_requests_per_s": result.requests / bare_s if bare_s > 0 else 0.0,
        "replay_vs_manager_only": result.wall_s / bare_s if bare_s > 0 else 0.0,
    }
    if args.json:
        print(json.dumps(record, allow_nan=False))
        return 0
    print(
        f"{record['trace']}: {result.requests:,} requests, {args.policy} at {args.capacity:,} chunks"
    )
    print(f"  trace read and hashed: {load_s:.2f} s")
    print(
        f"  replay (connector + manager + engine model): {result.wall_s:.2f} s, "
        f"{result.requests_per_s:,.0f} requests/s, hit ratio {result.hit_ratio:.3f}"
    )
    print(
        f"  manager operations alone: {bare_s:.2f} s, "
        f"{record['manager_only_requests_per_s']:,.0f} requests/s"
    )
    print(f"  replay / manager alone: {record['replay_vs_manager_only']:.1f}x")
    return 0

"""`kvoffload replay --engines N --router ...`: a fleet replay from the command line.

Same workload, time model and capacity options as a single-engine replay; each
(capacity, policy, router, threshold) is one fleet run. Arrivals are stretched
(`--time-scale auto`) so that the fleet as a whole runs at `--target-load`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace

from rich.console import Console

from kvoffload.replay import report
from kvoffload.replay.capacity import capacities
from kvoffload.replay.cli import (
    DEFAULT_TARGET_LOAD,
    _auto_scale,
    _load,
    _policies,
    _size,
    _time_model,
    write_report,
)
from kvoffload.replay.fleet import FleetSettings, run_fleet
from kvoffload.replay.fleet_args import tier_settings
from kvoffload.replay.fleet_report import EngineResult, FleetResult
from kvoffload.replay.hints import hint_settings, hint_title
from kvoffload.replay.mooncake import MOONCAKE_BLOCK_TOKENS
from kvoffload.replay.progress import ReplayProgress, progress_for
from kvoffload.replay.runner import ReplaySettings
from kvoffload.replay.sweep import Report, offline_bounds, run_parallel
from kvoffload.replay.synthetic import SYNTHETIC_WORKLOADS
from kvoffload.replay.tables import ReportTable, print_tables
from kvoffload.replay.tier_report import make_tier_tables, rate_rows, tier_rows
from kvoffload.replay.workload import Workload

PER_ENGINE_ROWS = 16
"""Fleets larger than this show their engines' spread, not every engine."""


@dataclass(frozen=True)
class FleetRun:
    policy: str
    capacity_chunks: int
    settings: ReplaySettings
    fleet: FleetSettings


def run_fleets(
    workload: Workload,
    runs: Sequence[FleetRun],
    jobs: int | None,
    progress: ReplayProgress | None = None,
) -> list[FleetResult]:
    """Every run, in parallel processes when `jobs` allows; in order of `runs`.
    `progress` counts `len(runs) * len(workload)` requests."""
    progress = progress or ReplayProgress(len(runs) * len(workload), len(runs))

    def replay(run: FleetRun, report: Report) -> FleetResult:
        return run_fleet(
            workload, run.policy, run.capacity_chunks, run.settings, run.fleet, report
        )

    return run_parallel(replay, runs, jobs, progress)


def rescaled(workload: Workload, scale: float) -> Workload:
    """`workload` with its arrival times stretched by `scale`."""
    if scale == 1.0:
        return workload
    requests = tuple(replace(r, arrival=r.arrival * scale) for r in workload.requests)
    return replace(workload, requests=requests)


def fleet_main(args: argparse.Namespace, console: Console) -> int:
    for flag, given in (("--belady", args.belady), ("--plot", args.plot)):
        if given:
            raise ValueError(
                f"{flag} is for single-engine replays; a fleet replay (--engines, "
                "--router, --shared-tier) reports with --json and --report-dir"
            )
    tm = _time_model(args)
    engines = args.engines or 1
    workload = _load(args, 1.0)
    if args.time_scale == "auto":
        target = args.target_load or DEFAULT_TARGET_LOAD
        scale = _auto_scale(workload, tm, target * engines)
    else:
        scale = float(args.time_scale)
    workload = rescaled(workload, scale)
    # As a single-engine replay chooses it.
    block_format = args.trace or args.workload in SYNTHETIC_WORKLOADS
    chunk = args.chunk_tokens or (
        MOONCAKE_BLOCK_TOKENS if block_format else 16 * workload.hash_block_tokens
    )
    prompt_only = {"on": [True], "off": [False], "both": [True, False]}[
        args.offload_prompt_only
    ]
    runs = [
        FleetRun(
            policy,
            capacity,
            ReplaySettings(
                chunk_tokens=chunk,
                device_tokens=args.device_tokens,
                store_threshold=threshold,
                offload_prompt_only=po,
                time_model=tm,
                **tier_settings(args),
                **hint_settings(args, scale),
            ),
            FleetSettings(engines, router, args.shared_tier),
        )
        for capacity in capacities(args, workload, chunk, tm)
        for policy in _policies(args)
        for router in args.router or ["round-robin"]
        for threshold in args.store_threshold
        for po in prompt_only
    ]
    runs[0].settings.validate(workload)
    if args.shared_tier is not None:
        args.shared_tier.capacity_chunks(runs[0].settings.chunk_bytes)
    with progress_for(args.progress, len(runs) * len(workload), len(runs)) as shown:
        results = run_fleets(workload, runs, args.jobs, shown)
    _, inf = offline_bounds(workload, chunk, [], False)
    title = (
        f"{workload.name}: {len(workload):,} requests over {engines} engines, chunk "
        f"{chunk} tokens ({_size(runs[0].settings.chunk_bytes)}), device "
        f"cache {args.device_tokens:,} tokens, arrivals x{scale:.2f}; "
        f"infinite-cache hit ratio {inf.hit_ratio:.3f}"
    )
    if args.hints.kind != "none":
        title += f"; {hint_title([args.hints])}"
    tables = fleet_tables(results, title)
    records = [r.as_json() for r in results]
    records.append(report.offline_json("infinite", workload.name, None, inf))
    if args.json:
        report.write_json_lines(records, sys.stdout)
    else:
        print_tables(console, tables)
    if args.report_dir:
        write_report(args.report_dir, records, tables)
        console.print(f"report written to {args.report_dir}/: results.jsonl, table.txt")
    return 0


def fleet_tables(results: Sequence[FleetResult], title: str) -> list[ReportTable]:
    """The fleet summary, each run's engines, and each run's tiers."""
    tables = [_summary(results, title)]
    for r in results:
        tables.append(_engines(r))
    rows = [row for r in results for row in tier_rows(_label(r), r.tiers)]
    rates = [row for r in results for row in rate_rows(_label(r), r.tiers)]
    tables += make_tier_tables("tiers (host and local tiers: all engines)", rows, rates)
    return tables


def _label(r: FleetResult) -> str:
    return f"{r.router} {r.policy} {r.capacity_chunks:,}"


def _summary(results: Sequence[FleetResult], title: str) -> ReportTable:
    """One row per run; a column per tier of its share of the hit ratio."""
    first = results[0]
    # "shared-redis" over two lines: these columns hold 0.123.
    tiers = [t.name.replace("-", "-\n", 1) for t in first.tiers]
    headers = ("router", "policy", "host\nchunks", "hit\nratio", *tiers,
               "TTFT\nmean s", "TTFT\np90 s", "imbalance")  # fmt: skip
    rows = tuple(
        (
            r.router,
            r.policy,
            f"{r.capacity_chunks:,}",
            f"{r.hit_ratio:.3f}",
            *(f"{t.hit_ratio:.3f}" for t in r.tiers),
            f"{r.est_ttft_s:.3f}",
            f"{r.p90_ttft_s:.3f}",
            f"{r.load_imbalance:.2f}",
        )
        for r in results
    )
    local = " ".join(first.local_tiers) or "-"
    title += (
        f"\nper engine: host tier, local tiers {local}; shared tier "
        f"{first.shared_tier or '-'}"
    )
    return ReportTable(title, headers, rows, keys=3, left=2)


def _engines(r: FleetResult) -> ReportTable:
    title = (
        f"engines: {_label(r)}, shared tier {r.shared_tier or '-'} (replayed at "
        f"{r.requests_per_s:,.0f} requests/s)"
    )
    headers = ("engine", "requests", "load\nshare", "hit\nratio", "TTFT\nmean s",
               "TTFT\np90 s")  # fmt: skip
    engines = list(r.per_engine)
    if len(engines) > PER_ENGINE_ROWS:
        rows = [(label, *_engine_cells(e)) for label, e in _spread(engines)]
    else:
        rows = [(str(e.engine), *_engine_cells(e)) for e in engines]
    return ReportTable(title, headers, tuple(rows))


def _spread(engines: list[EngineResult]) -> list[tuple[str, EngineResult]]:
    """The engines of least and most load, and the median one."""
    ordered = sorted(engines, key=lambda e: e.prompt_tokens)
    median = ordered[len(ordered) // 2]
    mean_ttft = statistics.fmean(e.est_ttft_s for e in engines)
    return [
        (f"least loaded (#{ordered[0].engine})", ordered[0]),
        (f"median (#{median.engine}); mean TTFT {mean_ttft:.3f}", median),
        (f"most loaded (#{ordered[-1].engine})", ordered[-1]),
    ]


def _engine_cells(e: EngineResult) -> list[str]:
    return [
        f"{e.requests:,}",
        f"{e.load_share:.3f}",
        f"{e.hit_ratio:.3f}",
        f"{e.est_ttft_s:.3f}",
        f"{e.p90_ttft_s:.3f}",
    ]

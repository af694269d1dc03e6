"""`kvoffload replay` and `kvoffload demo`: what would this cache give me?

Replays a request trace (Mooncake JSONL) or a generated workload through the real
connector, manager and policies against the engine model, for one or several
policies and capacities, next to the offline optimum for the same capacity.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Literal

from rich.console import Console

from kvoffload.config.sizes import format_size
from kvoffload.engine_model import TimeModel
from kvoffload.policies import policy_names
from kvoffload.replay import limits, report
from kvoffload.replay.capacity import (
    add_capacity_arguments,
    capacities,
    kv_bytes_per_token,
)
from kvoffload.replay.cli_types import (
    AtLeastOne,
    HelpFormatter,
    float_in,
    int_in,
    policy_name,
    time_scale,
)
from kvoffload.replay.fleet_args import (
    add_tier_and_fleet_arguments,
    check_requests,
    is_fleet,
    tier_settings,
)
from kvoffload.replay.generators import (
    ChatAgentsSpec,
    ReasoningSpec,
    chat_agents,
    reasoning,
)
from kvoffload.replay.hints import (
    add_hint_arguments,
    hint_modes,
    hint_settings,
    hint_title,
)
from kvoffload.replay.mooncake import MOONCAKE_BLOCK_TOKENS, TraceError, load_mooncake
from kvoffload.replay.output_paths import prepare_report_dir, resolve_plot_path
from kvoffload.replay.progress import LINE_INTERVAL_S, PROGRESS_MODES, progress_for
from kvoffload.replay.runner import ReplaySettings
from kvoffload.replay.sweep import Run, offline_bounds, run_sweep
from kvoffload.replay.synthetic import SYNTHETIC_WORKLOADS, synthetic
from kvoffload.replay.tables import ReportTable, print_tables, write_tables
from kvoffload.replay.tier_report import tiers_tables
from kvoffload.replay.workload import Workload

WORKLOADS = ("chat-agents", "reasoning", *SYNTHETIC_WORKLOADS)
DEFAULT_TARGET_LOAD = 0.5
_TM = TimeModel()  # the time model's defaults, for --help
# What a shell reports for a command killed by SIGPIPE (128 + 13).
BROKEN_PIPE_STATUS = 141


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", nargs="?", help="a Mooncake-format JSONL trace")
    parser.add_argument(
        "--workload",
        choices=WORKLOADS,
        help="replay a generated workload instead (default: chat-agents, "
        "without a trace)",
    )
    parser.add_argument(
        "--seed",
        type=int_in(0, limits.MAX_SEED),
        help="seed of the generated workload (default: the workload's own)",
    )
    parser.add_argument(
        "--policy",
        action="append",
        type=policy_name,
        help="eviction policy (repeat; 'all' = every registered one; default: lru)",
    )
    parser.add_argument(
        "--list-policies", action="store_true", help="print the policy names and exit"
    )
    add_capacity_arguments(parser)
    parser.add_argument(
        "--chunk-tokens",
        type=int_in(1, limits.MAX_CHUNK_TOKENS),
        help="tokens per chunk (default: 512 for Mooncake traces and synth-* "
        "workloads, 16 hash blocks for the others)",
    )
    parser.add_argument(
        "--device-tokens",
        type=int_in(0, limits.MAX_DEVICE_TOKENS),
        default=0,
        help="device prefix cache size in tokens, 0 for none",
    )
    parser.add_argument(
        "--store-threshold",
        type=int_in(0, limits.MAX_STORE_THRESHOLD),
        nargs="+",
        action=AtLeastOne,
        default=[0],
        help="reuse-filter threshold(s): store a chunk once it was asked for this "
        "many times; 0 and 1 store every chunk (default: 0)",
    )
    parser.add_argument(
        "--offload-prompt-only",
        choices=("on", "off", "both"),
        default="on",
        help="store only prompt chunks, not decoded ones; both replays each way",
    )
    parser.add_argument(
        "--belady",
        action="store_true",
        help="add the offline optimum for each capacity",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object per line instead of a table",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        help="write a PNG of hit ratio against capacity: a .png file, or a "
        "directory to write hit_ratio.png in (default: no plot)",
    )
    parser.add_argument(
        "--report-dir",
        type=Path,
        help="write results.jsonl, table.txt and hit_ratio.png here (default: none)",
    )
    parser.add_argument(
        "--limit",
        type=int_in(1, sys.maxsize),
        help="replay only the first N requests (default: all)",
    )
    parser.add_argument(
        "--partial-block",
        choices=("pad", "drop"),
        help="Mooncake: count a partial last block as a chunk (pad, the default) "
        "or not (drop)",
    )
    parser.add_argument(
        "--time-scale",
        type=time_scale,
        default="auto",
        help="stretch arrival times by this factor; 'auto' keeps the modeled engine "
        "at --target-load of its prefill capacity",
    )
    parser.add_argument(
        "--target-load",
        type=float_in(0, limits.MAX_TARGET_LOAD, open_minimum=True),
        help="with --time-scale auto: the modeled engine's load, as a share of "
        f"its prefill capacity (default: {DEFAULT_TARGET_LOAD})",
    )
    parser.add_argument(
        "--prefill-us-per-token",
        type=float_in(0, limits.MAX_PREFILL_US_PER_TOKEN),
        help="engine prefill time per token (µs; default: "
        f"{_TM.prefill_s_per_token * 1e6:g})",
    )
    parser.add_argument(
        "--decode-ms",
        type=float_in(0, limits.MAX_DECODE_MS),
        help=f"engine decode step time (ms; default: {_TM.decode_step_s * 1e3:g})",
    )
    parser.add_argument(
        "--link-gbps",
        type=float_in(limits.MIN_LINK_GBPS, limits.MAX_LINK_GBPS),
        help="device<->host bandwidth (GB/s; default: "
        f"{_TM.transfer_bytes_per_s / 1e9:g})",
    )
    parser.add_argument(
        "--kv-bytes-per-token",
        type=int_in(1, limits.MAX_KV_BYTES_PER_TOKEN),
        help="KV bytes per token, all layers' keys and values (default: "
        f"{_TM.kv_bytes_per_token:,}, an 8B model in bf16, or --model's)",
    )
    parser.add_argument(
        "--jobs",
        type=int_in(1, limits.MAX_JOBS),
        help="parallel replay processes (default: CPU count)",
    )
    parser.add_argument(
        "--progress",
        choices=PROGRESS_MODES,
        default="auto",
        help="progress on stderr: auto is a bar with rate and ETA on a terminal, "
        f"else a line every {LINE_INTERVAL_S:g} s (lines)",
    )
    add_tier_and_fleet_arguments(parser)
    add_hint_arguments(parser)


def run_cli(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """`replay_main`, with bad input reported in one line, never a traceback.

    Options that conflict, settings the replay refuses and output paths that
    cannot be written (checked before the replay runs) are usage errors from
    `parser` (exit status 2); a trace that cannot be read or replayed is one line
    naming its file, line and field (exit status 1). Output to a reader that went
    away (`| head`) ends the run quietly."""
    _check_conflicts(parser, args)
    try:
        if args.report_dir is not None:
            prepare_report_dir(args.report_dir)
        if args.plot is not None:
            args.plot = resolve_plot_path(args.plot)
        return replay_main(args)
    except BrokenPipeError:
        return _quiet_after_broken_pipe()
    except TraceError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 1
    except (ValueError, OSError) as exc:
        parser.error(" ".join(str(exc).splitlines()))


def _check_conflicts(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Options that would be ignored silently are refused instead."""
    if args.trace and args.workload:
        parser.error("give a trace or --workload, not both")
    if args.trace and args.seed is not None:
        parser.error("--seed applies to a generated --workload, not to a trace")
    if not args.trace and args.partial_block is not None:
        parser.error("--partial-block applies to a trace, not to a --workload")
    if args.time_scale != "auto" and args.target_load is not None:
        parser.error("--target-load applies to --time-scale auto only")
    if args.model is not None and args.kv_bytes_per_token is not None:
        parser.error("give --model or --kv-bytes-per-token, not both")
    if len(hint_modes(args)) > 1 and is_fleet(args):
        parser.error("a fleet replay takes one --hints mode")


def _quiet_after_broken_pipe() -> int:
    # Python would report the pipe again when it flushes stdout at exit: point
    # stdout at /dev/null first (what the Python documentation recommends).
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass  # stdout is not a file descriptor (a test's capture): nothing to flush
    return BROKEN_PIPE_STATUS


def _time_model(args: argparse.Namespace) -> TimeModel:
    tm = TimeModel()
    if args.prefill_us_per_token is not None:
        tm = replace(tm, prefill_s_per_token=args.prefill_us_per_token * 1e-6)
    if args.decode_ms is not None:
        tm = replace(tm, decode_step_s=args.decode_ms * 1e-3)
    if args.link_gbps is not None:
        tm = replace(tm, transfer_bytes_per_s=args.link_gbps * 1e9)
    kv_bytes = kv_bytes_per_token(args)
    if kv_bytes is not None:
        tm = replace(tm, kv_bytes_per_token=kv_bytes)
    return tm


def _load(args: argparse.Namespace, scale: float) -> Workload:
    if args.trace:
        partial: Literal["pad", "drop"] = (
            "drop" if args.partial_block == "drop" else "pad"
        )
        return load_mooncake(args.trace, partial, args.limit, scale)
    name = args.workload or "chat-agents"
    if name in SYNTHETIC_WORKLOADS:
        w = synthetic(name, args.seed, scale, args.requests)
    elif name == "reasoning":
        spec = ReasoningSpec() if args.seed is None else ReasoningSpec(seed=args.seed)
        w = reasoning(
            replace(
                spec, arrival_rate=spec.arrival_rate / scale, gap_s=spec.gap_s * scale
            )
        )
    else:
        spec2 = (
            ChatAgentsSpec() if args.seed is None else ChatAgentsSpec(seed=args.seed)
        )
        w = chat_agents(
            replace(
                spec2,
                arrival_rate=spec2.arrival_rate / scale,
                chat_gap_s=spec2.chat_gap_s * scale,
                agent_gap_s=spec2.agent_gap_s * scale,
            )
        )
    if args.limit is not None:
        actual = w.actual_prompt_tokens
        w = Workload(
            w.name,
            w.requests[: args.limit],
            w.hash_block_tokens,
            None if actual is None else actual[: args.limit],
        )
    return w


def _stretch(workload: Workload, scale: float) -> Workload:
    """`workload` with arrivals times `scale` (as reading it at that scale gives:
    a trace is read once, so it may be a pipe)."""
    try:
        requests = tuple(
            replace(r, arrival=r.arrival * scale) for r in workload.requests
        )
    except ValueError as exc:
        raise ValueError(f"arrivals stretched x{scale:g}: {exc}") from None
    return replace(workload, requests=requests)


def _scaled_workload(args: argparse.Namespace, tm: TimeModel) -> tuple[Workload, float]:
    """The workload to replay, arrivals stretched per --time-scale, and the stretch."""
    unscaled = _load(args, 1.0)
    if args.time_scale == "auto":
        target = args.target_load or DEFAULT_TARGET_LOAD
        scale = _auto_scale(unscaled, tm, target)
    else:
        scale = float(args.time_scale)
    if scale == 1.0:
        return unscaled, scale
    return (_stretch(unscaled, scale) if args.trace else _load(args, scale)), scale


def _auto_scale(workload: Workload, tm: TimeModel, target: float) -> float:
    """Arrival stretch that puts the modeled engine at `target` of its prefill capacity."""
    reqs = workload.requests
    if len(reqs) < 2 or target <= 0:
        return 1.0
    span = reqs[-1].arrival - reqs[0].arrival
    work = sum(tm.prefill_seconds(r.num_prompt_tokens, 0) for r in reqs)
    return max(1.0, work / span / target) if span > 0 else 1.0


def _policies(args: argparse.Namespace) -> list[str]:
    chosen = args.policy or ["lru"]
    if "all" in chosen:
        return policy_names()
    return list(dict.fromkeys(chosen))


def replay_main(args: argparse.Namespace, console: Console | None = None) -> int:
    console = console or Console()
    if args.list_policies:
        print("\n".join(policy_names()))
        return 0
    check_requests(args, SYNTHETIC_WORKLOADS)
    modes = hint_modes(args)  # (sets `args.hints`, the first, for a fleet)
    if is_fleet(args):
        from kvoffload.replay.fleet_cli import fleet_main  # it builds on this module

        return fleet_main(args, console)
    tm = _time_model(args)
    workload, scale = _scaled_workload(args, tm)
    block_format = args.trace or args.workload in SYNTHETIC_WORKLOADS
    chunk = args.chunk_tokens or (
        MOONCAKE_BLOCK_TOKENS if block_format else 16 * workload.hash_block_tokens
    )
    host_capacities = capacities(args, workload, chunk, tm)
    prompt_only = {"on": [True], "off": [False], "both": [True, False]}[
        args.offload_prompt_only
    ]
    runs = [
        Run(
            policy,
            capacity,
            ReplaySettings(
                chunk_tokens=chunk,
                device_tokens=args.device_tokens,
                store_threshold=threshold,
                offload_prompt_only=po,
                time_model=tm,
                **tier_settings(args),
                **hint_settings(args, scale, mode),
            ),
        )
        for capacity in host_capacities
        for policy in _policies(args)
        for threshold in args.store_threshold
        for po in prompt_only
        for mode in modes
    ]
    runs[0].settings.validate(workload)
    with progress_for(args.progress, len(runs) * len(workload), len(runs)) as shown:
        results = run_sweep(workload, runs, args.jobs, shown)
    bel, inf = offline_bounds(workload, chunk, host_capacities, args.belady)
    records = [r.as_json() for r in results]
    records += [
        report.offline_json("belady", workload.name, c, b)
        for c, b in sorted(bel.items())
    ]
    records.append(report.offline_json("infinite", workload.name, None, inf))
    title = (
        f"{workload.name}: {len(workload):,} requests, chunk {chunk} tokens "
        f"({_size(runs[0].settings.chunk_bytes)}), device cache "
        f"{args.device_tokens:,} tokens, arrivals x{scale:.2f}"
    )
    if any(mode.kind != "none" for mode in modes):
        title += f", {hint_title(modes)}"
    tables = [report.results_table(results, bel, inf, title)]
    for extra in (report.prompt_only_table(results), report.hints_table(results)):
        if extra is not None:
            tables.append(extra)
    if any(r.tiers for r in results):
        tables += tiers_tables(results)
    if args.json:
        report.write_json_lines(records, sys.stdout)
    else:
        print_tables(console, tables)
    if args.plot:
        report.plot(results, bel, inf, args.plot, title)
    if args.report_dir:
        write_report(args.report_dir, records, tables)
        drawn = report.plot(results, bel, inf, args.report_dir / "hit_ratio.png", title)
        console.print(
            f"report written to {args.report_dir}/: results.jsonl, table.txt"
            + (", hit_ratio.png" if drawn else " (matplotlib missing: no plot)")
        )
    return 0


def _size(nbytes: int) -> str:
    """`nbytes` as a title shows it: `64MiB`, one word that a line does not break."""
    return format_size(nbytes).replace(" ", "")


def write_report(
    directory: Path,
    records: Sequence[dict[str, object]],
    tables: Sequence[ReportTable],
) -> None:
    """results.jsonl and table.txt (the tables at `REPORT_WIDTH` columns)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "results.jsonl", "w", encoding="utf-8") as f:
        report.write_json_lines(records, f)
    with open(directory / "table.txt", "w", encoding="utf-8") as f:
        write_tables(f, tables)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="kvoffload replay", description=__doc__, formatter_class=HelpFormatter
    )
    add_replay_arguments(parser)
    args = parser.parse_args(argv)
    return run_cli(parser, args)


if __name__ == "__main__":
    sys.exit(main())

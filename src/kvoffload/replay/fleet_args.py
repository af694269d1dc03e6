"""`kvoffload replay` options for secondary tiers and fleets (see docs/fleet.md)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from kvoffload.connector.config import DEFAULT_MAX_DEFER_S
from kvoffload.replay.cli_types import (
    float_in,
    int_in,
    router_name,
    shared_tier_spec,
    tier_spec,
)
from kvoffload.replay.limits import MAX_DEFER_S, MAX_ENGINES, MAX_GENERATED_REQUESTS
from kvoffload.replay.routers import ROUTERS


def add_tier_and_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tier",
        action="append",
        type=tier_spec,
        metavar="KIND:CAPACITY[:GBPS][:back]",
        help="a secondary tier behind host memory, on each engine (repeat, in "
        "order): file or redis; CAPACITY in chunks, or a size such as 200GiB; "
        "GBPS its bandwidth, if not given file 5, redis 2.5; ':back' writes a "
        "file tier back (a chunk is written when host memory is about to evict "
        "it, so the disk holds what host memory does not) (default: none)",
    )
    parser.add_argument(
        "--engines",
        type=int_in(1, MAX_ENGINES),
        metavar="N",
        help="replay over a fleet of N engines behind --router (default: one "
        "engine, unless --router or --shared-tier is given)",
    )
    parser.add_argument(
        "--router",
        action="append",
        type=router_name,
        metavar="NAME",
        help="how a fleet routes requests (repeat to compare): "
        f"{', '.join(ROUTERS)} (default: round-robin)",
    )
    parser.add_argument(
        "--shared-tier",
        type=shared_tier_spec,
        metavar="KIND:CAPACITY[:GBPS]",
        help="one tier every engine of the fleet reads and writes, behind its "
        "own (default: none)",
    )
    parser.add_argument(
        "--max-defer-s",
        type=float_in(0.0, MAX_DEFER_S),
        metavar="SECONDS",
        help="longest a request waits for chunks in flight, the connector's "
        f"max_defer_s (default: {DEFAULT_MAX_DEFER_S:g})",
    )
    parser.add_argument(
        "--requests",
        type=int_in(1, MAX_GENERATED_REQUESTS),
        metavar="N",
        help="synth-* workloads: requests to generate, before their steady-state "
        "window keeps about 80%% (default: each workload's own)",
    )


def is_fleet(args: argparse.Namespace) -> bool:
    """Whether the options ask for a fleet replay."""
    return args.engines is not None or bool(args.router) or args.shared_tier is not None


def tier_settings(args: argparse.Namespace) -> dict[str, Any]:
    """`ReplaySettings` fields these options set (none: the defaults)."""
    extra: dict[str, Any] = {"tiers": tuple(args.tier or ())}
    if args.max_defer_s is not None:
        extra["max_defer_s"] = args.max_defer_s
    return extra


def check_requests(args: argparse.Namespace, synthetic_names: Iterable[str]) -> None:
    """`--requests` sizes only synth-* workloads: elsewhere it is an error."""
    if args.requests is not None and args.workload not in set(synthetic_names):
        raise ValueError(
            f"--requests {args.requests}: only synth-* workloads are generated to a "
            "size; use --limit to replay the first N requests of others"
        )

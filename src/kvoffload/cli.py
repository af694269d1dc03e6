"""The `kvoffload` command: `replay` a trace through the cache, run the `demo`, or
`check-config` a vLLM configuration offline."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from kvoffload import __version__
from kvoffload.integrations.vllm.check import (
    add_check_config_arguments,
    run_check_config,
)
from kvoffload.policies import policy_names
from kvoffload.replay.cli import __doc__ as replay_doc
from kvoffload.replay.cli import add_replay_arguments, run_cli
from kvoffload.replay.cli_types import HelpFormatter

# The reference table's capacities (512-token chunks) for the bundled trace.
TRACE_CAPACITIES = [1000, 2000, 5859, 10000, 20000, 50000]
# kvoffload's best policy for prefix caches; see docs/policies.md.
BEST_POLICY = "split"


def _demo_argv(args: argparse.Namespace) -> list[str]:
    best = BEST_POLICY if BEST_POLICY in policy_names() else "arc"
    argv = ["--policy", "lru", "--policy", "arc", "--policy", best, "--belady"]
    argv += ["--report-dir", str(args.report_dir)]
    if args.trace:
        argv = [args.trace, *argv, "--capacity-chunks", *map(str, TRACE_CAPACITIES)]
    else:
        argv += ["--workload", "chat-agents"]
    return argv


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="kvoffload", description="Tiered KV-cache offloading: replay and planning."
    )
    parser.add_argument(
        "--version", action="version", version=f"kvoffload {__version__}"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    replay = sub.add_parser(
        "replay",
        help="replay a trace through the cache and report hit ratios",
        description=replay_doc,
        formatter_class=HelpFormatter,
    )
    add_replay_arguments(replay)
    demo = sub.add_parser(
        "demo",
        help="replay a generated chat+agent workload (or --trace) for LRU, ARC and the best policy",
        description="Replay a generated chat+agent workload (or --trace) for LRU, "
        "ARC and the best policy next to the offline optimum, as `kvoffload replay` "
        "would, and write the report.",
        formatter_class=HelpFormatter,
    )
    demo.add_argument(
        "--trace",
        help="a Mooncake-format trace instead of the generated workload (at "
        f"capacities of {', '.join(f'{c:,}' for c in TRACE_CAPACITIES)} chunks; "
        "default: none)",
    )
    demo.add_argument(
        "--report-dir",
        type=Path,
        default=Path("reports"),
        help="write results.jsonl, table.txt and hit_ratio.png here",
    )
    check = sub.add_parser(
        "check-config",
        help="check kvoffload's vLLM configuration offline: print it resolved, "
        "or every error",
        description="Check kv_connector_extra_config (or a whole "
        "--kv-transfer-config) as the vLLM connector would, without vLLM: print "
        "the resolved configuration (secrets masked) and exit 0, or every error "
        "and exit 1.",
    )
    add_check_config_arguments(check)
    args = parser.parse_args(argv)
    if args.command == "check-config":
        return run_check_config(args)
    if args.command == "demo":
        replay_args = replay.parse_args(_demo_argv(args))
        return run_cli(demo, replay_args)
    return run_cli(replay, args)


if __name__ == "__main__":
    sys.exit(main())

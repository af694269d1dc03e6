"""Benchmark: the scheduler-side cost of the reused-block guard, in decode.

N requests with long prompts decode one token a step, each taking a fresh engine
block every 16 tokens, through a real `OffloadConnector` and host tier (no engine:
`decode_engine` plays vLLM's scheduler). Every step is timed: `build_step` alone,
and the whole step (`build_step`, the stores' results, `on_schedule_end`). The
baseline is the same run with the guard switched off; rounds alternate between
the two and the ratio is printed. Cases: stores land (`stored`); the host tier is
full and pinned, so every prompt chunk stays unstored (`put-off`); both again with
a sliding-window group whose blocks leave the window and come back to other
requests (`hybrid`, `hybrid-put-off`).

    python -m kvoffload.bench reuse_guard [--requests N ...] [--case NAME ...] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from kvoffload.bench.decode_engine import BenchRequest, BlockPool, Decoder
from kvoffload.connector import ConnectorConfig, GroupSpec, OffloadConnector
from kvoffload.connector.request_state import RequestState
from kvoffload.connector.reuse_guard import ReuseGuard
from kvoffload.keys import make_offload_key
from kvoffload.tiers.base import ReqContext
from kvoffload.tiers.primary import CPUOffloadingManager

BLOCK = 16
PER_CHUNK = 32  # chunks of 512 tokens
PINNED_HOST_CHUNKS = 64


@dataclass(frozen=True)
class Case:
    name: str
    sliding: bool
    """A second KV-cache group with a sliding window."""
    put_off: bool
    """The host tier is full and pinned: no store lands, prompts stay unstored."""


CASES = {
    c.name: c
    for c in (
        Case("stored", False, False),
        Case("put-off", False, True),
        Case("hybrid", True, False),
        Case("hybrid-put-off", True, True),
    )
}


@dataclass(frozen=True)
class Workload:
    requests: int
    steps: int
    min_prompt: int
    max_prompt: int
    window: int
    seed: int

    def prompts(self) -> list[int]:
        rng = random.Random(self.seed)
        return [
            rng.randint(self.min_prompt, self.max_prompt) for _ in range(self.requests)
        ]


@dataclass(frozen=True)
class Run:
    """Mean microseconds a step over one run's decode steps."""

    build_us: float
    step_us: float
    fresh_blocks: float
    """Engine blocks allocated a step, all groups."""


class NoGuard(ReuseGuard):
    """A reused-block guard that notes, indexes and voids nothing."""

    def note_allocated(self, tables: Sequence[Sequence[int]], hit_tokens: int) -> None:
        pass

    def on_new_table(self, state: RequestState) -> None:
        pass

    def void_reused(self) -> None:
        pass

    def end_step(self) -> None:
        pass

    def sync(self, state: RequestState) -> None:
        pass

    def release(self, state: RequestState) -> None:
        pass


class UnguardedConnector(OffloadConnector):
    """The baseline: the connector without its reused-block guard."""

    def __init__(self, config: ConnectorConfig, manager: CPUOffloadingManager) -> None:
        super().__init__(config, manager)
        self._guard = NoGuard(config.groups, config.null_block_id)


def host_tier(case: Case, chunks: int) -> CPUOffloadingManager:
    """Room for every prompt chunk, or (`put_off`) a few slots, all pinned."""
    if not case.put_off:
        return CPUOffloadingManager(chunks)
    manager = CPUOffloadingManager(PINNED_HOST_CHUNKS)
    ctx = ReqContext("filler")
    keys = [
        make_offload_key(i.to_bytes(32, "big"), 0) for i in range(PINNED_HOST_CHUNKS)
    ]
    out = manager.prepare_store(keys, ctx)
    assert out is not None
    manager.complete_store(out.keys_to_store, ctx)
    manager.pin(keys)
    return manager


def prefilled(case: Case, workload: Workload, guard: bool) -> Decoder:
    """A decoder whose requests are all prefilled (not timed)."""
    groups = 2 if case.sliding else 1
    config = ConnectorConfig((GroupSpec(BLOCK, PER_CHUNK),) * groups, null_block_id=0)
    prompts = workload.prompts()
    prompt_blocks = sum(-(-p // BLOCK) for p in prompts)
    chunks = sum(p // (BLOCK * PER_CHUNK) for p in prompts) * groups
    connector_type = OffloadConnector if guard else UnguardedConnector
    connector = connector_type(config, host_tier(case, chunks + 1))
    # The full-attention groups keep every block; with a sliding window, the
    # blocks that leave it come back soon after a small reserve is used up.
    per_request = workload.steps // BLOCK + 2
    reserve = workload.requests * (
        per_request if case.sliding else groups * per_request
    )
    pool = BlockPool(1 + prompt_blocks * groups + reserve)
    window = workload.window if case.sliding else None
    decoder = Decoder(connector, pool, BLOCK, groups, window)
    decoder.prefill([BenchRequest(f"r{i}", p, p, BLOCK) for i, p in enumerate(prompts)])
    return decoder


def run(case: Case, workload: Workload, guard: bool) -> Run:
    decoder = prefilled(case, workload, guard)
    build = step = 0.0
    fresh = 0
    # The prefilled tables are long-lived: keep the collector from rescanning them.
    gc.collect()
    gc.freeze()
    try:
        for _ in range(workload.steps):
            scheduled = decoder.decode_step()
            fresh += sum(len(g) for item in scheduled for g in item.new_block_ids)
            built, whole = decoder.finish_step(scheduled)
            build += built
            step += whole
            decoder.advance()
    finally:
        gc.unfreeze()
    n = workload.steps
    return Run(build / n * 1e6, step / n * 1e6, fresh / n)


@dataclass(frozen=True)
class Comparison:
    case: str
    requests: int
    guard: list[Run]
    baseline: list[Run]

    def best(self, runs: list[Run], what: str) -> float:
        return min(float(getattr(r, what)) for r in runs)

    def ratio(self, what: str) -> float:
        return self.best(self.guard, what) / self.best(self.baseline, what)

    def round_ratio(self, what: str) -> float:
        """Median of the rounds' ratios (each round ran both)."""
        return statistics.median(
            float(getattr(g, what)) / float(getattr(b, what))
            for g, b in zip(self.guard, self.baseline, strict=True)
        )

    def record(self) -> dict[str, object]:
        return {
            "case": self.case,
            "requests": self.requests,
            "fresh_blocks_per_step": self.guard[0].fresh_blocks,
            "build_us": self.best(self.guard, "build_us"),
            "build_us_no_guard": self.best(self.baseline, "build_us"),
            "build_ratio": self.ratio("build_us"),
            "build_ratio_by_round": self.round_ratio("build_us"),
            "step_us": self.best(self.guard, "step_us"),
            "step_us_no_guard": self.best(self.baseline, "step_us"),
            "step_ratio": self.ratio("step_us"),
        }


def compare(case: Case, workload: Workload, rounds: int) -> Comparison:
    """`rounds` runs with the guard and without, alternating which goes first."""
    guard: list[Run] = []
    baseline: list[Run] = []
    for r in range(rounds):
        for on in (True, False) if r % 2 == 0 else (False, True):
            (guard if on else baseline).append(run(case, workload, on))
    return Comparison(case.name, workload.requests, guard, baseline)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kvoffload.bench reuse_guard", description=__doc__
    )
    parser.add_argument("--requests", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--case", action="append", choices=sorted(CASES))
    parser.add_argument("--steps", type=int, default=64, help="decode steps timed")
    parser.add_argument("--prompt", type=int, nargs=2, default=[4096, 32768])
    parser.add_argument("--window", type=int, default=1024, help="sliding, tokens")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    cases = [CASES[name] for name in args.case or CASES]
    if not args.json:
        print(
            f"decode, block {BLOCK}, chunk {BLOCK * PER_CHUNK} tokens, prompts "
            f"{args.prompt[0]}-{args.prompt[1]} tokens, {args.steps} steps; µs a "
            f"step, best of {args.rounds}; ratio: guard / no guard"
        )
        print(
            f"{'case':<15} {'N':>5} {'fresh':>6} {'build':>9} {'no guard':>9} "
            f"{'ratio':>6} {'by round':>8} {'step':>9} {'no guard':>9} {'ratio':>6}"
        )
    for requests in args.requests:
        low, high = args.prompt
        workload = Workload(requests, args.steps, low, high, args.window, args.seed)
        for case in cases:
            result = compare(case, workload, args.rounds).record()
            if args.json:
                print(json.dumps(result, allow_nan=False))
                continue
            print(
                f"{case.name:<15} {requests:>5} "
                f"{result['fresh_blocks_per_step']:>6.1f} "
                f"{result['build_us']:>9.0f} {result['build_us_no_guard']:>9.0f} "
                f"{result['build_ratio']:>6.2f} {result['build_ratio_by_round']:>8.2f} "
                f"{result['step_us']:>9.0f} {result['step_us_no_guard']:>9.0f} "
                f"{result['step_ratio']:>6.2f}",
                flush=True,
            )
    return 0

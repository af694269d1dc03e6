"""Benchmark: the primary tier manager under the operation stream a scheduler issues.

For every request of a trace, in order: first sight, a lookup of its prefix, a load
of the hit chunks, a store of the rest of its prompt chunks, recency, finish. The
same stream runs through vLLM's own `CPUOffloadingManager` in the same process when
vLLM is installed, and the ratio of time per request is printed (goal: at most
one third of vLLM's). The loads are touched as the connector touches them for an
engine without a prefix cache (the replay's `--device-tokens 0`). LRU's hit
counts differ from vLLM's by a few chunks (39,258 against 39,266 at 5,859
chunks): a load is an access here, so a request's own stores never evict the
prefix it has just loaded, where vLLM's manager refreshes it only at the touch,
after those stores. Against LRU it also prints
the median of the per-round ratios and their quartiles: every round runs every
policy back to back, so a round's ratio cancels most of the load on a shared
machine, and the spread shows how far one run's figure can be trusted.

With `--hints MODE` (`kvoffload replay`'s modes: oracle, session:S, ...) each
policy runs once more with every request carrying the retention hint the mode
derives from the trace, the manager's clock following the trace's arrivals, and
the table adds the per-round ratio to the same policy without hints (the cost of
honouring them: goal at most 1.2x). `--floor` runs the same hints once more
through their bare classes (`hint_floor.BareHints`, nothing learned): what
keeping the classes costs at all.

    python -m kvoffload.bench manager [--trace PATH] [--capacity N ...]
        [--hints MODE [--floor]] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvoffload.bench.hint_floor import BareHints
from kvoffload.keys import OffloadKey, make_offload_key
from kvoffload.policies.retention import RetentionPolicy
from kvoffload.replay.hints import NO_HINTS, HintMode, parse_hint_mode
from kvoffload.replay.mooncake import load_mooncake
from kvoffload.replay.workload import Workload
from kvoffload.tiers.base import ReqContext
from kvoffload.tiers.primary import CPUOffloadingManager

DEFAULT_TRACE = (
    Path(__file__).resolve().parents[4]
    / "shared"
    / "traces"
    / "mooncake_fast25_conversation_trace.jsonl"
)

Stream = list[tuple[str, list[OffloadKey]]]
Hinted = tuple[Sequence[float], Sequence[float | None]]
"""Each request's arrival and retention hint (`kv_retention_s`, `None`: none)."""
VLLM_POLICIES = ("lru", "arc")  # what vLLM's manager offers
HINTED = "+hints"
"""The implementation name of kvoffload's manager with hints on."""
FLOOR = "+floor"
"""The implementation name of the bare classes (`hint_floor.BareHints`)."""


@dataclass(frozen=True)
class Measurement:
    implementation: str
    policy: str
    capacity: int
    requests: int
    chunks: int
    hit_chunks: int
    round_seconds: tuple[float, ...]  # every round, in order

    @property
    def seconds(self) -> float:
        """The best round."""
        return min(self.round_seconds)

    @property
    def us_per_request(self) -> float:
        return self.seconds / self.requests * 1e6

    @property
    def ns_per_chunk(self) -> float:
        return self.seconds / self.chunks * 1e9


def round_ratios(m: Measurement, base: Measurement) -> tuple[float, float, float]:
    """Median and quartiles of `m`'s time over `base`'s, round by round (rounds
    are paired: each ran both)."""
    ratios = [a / b for a, b in zip(m.round_seconds, base.round_seconds, strict=True)]
    if len(ratios) < 2:
        return ratios[0], ratios[0], ratios[0]
    low, median, high = statistics.quantiles(ratios, n=4, method="inclusive")
    return median, low, high


def workload_stream(workload: Workload, chunk_tokens: int) -> Stream:
    """Each request of `workload` as (request id, its prompt chunks' keys)."""
    return [
        (str(i), [make_offload_key(h, 0) for h in chunks])
        for i, chunks in enumerate(workload.chunk_sequence(chunk_tokens))
    ]


def build_stream(
    trace: Path, limit: int | None, hints: HintMode = NO_HINTS
) -> tuple[Stream, Hinted | None]:
    """The trace's stream and, for a hint mode, each request's arrival and hint."""
    workload = load_mooncake(trace, limit=limit)
    per_request = hints.hints(workload)
    hinted = None
    if per_request is not None:
        hinted = ([r.arrival for r in workload.requests], per_request)
    return workload_stream(workload, 512), hinted


def run_ours(
    stream: Stream,
    policy: str,
    capacity: int,
    hinted: Hinted | None = None,
    *,
    collect: bool = True,
    retention: type[RetentionPolicy] = RetentionPolicy,
) -> tuple[int, float]:
    """Hits and seconds of `stream` through kvoffload's manager; with `hinted`,
    each request carries its hint and the clock reads its arrival. `collect`
    runs the garbage collector first, so that no run pays for another's
    garbage (a second or more in a process holding much, such as pytest's).
    `retention`: the class that honours the hints (`BareHints` for the floor)."""
    arrivals: Sequence[float] = [0.0] * len(stream)
    now = [0.0]
    manager = CPUOffloadingManager(
        capacity, policy, clock=lambda: now[0], retention=retention
    )
    if hinted is None:
        contexts = [ReqContext(req_id) for req_id, _ in stream]
    else:
        arrivals, hints = hinted
        contexts = [
            ReqContext.create(req_id, None if h is None else {"kv_retention_s": h})
            for (req_id, _), h in zip(stream, hints, strict=True)
        ]
    hits = 0
    if collect:
        gc.collect()
    start = time.perf_counter()
    for ctx, (_, keys), arrival in zip(contexts, stream, arrivals, strict=True):
        now[0] = arrival
        manager.on_new_request(ctx)
        ready = manager.lookup_prefix(keys, ctx).ready
        if ready:
            loaded = keys[:ready]
            manager.prepare_load(loaded, ctx)
            manager.touch(loaded, ctx)  # the connector's, without a prefix cache
            manager.complete_load(loaded, ctx)
        out = manager.prepare_store(keys[ready:], ctx)
        if out is not None and out.keys_to_store:
            manager.complete_store(out.keys_to_store, ctx)
        manager.touch(keys, ctx)
        manager.on_request_finished(ctx)
        hits += ready
    return hits, time.perf_counter() - start


def vllm_runner() -> Callable[[Stream, str, int], tuple[int, float]] | None:
    """The same stream through vLLM's CPUOffloadingManager, if vLLM is importable."""
    try:
        from vllm.v1.kv_offload.base import LookupResult
        from vllm.v1.kv_offload.base import ReqContext as VReqContext
        from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager as VManager
    except ImportError:
        return None

    def run(stream: Stream, policy: str, capacity: int) -> tuple[int, float]:
        manager: Any = VManager(capacity, cache_policy=policy)
        contexts = [VReqContext(req_id=req_id) for req_id, _ in stream]
        hit = LookupResult.HIT
        hits = 0
        gc.collect()
        start = time.perf_counter()
        for ctx, (_, keys) in zip(contexts, stream, strict=True):
            manager.on_new_request(ctx)
            ready = 0
            for key in keys:
                if manager.lookup(key, ctx) != hit:
                    break
                ready += 1
            if ready:
                loaded = keys[:ready]
                manager.prepare_load(loaded, ctx)
                manager.complete_load(loaded, ctx)
            out = manager.prepare_store(keys[ready:], ctx)
            if out is not None and out.keys_to_store:
                manager.complete_store(out.keys_to_store, ctx)
            manager.touch(keys, ctx)
            manager.on_request_finished(ctx)
            hits += ready
        return hits, time.perf_counter() - start

    return run


def measure(
    stream: Stream,
    policies: Sequence[str],
    capacities: Sequence[int],
    repeat: int,
    hinted: Hinted | None = None,
    floor: bool = False,
) -> list[Measurement]:
    runners: dict[str, Callable[[Stream, str, int], tuple[int, float]]] = {
        "kvoffload": run_ours
    }
    if hinted is not None:
        runners[HINTED] = lambda s, p, c: run_ours(s, p, c, hinted)
        if floor:
            runners[FLOOR] = lambda s, p, c: run_ours(
                s, p, c, hinted, retention=BareHints
            )
    theirs = vllm_runner()
    if theirs is not None:
        runners["vllm"] = theirs
    chunks = sum(len(keys) for _, keys in stream)
    # Every round runs every (policy, implementation) once, so load that drifts
    # during a long run reaches all of them alike; every other round runs them
    # in reverse order, so that none always runs first.
    rounds: dict[tuple[str, str, int], tuple[int, list[float]]] = {}
    for capacity in capacities:
        for r in range(repeat):
            for policy in policies if r % 2 == 0 else list(reversed(policies)):
                for name, runner in runners.items():
                    if name == "vllm" and policy not in VLLM_POLICIES:
                        continue
                    hits, seconds = runner(stream, policy, capacity)
                    rounds.setdefault((name, policy, capacity), (hits, []))[1].append(
                        seconds
                    )
    return [
        Measurement(name, policy, capacity, len(stream), chunks, hits, tuple(times))
        for policy in policies
        for capacity in capacities
        for (name, p, c), (hits, times) in rounds.items()
        if (p, c) == (policy, capacity)
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kvoffload.bench manager", description=__doc__
    )
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument(
        "--policy", action="append", help="policies (default: lru, arc)"
    )
    parser.add_argument("--capacity", type=int, nargs="+", default=[1000, 5859, 50000])
    parser.add_argument("--limit", type=int, help="first N requests only")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--hints",
        type=parse_hint_mode,
        default="none",  # argparse passes a string default through `type`
        metavar="MODE",
        help="also run each policy with the retention hints this mode derives "
        "from the trace (as `kvoffload replay --hints`)",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="with --hints, also run the bare classes (bench/hint_floor.py): "
        "what any implementation of them costs",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not args.trace.exists():
        parser.error(f"trace not found: {args.trace} (pass --trace)")
    if args.floor and args.hints == NO_HINTS:
        parser.error("--floor needs --hints MODE")
    stream, hinted = build_stream(args.trace, args.limit, args.hints)
    results = measure(
        stream,
        args.policy or ["lru", "arc"],
        args.capacity,
        args.repeat,
        hinted,
        args.floor,
    )
    by_key = {(m.implementation, m.policy, m.capacity): m for m in results}

    def unhinted(m: Measurement) -> Measurement | None:
        if m.implementation not in (HINTED, FLOOR):
            return None
        return by_key.get(("kvoffload", m.policy, m.capacity))

    if args.json:
        for m in results:
            theirs = by_key.get(("vllm", m.policy, m.capacity))
            lru = by_key.get((m.implementation, "lru", m.capacity))
            record = {
                "implementation": m.implementation,
                "policy": m.policy,
                "capacity": m.capacity,
                "requests": m.requests,
                "chunks": m.chunks,
                "hit_chunks": m.hit_chunks,
                "us_per_request": m.us_per_request,
                "ns_per_chunk": m.ns_per_chunk,
                "time_vs_vllm": m.seconds / theirs.seconds if theirs else None,
                "time_vs_lru": m.seconds / lru.seconds if lru else None,
                "time_vs_lru_rounds": round_ratios(m, lru) if lru else None,
            }
            plain = unhinted(m)
            if plain is not None:
                record["hints"] = args.hints.label
                record["time_vs_no_hints_rounds"] = round_ratios(m, plain)
            print(json.dumps(record, allow_nan=False))
        return 0
    print(
        f"{len(stream):,} requests, {results[0].chunks:,} chunks; best of {args.repeat}"
        "; 'by round': median [quartiles] of the per-round ratio to LRU"
    )
    print(
        f"{'impl':<10} {'policy':<8} {'capacity':>9} {'hits':>8} {'us/request':>11} "
        f"{'ns/chunk':>9} {'vs vLLM':>8} {'vs LRU':>7} {'by round':>18}"
    )
    for m in results:
        theirs = by_key.get(("vllm", m.policy, m.capacity))
        lru = by_key.get((m.implementation, "lru", m.capacity))
        ratio = f"{m.seconds / theirs.seconds:.2f}x" if theirs else "-"
        vs_lru = f"{m.seconds / lru.seconds:.2f}x" if lru else "-"
        by_round = "-"
        if lru and lru is not m:
            median, low, high = round_ratios(m, lru)
            by_round = f"{median:.2f}x [{low:.2f}-{high:.2f}]"
        plain = unhinted(m)
        if plain is not None:
            median, low, high = round_ratios(m, plain)
            by_round += f"  vs no hints {median:.2f}x [{low:.2f}-{high:.2f}]"
        print(
            f"{m.implementation:<10} {m.policy:<8} {m.capacity:>9,} {m.hit_chunks:>8,} "
            f"{m.us_per_request:>11.1f} {m.ns_per_chunk:>9.0f} {ratio:>8} {vs_lru:>7} "
            f"{by_round:>18}"
        )
    if hinted is not None:
        print(f"{HINTED}: kvoffload with retention hints {args.hints.label}")
    if args.floor:
        print(
            f"{FLOOR}: the same hints through their bare classes, nothing learned "
            "(bench/hint_floor.py): a floor, not the product"
        )
    if "vllm" not in {m.implementation for m in results}:
        print("vLLM is not installed: no comparison")
    return 0

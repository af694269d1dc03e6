"""Benchmark: conversations taking turns under a small host tier, in the engine
model, kvoffload's policies against vLLM's own connector.

The turns of `python -m kvoffload.bench vllm` (`kvoffload.replay.chat_rounds`)
run through the engine model with kvoffload's connector, and through vLLM's
`CPUOffloadingManager` driven in the order its OffloadingConnector drives it (when
vLLM is installed): one request at a time; lookup past the device's prefix hit;
a load with no recency; stores from the first chunk past the hit when something
was loaded, else from chunk 0 (it stores again the head the device still holds);
recency refreshed in `on_request_finished`, which the connector calls in the
next request's first step, after that step's stores when it loads nothing.
That order reproduces real vLLM's figures of issue 22 (2,944 later-turn tokens
with LRU at 20 chunks). Prints later-turn hit tokens per host size and, with
vLLM, the points where a kvoffload policy gets fewer than vLLM's same policy
(`split`: fewer than the better of vLLM's two). `--order` may be given more than
once, and `random:A-B` runs every seed from A to B: the totals then cover every
order, which is how an interleaving the fixed sweep lacks shows up. `--grid N`
runs N round-robin configurations of the sizes the peer tool takes instead
(`rounds_grid.py`), each at ten host sizes.

    python -m kvoffload.bench rounds [--order ORDER ...] [--system-tokens N]
        [--conversations N] [--turns N] [--first-tokens N] [--message-tokens N]
        [--answer-tokens N] [--device-blocks N] [--chunks N ...] [--json]
        [--grid N [--grid-seed S]]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from typing import Any

from kvoffload.bench.rounds_grid import ANSWER_TOKENS, grid_cases
from kvoffload.engine_model import BlockPool
from kvoffload.replay.chat_rounds import ChatRounds, Turn, run_chat_rounds, turn_order

DEFAULT_CHUNKS = (4, 7, 10, 14, 18, 20, 24, 28, 32, 36)
DEVICE_BLOCKS = 16


def vllm_rounds() -> Callable[[Sequence[Turn], str, int, int, int], int] | None:
    """Later-turn hit tokens of vLLM's connector order, or None without vLLM."""
    try:
        from vllm.v1.kv_offload.base import ReqContext, make_offload_key
        from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
    except ImportError:
        return None

    def run(
        turns: Sequence[Turn], policy: str, chunks: int, block: int, device_blocks: int
    ) -> int:
        manager: Any = CPUOffloadingManager(chunks, cache_policy=policy)
        device = BlockPool(device_blocks)
        device.release(device.allocate(1) or [])  # the bench's warm-up request
        unfinished: Any = None
        hits = 0
        for i, turn in enumerate(turns):
            ctx = ReqContext(req_id=str(i))
            full = turn.prompt_tokens // block
            keys = [make_offload_key(h, 0) for h in turn.hashes[:full]]
            for position, key in enumerate(keys, 1):
                ctx.set_offload_key_position(key, position * block)
            manager.on_new_request(ctx)
            cached = device.cached_prefix(turn.hashes[:full])
            local = min(len(cached), (turn.prompt_tokens - 1) // block)
            found = 0
            if full - local >= 1:
                for key in keys[local:]:
                    if manager.lookup(key, ctx).name != "HIT":
                        break
                    found += 1
            device.acquire(cached[:local])
            blocks = -(-(turn.prompt_tokens + turn.answer_tokens) // block)
            table = cached[:local] + (device.allocate(blocks - local) or [])
            if found:
                loaded = keys[local : local + found]
                manager.prepare_load(loaded, ctx)
                if unfinished is not None:  # its load takes a step of its own
                    manager.on_request_finished(unfinished)
                    unfinished = None
                manager.complete_load(loaded, ctx)
            out = manager.prepare_store(keys[local + found if found else 0 :], ctx)
            if out is not None and out.keys_to_store:
                manager.complete_store(out.keys_to_store, ctx)
            if unfinished is not None:
                manager.on_request_finished(unfinished)
            for j in range(min(len(table), len(turn.hashes))):
                device.register(table[j], turn.hashes[j])
            device.release(table)
            unfinished = ctx
            if turn.turn > 0:
                hits += found * block
        return hits

    return run


def below_vllm(rows: dict[str, list[int]]) -> dict[str, list[int]]:
    """Per kvoffload policy, the indices of the host sizes where it gets fewer
    later-turn tokens than vLLM: LRU and ARC against vLLM's same policy, `split`
    against the better of the two (empty without vLLM's rows)."""
    if "vLLM lru" not in rows:
        return {}
    best = [max(a, b) for a, b in zip(rows["vLLM lru"], rows["vLLM arc"], strict=True)]
    peers = {"lru": rows["vLLM lru"], "arc": rows["vLLM arc"], "split": best}
    return {
        policy: [
            i
            for i, (ours, theirs) in enumerate(
                zip(rows[f"kvoffload {policy}"], peer, strict=True)
            )
            if ours < theirs
        ]
        for policy, peer in peers.items()
    }


def expand_orders(orders: list[str]) -> list[str]:
    """`random:A-B` as every seed from A to B; other orders as given
    (`ValueError` naming a bad range)."""
    out: list[str] = []
    for order in orders:
        kind, _, arg = order.partition(":")
        first, dash, last = arg.partition("-")
        if kind == "random" and dash:
            if not (first.isdigit() and last.isdigit() and int(first) <= int(last)):
                raise ValueError(f"order: {order!r} is not random:A-B with A <= B")
            out += [f"random:{seed}" for seed in range(int(first), int(last) + 1)]
        else:
            out.append(order)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m kvoffload.bench rounds", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--order", action="append", default=None)
    parser.add_argument("--system-tokens", type=int, default=0)
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--first-tokens", type=int, default=768)
    parser.add_argument("--message-tokens", type=int, default=96)
    parser.add_argument("--answer-tokens", type=int, default=16)
    parser.add_argument("--device-blocks", type=int, default=DEVICE_BLOCKS)
    parser.add_argument("--chunks", type=int, nargs="+", default=list(DEFAULT_CHUNKS))
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--grid",
        type=int,
        default=0,
        help="run N round-robin configurations of the sizes peer_vllm takes "
        "(rounds_grid.py) instead of the sizes and orders given",
    )
    parser.add_argument("--grid-seed", type=int, default=7)
    args = parser.parse_args(argv)
    if args.grid < 0:
        parser.error(f"--grid: {args.grid} must be >= 0")
    if args.grid:
        try:
            grid_cases(args.grid, args.grid_seed, args.answer_tokens)
        except ValueError as exc:
            parser.error(str(exc))
    try:
        args.order = expand_orders(args.order or ["round-robin"])
        for order in args.order:
            turn_order(1, 1, order)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def run_order(
    args: argparse.Namespace,
    order: str,
    native: Callable[[Sequence[Turn], str, int, int, int], int] | None,
) -> dict[str, list[int]]:
    """Later-turn hit tokens per host size of every kvoffload policy and, with
    `native` (`vllm_rounds`), of vLLM's connector, for one turn order."""
    rounds = ChatRounds(
        conversations=args.conversations,
        turns=args.turns,
        first_tokens=args.first_tokens,
        message_tokens=args.message_tokens,
        answer_tokens=args.answer_tokens,
        system_tokens=args.system_tokens,
        order=order,
    )
    turns = rounds.requests()
    rows: dict[str, list[int]] = {}
    for policy in ("lru", "arc", "split"):
        rows[f"kvoffload {policy}"] = [
            run_chat_rounds(
                rounds, policy, n, args.device_blocks, turns
            ).later_hit_tokens
            for n in args.chunks
        ]
    if native is not None:
        for policy in ("lru", "arc"):
            rows[f"vLLM {policy}"] = [
                native(turns, policy, n, rounds.block_tokens, args.device_blocks)
                for n in args.chunks
            ]
    return rows


def cases(args: argparse.Namespace) -> list[tuple[str, argparse.Namespace, str]]:
    """(label, sizes, order) of each run: every order at the given sizes, or the
    `--grid` configurations in round-robin order."""
    if not args.grid:
        return [(order, args, order) for order in args.order]
    out = []
    for case in grid_cases(args.grid, args.grid_seed, args.answer_tokens):
        sizes = argparse.Namespace(**vars(args))
        for name in ("conversations", "turns", "first_tokens", "message_tokens"):
            setattr(sizes, name, getattr(case, name))
        sizes.device_blocks = case.device_blocks
        sizes.chunks = list(case.chunks)
        label = case.label()
        if args.answer_tokens != ANSWER_TOKENS:
            label += f" --answer-tokens {args.answer_tokens}"
        out.append((label, sizes, "round-robin"))
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runs = cases(args)
    native = vllm_rounds()  # vLLM is imported once, whatever the number of orders
    totals: dict[str, int] = {}
    below: dict[str, int] = {}
    points = 0
    for label, sizes, order in runs:
        rows = run_order(sizes, order, native)
        points += len(sizes.chunks)
        for name, values in rows.items():
            totals[name] = totals.get(name, 0) + sum(values)
        for policy, where in below_vllm(rows).items():
            below[policy] = below.get(policy, 0) + len(where)
        if args.json:
            record: dict[str, Any] = {"order": order, "chunks": sizes.chunks}
            if args.grid:
                record["sizes"] = label
            print(json.dumps({**record, "later_turn_hit_tokens": rows}))
            continue
        print(f"order {label}")
        print(
            f"{'host chunks':<15}"
            + "".join(f"{n:>8}" for n in sizes.chunks)
            + "     sum"
        )
        for name, values in rows.items():
            print(
                f"{name:<15}" + "".join(f"{v:>8}" for v in values) + f"{sum(values):>8}"
            )
    summary = {"orders": len(runs), "points": points, "below_vllm": below}
    if args.json:
        print(json.dumps({**summary, "sums": totals}))
    elif below:
        shown = ", ".join(f"{p} {n}" for p, n in below.items())
        print(f"points below vLLM, of {points} per policy: {shown}")
        print("sums: " + ", ".join(f"{k} {v}" for k, v in totals.items()))
    return 0

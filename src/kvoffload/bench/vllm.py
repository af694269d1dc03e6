"""Benchmark: time to first token of a multi-turn chat in real vLLM, with and without kvoffload.

Several conversations run interleaved on a locally built model, with a device KV
cache too small to keep a conversation's previous turn until its next one. The
same turns run with no connector, with kvoffload's host tier, and with host memory
plus a file tier; TTFT is reported for first turns (nothing to reuse) and later
turns (the conversation so far was offloaded), and every answer is compared
(exit status 1 if any differs from the no-connector run's).

With `--peer`, the configurations are kvoffload's host tier under LRU, ARC and
`split` and vLLM's own OffloadingConnector under LRU and ARC, on the same host
bytes (`kvoffload.bench.vllm_native` runs vLLM's scheduler side with a torch copy
worker on the CPU platform); the table adds the tokens later turns loaded, the
chunks stored and later turns' TTFT relative to no connector.

    python -m kvoffload.bench vllm [--json] [--peer] [--conversations N] ...
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kvoffload.bench.chat_workload import (
    ChatWorkload,
    Conversation,
    Tokenizer,
    interleaved,
    make_conversations,
)
from kvoffload.config import parse_size
from kvoffload.integrations.vllm.model_builder import (
    BENCH,
    TINY,
    BuiltModel,
    ModelSpec,
    build_model,
)

MODELS = {"bench": BENCH, "tiny": TINY}
BLOCK_TOKENS = 128  # vLLM's default block size on CPU
CONFIGS = ("none", "kvoffload-host", "kvoffload-host+file")
PEER_CONFIGS = (
    "none",
    "kvoffload-lru",
    "kvoffload-arc",
    "kvoffload-split",
    "native-lru",
    "native-arc",
)
TTFT_METHOD = (
    "TTFT is vLLM's own per-request measure, RequestOutput.metrics."
    "first_token_latency (the value behind vllm:time_to_first_token_seconds): from "
    "the request's arrival to the step that produced its first token, so it "
    "includes waiting for kvoffload's asynchronous load and the prefill of the "
    "rest; it equals the wall time of a max_tokens=1 generate() within "
    "milliseconds. Turns run one request at a time, so no other request's "
    "prefill or decode is inside it. Columns: prompt and cached tokens are means "
    "over later turns (cached = RequestOutput.num_cached_tokens: the device "
    "prefix-cache hit plus what kvoffload loaded); loaded tokens is kvoffload's "
    "total (vllm:kvoffload_hit_tokens); total s is the wall time of all turns."
)


@dataclass(frozen=True)
class TurnRecord:
    conversation: int
    turn: int
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float
    output: tuple[int, ...]
    external_tokens: int = 0
    """Tokens the connector supplied (vLLM's external prefix-cache hits)."""


@dataclass
class ConfigRun:
    name: str
    records: list[TurnRecord] = field(default_factory=list)
    seconds: float = 0.0
    startup_s: float = 0.0
    loaded_tokens: int = 0
    chunks_loaded: dict[str, int] = field(default_factory=dict)
    chunks_stored: int = 0


def page_bytes(spec: ModelSpec) -> int:
    """Bytes of one engine block across all layers (K and V)."""
    itemsize = 4 if spec.dtype == "float32" else 2
    per_token = 2 * spec.num_key_value_heads * spec.head_dim * itemsize
    return spec.num_hidden_layers * BLOCK_TOKENS * per_token


def kv_transfer_config(
    name: str, args: argparse.Namespace, page: int, file_dir: str
) -> dict[str, Any] | None:
    if name == "none":
        return None
    kind, _, policy = name.partition("-")
    if kind == "native":
        return {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "spec_name": "HostCopySpec",
                "spec_module_path": "kvoffload.bench.vllm_native",
                "cpu_bytes_to_use": parse_size(args.host_bytes, "--host-bytes"),
                "eviction_policy": policy,
            },
        }
    extra: dict[str, Any] = {"cpu_bytes_to_use": args.host_bytes}
    if policy in ("lru", "arc", "split"):
        extra["eviction_policy"] = policy
    if name == "kvoffload-host+file":
        extra["cpu_bytes_to_use"] = args.tiered_host_chunks * page
        extra["secondary_tiers"] = [
            {"type": "file", "path": file_dir, "capacity": args.file_capacity}
        ]
    return {
        "kv_connector": "KVOffloadConnector",
        "kv_connector_module_path": "kvoffload.integrations.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra,
    }


def _counter(llm: Any, name: str) -> float:
    """A vLLM counter's value, summed over its labels."""
    return sum(float(m.value) for m in llm.get_metrics() if m.name == name)


def _metric_totals(llm: Any, name: str) -> dict[str, int]:
    """A kvoffload counter's value per `tier` label."""
    totals: dict[str, int] = {}
    for metric in llm.get_metrics():
        if metric.name == name:
            tier = str(metric.labels.get("tier"))
            totals[tier] = totals.get(tier, 0) + int(metric.value)
    return totals


def start_engine(
    name: str, model: BuiltModel, args: argparse.Namespace, file_dir: str
) -> Any:
    """A fresh `vllm.LLM` whose device cache holds `--device-blocks` blocks."""
    from vllm import LLM

    page = page_bytes(model.spec)
    options: dict[str, Any] = {
        **model.vllm_args(),
        "enforce_eager": True,
        "block_size": BLOCK_TOKENS,
        "max_model_len": args.device_blocks * BLOCK_TOKENS,
        "max_num_batched_tokens": args.device_blocks * BLOCK_TOKENS,
        "kv_cache_memory_bytes": (args.device_blocks + 1) * page,  # + the null block
        "disable_log_stats": False,  # RequestOutput.metrics, the connector's stats
        "seed": 0,
        "kv_transfer_config": kv_transfer_config(name, args, page, file_dir),
    }
    return LLM(**options)


def run_turn(llm: Any, conversation: Conversation, sampling: Any) -> TurnRecord:
    """The conversation's next turn, alone in the engine."""
    from vllm.inputs import TokensPrompt

    prompt = conversation.next_prompt()
    external = _counter(llm, "vllm:external_prefix_cache_hits")
    out = llm.generate(
        [TokensPrompt(prompt_token_ids=prompt)], sampling, use_tqdm=False
    )[0]
    external = _counter(llm, "vllm:external_prefix_cache_hits") - external
    if out.metrics is None:
        raise RuntimeError("vLLM returned no request metrics (disable_log_stats?)")
    answer = tuple(int(t) for t in out.outputs[0].token_ids)
    record = TurnRecord(
        conversation.index,
        conversation.turn,
        len(prompt),
        int(out.num_cached_tokens or 0),
        float(out.metrics.first_token_latency),
        answer,
        int(external),
    )
    conversation.record_answer(prompt, list(answer))
    return record


def run_config(
    name: str,
    model: BuiltModel,
    workload: ChatWorkload,
    args: argparse.Namespace,
    file_dir: str,
) -> ConfigRun:
    """All turns of the workload, interleaved, through one fresh engine."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    start = time.perf_counter()
    llm = start_engine(name, model, args, file_dir)
    run = ConfigRun(name)
    try:
        tokenizer = Tokenizer(model.path)
        sampling = SamplingParams(
            temperature=0, max_tokens=workload.answer_tokens, ignore_eos=True
        )
        warm_up = tokenizer.bos + tokenizer.encode("warm up " * 50)[:64]
        llm.generate([TokensPrompt(prompt_token_ids=warm_up)], sampling, use_tqdm=False)
        run.startup_s = time.perf_counter() - start
        conversations = make_conversations(workload, tokenizer)
        begin = time.perf_counter()
        for conversation in interleaved(conversations, workload.turns, workload.order):
            run.records.append(run_turn(llm, conversation, sampling))
        run.seconds = time.perf_counter() - begin
        run.loaded_tokens = _metric_totals(llm, "vllm:kvoffload_hit_tokens").get(
            "connector", 0
        )
        loaded = _metric_totals(llm, "vllm:kvoffload_chunks_loaded")
        run.chunks_loaded = {t: n for t, n in loaded.items() if t != "connector"}
        run.chunks_stored = _chunks_stored(llm, name, page_bytes(model.spec))
    finally:
        llm.llm_engine.engine_core.shutdown()
    return run


def _chunks_stored(llm: Any, name: str, page: int) -> int:
    """Chunks the host tier stored: kvoffload counts them; vLLM's connector counts
    bytes (its chunks are one block here)."""
    if name.startswith("native"):
        return int(_counter(llm, "vllm:kv_offload_store_bytes")) // page
    return _metric_totals(llm, "vllm:kvoffload_chunks_stored").get("cpu", 0)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _p90(values: Sequence[float]) -> float:
    """Linear-interpolated 90th percentile."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = 0.9 * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def summarize(run: ConfigRun, reference: ConfigRun) -> dict[str, Any]:
    first = [r.ttft_s for r in run.records if r.turn == 0]
    later = [r.ttft_s for r in run.records if r.turn > 0]
    base_later = _mean([r.ttft_s for r in reference.records if r.turn > 0])
    expected = {(r.conversation, r.turn): r.output for r in reference.records}
    same = sum(expected.get((r.conversation, r.turn)) == r.output for r in run.records)
    return {
        "config": run.name,
        "turns": len(run.records),
        "first_turn_ttft_mean_s": round(_mean(first), 4),
        "first_turn_ttft_p90_s": round(_p90(first), 4),
        "later_turns_ttft_mean_s": round(_mean(later), 4),
        "later_turns_ttft_p90_s": round(_p90(later), 4),
        "later_turns_speedup": round(base_later / _mean(later), 2) if later else None,
        "later_turns_prompt_tokens_mean": round(
            _mean([r.prompt_tokens for r in run.records if r.turn > 0]), 1
        ),
        "later_turns_cached_tokens_mean": round(
            _mean([r.cached_tokens for r in run.records if r.turn > 0]), 1
        ),
        "loaded_tokens": run.loaded_tokens,
        "later_turns_hit_tokens": sum(
            r.external_tokens for r in run.records if r.turn > 0
        ),
        "later_turns_ttft_ratio": round(_mean(later) / base_later, 3)
        if later
        else None,
        "chunks_stored": run.chunks_stored,
        "chunks_loaded": run.chunks_loaded,
        "total_s": round(run.seconds, 2),
        "startup_s": round(run.startup_s, 2),
        "outputs_identical": same == len(run.records) == len(reference.records),
        "identical_turns": same,
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'config':<21} {'first turn TTFT s':>17} {'later turns TTFT s':>18} "
        f"{'later':>7} {'prompt':>7} {'cached':>7} {'loaded':>7} {'total':>7}  outputs"
    )
    print(
        f"{'':<21} {'mean':>8} {'p90':>8} {'mean':>9} {'p90':>8} {'speedup':>7} "
        f"{'tokens':>7} {'tokens':>7} {'tokens':>7} {'s':>7}"
    )
    for row in rows:
        same = "identical" if row["outputs_identical"] else "DIFFERENT"
        print(
            f"{row['config']:<21} {row['first_turn_ttft_mean_s']:>8.3f} "
            f"{row['first_turn_ttft_p90_s']:>8.3f} {row['later_turns_ttft_mean_s']:>9.3f} "
            f"{row['later_turns_ttft_p90_s']:>8.3f} {row['later_turns_speedup']:>6.2f}x "
            f"{row['later_turns_prompt_tokens_mean']:>7.0f} "
            f"{row['later_turns_cached_tokens_mean']:>7.0f} {row['loaded_tokens']:>7} "
            f"{row['total_s']:>7.1f}  {same} ({row['identical_turns']}/{row['turns']})"
        )


def print_peer_table(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'config':<16} {'later-turn hit tokens':>21} {'chunks stored':>13} "
        f"{'later-turn TTFT / none':>22}  outputs"
    )
    for row in rows:
        same = "identical" if row["outputs_identical"] else "DIFFERENT"
        print(
            f"{row['config']:<16} {row['later_turns_hit_tokens']:>21,} "
            f"{row['chunks_stored']:>13} {row['later_turns_ttft_ratio']:>22.2f}  "
            f"{same} ({row['identical_turns']}/{row['turns']})"
        )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m kvoffload.bench vllm", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--json", action="store_true", help="one JSON object per config"
    )
    parser.add_argument("--model", choices=sorted(MODELS), default="bench")
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--first-tokens", type=int, default=1536, help="first message")
    parser.add_argument("--message-tokens", type=int, default=96, help="later messages")
    parser.add_argument("--answer-tokens", type=int, default=16, help="max_tokens")
    parser.add_argument(
        "--system-tokens",
        type=int,
        default=0,
        help="a system prompt every conversation starts with",
    )
    parser.add_argument(
        "--order",
        default="round-robin",
        help="turn order: round-robin, bursts:K or random:SEED",
    )
    parser.add_argument(
        "--peer",
        action="store_true",
        help="kvoffload (LRU, ARC, split) against vLLM's own OffloadingConnector",
    )
    parser.add_argument(
        "--device-blocks",
        type=int,
        default=16,
        help="device KV cache, 128-token blocks",
    )
    parser.add_argument("--host-bytes", default="2GiB", help="host tier (host config)")
    parser.add_argument(
        "--tiered-host-chunks",
        type=int,
        default=16,
        help="host tier in chunks for the host+file config (small: the file tier serves)",
    )
    parser.add_argument(
        "--file-dir",
        help="file tier directory (default: a temp dir); chunks already there are reused",
    )
    parser.add_argument("--file-capacity", default="4GiB")
    return parser.parse_args(argv)


def workload_from(args: argparse.Namespace) -> ChatWorkload:
    """The workload the options describe; `ValueError` if they do not fit."""
    workload = ChatWorkload(
        args.conversations,
        args.turns,
        args.first_tokens,
        args.message_tokens,
        args.answer_tokens,
        system_tokens=args.system_tokens,
        order=args.order,
    )
    parse_size(args.host_bytes, "--host-bytes")
    parse_size(args.file_capacity, "--file-capacity")
    if args.turns < 2 or args.tiered_host_chunks < 1 or args.device_blocks < 1:
        raise ValueError(
            "--turns must be >= 2, --tiered-host-chunks and --device-blocks >= 1"
        )
    if workload.max_context_tokens() > args.device_blocks * BLOCK_TOKENS:
        raise ValueError(
            f"a conversation reaches about {workload.max_context_tokens()} tokens; "
            f"--device-blocks {args.device_blocks} holds "
            f"{args.device_blocks * BLOCK_TOKENS}"
        )
    return workload


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        workload = workload_from(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # In-process engine core, vLLM's logs on stderr: stdout carries only results.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    import vllm

    model = build_model(MODELS[args.model])
    load = os.getloadavg()[0]
    started = time.perf_counter()
    if not args.json:
        print_header(args, model, workload, vllm.__version__, load)
    with tempfile.TemporaryDirectory(prefix="kvoffload-bench-vllm-") as tmp:
        file_dir = args.file_dir or tmp
        configs = PEER_CONFIGS if args.peer else CONFIGS
        runs = [run_config(name, model, workload, args, file_dir) for name in configs]
    rows = [summarize(run, runs[0]) for run in runs]
    context = {
        "model": model.spec.name,
        "workload": asdict(workload),
        "device_blocks": args.device_blocks,
    }
    if args.json:
        for row in rows:
            print(json.dumps({**row, **context, "load_average": load}, allow_nan=False))
    elif args.peer:
        print_peer_table(rows)
    else:
        print_table(rows)
        for row in rows[1:]:
            print(f"{row['config']}: chunks loaded per tier {row['chunks_loaded']}")
        print(
            f"load average {load:.2f} at start, {os.getloadavg()[0]:.2f} at end; "
            f"runtime {time.perf_counter() - started:.0f} s"
        )
    return 0 if all(row["outputs_identical"] for row in rows) else 1


def print_header(
    args: argparse.Namespace,
    model: BuiltModel,
    workload: ChatWorkload,
    version: str,
    load: float,
) -> None:
    import torch
    from vllm.platforms import current_platform

    platform = current_platform.device_type
    spec = model.spec
    print(
        f"vLLM {version} ({platform}), torch {torch.__version__}; model {spec.name} "
        f"(hidden {spec.hidden_size}, {spec.num_hidden_layers} layers, {spec.dtype}); "
        f"{os.cpu_count()} CPUs, load average {load:.2f}"
    )
    print(
        f"{workload.conversations} conversations x {workload.turns} turns, "
        f"interleaved; first message {workload.first_message_tokens} tokens, later "
        f"messages {workload.message_tokens}, answers {workload.answer_tokens} "
        "(greedy, ignore_eos); each prompt is the whole conversation so far"
    )
    page = page_bytes(spec)
    print(
        f"device KV cache {args.device_blocks} blocks of {BLOCK_TOKENS} tokens "
        f"({args.device_blocks * page >> 20} MiB); host tier {args.host_bytes}; "
        f"host+file: host {args.tiered_host_chunks} chunks "
        f"({args.tiered_host_chunks * page >> 20} MiB) and a file tier of "
        f"{args.file_capacity} in {args.file_dir or 'a temp dir'}"
    )
    print(TTFT_METHOD)
    print()

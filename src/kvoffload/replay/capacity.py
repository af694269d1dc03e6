"""Host tier capacities of `kvoffload replay`: in chunks, in tokens or in bytes,
and the model shapes that turn bytes into chunks.

A chunk is `--chunk-tokens` tokens of KV cache. One token's KV is every layer's
key and value: 2 x layers x KV heads x head dim x bytes per value. A capacity in
bytes (`--capacity 16GiB`) holds as many whole chunks as fit, at the per-token
size of `--kv-bytes-per-token`, of `--model`'s shape, or else of the time
model's default (131,072 bytes: an 8B model such as Llama 3.1 8B in bf16).
"""

from __future__ import annotations

import argparse
import difflib
from dataclasses import dataclass

from kvoffload.config.sizes import format_size
from kvoffload.engine_model import TimeModel
from kvoffload.replay import limits
from kvoffload.replay.cli_types import AtLeastOne, int_in, size_in
from kvoffload.replay.workload import Workload


@dataclass(frozen=True)
class ModelShape:
    """What sizes a model's KV cache: from its `config.json`, `num_hidden_layers`,
    `num_key_value_heads` and `head_dim` (or `hidden_size` over
    `num_attention_heads`); `dtype_bytes` 2 for bf16 or fp16."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


MODEL_SHAPES: dict[str, ModelShape] = {
    "llama-3.2-1b": ModelShape(16, 8, 64),
    "llama-3.2-3b": ModelShape(28, 8, 128),
    "llama-3.1-8b": ModelShape(32, 8, 128),
    "llama-3.1-70b": ModelShape(80, 8, 128),
    "llama-3.1-405b": ModelShape(126, 8, 128),
    "mistral-7b": ModelShape(32, 8, 128),
    "qwen2.5-7b": ModelShape(28, 4, 128),
    "qwen2.5-72b": ModelShape(80, 8, 128),
    "qwen3-8b": ModelShape(36, 8, 128),
    "qwen3-32b": ModelShape(64, 8, 128),
}
"""Common models with a plain KV cache in bf16 (models with latent attention or
another KV dtype: give `--kv-bytes-per-token`)."""


def model_shape(text: str) -> str:
    """An argparse type: a name of `MODEL_SHAPES` (any case)."""
    name = text.strip().lower()
    if name in MODEL_SHAPES:
        return name
    close = difflib.get_close_matches(name, MODEL_SHAPES, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise argparse.ArgumentTypeError(
        f"{text[:40]!r} is not a known model shape; {hint}expected one of "
        f"{', '.join(MODEL_SHAPES)}, or give --kv-bytes-per-token"
    )


def add_capacity_arguments(parser: argparse.ArgumentParser) -> None:
    """--capacity-chunks, --capacity-tokens or --capacity (one of them), --model."""
    capacity = parser.add_mutually_exclusive_group()
    capacity.add_argument(
        "--capacity-chunks",
        type=int_in(1, limits.MAX_CAPACITY_CHUNKS),
        nargs="+",
        action=AtLeastOne,
        metavar="N",
        help="host tier capacities in chunks (default: 2%%, 5%%, 10%%, 20%% and "
        "40%% of the workload's distinct chunks)",
    )
    capacity.add_argument(
        "--capacity-tokens",
        type=int_in(1, limits.MAX_CAPACITY_TOKENS),
        nargs="+",
        action=AtLeastOne,
        metavar="N",
        help="host tier capacities in tokens, each rounded down to whole chunks "
        "(default: as --capacity-chunks)",
    )
    capacity.add_argument(
        "--capacity",
        type=size_in(1, limits.MAX_CAPACITY_BYTES),
        nargs="+",
        action=AtLeastOne,
        metavar="SIZE",
        help="host tier capacities in bytes, such as 16GiB or 512MB: each holds "
        "SIZE // (chunk tokens x KV bytes per token) chunks, the KV bytes per "
        "token from --kv-bytes-per-token or --model (default: as "
        "--capacity-chunks)",
    )
    parser.add_argument(
        "--model",
        type=model_shape,
        metavar="NAME",
        help="size the KV cache as this model's, in bf16: "
        f"{', '.join(MODEL_SHAPES)} (default: --kv-bytes-per-token)",
    )


def kv_bytes_per_token(args: argparse.Namespace) -> int | None:
    """The per-token KV size the options give, if they give one."""
    if args.model is not None:
        return MODEL_SHAPES[args.model].kv_bytes_per_token
    value: int | None = args.kv_bytes_per_token
    return value


def capacities(
    args: argparse.Namespace, workload: Workload, chunk: int, tm: TimeModel
) -> list[int]:
    """The host tier capacities to replay, in chunks of `chunk` tokens, each once,
    smallest first; ValueError for a size that holds no chunk or too many."""
    if args.capacity_chunks:
        return sorted(set(args.capacity_chunks))
    if args.capacity_tokens:
        return sorted({max(1, t // chunk) for t in args.capacity_tokens})
    if args.capacity:
        return sorted({_chunks_in(size, chunk, tm) for size in args.capacity})
    distinct = len({h for reqs in workload.chunk_sequence(chunk) for h in reqs})
    return sorted({max(1, int(distinct * f)) for f in (0.02, 0.05, 0.1, 0.2, 0.4)})


def _chunks_in(size: int, chunk: int, tm: TimeModel) -> int:
    chunk_bytes = chunk * tm.kv_bytes_per_token
    chunks = size // chunk_bytes
    what = (
        f"--capacity {format_size(size).replace(' ', '')}: a chunk is {chunk:,} "
        f"tokens of {tm.kv_bytes_per_token:,} bytes, {format_size(chunk_bytes)}"
    )
    if chunks < 1:
        raise ValueError(f"{what}; give at least that much")
    if chunks > limits.MAX_CAPACITY_CHUNKS:
        raise ValueError(
            f"{what}, and {chunks:,} of them are more than "
            f"{limits.MAX_CAPACITY_CHUNKS:,} chunks"
        )
    return chunks

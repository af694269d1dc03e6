"""Configuration of the scheduler-side connector, validated once at the edge."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvoffload.config import finite_seconds, is_count, shown

DEFAULT_MAX_DEFER_S = 10.0
"""Long enough for a local disk or a Redis server to return a long prefix (100
chunks of 64 MiB are 6.7 GB: 1.3 s at 5 GB/s, 2.7 s at 2.5 GB/s, longer behind
other requests' reads), which is faster than recomputing it; short enough that a
stalled tier costs a request seconds, not minutes. Measured on the bundled trace
(docs/fleet.md): with 1 s a disk behind host memory gave 0.196 of prompt chunks
where it gives 0.217 with time to wait, and a shared Redis tier 0.107 against
0.217."""


def is_valid_max_defer_s(value: object) -> bool:
    """A finite number of seconds >= 0, not a bool: NaN never compares, and inf
    would let a deferral last forever (SPEC: it never lasts beyond a bound)."""
    seconds = finite_seconds(value)
    return seconds is not None and seconds >= 0


@dataclass(frozen=True)
class GroupSpec:
    """One KV-cache group as the connector sees it.

    `tokens_per_block` is the engine block size of the group; a chunk of the group
    spans `blocks_per_chunk` engine blocks. A group that is not `offloaded` is
    served by the engine alone, so no prefix beyond the engine's own hit can be
    loaded for any group.
    """

    tokens_per_block: int
    blocks_per_chunk: int = 1
    offloaded: bool = True

    def __post_init__(self) -> None:
        for name in ("tokens_per_block", "blocks_per_chunk"):
            value = getattr(self, name)
            if not is_count(value, 1):
                raise ValueError(
                    f"{name} must be an int >= 1 (up to 2**63 - 1), got {shown(value)}"
                )
        if not isinstance(self.offloaded, bool):
            raise ValueError(
                f"offloaded must be true or false, got {shown(self.offloaded)}"
            )

    @property
    def tokens_per_chunk(self) -> int:
        return self.tokens_per_block * self.blocks_per_chunk


@dataclass(frozen=True)
class ConnectorConfig:
    """Settings of `OffloadConnector`.

    - `groups`: the KV-cache groups, in the engine's group order.
    - `hash_block_tokens`: tokens per entry of a request's `block_hashes` (the
      engine's hash granularity); every group's block size must be a multiple.
      Defaults to the smallest group block size.
    - `offload_prompt_only`: store only chunks inside the prompt (default true).
    - `max_defer_s`: the longest a request's lookup may be deferred while chunks
      it could load are still in flight, in all, from its first deferral until it
      is admitted; after that it proceeds with what is readable (`0`: never
      deferred).
    - `world_size`: worker ranks that report each job; a job completes when all
      have reported, and succeeds only if all succeeded.
    - `engine_prefix_caching`: the engine keeps loaded blocks in its own prefix
      cache for other requests (vLLM does). Then a request whose prefix another
      request is loading waits for that load instead of loading it again, and a
      request's chunks count as used in the tiers once the engine lets go of its
      blocks (`connector/releases.py`), not when loaded or computed.
    - `null_block_id`: an engine block id that holds no data (vLLM's block 0,
      which sliding-window groups use for blocks outside the window). Nothing is
      stored from it or loaded into it.
    - `engine_blocks`: the engine prefix cache's size in blocks of the first
      group, if known. With `engine_prefix_caching`, a host tier that holds
      more chunks keeps whole chains (`tiers.primary.chains`).
    """

    groups: tuple[GroupSpec, ...]
    hash_block_tokens: int = 0
    offload_prompt_only: bool = True
    max_defer_s: float = DEFAULT_MAX_DEFER_S
    world_size: int = 1
    engine_prefix_caching: bool = True
    null_block_id: int | None = None
    engine_blocks: int | None = None

    def __post_init__(self) -> None:
        self._check_groups()
        if type(self.hash_block_tokens) is int and self.hash_block_tokens == 0:
            object.__setattr__(
                self, "hash_block_tokens", min(g.tokens_per_block for g in self.groups)
            )
        if not is_count(self.hash_block_tokens, 1):
            raise ValueError(
                "hash_block_tokens must be an int >= 1 (up to 2**63 - 1), got "
                f"{shown(self.hash_block_tokens)}"
            )
        for i, group in enumerate(self.groups):
            if group.tokens_per_block % self.hash_block_tokens:
                raise ValueError(
                    f"groups[{i}].tokens_per_block={group.tokens_per_block} is not a "
                    f"multiple of hash_block_tokens={self.hash_block_tokens}"
                )
        if not isinstance(self.offload_prompt_only, bool):
            raise ValueError(
                "offload_prompt_only must be true or false, got "
                f"{shown(self.offload_prompt_only)}"
            )
        if not is_valid_max_defer_s(self.max_defer_s):
            raise ValueError(
                "max_defer_s must be a finite number of seconds >= 0 (a deferral "
                f"must end), got {shown(self.max_defer_s)}"
            )
        if not is_count(self.world_size, 1):
            raise ValueError(
                "world_size must be an int >= 1 (up to 2**63 - 1), got "
                f"{shown(self.world_size)}"
            )
        if not isinstance(self.engine_prefix_caching, bool):
            raise ValueError(
                "engine_prefix_caching must be true or false, got "
                f"{shown(self.engine_prefix_caching)}"
            )
        null = self.null_block_id
        if null is not None and not is_count(null, 0):
            raise ValueError(
                "null_block_id must be an int >= 0 (up to 2**63 - 1) or None, got "
                f"{shown(null)}"
            )
        blocks = self.engine_blocks
        if blocks is not None and not is_count(blocks, 1):
            raise ValueError(
                "engine_blocks must be an int >= 1 (up to 2**63 - 1) or None, got "
                f"{shown(blocks)}"
            )

    def _check_groups(self) -> None:
        groups = self.groups
        if (
            not isinstance(groups, Sequence)
            or isinstance(groups, str)
            or not all(isinstance(g, GroupSpec) for g in groups)
        ):
            raise ValueError(
                f"groups must be a non-empty sequence of GroupSpec, got {shown(groups)}"
            )
        if not groups:
            raise ValueError("groups: at least one KV-cache group is required")

    @property
    def block_alignment(self) -> int:
        """Token counts handed to the engine are multiples of every block size."""
        return math.lcm(*(g.tokens_per_block for g in self.groups))

    @property
    def min_chunk_tokens(self) -> int:
        return min(g.tokens_per_chunk for g in self.groups)

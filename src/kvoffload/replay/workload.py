"""A workload to replay: requests with arrival times, lengths and block hashes.

Whoever builds one (the trace reader, a generator, a caller) gets a `ValueError`
for a request the engine model could not replay in bounded time: a non-finite or
negative arrival, no prompt, lengths past `kvoffload.replay.limits`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvoffload.replay.limits import MAX_ARRIVAL_S, MAX_REQUEST_TOKENS


@dataclass(frozen=True)
class WorkloadRequest:
    """One request: when it arrives, its prompt and output lengths, and the chained
    hash of every full `hash_block_tokens` block of prompt-then-output."""

    arrival: float
    num_prompt_tokens: int
    num_output_tokens: int
    hashes: Sequence[bytes]
    kind: str = ""

    def __post_init__(self) -> None:
        arrival = self.arrival
        number = isinstance(arrival, int | float) and not isinstance(arrival, bool)
        if not (number and math.isfinite(arrival) and 0 <= arrival <= MAX_ARRIVAL_S):
            raise ValueError(
                f"arrival must be a number of seconds in [0, {MAX_ARRIVAL_S:g}], "
                f"got {arrival!r}"
            )
        for name, minimum in (("num_prompt_tokens", 1), ("num_output_tokens", 0)):
            value = getattr(self, name)
            if type(value) is not int or value < minimum:
                raise ValueError(
                    f"{name} must be an integer >= {minimum}, got {value!r}"
                )
        if self.num_prompt_tokens + self.num_output_tokens > MAX_REQUEST_TOKENS:
            raise ValueError(
                f"a request of {self.num_prompt_tokens:,} prompt and "
                f"{self.num_output_tokens:,} output tokens is past the replay's "
                f"limit of {MAX_REQUEST_TOKENS:,} tokens"
            )

    def num_prompt_blocks(self, hash_block_tokens: int) -> int:
        return self.num_prompt_tokens // hash_block_tokens


@dataclass(frozen=True)
class Workload:
    """Requests in arrival order, hashed at `hash_block_tokens` granularity.

    `actual_prompt_tokens` (when given) are the true prompt lengths for the token
    hit ratio, where `num_prompt_tokens` was padded to whole blocks.
    """

    name: str
    requests: tuple[WorkloadRequest, ...]
    hash_block_tokens: int
    actual_prompt_tokens: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.hash_block_tokens < 1:
            raise ValueError(
                f"workload {self.name}: hash_block_tokens must be >= 1, "
                f"got {self.hash_block_tokens!r}"
            )
        arrivals = [r.arrival for r in self.requests]
        if arrivals != sorted(arrivals):
            raise ValueError(f"workload {self.name}: requests are not in arrival order")
        for i, r in enumerate(self.requests):
            if len(r.hashes) < r.num_prompt_tokens // self.hash_block_tokens:
                raise ValueError(
                    f"workload {self.name}: request {i} has {len(r.hashes)} hashes "
                    f"for {r.num_prompt_tokens} prompt tokens in blocks of "
                    f"{self.hash_block_tokens}"
                )
        actual = self.actual_prompt_tokens
        if actual is not None and len(actual) != len(self.requests):
            raise ValueError(
                f"workload {self.name}: {len(actual)} actual prompt lengths for "
                f"{len(self.requests)} requests"
            )

    def __len__(self) -> int:
        return len(self.requests)

    def prompt_tokens(self, index: int) -> int:
        if self.actual_prompt_tokens is not None:
            return self.actual_prompt_tokens[index]
        return self.requests[index].num_prompt_tokens

    def chunk_sequence(self, chunk_tokens: int) -> list[list[bytes]]:
        """Each request's prompt chunks as hash ids (a chunk is named by its last
        hash block), for offline analysis such as Belady's optimum."""
        per = chunk_tokens // self.hash_block_tokens
        out: list[list[bytes]] = []
        for req in self.requests:
            n = req.num_prompt_tokens // chunk_tokens
            out.append([req.hashes[(c + 1) * per - 1] for c in range(n)])
        return out

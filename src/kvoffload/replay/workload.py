"""A workload to replay: requests with arrival times, lengths and block hashes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkloadRequest:
    """One request: when it arrives, its prompt and output lengths, and the chained
    hash of every full `hash_block_tokens` block of prompt-then-output."""

    arrival: float
    num_prompt_tokens: int
    num_output_tokens: int
    hashes: Sequence[bytes]
    kind: str = ""

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
        arrivals = [r.arrival for r in self.requests]
        if arrivals != sorted(arrivals):
            raise ValueError(f"workload {self.name}: requests are not in arrival order")

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

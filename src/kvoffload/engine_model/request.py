"""A simulated request: known tokens (as block hashes), progress and timings."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, overload


class RequestStatus(Enum):
    WAITING = "waiting"
    LOADING = "loading"
    """Blocks allocated; waiting for the connector's load to land."""
    RUNNING = "running"
    DONE = "done"


class HashPrefix(Sequence[bytes]):
    """The first `length` hashes of a list, without copying it."""

    __slots__ = ("_hashes", "_length")

    def __init__(self, hashes: Sequence[bytes], length: int) -> None:
        self._hashes = hashes
        self._length = min(length, len(hashes))

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> bytes: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[bytes]: ...
    def __getitem__(self, index: int | slice) -> bytes | Sequence[bytes]:
        if isinstance(index, slice):
            return list(self._hashes[: self._length])[index]
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError(index)
        return self._hashes[index]

    def __iter__(self) -> Iterator[bytes]:
        for i in range(self._length):
            yield self._hashes[i]


@dataclass
class SimRequest:
    """One request of a workload, and what happened to it in the engine model.

    `hashes` are the chained hashes of every full hash block of the request's whole
    token sequence (prompt, then the output it will generate).
    """

    request_id: str
    arrival: float
    num_prompt_tokens: int
    max_output_tokens: int
    hashes: Sequence[bytes]
    hash_block_tokens: int
    kv_transfer_params: Mapping[str, Any] | None = None
    # progress
    num_output: int = 0
    num_computed: int = 0
    status: RequestStatus = RequestStatus.WAITING
    block_ids: list[list[int]] = field(default_factory=list)
    # outcomes
    first_token_time: float | None = None
    finish_time: float | None = None
    device_hit_tokens: int = 0
    loaded_tokens: int = 0
    preemptions: int = 0
    scheduled_once: bool = False
    lookahead: int = 0
    """Tokens a multi-token decode step will generate, visible to the connector."""

    def __post_init__(self) -> None:
        # A NaN arrival is never admitted and stalls the clock: refuse it here.
        if not math.isfinite(self.arrival):
            raise ValueError(
                f"request {self.request_id}: arrival must be finite, got {self.arrival!r}"
            )
        if self.num_prompt_tokens < 1 or self.max_output_tokens < 0:
            raise ValueError(
                f"request {self.request_id}: needs num_prompt_tokens >= 1 and "
                f"max_output_tokens >= 0, got {self.num_prompt_tokens!r} and "
                f"{self.max_output_tokens!r}"
            )
        if self.hash_block_tokens < 1:
            raise ValueError(
                f"request {self.request_id}: hash_block_tokens must be >= 1, "
                f"got {self.hash_block_tokens!r}"
            )

    @property
    def max_kv_tokens(self) -> int:
        """Tokens whose KV the request holds at most (the last sampled token's
        KV is never computed)."""
        return self.num_prompt_tokens + max(self.max_output_tokens, 1) - 1

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output

    @property
    def block_hashes(self) -> Sequence[bytes]:
        visible = self.num_tokens + self.lookahead
        return HashPrefix(self.hashes, visible // self.hash_block_tokens)

    @property
    def ttft(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival

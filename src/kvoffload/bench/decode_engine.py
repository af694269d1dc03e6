"""A stand-in for vLLM's scheduler in decode, driving a scheduler-side connector.

Requests are prefilled in one step each, then decode one token a step. Block ids
come from one pool shared by every group, oldest free block first (vLLM's free
queue). A sliding-window group frees the blocks that leave its window without
telling the connector, as vLLM does, so they come back to other requests.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from kvoffload.connector import OffloadConnector, ScheduledRequest
from kvoffload.worker.base import JobResult


class TokenHashes(Sequence[bytes]):
    """Distinct stand-in block hashes, made on demand: long prompts of many
    requests would otherwise hold millions of them."""

    def __init__(self, tag: bytes, request: BenchRequest, block_tokens: int) -> None:
        self._tag = tag
        self._request = request
        self._block_tokens = block_tokens

    def __len__(self) -> int:
        return self._request.num_tokens // self._block_tokens

    @overload
    def __getitem__(self, index: int) -> bytes: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[bytes]: ...
    def __getitem__(self, index: int | slice) -> bytes | Sequence[bytes]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._tag + index.to_bytes(8, "big")


@dataclass
class BenchRequest:
    """A request as the connector sees it (`RequestInfo`)."""

    request_id: str
    num_prompt_tokens: int
    num_tokens: int
    block_tokens: int
    kv_transfer_params: dict[str, Any] | None = None
    block_hashes: TokenHashes = field(init=False)

    def __post_init__(self) -> None:
        tag = self.request_id.encode().rjust(24, b"\0")
        self.block_hashes = TokenHashes(tag, self, self.block_tokens)


class BlockPool:
    """Engine block ids, handed out oldest-freed first; block 0 is the null block."""

    def __init__(self, num_blocks: int) -> None:
        self._free = deque(range(1, num_blocks))

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise RuntimeError("block pool exhausted: raise its size")
        return [self._free.popleft() for _ in range(n)]

    def free(self, ids: Iterable[int]) -> None:
        self._free.extend(ids)


@dataclass
class Running:
    """One request in the engine: its tables, and how far its window has freed."""

    request: BenchRequest
    tables: list[list[int]]
    computed: int = 0
    window_start: int = 0
    """Blocks of the sliding group before this one are freed."""


class Decoder:
    """Schedules every running request each step; the connector plans its stores
    and the workers report every job done at once."""

    def __init__(
        self,
        connector: OffloadConnector,
        pool: BlockPool,
        block_tokens: int,
        num_groups: int,
        sliding_window: int | None = None,
    ) -> None:
        """`sliding_window` (tokens): the last group keeps only that many tokens'
        blocks; the others keep every block."""
        self.connector = connector
        self._pool = pool
        self._block = block_tokens
        self._groups = num_groups
        self._window = sliding_window
        self.running: list[Running] = []

    def prefill(self, requests: Sequence[BenchRequest], per_step: int = 16) -> None:
        """Admit and prefill `requests`, `per_step` whole prompts a step."""
        for first in range(0, len(requests), per_step):
            batch = [self._admit(r) for r in requests[first : first + per_step]]
            self.finish_step(
                [
                    ScheduledRequest(
                        r.request.request_id,
                        0,
                        r.request.num_prompt_tokens,
                        tuple(tuple(t) for t in r.tables),
                        replace_block_ids=True,
                    )
                    for r in batch
                ]
            )
            for r in batch:
                r.computed = r.request.num_prompt_tokens
                r.request.num_tokens += 1  # the first output token
            self.running.extend(batch)

    def _admit(self, request: BenchRequest) -> Running:
        connector = self.connector
        connector.on_new_request(request)
        assert connector.get_num_new_matched_tokens(request, 0) == 0
        blocks = -(-request.num_prompt_tokens // self._block)
        tables = [self._pool.allocate(blocks) for _ in range(self._groups)]
        connector.update_state_after_alloc(request.request_id, tables, 0, 0)
        return Running(request, tables)

    def decode_step(self) -> list[ScheduledRequest]:
        """What the engine schedules this step: one token of every request, with a
        fresh block in every group for those that begin one."""
        out: list[ScheduledRequest] = []
        for r in self.running:
            self._slide(r)
            new: tuple[tuple[int, ...], ...] = ()
            if r.computed % self._block == 0:
                ids = self._pool.allocate(self._groups)
                for table, block in zip(r.tables, ids, strict=True):
                    table.append(block)
                new = tuple((block,) for block in ids)
            out.append(ScheduledRequest(r.request.request_id, r.computed, 1, new))
        return out

    def _slide(self, r: Running) -> None:
        """Free the sliding group's blocks before the window (vLLM's
        `remove_skipped_blocks`, on the computed tokens, before allocating)."""
        if self._window is None:
            return
        end = max(0, r.computed - self._window + 1) // self._block
        if end > r.window_start:
            table = r.tables[-1]
            self._pool.free(table[r.window_start : end])
            table[r.window_start : end] = [0] * (end - r.window_start)
            r.window_start = end

    def finish_step(self, scheduled: list[ScheduledRequest]) -> tuple[float, float]:
        """The connector's whole step: plan, the workers' results, schedule end.
        Returns the seconds `build_step` took and the seconds of the whole step."""
        connector = self.connector
        start = time.perf_counter()
        plan = connector.build_step(scheduled)
        built = time.perf_counter()
        jobs = (*plan.loads, *plan.stores)
        if jobs:
            connector.on_job_results([JobResult(job.job_id, True) for job in jobs])
        connector.on_schedule_end()
        return built - start, time.perf_counter() - start

    def advance(self) -> None:
        """Every running request computed one more token."""
        for r in self.running:
            r.computed += 1
            r.request.num_tokens += 1

"""Fences: engine blocks that store jobs in flight still read.

Engine blocks are fenced, not held: a finished or preempted request's blocks go
back to the engine at once. When the engine hands such a block to another
request (in any group: vLLM's groups share one block pool over the same bytes),
the next step plan names the store jobs still reading it in `wait_for`, and the
worker finishes them before anything writes the block.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvoffload.worker.base import GroupTransfer


class StoreFences:
    """Which store jobs read which engine blocks, and the jobs a step waits for."""

    def __init__(self) -> None:
        self._readers: dict[int, set[int]] = {}
        self._wait_for: set[int] = set()

    def add(self, job_id: int, transfers: Iterable[GroupTransfer]) -> None:
        """A store job reads these transfers' engine blocks until it completes."""
        for transfer in transfers:
            for block in transfer.engine_blocks:
                self._readers.setdefault(block, set()).add(job_id)

    def remove(self, job_id: int, transfers: Iterable[GroupTransfer]) -> None:
        """The store job completed: its blocks are free to be written."""
        readers = self._readers
        for transfer in transfers:
            for block in transfer.engine_blocks:
                jobs = readers.get(block)
                if jobs is not None:
                    jobs.discard(job_id)
                    if not jobs:
                        del readers[block]

    def fence(self, tables: Sequence[Sequence[int]]) -> None:
        """Blocks (re)allocated to a request wait for the stores reading them."""
        readers = self._readers
        if not readers:
            return
        for ids in tables:
            for block in ids:
                jobs = readers.get(block)
                if jobs:
                    self._wait_for.update(jobs)

    def wait_for(self, job_ids: Iterable[int]) -> None:
        """The next step waits for these jobs too (whatever their blocks)."""
        self._wait_for.update(job_ids)

    def take_wait_for(self) -> tuple[int, ...]:
        """The jobs this step must wait for, sorted; forgotten after."""
        out = tuple(sorted(self._wait_for))
        self._wait_for.clear()
        return out

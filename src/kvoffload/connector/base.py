"""What the scheduler-side connector needs from an engine, and what it returns.

An engine adapter passes `RequestInfo` objects (vLLM's `Request` already has this
shape) and, once per step, the requests it scheduled. The connector answers with a
`StepPlan`: the load and store jobs for the workers, and jobs that must finish
before engine blocks are reused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kvoffload.keys import OffloadKey
from kvoffload.worker.base import TransferJob


class Clock(Protocol):
    """Seconds from an arbitrary origin, never going backwards."""

    def __call__(self) -> float: ...


class RequestInfo(Protocol):
    """A live view of one request; the engine updates it as tokens are generated."""

    @property
    def request_id(self) -> str: ...

    @property
    def kv_transfer_params(self) -> object:
        """As the request carries them: a mapping or `None`. Anything else is
        warned about and ignored, never a failed request."""
        ...

    @property
    def num_prompt_tokens(self) -> int: ...

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens known so far."""
        ...

    @property
    def block_hashes(self) -> Sequence[bytes]:
        """Chained hash of every full hash block (`hash_block_tokens` tokens) of
        the request's current tokens: after the engine rewrites them
        (`OffloadConnector.on_request_rewritten`), those of the new tokens."""
        ...


class ChunkObserver(Protocol):
    """Told which chunks of a live request the connector stores or loads.

    `chunks` are (chunk index, key) pairs of one KV-cache group, in prefix order.
    An engine adapter uses it to describe chunks in the engine's own terms (vLLM's
    KV events) while the request, and so its tokens, is still at hand.
    """

    def __call__(
        self, request_id: str, group: int, chunks: Sequence[tuple[int, OffloadKey]]
    ) -> None: ...


@dataclass(frozen=True)
class ScheduledRequest:
    """One request in one engine step.

    `num_computed_tokens` is counted before the step; the step computes
    `num_scheduled_tokens` more. `new_block_ids[g]` are the engine blocks of group
    `g` appended this step, freshly allocated; with `replace_block_ids` they are
    the whole block table (a request resumed after preemption), fresh past the
    engine's prefix-cache hits in the first `num_computed_tokens`.
    """

    request_id: str
    num_computed_tokens: int
    num_scheduled_tokens: int
    new_block_ids: tuple[tuple[int, ...], ...] = ()
    replace_block_ids: bool = False


@dataclass(frozen=True)
class StepPlan:
    """The connector's output for one engine step.

    Loads can start at once; stores read blocks this step computes, so a worker
    runs them after the step's forward pass. `wait_for` are earlier jobs that must
    finish before engine blocks or host slots are reused (preemption, reset).
    `stale_loads` are loads handed out before a `reset_cache`: whatever their
    copy does, a worker reports them failed, so their requests recompute.
    """

    loads: tuple[TransferJob, ...] = ()
    stores: tuple[TransferJob, ...] = ()
    wait_for: tuple[int, ...] = ()
    request_of: Mapping[int, str] = field(default_factory=dict)
    stale_loads: tuple[int, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.loads or self.stores or self.wait_for or self.stale_loads)


@dataclass
class ConnectorStats:
    """Counters of the scheduler-side connector (cumulative)."""

    requests: int = 0
    lookups: int = 0
    deferrals: int = 0
    hit_tokens: int = 0
    load_jobs: int = 0
    store_jobs: int = 0
    failed_load_jobs: int = 0
    failed_store_jobs: int = 0
    chunks_loaded: int = 0
    chunks_stored: int = 0
    bytes_loaded: int = 0
    bytes_stored: int = 0
    load_seconds: float = 0.0
    store_seconds: float = 0.0
    store_skipped: int = 0

    def as_dict(self) -> dict[str, float]:
        return {name: float(value) for name, value in self.__dict__.items()}


def block_table_view(tables: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    """Freeze a per-group block table."""
    return tuple(tuple(t) for t in tables)

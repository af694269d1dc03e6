"""A small harness: the engine model driving the real connector and manager."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from kvoffload import BlockHasher, CPUOffloadingManager, OffloadKey, ReqContext
from kvoffload.connector import (
    ChunkObserver,
    ConnectorConfig,
    GroupSpec,
    OffloadConnector,
    ScheduledRequest,
    StepPlan,
)
from kvoffload.engine_model import (
    EngineConfig,
    EngineModel,
    SimClock,
    SimRequest,
    TimeModel,
)
from kvoffload.tiers.base import (
    OffloadPolicy,
    PrepareStoreOutput,
    RequestOffloadingContext,
)
from kvoffload.worker.base import TransferJob


class RecordingManager(CPUOffloadingManager):
    """The real primary tier, recording the calls the connector makes."""

    def __init__(
        self, num_chunks: int, policy: OffloadPolicy = OffloadPolicy.CHUNK_LEVEL
    ):
        super().__init__(num_chunks)
        self.request_policy = policy
        self.calls: list[tuple[str, str]] = []
        self.offered: dict[str, list[OffloadKey]] = {}
        self.stored: list[OffloadKey] = []

    def on_new_request(self, ctx: ReqContext) -> RequestOffloadingContext:
        self.calls.append(("on_new_request", ctx.req_id))
        return RequestOffloadingContext(self.request_policy)

    def lookup_prefix(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> Any:
        self.calls.append(("lookup", ctx.req_id))
        return super().lookup_prefix(keys, ctx)

    def prepare_load(
        self, keys: Sequence[OffloadKey], ctx: ReqContext
    ) -> tuple[int, ...]:
        self.calls.append(("prepare_load", ctx.req_id))
        return super().prepare_load(keys, ctx)

    def complete_load(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        self.calls.append(("complete_load", ctx.req_id))
        super().complete_load(keys, ctx)

    def prepare_store(
        self,
        keys: Sequence[OffloadKey],
        ctx: ReqContext,
        *,
        may_evict: bool = True,
        keep_loaded: bool = True,
        promotion: bool = False,
        protect: Sequence[OffloadKey] = (),
    ) -> PrepareStoreOutput | None:
        self.calls.append(("prepare_store", ctx.req_id))
        out = super().prepare_store(
            keys,
            ctx,
            may_evict=may_evict,
            keep_loaded=keep_loaded,
            promotion=promotion,
            protect=protect,
        )
        if out is not None:
            self.offered.setdefault(ctx.req_id, []).extend(keys)
        return out

    def complete_store(
        self, keys: Sequence[OffloadKey], ctx: ReqContext, success: bool = True
    ) -> None:
        self.calls.append(("complete_store", ctx.req_id))
        if success:
            self.stored.extend(keys)
        super().complete_store(keys, ctx, success)

    def on_request_finished(self, ctx: ReqContext) -> None:
        self.calls.append(("on_request_finished", ctx.req_id))
        super().on_request_finished(ctx)

    def calls_for(self, req_id: str) -> list[str]:
        return [name for name, rid in self.calls if rid == req_id]


class RecordingConnector(OffloadConnector):
    """The real connector, keeping every step plan it produced."""

    plans: list[StepPlan]

    def build_step(self, scheduled: Sequence[ScheduledRequest]) -> StepPlan:
        plan = super().build_step(scheduled)
        if not hasattr(self, "plans"):
            self.plans = []
        self.plans.append(plan)
        return plan

    def loads(self) -> list[TransferJob]:
        return [job for plan in getattr(self, "plans", []) for job in plan.loads]

    def waits(self) -> list[int]:
        return [j for plan in getattr(self, "plans", []) for j in plan.wait_for]


@dataclass
class Harness:
    """Builds requests and runs them through an engine with (or without) kvoffload."""

    tokens_per_block: tuple[int, ...] = (4,)
    blocks_per_chunk: tuple[int, ...] = (3,)
    device_blocks: int | None = 64
    host_chunks: int = 256
    async_scheduling: bool = False
    offload_prompt_only: bool | None = None
    """`None`: the connector's default."""
    policy: OffloadPolicy = OffloadPolicy.CHUNK_LEVEL
    max_batched_tokens: int = 8192
    fail_job: Callable[[TransferJob], bool] | None = None
    time_model: TimeModel = field(default_factory=TimeModel)
    seed: int = 0
    clock: SimClock = field(default_factory=SimClock)
    observer: ChunkObserver | None = None

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.hash_tokens = min(self.tokens_per_block)
        self.hasher = BlockHasher(self.hash_tokens)
        self.manager = RecordingManager(self.host_chunks, self.policy)
        groups = tuple(
            GroupSpec(t, b)
            for t, b in zip(self.tokens_per_block, self.blocks_per_chunk, strict=True)
        )
        prompt_only = (
            {}
            if self.offload_prompt_only is None
            else {"offload_prompt_only": self.offload_prompt_only}
        )
        self.connector = RecordingConnector(
            ConnectorConfig(groups, **prompt_only),
            self.manager,
            clock=self.clock,
            observer=self.observer,
        )
        self.engine = self._engine(self.connector)

    def _engine(self, connector: OffloadConnector | None) -> EngineModel:
        config = EngineConfig(
            tokens_per_block=self.tokens_per_block,
            device_blocks=self.device_blocks,
            async_scheduling=self.async_scheduling,
            max_batched_tokens=self.max_batched_tokens,
            time_model=self.time_model,
        )
        return EngineModel(config, connector, self.fail_job, self.clock)

    def tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(50_000) for _ in range(n)]

    def request(
        self,
        req_id: str,
        prompt: list[int],
        output: list[int] | None = None,
        arrival: float | None = None,
        params: dict[str, Any] | None = None,
    ) -> SimRequest:
        out = output if output is not None else self.tokens(2)
        return SimRequest(
            request_id=req_id,
            arrival=self.clock.now if arrival is None else arrival,
            num_prompt_tokens=len(prompt),
            max_output_tokens=len(out),
            hashes=self.hasher.hash_blocks(prompt + out),
            hash_block_tokens=self.hash_tokens,
            kv_transfer_params=params,
        )

    def run(self, *requests: SimRequest) -> list[SimRequest]:
        self.engine.run(requests)
        return list(requests)

    def baseline(self) -> EngineModel:
        """The same engine without kvoffload, on its own clock."""
        self.base_clock = SimClock()
        config = EngineConfig(
            tokens_per_block=self.tokens_per_block,
            device_blocks=self.device_blocks,
            async_scheduling=self.async_scheduling,
            max_batched_tokens=self.max_batched_tokens,
        )
        return EngineModel(config, None, None, self.base_clock)


@pytest.fixture(params=[False, True], ids=["sync", "async"])
def async_scheduling(request: pytest.FixtureRequest) -> bool:
    value: bool = request.param
    return value

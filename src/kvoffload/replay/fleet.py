"""A fleet of modeled engines behind a router, replayed in one simulated time.

Each engine is a whole `EngineStack`: its connector, host tier and local tiers.
A shared tier is one backend (a Redis server, a directory's index, their links)
that every engine's own tier object reads and writes. The loop always does the
earliest thing next: route the next arrival, or step the engine whose next event
comes first, so that a router sees the fleet as it is when a request arrives and
the shared tier sees the engines' stores and loads in time order. With one
engine it steps that engine exactly as `run_replay` does.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from kvoffload.engine_model import SimRequest
from kvoffload.replay.engine_stack import (
    SHARED_PREFIX,
    EngineStack,
    NamedBackend,
    build_backend,
    build_backends,
)
from kvoffload.replay.fleet_report import FleetResult, fleet_result
from kvoffload.replay.hints import hinted_params
from kvoffload.replay.routers import make_router
from kvoffload.replay.runner import ReplaySettings
from kvoffload.replay.tier_specs import TierSpec, check_shareable
from kvoffload.replay.workload import Workload


@dataclass(frozen=True)
class FleetSettings:
    """How many engines, which router, and the tier they share (if any)."""

    engines: int
    router: str = "round-robin"
    shared_tier: TierSpec | None = None

    def __post_init__(self) -> None:
        if type(self.engines) is not int or self.engines < 1:
            raise ValueError(f"--engines must be an integer >= 1, got {self.engines!r}")
        if self.shared_tier is not None:
            check_shareable(self.shared_tier)

    @property
    def shared_name(self) -> str | None:
        return (
            None if self.shared_tier is None else SHARED_PREFIX + self.shared_tier.kind
        )


class _Fleet:
    """The engines, their loads as the router sees them, and the event loop."""

    def __init__(
        self,
        workload: Workload,
        policy: str,
        capacity_chunks: int,
        settings: ReplaySettings,
        fleet: FleetSettings,
    ) -> None:
        self.workload = workload
        # Each request's retention hint, derived from the whole trace as for one
        # engine: an application knows its conversations wherever they go.
        self._hints = settings.hints.hints(workload)
        chunk_bytes = settings.chunk_bytes
        self.shared: list[NamedBackend] = []
        if fleet.shared_tier is not None:
            assert fleet.shared_name is not None
            self.shared = [
                build_backend(fleet.shared_tier, fleet.shared_name, policy, chunk_bytes)
            ]
        self.router = make_router(
            fleet.router,
            fleet.engines,
            settings.chunk_tokens,
            [m.name for m in self.shared],
            _shared_cost(settings, fleet.shared_tier),
        )
        block = settings.block_tokens(workload)
        self.local: list[list[NamedBackend]] = []
        self.stacks: list[EngineStack] = []
        for _ in range(fleet.engines):
            backends = build_backends(settings.tiers, policy, chunk_bytes)
            self.local.append(backends)
            self.stacks.append(
                EngineStack(
                    block,
                    workload.hash_block_tokens,
                    policy,
                    capacity_chunks,
                    settings,
                    [*backends, *self.shared],
                    record_events=self.router.wants_events,
                )
            )
        n = fleet.engines
        self.loads = [0] * n
        self._waiting_first: list[list[SimRequest]] = [[] for _ in range(n)]
        self._heap: list[tuple[float, int, int]] = []
        self._version = [0] * n
        self.owner: list[int] = []
        self.requests: list[SimRequest] = []

    def run(self, progress: Callable[[int], None] | None) -> None:
        arrivals = self.workload.requests
        count = len(arrivals)
        stacks, heap, version = self.stacks, self._heap, self._version
        finished = reported = 0
        i = 0
        while True:
            ta = arrivals[i].arrival if i < count else math.inf
            while heap and version[heap[0][1]] != heap[0][2]:
                heapq.heappop(heap)  # superseded by a later schedule
            te = heap[0][0] if heap else math.inf
            if ta == math.inf and te == math.inf:
                break
            if ta <= te:
                self._route(i)
                i += 1
                continue
            _, e, _ = heapq.heappop(heap)
            engine = stacks[e].engine
            done_before = len(engine.finished)
            engine.step(None if ta == math.inf else ta)
            if self.router.wants_events:
                self.router.observe(e, stacks[e].connector.take_events())
            self._first_tokens(e)
            self._schedule(e)
            finished += len(engine.finished) - done_before
            if progress is not None and finished - reported >= 200:
                progress(finished - reported)
                reported = finished
        if progress is not None:
            progress(finished - reported)

    def _route(self, i: int) -> None:
        w = self.workload
        r = w.requests[i]
        req = SimRequest(
            request_id=f"{w.name}-{i}",
            arrival=r.arrival,
            num_prompt_tokens=r.num_prompt_tokens,
            max_output_tokens=r.num_output_tokens,
            hashes=r.hashes,
            hash_block_tokens=w.hash_block_tokens,
            kv_transfer_params=hinted_params(self._hints, i),
        )
        e = self.router.route(req, w.prompt_tokens(i), self.loads)
        if not 0 <= e < len(self.stacks):
            raise RuntimeError(f"router {self.router.name} chose engine {e}")
        self.stacks[e].engine.add((req,))
        self.loads[e] += req.num_prompt_tokens
        self._waiting_first[e].append(req)
        self.owner.append(e)
        self.requests.append(req)
        self._schedule(e)

    def _first_tokens(self, e: int) -> None:
        """Take requests whose first token came off engine `e`'s load."""
        waiting = self._waiting_first[e]
        if not any(r.first_token_time is not None for r in waiting):
            return
        still = []
        for r in waiting:
            if r.first_token_time is None:
                still.append(r)
            else:
                self.loads[e] -= r.num_prompt_tokens
        self._waiting_first[e] = still

    def _schedule(self, e: int) -> None:
        self._version[e] += 1
        at = self.stacks[e].engine.next_event_time()
        if at is not None:
            heapq.heappush(self._heap, (at, e, self._version[e]))

    def end_time(self) -> float:
        return max(s.clock.now for s in self.stacks)


def _shared_cost(settings: ReplaySettings, shared: TierSpec | None) -> float:
    """What the prefix router charges per token loaded from the shared tier, in
    tokens of prefill: its transfer time over the prefill time of a token."""
    if shared is None:
        return 0.0
    tm = settings.time_model
    seconds = tm.kv_bytes_per_token / shared.bytes_per_s
    if tm.prefill_s_per_token <= 0:
        return 1.0
    return min(1.0, seconds / tm.prefill_s_per_token)


def run_fleet(
    workload: Workload,
    policy: str,
    capacity_chunks: int,
    settings: ReplaySettings,
    fleet: FleetSettings,
    progress: Callable[[int], None] | None = None,
) -> FleetResult:
    """Replay `workload` over `fleet.engines` engines, each with a host tier of
    `capacity_chunks` chunks under `policy` and the tiers of `settings.tiers`."""
    settings.validate(workload)
    if fleet.shared_tier is not None:
        fleet.shared_tier.capacity_chunks(settings.chunk_bytes)
    model = _Fleet(workload, policy, capacity_chunks, settings, fleet)
    started = time.perf_counter()
    model.run(progress)
    wall = time.perf_counter() - started
    return fleet_result(
        workload,
        policy,
        capacity_chunks,
        settings,
        fleet.router,
        model.requests,
        model.owner,
        model.stacks,
        model.local,
        model.shared,
        model.end_time(),
        wall,
    )

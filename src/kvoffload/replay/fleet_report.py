"""A fleet replay's results: per engine, per tier and for the whole fleet, as
records and tables."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from kvoffload.engine_model import SimRequest
from kvoffload.replay.engine_stack import EngineStack, NamedBackend, backend_result
from kvoffload.replay.tally import RequestTally, TierResult, sum_stats
from kvoffload.replay.workload import Workload
from kvoffload.tiers.base import TierStats

if TYPE_CHECKING:
    from kvoffload.replay.runner import ReplaySettings


@dataclass(frozen=True)
class EngineResult:
    """One engine of a fleet: its share of the requests and prompt tokens, its
    hit ratio (and each tier's share of it), and its TTFT."""

    engine: int
    requests: int
    prompt_tokens: int
    load_share: float
    hit_ratio: float
    tier_hit_ratios: dict[str, float]
    est_ttft_s: float
    p90_ttft_s: float


@dataclass(frozen=True)
class FleetResult:
    """A fleet replay. `tiers` are fleet-wide: host memory and local tiers
    summed over the engines (their bandwidths per engine: the mean of the
    engines' means, the highest peak), the shared tier as one. `load_imbalance`
    is the busiest engine's prompt tokens over the mean engine's."""

    workload: str
    policy: str
    capacity_chunks: int
    engines: int
    router: str
    local_tiers: tuple[str, ...]
    shared_tier: str | None
    requests: int
    prompt_chunks: int
    hit_chunks: int
    hit_ratio: float
    token_hit_ratio: float
    est_ttft_s: float
    p90_ttft_s: float
    load_imbalance: float
    tiers: tuple[TierResult, ...]
    per_engine: tuple[EngineResult, ...]
    wall_s: float
    requests_per_s: float

    def as_json(self) -> dict[str, object]:
        record = asdict(self)
        record["kind"] = "fleet"
        return record


def fleet_result(
    workload: Workload,
    policy: str,
    capacity: int,
    settings: ReplaySettings,
    router: str,
    requests: Sequence[SimRequest],
    owner: Sequence[int],
    stacks: Sequence[EngineStack],
    local: Sequence[Sequence[NamedBackend]],
    shared: Sequence[NamedBackend],
    end_time: float,
    wall: float,
) -> FleetResult:
    """Tally every request for its engine and the fleet; sum the tiers."""
    chunk = settings.chunk_tokens
    fleet = RequestTally(chunk)
    engines = [RequestTally(chunk) for _ in stacks]
    for i, (req, e) in enumerate(zip(requests, owner, strict=True)):
        true_tokens = workload.prompt_tokens(i)
        fleet.add(req, true_tokens)
        engines[e].add(req, true_tokens)
    span = end_time - (requests[0].arrival if requests else 0.0)
    stats = [s.tier_stats() for s in stacks]
    total_tokens = fleet.prompt_chunks * chunk
    tiers = _fleet_tiers(stats, local, shared, total_tokens, span)
    per_engine = tuple(
        _engine_result(e, tally, stats[e], fleet.prompt_tokens)
        for e, tally in enumerate(engines)
    )
    mean_tokens = fleet.prompt_tokens / len(stacks) if stacks else 0.0
    busiest = max((t.prompt_tokens for t in engines), default=0)
    mean, p90 = fleet.ttft_mean_and_p90()
    return FleetResult(
        workload=workload.name,
        policy=policy,
        capacity_chunks=capacity,
        engines=len(stacks),
        router=router,
        local_tiers=tuple(spec.text for spec in settings.tiers),
        shared_tier=shared[0].backend.spec.text if shared else None,
        requests=fleet.requests,
        prompt_chunks=fleet.prompt_chunks,
        hit_chunks=fleet.hit_chunks,
        hit_ratio=fleet.hit_ratio,
        token_hit_ratio=fleet.token_hit_ratio,
        est_ttft_s=mean,
        p90_ttft_s=p90,
        load_imbalance=busiest / mean_tokens if mean_tokens else 0.0,
        tiers=tiers,
        per_engine=per_engine,
        wall_s=wall,
        requests_per_s=fleet.requests / wall if wall > 0 else 0.0,
    )


def _engine_result(
    engine: int, tally: RequestTally, stats: dict[str, TierStats], fleet_tokens: int
) -> EngineResult:
    chunk_tokens = tally.prompt_chunks * tally.chunk_tokens
    mean, p90 = tally.ttft_mean_and_p90()
    return EngineResult(
        engine=engine,
        requests=tally.requests,
        prompt_tokens=tally.prompt_tokens,
        load_share=tally.prompt_tokens / fleet_tokens if fleet_tokens else 0.0,
        hit_ratio=tally.hit_ratio,
        tier_hit_ratios={
            name: (s.hit_tokens / chunk_tokens if chunk_tokens else 0.0)
            for name, s in stats.items()
        },
        est_ttft_s=mean,
        p90_ttft_s=p90,
    )


def _fleet_tiers(
    stats: Sequence[dict[str, TierStats]],
    local: Sequence[Sequence[NamedBackend]],
    shared: Sequence[NamedBackend],
    total_tokens: int,
    span: float,
) -> tuple[TierResult, ...]:
    """Host memory and each local tier summed over the engines, then the shared tier."""
    summed = {name: sum_stats(s[name] for s in stats) for name in stats[0]}
    out = [TierResult.build("cpu", "host", None, summed["cpu"], total_tokens)]
    for j, first in enumerate(local[0] if local else ()):
        group = [backends[j] for backends in local]
        out.append(backend_result(group, summed[first.name], total_tokens, span))
    for m in shared:
        out.append(backend_result([m], summed[m.name], total_tokens, span))
    return tuple(out)

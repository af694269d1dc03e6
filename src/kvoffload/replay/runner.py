"""Replaying a workload through the real connector, manager and policy against the
engine model, for one (policy, capacity) at a time."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from kvoffload.connector import ConnectorConfig, OffloadConnector
from kvoffload.engine_model import SimRequest, TimeModel
from kvoffload.policies.retention import DEFAULT_MAX_HINTED_SHARE
from kvoffload.replay.engine_stack import EngineStack, build_backends, tier_results
from kvoffload.replay.hints import NO_HINTS, HintMode, hinted_params
from kvoffload.replay.tally import RequestTally, TierResult
from kvoffload.replay.tier_specs import TierSpec
from kvoffload.replay.workload import Workload


@dataclass(frozen=True)
class ReplaySettings:
    """How to replay: chunk size, device cache, admission, the time model, the
    secondary tiers behind host memory (none: host memory alone), and how long
    the connector lets a request wait for chunks in flight (`max_defer_s`),
    the retention hints requests send (`hints`, derived from the workload) and
    the share of each tier they may hold.

    `device_tokens=0` means no device prefix cache in front of kvoffload (every
    reuse must come from the host tier), as in the reference figures.
    """

    chunk_tokens: int
    device_tokens: int = 0
    engine_block_tokens: int | None = None
    store_threshold: int = 0
    offload_prompt_only: bool = True
    max_batched_tokens: int = 8192
    time_model: TimeModel = field(default_factory=TimeModel)
    tiers: tuple[TierSpec, ...] = ()
    max_defer_s: float = ConnectorConfig.max_defer_s
    hints: HintMode = NO_HINTS
    max_hinted_share: float = DEFAULT_MAX_HINTED_SHARE

    @property
    def chunk_bytes(self) -> int:
        """KV bytes of one chunk: what a tier stores and moves for it."""
        return self.chunk_tokens * self.time_model.kv_bytes_per_token

    def block_tokens(self, workload: Workload) -> int:
        return self.engine_block_tokens or workload.hash_block_tokens

    def validate(self, workload: Workload) -> None:
        block = self.block_tokens(workload)
        if block % workload.hash_block_tokens:
            raise ValueError(
                f"engine block of {block} tokens is not a multiple of the workload's "
                f"hash block of {workload.hash_block_tokens}"
            )
        if self.chunk_tokens < block or self.chunk_tokens % block:
            raise ValueError(
                f"--chunk-tokens {self.chunk_tokens} must be a positive multiple of the "
                f"engine block size {block}"
            )
        if self.device_tokens < 0:
            raise ValueError(f"--device-tokens must be >= 0, got {self.device_tokens}")
        if self.device_tokens:
            # A request the device cannot hold whole would wait for room forever.
            # (Its last sampled token's KV is never computed.)
            longest = max(
                (
                    r.num_prompt_tokens + max(r.num_output_tokens, 1) - 1
                    for r in workload.requests
                ),
                default=0,
            )
            needed = -(-longest // block) * block
            if self.device_tokens < needed:
                raise ValueError(
                    f"--device-tokens {self.device_tokens:,} cannot hold the longest "
                    f"request ({longest:,} tokens with its output); give 0 (no "
                    f"device cache) or at least {needed:,}"
                )
        for spec in self.tiers:
            spec.capacity_chunks(self.chunk_bytes)  # a size too small for a chunk


@dataclass(frozen=True)
class HintOutcome:
    """What became of the retention hints in the host tier (`TierStats`)."""

    honoured: int
    expired_unused: int
    dropped: int
    max_hinted_share: float


@dataclass(frozen=True)
class ReplayResult:
    """One (policy, capacity) replay. Ratios are over prompt chunks, but
    `token_hit_ratio`: prompt tokens loaded from the host tier over all prompt
    tokens, both at the trace's true prompt lengths (padding never counts).
    `p90_ttft_s` is the nearest-rank 90th percentile (of two TTFTs, the larger).
    `tiers` (with secondary tiers only) are each tier's hits and traffic, host
    memory first. `hints` names the retention-hint mode (`--hints`), with
    `hinted` what became of the hints in the host tier (both only when hints
    were sent)."""

    workload: str
    policy: str
    capacity_chunks: int
    store_threshold: int
    offload_prompt_only: bool
    device_tokens: int
    requests: int
    prompt_chunks: int
    hit_chunks: int
    hit_ratio: float
    device_hit_chunks: int
    total_hit_ratio: float
    token_hit_ratio: float
    chunks_stored: int
    chunks_loaded: int
    chunks_evicted: int
    bytes_stored: int
    bytes_loaded: int
    est_ttft_s: float
    p90_ttft_s: float
    wall_s: float
    requests_per_s: float
    tiers: tuple[TierResult, ...] = ()
    hints: str = "none"
    hinted: HintOutcome | None = None

    def as_json(self) -> dict[str, object]:
        record = asdict(self)
        if not self.tiers:
            del record["tiers"]  # a host-only replay's record, as it always was
        else:
            record["tiers"] = [asdict(t) for t in self.tiers]
        if self.hints == "none":
            del record["hints"], record["hinted"]  # as it was before hints
        return record


def to_sim_requests(workload: Workload, hints: HintMode = NO_HINTS) -> list[SimRequest]:
    """The workload's requests for the engine model, each with the retention
    hint `hints` derives for it in its `kv_transfer_params`."""
    per_request = hints.hints(workload)
    return [
        SimRequest(
            request_id=f"{workload.name}-{i}",
            arrival=r.arrival,
            num_prompt_tokens=r.num_prompt_tokens,
            max_output_tokens=r.num_output_tokens,
            hashes=r.hashes,
            hash_block_tokens=workload.hash_block_tokens,
            kv_transfer_params=hinted_params(per_request, i),
        )
        for i, r in enumerate(workload.requests)
    ]


def run_replay(
    workload: Workload,
    policy: str,
    capacity_chunks: int,
    settings: ReplaySettings,
    progress: Callable[[int], None] | None = None,
) -> ReplayResult:
    """Replay `workload` with a host tier of `capacity_chunks` chunks under `policy`
    (and the secondary tiers of `settings.tiers` behind it)."""
    settings.validate(workload)
    block = settings.block_tokens(workload)
    backends = build_backends(settings.tiers, policy, settings.chunk_bytes)
    stack = EngineStack(
        block, workload.hash_block_tokens, policy, capacity_chunks, settings, backends
    )
    engine = stack.engine
    requests = to_sim_requests(workload, settings.hints)
    started = time.perf_counter()
    engine.add(requests)
    reported = 0
    while engine.has_work():
        engine.step()
        if progress is not None and len(engine.finished) - reported >= 200:
            progress(len(engine.finished) - reported)
            reported = len(engine.finished)
    if progress is not None:
        progress(len(engine.finished) - reported)
    wall = time.perf_counter() - started
    tally = RequestTally(settings.chunk_tokens)
    for i, req in enumerate(requests):
        tally.add(req, workload.prompt_tokens(i))
    tiers: tuple[TierResult, ...] = ()
    if backends:
        span = stack.clock.now - (requests[0].arrival if requests else 0.0)
        tiers = tier_results(
            stack.tier_stats(),
            backends,
            tally.prompt_chunks * settings.chunk_tokens,
            span,
        )
    return _result(
        workload, policy, capacity_chunks, settings, tally, stack.connector, wall, tiers
    )


def _result(
    workload: Workload,
    policy: str,
    capacity: int,
    settings: ReplaySettings,
    tally: RequestTally,
    connector: OffloadConnector,
    wall: float,
    tiers: tuple[TierResult, ...],
) -> ReplayResult:
    tier = connector.get_tier_stats()["cpu"]
    stats = connector.get_stats()
    mean, p90 = tally.ttft_mean_and_p90()
    hinted = None
    if settings.hints.kind != "none":
        hinted = HintOutcome(
            tier.hints_honoured,
            tier.hints_expired_unused,
            tier.hints_dropped,
            settings.max_hinted_share,
        )
    return ReplayResult(
        workload=workload.name,
        policy=policy,
        capacity_chunks=capacity,
        store_threshold=settings.store_threshold,
        offload_prompt_only=settings.offload_prompt_only,
        device_tokens=settings.device_tokens,
        requests=tally.requests,
        prompt_chunks=tally.prompt_chunks,
        hit_chunks=tally.hit_chunks,
        hit_ratio=tally.hit_ratio,
        device_hit_chunks=tally.device_hit_chunks,
        total_hit_ratio=tally.total_hit_ratio,
        token_hit_ratio=tally.token_hit_ratio,
        chunks_stored=tier.chunks_stored,
        chunks_loaded=tier.chunks_loaded,
        chunks_evicted=tier.evictions,
        bytes_stored=stats.bytes_stored,
        bytes_loaded=stats.bytes_loaded,
        est_ttft_s=mean,
        p90_ttft_s=p90,
        wall_s=wall,
        requests_per_s=tally.requests / wall if wall > 0 else 0.0,
        tiers=tiers,
        hints=settings.hints.label,
        hinted=hinted,
    )

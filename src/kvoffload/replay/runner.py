"""Replaying a workload through the real connector, manager and policy against the
engine model, for one (policy, capacity) at a time."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from kvoffload.connector import ConnectorConfig, GroupSpec, OffloadConnector
from kvoffload.engine_model import (
    EngineConfig,
    EngineModel,
    SimClock,
    SimRequest,
    TimeModel,
)
from kvoffload.replay.workload import Workload
from kvoffload.tiers.primary import CPUOffloadingManager


@dataclass(frozen=True)
class ReplaySettings:
    """How to replay: chunk size, device cache, admission, and the time model.

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


@dataclass(frozen=True)
class ReplayResult:
    """One (policy, capacity) replay. Ratios are over prompt chunks, but
    `token_hit_ratio`: prompt tokens loaded from the host tier over all prompt
    tokens, both at the trace's true prompt lengths (padding never counts).
    `p90_ttft_s` is the nearest-rank 90th percentile (of two TTFTs, the larger)."""

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

    def as_json(self) -> dict[str, object]:
        return asdict(self)


def to_sim_requests(workload: Workload) -> list[SimRequest]:
    return [
        SimRequest(
            request_id=f"{workload.name}-{i}",
            arrival=r.arrival,
            num_prompt_tokens=r.num_prompt_tokens,
            max_output_tokens=r.num_output_tokens,
            hashes=r.hashes,
            hash_block_tokens=workload.hash_block_tokens,
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
    """Replay `workload` with a host tier of `capacity_chunks` chunks under `policy`."""
    settings.validate(workload)
    block = settings.block_tokens(workload)
    clock = SimClock()
    manager = CPUOffloadingManager(
        capacity_chunks, policy, store_threshold=settings.store_threshold
    )
    connector = OffloadConnector(
        ConnectorConfig(
            (GroupSpec(block, settings.chunk_tokens // block),),
            hash_block_tokens=workload.hash_block_tokens,
            offload_prompt_only=settings.offload_prompt_only,
            engine_prefix_caching=settings.device_tokens > 0,
        ),
        manager,
        clock=clock,
    )
    engine = EngineModel(
        EngineConfig(
            tokens_per_block=(block,),
            device_blocks=settings.device_tokens // block or None,
            max_batched_tokens=settings.max_batched_tokens,
            decode_model="delay",
            time_model=settings.time_model,
        ),
        connector,
        clock=clock,
    )
    requests = to_sim_requests(workload)
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
    return _result(
        workload, policy, capacity_chunks, settings, requests, connector, wall
    )


def _result(
    workload: Workload,
    policy: str,
    capacity: int,
    settings: ReplaySettings,
    requests: list[SimRequest],
    connector: OffloadConnector,
    wall: float,
) -> ReplayResult:
    chunk = settings.chunk_tokens
    prompt_chunks = hit = device = loaded_tokens = prompt_tokens = 0
    for i, req in enumerate(requests):
        n = req.num_prompt_tokens // chunk
        total = min(n, (req.device_hit_tokens + req.loaded_tokens) // chunk)
        own = min(total, req.device_hit_tokens // chunk)
        prompt_chunks += n
        device += own
        hit += total - own
        # A prompt padded to whole blocks loads its padding too: only the tokens
        # of the true prompt count, against its true length.
        true_tokens = workload.prompt_tokens(i)
        loaded_tokens += min(req.loaded_tokens, true_tokens)
        prompt_tokens += true_tokens
    tier = connector.get_tier_stats()["cpu"]
    stats = connector.get_stats()
    ttfts = sorted(r.ttft for r in requests if r.ttft is not None)
    return ReplayResult(
        workload=workload.name,
        policy=policy,
        capacity_chunks=capacity,
        store_threshold=settings.store_threshold,
        offload_prompt_only=settings.offload_prompt_only,
        device_tokens=settings.device_tokens,
        requests=len(requests),
        prompt_chunks=prompt_chunks,
        hit_chunks=hit,
        hit_ratio=hit / prompt_chunks if prompt_chunks else 0.0,
        device_hit_chunks=device,
        total_hit_ratio=(hit + device) / prompt_chunks if prompt_chunks else 0.0,
        token_hit_ratio=loaded_tokens / prompt_tokens if prompt_tokens else 0.0,
        chunks_stored=tier.chunks_stored,
        chunks_loaded=tier.chunks_loaded,
        chunks_evicted=tier.evictions,
        bytes_stored=stats.bytes_stored,
        bytes_loaded=stats.bytes_loaded,
        est_ttft_s=statistics.fmean(ttfts) if ttfts else 0.0,
        p90_ttft_s=_nearest_rank(ttfts, 90),
        wall_s=wall,
        requests_per_s=len(requests) / wall if wall > 0 else 0.0,
    )


def _nearest_rank(ordered: list[float], percent: int) -> float:
    """The `percent`th percentile of sorted `ordered` by nearest rank: the smallest
    value with at least `percent`% of the values at or below it (0.0 if none)."""
    if not ordered:
        return 0.0
    rank = -(-percent * len(ordered) // 100)  # ceil, in integers: 0.9 * 70 > 63
    return ordered[max(rank, 1) - 1]

"""One modeled engine with kvoffload in front of it, built as production builds it.

The engine model drives the real `OffloadConnector`; behind it is the primary
(host) manager alone, as in a host-only deployment, or the `TieringManager` over
the primary manager and modeled secondary tiers: this engine's own (`--tier`),
then a shared one whose backend every engine of a fleet uses (`--shared-tier`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvoffload.connector import ConnectorConfig, GroupSpec, OffloadConnector
from kvoffload.engine_model import EngineConfig, EngineModel, SimClock
from kvoffload.replay.links import LinkUsage
from kvoffload.replay.redis_model import ModeledRedisTier, RedisServerModel
from kvoffload.replay.tally import TierResult
from kvoffload.replay.tier_models import (
    FileBackend,
    ModeledFileTier,
    ModeledTier,
    TierBackend,
)
from kvoffload.replay.tier_specs import TierSpec
from kvoffload.tiering.manager import TieringManager
from kvoffload.tiers.base import OffloadingManager, TierStats
from kvoffload.tiers.primary import CPUOffloadingManager

if TYPE_CHECKING:  # the runner builds engines with this module
    from kvoffload.replay.runner import ReplaySettings

SHARED_PREFIX = "shared-"


@dataclass(frozen=True)
class NamedBackend:
    """A built backend and the name its tiers take."""

    name: str
    backend: TierBackend


def build_backend(
    spec: TierSpec, name: str, policy: str, chunk_bytes: int
) -> NamedBackend:
    """The backend of one tier spec: a file index or a Redis server, with links.

    A file tier evicts by the run's policy, as host memory does; a Redis server
    by its own LRU (`allkeys-lru`), whatever kvoffload's policy.
    """
    chunks = spec.capacity_chunks(chunk_bytes)
    if spec.kind == "file":
        return NamedBackend(name, FileBackend(spec, chunks, chunk_bytes, policy))
    return NamedBackend(name, RedisServerModel(spec, chunks, chunk_bytes))


def local_tier_names(specs: Sequence[TierSpec]) -> list[str]:
    """`file`, `redis`, then `file-2`, ... for a kind given again."""
    seen: dict[str, int] = {}
    names = []
    for spec in specs:
        seen[spec.kind] = seen.get(spec.kind, 0) + 1
        count = seen[spec.kind]
        names.append(spec.kind if count == 1 else f"{spec.kind}-{count}")
    return names


def build_backends(
    specs: Sequence[TierSpec], policy: str, chunk_bytes: int, prefix: str = ""
) -> list[NamedBackend]:
    names = local_tier_names(specs)
    return [
        build_backend(spec, prefix + name, policy, chunk_bytes)
        for spec, name in zip(specs, names, strict=True)
    ]


def _tier(named: NamedBackend, clock: SimClock, record_events: bool) -> ModeledTier:
    backend = named.backend
    if isinstance(backend, FileBackend):
        return ModeledFileTier(named.name, backend, clock, record_events)
    assert isinstance(backend, RedisServerModel)
    return ModeledRedisTier(named.name, backend, clock, record_events)


class EngineStack:
    """An engine model, its connector and manager, and its modeled tiers."""

    def __init__(
        self,
        block_tokens: int,
        hash_block_tokens: int,
        policy: str,
        capacity_chunks: int,
        settings: ReplaySettings,
        backends: Sequence[NamedBackend] = (),
        record_events: bool = False,
    ) -> None:
        self.clock = SimClock()
        self.primary = CPUOffloadingManager(
            capacity_chunks,
            policy,
            store_threshold=settings.store_threshold,
            enable_events=record_events,
            max_hinted_share=settings.max_hinted_share,
            clock=self.clock,
        )
        self.tiers = [_tier(m, self.clock, record_events) for m in backends]
        manager: OffloadingManager = self.primary
        if self.tiers:
            manager = TieringManager(self.primary, self.tiers, clock=self.clock)
        self.connector = OffloadConnector(
            ConnectorConfig(
                (GroupSpec(block_tokens, settings.chunk_tokens // block_tokens),),
                hash_block_tokens=hash_block_tokens,
                offload_prompt_only=settings.offload_prompt_only,
                max_defer_s=settings.max_defer_s,
                engine_prefix_caching=settings.device_tokens > 0,
                engine_blocks=settings.device_tokens // block_tokens or None,
            ),
            manager,
            clock=self.clock,
        )
        self.engine = EngineModel(
            EngineConfig(
                tokens_per_block=(block_tokens,),
                device_blocks=settings.device_tokens // block_tokens or None,
                max_batched_tokens=settings.max_batched_tokens,
                decode_model="delay",
                time_model=settings.time_model,
            ),
            self.connector,
            clock=self.clock,
            wakeup=self._next_tier_event if self.tiers else None,
        )

    def _next_tier_event(self) -> float | None:
        times = [tier.next_completion() for tier in self.tiers]
        return min((t for t in times if t is not None), default=None)

    def tier_stats(self) -> dict[str, TierStats]:
        return self.connector.get_tier_stats()


def backend_result(
    group: Sequence[NamedBackend],
    stats: TierStats,
    prompt_chunk_tokens: int,
    span_s: float,
) -> TierResult:
    """A tier's result from its counters and the backends behind it: one backend,
    or one per engine of a fleet (then its bandwidth is per engine: the mean of
    their means, the highest of their peaks)."""
    first = group[0].backend
    evictions = None
    if isinstance(first, RedisServerModel):
        evictions = sum(
            m.backend.evictions
            for m in group
            if isinstance(m.backend, RedisServerModel)
        )
    links = (
        _per_backend([m.backend.reads.usage(span_s) for m in group]),
        _per_backend([m.backend.writes.usage(span_s) for m in group]),
    )
    return TierResult.build(
        group[0].name,
        first.spec.kind,
        first.spec.gbps,
        stats,
        prompt_chunk_tokens,
        evictions,
        links,
    )


def _per_backend(usages: Sequence[LinkUsage]) -> LinkUsage:
    if len(usages) == 1:
        return usages[0]
    return LinkUsage(
        num_bytes=sum(u.num_bytes for u in usages),
        jobs=sum(u.jobs for u in usages),
        busy_s=sum(u.busy_s for u in usages),
        mean_bytes_per_s=sum(u.mean_bytes_per_s for u in usages) / len(usages),
        peak_bytes_per_s=max(u.peak_bytes_per_s for u in usages),
    )


def tier_results(
    stats: dict[str, TierStats],
    backends: Sequence[NamedBackend],
    prompt_chunk_tokens: int,
    span_s: float,
) -> tuple[TierResult, ...]:
    """Every tier's result, host memory first, from one engine's counters."""
    out = [TierResult.build("cpu", "host", None, stats["cpu"], prompt_chunk_tokens)]
    for m in backends:
        out.append(backend_result([m], stats[m.name], prompt_chunk_tokens, span_s))
    return tuple(out)

"""What a replay measured: requests' hits and TTFTs, and each tier's traffic.

`RequestTally` sums finished requests (one engine's, or a whole fleet's); a
`TierResult` is one tier's share of the hits, what it stored and loaded, and the
mean and peak bandwidth its links carried.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvoffload.engine_model import SimRequest
from kvoffload.replay.links import LinkUsage
from kvoffload.tiers.base import TierStats


@dataclass
class RequestTally:
    """Chunks and tokens of finished requests. A hit is a prompt chunk loaded
    from a tier; a device hit one the engine's own prefix cache held. Token
    counts are at the requests' true prompt lengths (padding never counts)."""

    chunk_tokens: int
    requests: int = 0
    prompt_chunks: int = 0
    hit_chunks: int = 0
    device_hit_chunks: int = 0
    loaded_tokens: int = 0
    prompt_tokens: int = 0
    ttfts: list[float] = field(default_factory=list)

    def add(self, req: SimRequest, true_prompt_tokens: int) -> None:
        chunk = self.chunk_tokens
        n = req.num_prompt_tokens // chunk
        total = min(n, (req.device_hit_tokens + req.loaded_tokens) // chunk)
        own = min(total, req.device_hit_tokens // chunk)
        self.requests += 1
        self.prompt_chunks += n
        self.device_hit_chunks += own
        self.hit_chunks += total - own
        # A prompt padded to whole blocks loads its padding too: only the tokens
        # of the true prompt count, against its true length.
        self.loaded_tokens += min(req.loaded_tokens, true_prompt_tokens)
        self.prompt_tokens += true_prompt_tokens
        if req.ttft is not None:
            self.ttfts.append(req.ttft)

    @property
    def hit_ratio(self) -> float:
        return self.hit_chunks / self.prompt_chunks if self.prompt_chunks else 0.0

    @property
    def total_hit_ratio(self) -> float:
        hits = self.hit_chunks + self.device_hit_chunks
        return hits / self.prompt_chunks if self.prompt_chunks else 0.0

    @property
    def token_hit_ratio(self) -> float:
        return self.loaded_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def ttft_mean_and_p90(self) -> tuple[float, float]:
        ordered = sorted(self.ttfts)
        mean = statistics.fmean(ordered) if ordered else 0.0
        return mean, nearest_rank(ordered, 90)


def nearest_rank(ordered: list[float], percent: int) -> float:
    """The `percent`th percentile of sorted `ordered` by nearest rank: the smallest
    value with at least `percent`% of the values at or below it (0.0 if none)."""
    if not ordered:
        return 0.0
    rank = -(-percent * len(ordered) // 100)  # ceil, in integers: 0.9 * 70 > 63
    return ordered[max(rank, 1) - 1]


@dataclass(frozen=True)
class TierResult:
    """One tier over a replay. `hit_ratio` is the tier's share of the prompt
    chunks' tokens loaded for requests whose lookup found them there (the tiers'
    shares add up to the replay's hit ratio); `evictions` counts the medium's
    (a Redis server's are silent to its tiers). Bandwidths are in GB/s, the
    mean over the replay's simulated span, the peak over one second."""

    name: str
    kind: str
    capacity_chunks: int
    gbps: float | None
    hit_tokens: int
    hit_ratio: float
    chunks_stored: int
    chunks_loaded: int
    bytes_stored: int
    bytes_loaded: int
    evictions: int
    drops: int
    store_skipped: int
    failures: int
    read_gbps_mean: float | None = None
    read_gbps_peak: float | None = None
    write_gbps_mean: float | None = None
    write_gbps_peak: float | None = None

    @classmethod
    def build(
        cls,
        name: str,
        kind: str,
        gbps: float | None,
        stats: TierStats,
        prompt_chunk_tokens: int,
        evictions: int | None = None,
        links: tuple[LinkUsage, LinkUsage] | None = None,
    ) -> TierResult:
        """From a tier's counters (summed over engines for a fleet), the prompt
        chunks' tokens they are a share of, and its (read, write) link usage."""
        ratio = stats.hit_tokens / prompt_chunk_tokens if prompt_chunk_tokens else 0.0
        rates: dict[str, float | None] = {}
        if links is not None:
            for prefix, usage in zip(("read", "write"), links, strict=True):
                rates[f"{prefix}_gbps_mean"] = usage.mean_bytes_per_s / 1e9
                rates[f"{prefix}_gbps_peak"] = usage.peak_bytes_per_s / 1e9
        return cls(
            name=name,
            kind=kind,
            capacity_chunks=stats.capacity,
            gbps=gbps,
            hit_tokens=stats.hit_tokens,
            hit_ratio=ratio,
            chunks_stored=stats.chunks_stored,
            chunks_loaded=stats.chunks_loaded,
            bytes_stored=stats.bytes_stored,
            bytes_loaded=stats.bytes_loaded,
            evictions=stats.evictions if evictions is None else evictions,
            drops=stats.drops,
            store_skipped=stats.store_skipped,
            failures=stats.failures,
            **rates,
        )


def sum_stats(stats: Iterable[TierStats]) -> TierStats:
    """Counters added up (a fleet's engines' views of one tier); the capacity is
    the first one's (they share it, or each has the same)."""
    items = list(stats)
    total = TierStats()
    for s in items:
        for name, value in s.__dict__.items():
            if name not in ("capacity", "occupancy"):
                setattr(total, name, getattr(total, name) + value)
    if items:
        total.capacity = items[0].capacity
        total.occupancy = items[0].occupancy
    return total

"""Tables of per-tier results: where hits came from, what each tier moved, and
the bandwidth it took (two tables, so that each fits 80 columns)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvoffload.replay.runner import ReplayResult
from kvoffload.replay.tables import ReportTable
from kvoffload.replay.tally import TierResult

_CHUNK_HEADERS = ("run", "tier", "capacity", "hit\nratio", "stored", "loaded",
                  "evicted", "shed")  # fmt: skip
_RATE_HEADERS = ("run", "tier", "link\nGB/s", "read\nmean", "read\npeak",
                 "write\nmean", "write\npeak")  # fmt: skip


def _gbps(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def tier_rows(label: str, tiers: Iterable[TierResult]) -> list[tuple[str, ...]]:
    """One row per tier of one run (`label` names the run): hits and chunks."""
    return [
        (
            label,
            t.name,
            f"{t.capacity_chunks:,}",
            f"{t.hit_ratio:.3f}",
            f"{t.chunks_stored:,}",
            f"{t.chunks_loaded:,}",
            f"{t.evictions:,}",
            f"{t.drops:,}",
        )
        for t in tiers
    ]


def rate_rows(label: str, tiers: Iterable[TierResult]) -> list[tuple[str, ...]]:
    """One row per tier of one run with a modeled link (host memory has none)."""
    return [
        (
            label,
            t.name,
            f"{t.gbps:g}",
            _gbps(t.read_gbps_mean),
            _gbps(t.read_gbps_peak),
            _gbps(t.write_gbps_mean),
            _gbps(t.write_gbps_peak),
        )
        for t in tiers
        if t.gbps is not None
    ]


def make_tier_tables(
    title: str,
    rows: Sequence[tuple[str, ...]],
    rates: Sequence[tuple[str, ...]],
) -> list[ReportTable]:
    """The chunk table, then the bandwidth table if any tier has a link."""
    tables = [ReportTable(title, _CHUNK_HEADERS, tuple(rows), keys=2)]
    if rates:
        tables.append(
            ReportTable(
                "tier bandwidth in GB/s: the link's, the mean over the replay and "
                "the peak over one second, reading and writing",
                _RATE_HEADERS,
                tuple(rates),
                keys=2,
            )
        )
    return tables


def tiers_tables(results: Iterable[ReplayResult]) -> list[ReportTable]:
    """Each replay's tiers: a tier's hit ratio is its share of the replay's
    (host memory's hits, then the chunks promoted from each secondary tier);
    `shed` counts cascades the tier's backpressure dropped; then each secondary
    tier's bandwidth."""
    rows: list[tuple[str, ...]] = []
    rates: list[tuple[str, ...]] = []
    for r in results:
        label = f"{r.policy} {r.capacity_chunks:,}"
        rows += tier_rows(label, r.tiers)
        rates += rate_rows(label, r.tiers)
    return make_tier_tables("tiers: hits and chunks moved", rows, rates)

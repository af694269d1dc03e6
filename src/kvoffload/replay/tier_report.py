"""Tables of per-tier results: where hits came from and what each tier moved."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.table import Table

from kvoffload.replay.runner import ReplayResult
from kvoffload.replay.tally import TierResult

_COLUMNS = (
    "run",
    "tier",
    "capacity",
    "hit ratio",
    "stored",
    "loaded",
    "evicted",
    "shed",
    "read GB/s mean/peak",
    "write GB/s mean/peak",
)


def _rate(mean: float | None, peak: float | None) -> str:
    if mean is None or peak is None:
        return ""
    return f"{mean:.2f} / {peak:.2f}"


def tier_rows(label: str, tiers: Iterable[TierResult]) -> list[list[str]]:
    """One row per tier of one run (`label` names the run)."""
    rows = []
    for t in tiers:
        rows.append(
            [
                label,
                t.name if t.gbps is None else f"{t.name} ({t.gbps:g} GB/s)",
                f"{t.capacity_chunks:,}",
                f"{t.hit_ratio:.3f}",
                f"{t.chunks_stored:,}",
                f"{t.chunks_loaded:,}",
                f"{t.evictions:,}",
                f"{t.drops:,}",
                _rate(t.read_gbps_mean, t.read_gbps_peak),
                _rate(t.write_gbps_mean, t.write_gbps_peak),
            ]
        )
    return rows


def make_tier_table(title: str, rows: Sequence[Sequence[str]]) -> Table:
    table = Table(title=title)
    for i, name in enumerate(_COLUMNS):
        table.add_column(name, justify="left" if i < 2 else "right")
    for row in rows:
        table.add_row(*row)
    return table


def tiers_table(results: Iterable[ReplayResult]) -> Table:
    """Each replay's tiers: a tier's hit ratio is its share of the replay's
    (host memory's hits, then the chunks promoted from each secondary tier);
    `shed` counts cascades the tier's backpressure dropped; bandwidth is the
    mean over the replay and the peak over one second, in GB/s."""
    rows: list[list[str]] = []
    for r in results:
        rows += tier_rows(f"{r.policy} {r.capacity_chunks:,}", r.tiers)
    return make_tier_table("tiers", rows)

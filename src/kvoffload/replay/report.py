"""Presenting replay results: a terminal table, JSON lines and a PNG plot."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from kvoffload.replay.belady import OfflineResult
from kvoffload.replay.runner import ReplayResult
from kvoffload.replay.tables import ReportTable


def offline_json(
    name: str, workload: str, capacity: int | None, result: OfflineResult
) -> dict[str, object]:
    """A JSON record for an offline bound (Belady, infinite cache)."""
    return {
        "workload": workload,
        "policy": name,
        "capacity_chunks": capacity,
        "prompt_chunks": result.prompt_chunks,
        "hit_chunks": result.hit_chunks,
        "hit_ratio": result.hit_ratio,
    }


def write_json_lines(records: Sequence[dict[str, object]], out: TextIO) -> None:
    """One JSON object a line, strict JSON: a NaN or infinity (which strict
    parsers reject) is a `ValueError`, never written."""
    for record in records:
        out.write(json.dumps(record, sort_keys=True, allow_nan=False) + "\n")


def results_table(
    results: Sequence[ReplayResult],
    belady: dict[int, OfflineResult],
    infinite: OfflineResult | None,
    title: str,
) -> ReportTable:
    """One row per replay, then the offline bounds; constant settings are omitted."""
    show_filter = len({r.store_threshold for r in results}) > 1 or any(
        r.store_threshold >= 2 for r in results
    )
    show_prompt_only = len({r.offload_prompt_only for r in results}) > 1
    show_device = any(r.device_tokens for r in results)
    modes = _modes(results)
    show_hints = len(modes) > 1
    headers = ["policy", "capacity"]
    headers += ["filter"] * show_filter + ["prompt\nonly"] * show_prompt_only
    headers += ["hints"] * show_hints
    headers += ["hit\nratio", "token\nhit"] + ["device\nhits"] * show_device
    headers += ["stored", "loaded", "evicted", "TTFT\nmean s", "TTFT\np90 s"]
    rows: list[tuple[str, ...]] = []
    for r in sorted(
        results,
        key=lambda r: (r.capacity_chunks, r.policy, r.store_threshold, modes[r.hints]),
    ):
        row = [r.policy, f"{r.capacity_chunks:,}"]
        if show_filter:
            row.append(_filter_cell(r.store_threshold))
        if show_prompt_only:
            row.append(_on_off(r.offload_prompt_only))
        if show_hints:
            row.append(r.hints)
        row += [f"{r.hit_ratio:.3f}", f"{r.token_hit_ratio:.3f}"]
        if show_device:
            row.append(f"{r.device_hit_chunks:,}")
        row += [
            f"{r.chunks_stored:,}",
            f"{r.chunks_loaded:,}",
            f"{r.chunks_evicted:,}",
            f"{r.est_ttft_s:.3f}",
            f"{r.p90_ttft_s:.3f}",
        ]
        rows.append(tuple(row))
    pad = [""] * (len(headers) - 2 - show_filter - show_prompt_only - show_hints - 1)
    lead = ["-"] * (show_filter + show_prompt_only + show_hints)
    for capacity, result in sorted(belady.items()):
        rows.append(("belady", f"{capacity:,}", *lead, f"{result.hit_ratio:.3f}", *pad))
    if infinite is not None:
        rows.append(("infinite", "inf", *lead, f"{infinite.hit_ratio:.3f}", *pad))
    return ReportTable(title, tuple(headers), tuple(rows), keys=2, left=1)


def prompt_only_table(results: Sequence[ReplayResult]) -> ReportTable | None:
    """offload_prompt_only on against off at each (policy, capacity, filter,
    hint mode) replayed both ways: chunks written and hit ratio; None if none
    was."""
    pairs: dict[tuple[str, int, int, str], dict[bool, ReplayResult]] = {}
    for r in results:
        key = (r.policy, r.capacity_chunks, r.store_threshold, r.hints)
        pairs.setdefault(key, {})[r.offload_prompt_only] = r
    show_hints = len(_modes(results)) > 1
    rows: list[tuple[str, ...]] = []
    for (policy, capacity, _, hints), pair in sorted(pairs.items()):
        if True in pair and False in pair:
            on, off = pair[True], pair[False]
            saved = (
                1 - on.chunks_stored / off.chunks_stored if off.chunks_stored else 0.0
            )
            rows.append(
                (
                    policy,
                    f"{capacity:,}",
                    *[hints] * show_hints,
                    f"{on.chunks_stored:,}",
                    f"{off.chunks_stored:,}",
                    f"{saved:.0%}",
                    f"{on.hit_ratio:.3f}",
                    f"{off.hit_ratio:.3f}",
                )
            )
    if not rows:
        return None
    headers = ("policy", "capacity", *["hints"] * show_hints, "written\non",
               "written\noff", "fewer\nwrites", "hit ratio\non",
               "hit ratio\noff")  # fmt: skip
    return ReportTable(
        "offload_prompt_only: chunks written and hit ratio, on against off",
        headers,
        tuple(rows),
        keys=2 + show_hints,
        left=1,
    )


BELOW = 0.005
"""How far below the same replay without hints a mode's hit ratio may fall
before `hints_table` marks it (the bar of issue 25)."""


def _filter_cell(threshold: int) -> str:
    """A reuse filter as the tables show it: its threshold, or `-` for none."""
    return str(threshold) if threshold >= 2 else "-"


def _on_off(flag: bool) -> str:
    return "on" if flag else "off"


def _modes(results: Sequence[ReplayResult]) -> dict[str, int]:
    """The hint modes that ran, in the order of the results (`--hints`)."""
    return {mode: i for i, mode in enumerate(dict.fromkeys(r.hints for r in results))}


def _setting(r: ReplayResult) -> tuple[str, int, int, bool]:
    """What a replay ran besides its hints: policy, capacity, filter, prompt-only."""
    return (r.policy, r.capacity_chunks, r.store_threshold, r.offload_prompt_only)


def hints_table(results: Sequence[ReplayResult]) -> ReportTable | None:
    """Each hint mode's hit ratio and its change against the same replay
    without hints (a change below -`BELOW` marked `!`), at each (policy,
    capacity, filter, prompt-only) replayed both with `none` and with another
    mode; None if none was."""
    modes = [m for m in _modes(results) if m != "none"]
    if not modes:
        return None
    runs = {(_setting(r), r.hints): r for r in results}
    settings = {k for k, _ in runs}
    show_filter = len({k[2] for k in settings}) > 1
    show_prompt_only = len({k[3] for k in settings}) > 1
    rows: list[tuple[str, ...]] = []
    for key in sorted(settings, key=lambda k: (k[1], k[0], k[2], not k[3])):
        base = runs.get((key, "none"))
        if base is None:
            continue
        row = [key[0], f"{key[1]:,}"]
        if show_filter:
            row.append(_filter_cell(key[2]))
        if show_prompt_only:
            row.append(_on_off(key[3]))
        row.append(f"{base.hit_ratio:.3f}")
        for mode in modes:
            r = runs.get((key, mode))
            if r is None:
                row.append("")
                continue
            change = r.hit_ratio - base.hit_ratio
            mark = " !" if change < -BELOW else ""
            row.append(f"{r.hit_ratio:.3f} ({change:+.3f}){mark}")
        rows.append(tuple(row))
    if not rows:
        return None
    return ReportTable(
        f"retention hints: hit ratio and change against none (! more than "
        f"{BELOW:g} below)",
        (
            "policy",
            "capacity",
            *["filter"] * show_filter,
            *["prompt\nonly"] * show_prompt_only,
            "none",
            *modes,
        ),
        tuple(rows),
        keys=2 + show_filter + show_prompt_only,
        left=1,
    )


def plot(
    results: Sequence[ReplayResult],
    belady: dict[int, OfflineResult],
    infinite: OfflineResult | None,
    path: Path,
    title: str,
) -> bool:
    """Hit ratio against capacity per policy, with Belady and infinite-cache lines.

    Returns False (and draws nothing) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(8, 5))
    series: dict[str, list[tuple[int, float]]] = {}
    for r in results:
        label = r.policy + (
            f" + filter {r.store_threshold}" if r.store_threshold >= 2 else ""
        )
        if not r.offload_prompt_only:
            label += " (prompt-only off)"
        if r.hints != "none":
            label += f", hints {r.hints}"
        series.setdefault(label, []).append((r.capacity_chunks, r.hit_ratio))
    for label, points in sorted(series.items()):
        xs, ys = zip(*sorted(points), strict=True)
        ax.plot(xs, ys, marker="o", label=label)
    if belady:
        xs, ys = zip(*sorted((c, b.hit_ratio) for c, b in belady.items()), strict=True)
        ax.plot(xs, ys, linestyle="--", color="black", label="Belady (offline optimum)")
    if infinite is not None:
        ax.axhline(
            infinite.hit_ratio, linestyle=":", color="grey", label="infinite cache"
        )
    ax.set_xscale("log")
    ax.set_xlabel("host tier capacity (chunks)")
    ax.set_ylabel("hit ratio (hit chunks / prompt chunks)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True

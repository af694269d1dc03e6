"""Fuzzing `kv_transfer_params` through the connector: requests that share a
prefix, with arbitrary parameters, run through the engine model. Property: every request is served, and each logs at most one warning per
parameter. Bounded to seconds."""

from __future__ import annotations

import logging
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvoffload import BlockHasher, CPUOffloadingManager
from kvoffload.config.request_params import PARAMETER_NAMES
from kvoffload.connector import ConnectorConfig, GroupSpec, OffloadConnector
from kvoffload.engine_model import EngineConfig, EngineModel, SimClock, SimRequest

from ..config.test_config_fuzz import JSONISH
from ..config.test_request_params_fuzz import PARAMS


def _engine() -> tuple[EngineModel, BlockHasher]:
    manager = CPUOffloadingManager(4)
    connector = OffloadConnector(ConnectorConfig((GroupSpec(4, 2),)), manager)
    config = EngineConfig(tokens_per_block=(4,), device_blocks=24)
    return EngineModel(config, connector, None, SimClock()), BlockHasher(4)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(params=st.lists(PARAMS | JSONISH, min_size=3, max_size=3))
def test_requests_with_any_kv_transfer_params_are_served(
    params: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    engine, hasher = _engine()
    rng = random.Random(0)
    prefix = [rng.randrange(50_000) for _ in range(24)]
    requests = []
    for i, given_params in enumerate(params):
        prompt = prefix + [rng.randrange(50_000) for _ in range(9 + 8 * i)]
        output = [rng.randrange(50_000) for _ in range(2)]
        hashes = hasher.hash_blocks(prompt + output)
        requests.append(
            SimRequest(f"req-{i}", 0.0, len(prompt), 2, hashes, 4, given_params)
        )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kvoffload"):
        engine.run(requests)
    assert all(r.num_output == r.max_output_tokens for r in requests)
    for r in requests:
        about = [x.getMessage() for x in caplog.records]
        about = [m for m in about if r.request_id in m]
        assert len(about) <= len(PARAMETER_NAMES), about
        for name in PARAMETER_NAMES:
            assert sum(f"ignoring {name}=" in m for m in about) <= 1, about

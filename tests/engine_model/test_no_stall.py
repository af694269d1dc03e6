"""The engine model never loops forever: a request it could never run is refused
up front, and a run that stops making progress raises instead of spinning."""

from __future__ import annotations

import math

import pytest

from kvoffload import BlockHasher, CPUOffloadingManager
from kvoffload.connector import ConnectorConfig, GroupSpec, OffloadConnector
from kvoffload.engine_model import EngineConfig, EngineModel, SimClock, SimRequest

BLOCK = 4


def request(
    req_id: str, prompt: int, output: int = 2, arrival: float = 0.0
) -> SimRequest:
    tokens = list(range(prompt + output))
    hashes = BlockHasher(BLOCK).hash_blocks(tokens)
    return SimRequest(req_id, arrival, prompt, output, hashes, BLOCK)


def engine(device_blocks: int | None = 64) -> EngineModel:
    clock = SimClock()
    connector = OffloadConnector(
        ConnectorConfig((GroupSpec(BLOCK, 2),)), CPUOffloadingManager(64), clock=clock
    )
    return EngineModel(
        EngineConfig(tokens_per_block=(BLOCK,), device_blocks=device_blocks),
        connector,
        clock=clock,
    )


@pytest.mark.parametrize("arrival", [math.nan, math.inf, -math.inf])
def test_a_request_that_never_arrives_is_refused(arrival: float) -> None:
    """A NaN arrival is never admitted and kept the clock still: replay hung."""
    with pytest.raises(ValueError, match="arrival must be finite"):
        request("R", 8, arrival=arrival)


@pytest.mark.parametrize(("prompt", "output"), [(0, 2), (8, -1)])
def test_a_request_without_a_prompt_or_with_negative_output_is_refused(
    prompt: int, output: int
) -> None:
    with pytest.raises(ValueError, match="num_prompt_tokens >= 1"):
        request("R", prompt, output)


def test_a_request_larger_than_the_device_is_refused_when_added() -> None:
    """It waited for room forever, the clock ticking on."""
    model = engine(device_blocks=4)
    fits = request("fits", 14, 3)  # 16 tokens of KV: 4 blocks
    model.add([fits])
    with pytest.raises(ValueError, match="request big needs 17 tokens of KV"):
        model.add([request("big", 15, 3)])
    assert model.run() == [fits]


def test_a_run_that_stops_making_progress_raises() -> None:
    """Should a NaN arrival reach the engine anyway, it raises, never spins."""
    model = engine()
    stuck = request("R", 8)
    stuck.arrival = math.nan  # past the request's own check
    model.add([stuck])
    with pytest.raises(RuntimeError, match="cannot make progress"):
        model.run(max_steps=10_000)

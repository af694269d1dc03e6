"""A model of an inference engine for tests and replay: paged device cache with prefix
caching, chunked prefill, preemption and a compute/transfer time model, driving the
connector exactly as an engine does."""

from kvoffload.engine_model.block_pool import BlockPool
from kvoffload.engine_model.engine import EngineConfig, EngineModel, SimClock
from kvoffload.engine_model.request import RequestStatus, SimRequest
from kvoffload.engine_model.timing import TimeModel
from kvoffload.engine_model.worker import SimulatedWorker

__all__ = [
    "BlockPool",
    "EngineConfig",
    "EngineModel",
    "RequestStatus",
    "SimClock",
    "SimRequest",
    "SimulatedWorker",
    "TimeModel",
]
